package samenode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
)

const (
	testNode = "node-a"
	testPod  = "0b6f6a4e-1c1d-4f7e-9a7e-2f4d1c1b8e11"
	testAddr = "10.0.0.7:9192"
)

var secret = bytes.Repeat([]byte{7}, 32)

type fixture struct {
	dir   string
	store *store.Store
	keys  *ref.Keyring
	srv   *Server
	cli   *Client
}

func keyring(t testing.TB, ns string) *ref.Keyring {
	t.Helper()
	k, err := ref.NewKeyring(ns, map[string][]byte{"k1": secret}, "k1")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	// A short directory: unix socket paths are at most 107 bytes.
	dir, err := os.MkdirTemp("", "sn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	f := &fixture{dir: dir, store: store.New(1<<30, nil), keys: keyring(t, "team-a")}
	f.srv = &Server{Store: f.store, Keys: func() *ref.Keyring { return f.keys }, Addr: testAddr, Pod: testPod}
	ln, err := f.srv.Listen(dir)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = f.srv.Serve(ln) }()
	t.Cleanup(func() { _ = f.srv.Close() })
	f.cli = &Client{Dir: dir, Node: testNode, Keys: f.keys}
	return f
}

// put stores data and returns a reference naming this producer.
func (f *fixture) put(t testing.TB, id string, data []byte, reads uint32) string {
	t.Helper()
	exp := time.Now().Add(time.Minute)
	if err := f.store.Put(context.Background(), store.Meta{ID: id, Bucket: "b", Key: "k-" + id, Reads: reads, Expires: exp}, data); err != nil {
		t.Fatal(err)
	}
	r, err := f.keys.Seal(ref.Record{Addr: testAddr, Key: id, Expires: exp, Reads: reads, Node: testNode, Pod: testPod})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func payload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31 + i>>8)
	}
	return b
}

func TestGetAndSeals(t *testing.T) {
	f := newFixture(t)
	data := payload(3<<20 + 17)
	r := f.put(t, "obj1", data, 2)
	o, err := f.cli.Get(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if o.Size != int64(len(data)) || o.Bucket != "b" || o.Key != "k-obj1" {
		t.Fatalf("got size %d bucket %q key %q", o.Size, o.Bucket, o.Key)
	}
	m, err := o.Map()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m, data) {
		t.Fatal("mapped object differs from the stored one")
	}
	_ = Unmap(m)
	assertReadOnly(t, int(o.File.Fd()), int64(len(data)))
	// The second (last) read: the same memfd, from the cache.
	o2, err := f.cli.Get(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	var a, b unix.Stat_t
	_ = unix.Fstat(int(o.File.Fd()), &a)
	_ = unix.Fstat(int(o2.File.Fd()), &b)
	if a.Ino != b.Ino {
		t.Errorf("second read got another memfd (inode %d, first %d): the object was copied again", b.Ino, a.Ino)
	}
	o2.Close()
	// Reads exhausted: the producer refuses, the cache let its memfd go.
	if _, err := f.cli.Get(context.Background(), r); !errors.Is(err, ErrNotFound) {
		t.Fatalf("third read of a 2-read object: %v, want ErrNotFound", err)
	}
	waitFor(t, func() bool { return f.srv.Cached() == 0 }, "the server letting the freed object's memfd go (caches %d)", f.srv.Cached())
}

// assertReadOnly checks a consumer cannot change the object in any way.
func assertReadOnly(t *testing.T, fd int, size int64) {
	t.Helper()
	if _, err := unix.Pwrite(fd, []byte("x"), 0); err == nil {
		t.Error("pwrite on the received memfd succeeded")
	}
	if err := unix.Ftruncate(fd, 0); err == nil {
		t.Error("ftruncate on the received memfd succeeded")
	}
	if err := unix.Ftruncate(fd, size+4096); err == nil {
		t.Error("growing the received memfd succeeded")
	}
	if b, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
		_ = unix.Munmap(b)
		t.Error("a writable shared mapping of the received memfd succeeded")
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, 0); err == nil {
		// F_SEAL_SEAL: no seal can be changed (adding none included).
		t.Error("the seals are not sealed")
	}
	// Reopening through /proc for writing is refused too (F_SEAL_WRITE).
	if wf, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", fd), os.O_WRONLY, 0); err == nil {
		_, werr := wf.WriteAt([]byte("x"), 0)
		wf.Close()
		if werr == nil {
			t.Error("writing through a /proc reopen succeeded")
		}
	}
}

// TestChildProcessConsumer: a consumer in another process receives the
// object, cannot write it, and the producer's copy stays intact.
func TestChildProcessConsumer(t *testing.T) {
	if os.Getenv("SAMENODE_CHILD") != "" {
		t.Skip("child mode runs in TestMain")
	}
	f := newFixture(t)
	data := payload(1 << 20)
	r := f.put(t, "obj-child", data, 5)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SAMENODE_CHILD=1", "SAMENODE_DIR="+f.dir, "SAMENODE_REF="+r)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "child ok size=1048576 writes refused") {
		t.Fatalf("child output:\n%s", out)
	}
	got, _, ok := f.store.Peek("obj-child")
	if !ok || !bytes.Equal(got, data) {
		t.Fatal("producer's object changed")
	}
	// What the child received is what a later consumer receives.
	o, err := f.cli.Get(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	m, _ := o.Map()
	defer Unmap(m)
	if !bytes.Equal(m, data) {
		t.Fatal("the memfd changed after the child tried to write it")
	}
}

func TestMain(m *testing.M) {
	if os.Getenv("SAMENODE_CHILD") != "" {
		os.Exit(child())
	}
	os.Exit(m.Run())
}

func child() int {
	k, _ := ref.NewKeyring("team-a", map[string][]byte{"k1": secret}, "k1")
	c := &Client{Dir: os.Getenv("SAMENODE_DIR"), Node: testNode, Keys: k}
	o, err := c.Get(context.Background(), os.Getenv("SAMENODE_REF"))
	if err != nil {
		fmt.Println("child get:", err)
		return 1
	}
	fd := int(o.File.Fd())
	var refused []string
	if _, err := unix.Pwrite(fd, []byte("evil"), 0); err != nil {
		refused = append(refused, "pwrite")
	}
	if err := unix.Ftruncate(fd, 1); err != nil {
		refused = append(refused, "truncate")
	}
	if b, err := unix.Mmap(fd, 0, int(o.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		refused = append(refused, "mmap")
	} else {
		b[0] ^= 0xff
		_ = unix.Munmap(b)
	}
	if len(refused) != 3 {
		fmt.Println("child: only refused", refused)
		return 1
	}
	fmt.Printf("child ok size=%d writes refused\n", o.Size)
	return 0
}

func TestAttacksOnTheSocket(t *testing.T) {
	f := newFixture(t)
	data := payload(4096)
	good := f.put(t, "obj", data, 100)
	other := keyring(t, "team-b") // same key bytes, other namespace
	foreign, _ := other.Seal(ref.Record{Addr: testAddr, Key: "obj", Expires: time.Now().Add(time.Minute), Reads: 1, Node: testNode, Pod: testPod})
	// Expired: sealed expiry past, and no keep-alive extended the object.
	past := time.Now().Add(-time.Second)
	if err := f.store.Put(context.Background(), store.Meta{ID: "old", Reads: 1, Expires: past}, data); err != nil {
		t.Fatal(err)
	}
	expired, _ := f.keys.Seal(ref.Record{Addr: testAddr, Key: "old", Expires: past, Reads: 1, Node: testNode, Pod: testPod})
	otherPod, _ := f.keys.Seal(ref.Record{Addr: testAddr, Key: "obj", Expires: time.Now().Add(time.Minute), Reads: 1, Node: testNode, Pod: "11111111-2222-4333-8444-555555555555"})
	otherAddr, _ := f.keys.Seal(ref.Record{Addr: "10.9.9.9:9192", Key: "obj", Expires: time.Now().Add(time.Minute), Reads: 1, Node: testNode, Pod: testPod})
	forger, _ := ref.NewKeyring("team-a", map[string][]byte{"k1": bytes.Repeat([]byte{9}, 32)}, "k1")
	forged, _ := forger.Seal(ref.Record{Addr: testAddr, Key: "obj", Expires: time.Now().Add(time.Minute), Reads: 1, Node: testNode, Pod: testPod})
	tampered := good[:len(good)-3] + "AAA"
	sock, _ := SocketPath(f.dir, testPod)
	for name, r := range map[string]string{"foreign": foreign, "expired": expired, "forged": forged, "tampered": tampered,
		"garbage": "zt1.!!!!", "empty": "", "another pod's reference": otherPod, "another address": otherAddr} {
		st, msg := rawRequest(t, sock, append(magic[:len(magic):len(magic)], r...), nil)
		if st != statusRefused {
			t.Errorf("%s: status %d (%s), want refused", name, st, msg)
		}
	}
	// Garbage frames: no magic, oversized; the connection is answered and dropped.
	if st, _ := rawRequest(t, sock, []byte("GET / HTTP/1.1\r\n\r\n"), nil); st != statusBad {
		t.Errorf("garbage frame: status %d, want bad request", st)
	}
	if st, _ := rawRequest(t, sock, append(magic[:], bytes.Repeat([]byte("A"), MaxRequestBytes+100)...), nil); st != statusBad {
		t.Errorf("oversized frame: status %d, want bad request", st)
	}
	// A client that passes descriptors: refused, and the server closes them.
	p := make([]int, 2)
	if err := unix.Pipe2(p, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	if st, _ := rawRequest(t, sock, append(magic[:len(magic):len(magic)], good...), unix.UnixRights(p[0], p[1], p[0])); st != statusBad {
		t.Errorf("request with descriptors: status %d, want bad request", st)
	}
	// The server runs in this process: once it closed what it received,
	// the only descriptors on the pipe are the test's own two.
	pipe, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", p[0]))
	waitFor(t, func() bool { return countLinks(t, pipe) == 2 }, "the server closing the descriptors it was passed (%s open %d times, want 2)", pipe, countLinks(t, pipe))
	unix.Close(p[0])
	unix.Close(p[1])
	// After all that, the object is intact and still served.
	o, err := f.cli.Get(context.Background(), good)
	if err != nil {
		t.Fatal(err)
	}
	o.Close()
}

// rawRequest sends one frame (with oob) and returns the response status.
func rawRequest(t *testing.T, sock string, frame, oob []byte) (byte, string) {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, _, err := c.WriteMsgUnix(frame, oob, nil); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<16)
	roob := make([]byte, 64)
	n, oobn, _, _, err := c.ReadMsgUnix(buf, roob)
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range Rights(roob[:oobn]) {
		t.Errorf("an error response carried descriptor %d", fd)
		unix.Close(fd)
	}
	r, err := decodeResponse(buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	return r.status, r.msg
}

// countLinks counts this process's descriptors on target (e.g. pipe:[123]).
func countLinks(t *testing.T, target string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && l == target {
			n++
		}
	}
	return n
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// waitFor polls cond with a generous bound (no timing is asserted).
func waitFor(t *testing.T, cond func() bool, format string, args ...any) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("never reached: "+format, args...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestNoDescriptorLeaks(t *testing.T) {
	f := newFixture(t)
	data := payload(64 << 10)
	// One get first: the client then keeps its connection (and the server
	// its end) for the next gets.
	o, err := f.cli.Get(context.Background(), f.put(t, "warm", data, 1))
	if err != nil {
		t.Fatal(err)
	}
	o.Close()
	waitFor(t, func() bool { return f.srv.Cached() == 0 }, "the warm-up object's memfd released")
	baseline := openFDs(t)
	for i := range 200 {
		r := f.put(t, fmt.Sprintf("o%d", i), data, 1)
		o, err := f.cli.Get(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		o.Close()
		// Read once: refused now, nothing held for it.
		if _, err := f.cli.Get(context.Background(), r); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second read: %v", err)
		}
	}
	waitFor(t, func() bool { return openFDs(t) == baseline && f.srv.Cached() == 0 },
		"descriptors back to %d (now %d), cache empty (now %d)", baseline, openFDs(t), f.srv.Cached())
}

func TestPeerCredentialsAndSocketMode(t *testing.T) {
	f := newFixture(t)
	sock, _ := SocketPath(f.dir, testPod)
	st, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want a socket with 0600", st.Mode())
	}
	r := f.put(t, "o", payload(10), 10)
	var seen atomic.Uint32
	var allow atomic.Bool
	seen.Store(1 << 31)
	f.srv.mu.Lock()
	f.srv.AllowUID = func(uid uint32) bool { seen.Store(uid); return allow.Load() }
	f.srv.mu.Unlock()
	if _, err := f.cli.Get(context.Background(), r); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("refused peer: %v, want ErrUnavailable", err)
	}
	if seen.Load() != uint32(os.Geteuid()) {
		t.Errorf("peer uid %d, want %d", seen.Load(), os.Geteuid())
	}
	allow.Store(true)
	o, err := f.cli.Get(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	o.Close()
}

func TestNotApplicableAndFallback(t *testing.T) {
	f := newFixture(t)
	r := f.put(t, "o", payload(10), 10)
	elsewhere := &Client{Dir: f.dir, Node: "node-b", Keys: f.keys}
	if _, err := elsewhere.Get(context.Background(), r); !errors.Is(err, ErrNotApplicable) || !Fallback(err) {
		t.Fatalf("other node: %v", err)
	}
	plain, _ := f.keys.Seal(ref.Record{Addr: testAddr, Key: "o", Expires: time.Now().Add(time.Minute), Reads: 1})
	if _, err := f.cli.Get(context.Background(), plain); !errors.Is(err, ErrNotApplicable) {
		t.Fatalf("reference without node: %v", err)
	}
	// The producer's socket gone (pod ended): unavailable, TCP takes over.
	_ = f.srv.Close()
	if _, err := os.Stat(filepath.Join(f.dir, testPod+".sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket file left after Close: %v", err)
	}
	if _, err := f.cli.Get(context.Background(), r); !errors.Is(err, ErrUnavailable) || !Fallback(err) {
		t.Fatalf("closed producer: %v", err)
	}
	if _, err := SocketPath(f.dir, "../../etc/passwd"); err == nil {
		t.Error("a pod UID with a path escaped the directory")
	}
}

// TestPrepare: a put-time copy is what later reads get, without another copy.
func TestPrepare(t *testing.T) {
	f := newFixture(t)
	data := payload(1 << 20)
	r := f.put(t, "p", data, 3)
	if err := f.srv.Prepare("p", data); err != nil {
		t.Fatal(err)
	}
	o, err := f.cli.Get(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	m, _ := o.Map()
	defer Unmap(m)
	if !bytes.Equal(m, data) {
		t.Fatal("prepared memfd differs")
	}
}

// TestResponseDecoding: truncated and trailing responses are protocol errors.
func TestResponseDecoding(t *testing.T) {
	ok := response{status: statusOK, size: 5, bucket: "b", key: "k"}.encode()
	for i := 0; i < len(ok); i++ {
		if _, err := decodeResponse(ok[:i]); !errors.Is(err, ErrProtocol) {
			t.Errorf("response cut at %d: %v", i, err)
		}
	}
	if _, err := decodeResponse(append(ok, 0)); !errors.Is(err, ErrProtocol) {
		t.Error("trailing byte accepted")
	}
	r, err := decodeResponse(ok)
	if err != nil || r.size != 5 || r.bucket != "b" || r.key != "k" {
		t.Fatalf("%+v %v", r, err)
	}
}

// TestAdopt: an object produced in a sealed memfd is served as is (the
// consumer gets the very same file), and an unsealed one is refused.
func TestAdopt(t *testing.T) {
	f := newFixture(t)
	data := payload(100_000)
	mf, err := NewSealed("a", data)
	if err != nil {
		t.Fatal(err)
	}
	m, err := MapSealed(mf, int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(m)
	r := f.put(t, "a", m, 1)
	var a, b unix.Stat_t
	_ = unix.Fstat(int(mf.Fd()), &a)
	if err := f.srv.Adopt("a", mf, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	o, err := f.cli.Get(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	_ = unix.Fstat(int(o.File.Fd()), &b)
	if a.Ino != b.Ino {
		t.Error("the adopted memfd was copied")
	}
	fd, _ := unix.MemfdCreate("open", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	open := os.NewFile(uintptr(fd), "open")
	defer open.Close()
	_ = open.Truncate(10)
	if err := f.srv.Adopt("b", open, 10); !errors.Is(err, ErrProtocol) {
		t.Fatalf("adopting an unsealed memfd: %v", err)
	}
}

// TestCopyTo: the consumer's one copy into a file (sendfile) and into any
// WriterAt (through a mapping) give the object's bytes.
func TestCopyTo(t *testing.T) {
	f := newFixture(t)
	data := payload(3<<20 + 5)
	r := f.put(t, "c", data, 2)
	for _, toFile := range []bool{true, false} {
		o, err := f.cli.Get(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		var got []byte
		if toFile {
			out, err := os.Create(filepath.Join(t.TempDir(), "in"))
			if err != nil {
				t.Fatal(err)
			}
			if err := o.CopyTo(out); err != nil {
				t.Fatal(err)
			}
			out.Close()
			got, _ = os.ReadFile(out.Name())
		} else {
			buf := make(sliceAt, len(data))
			if err := o.CopyTo(buf); err != nil {
				t.Fatal(err)
			}
			got = buf
		}
		o.Close()
		if !bytes.Equal(got, data) {
			t.Fatalf("toFile=%v: copy differs (%d bytes)", toFile, len(got))
		}
	}
}

type sliceAt []byte

func (s sliceAt) WriteAt(p []byte, off int64) (int, error) { return copy(s[off:], p), nil }

// TestConnectionReuse: sequential gets share one connection, and a pooled
// connection the producer closed (its pod restarted) is replaced.
func TestConnectionReuse(t *testing.T) {
	f := newFixture(t)
	data := payload(1000)
	for i := range 10 {
		o, err := f.cli.Get(context.Background(), f.put(t, fmt.Sprintf("r%d", i), data, 1))
		if err != nil {
			t.Fatal(err)
		}
		o.Close()
	}
	f.srv.mu.Lock()
	n := len(f.srv.conns)
	f.srv.mu.Unlock()
	if n != 1 {
		t.Errorf("10 sequential gets left %d connections, want 1 reused", n)
	}
	// The producer restarts on the same socket: the pooled connection is dead.
	_ = f.srv.Close()
	srv := &Server{Store: f.store, Keys: func() *ref.Keyring { return f.keys }, Addr: testAddr, Pod: testPod}
	ln, err := srv.Listen(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	o, err := f.cli.Get(context.Background(), f.put(t, "after", data, 1))
	if err != nil {
		t.Fatalf("get after the producer restarted: %v", err)
	}
	o.Close()
}

// AddSeals seals a memfd; while a writable shared mapping of it exists
// the kernel refuses F_SEAL_WRITE with EBUSY every time, and AddSeals
// gives up with EBUSY after its attempts (a transient EBUSY, a page the
// kernel is migrating, is what the attempts are for).
func TestAddSeals(t *testing.T) {
	memfd := func() int {
		fd, err := unix.MemfdCreate("t", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		if err := unix.Ftruncate(fd, 8192); err != nil {
			t.Fatal(err)
		}
		return fd
	}
	fd := memfd()
	if err := AddSeals(fd, RequiredSeals); err != nil {
		t.Fatal(err)
	}
	if seals, _ := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0); seals&RequiredSeals != RequiredSeals {
		t.Fatalf("seals %#x", seals)
	}
	fd = memfd()
	m, err := unix.Mmap(fd, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	if err := AddSeals(fd, RequiredSeals); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("sealing a memfd mapped writable: %v; want EBUSY", err)
	}
}
