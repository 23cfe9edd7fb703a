package localapi

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
)

// serveObjects starts p's object socket (as the sidecar does next to its
// API socket).
func serveObjects(t testing.TB, p *pod) {
	t.Helper()
	ln, err := ListenObjects(p.sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.api.ServeObjects(ln) }()
	t.Cleanup(func() {
		p.api.Stop()
		if err := <-done; err != nil {
			t.Errorf("object socket: %v", err)
		}
	})
}

const (
	snNode = "node-1"
	snPod  = "0b6f6a4e-1c1d-4f7e-9a7e-2f4d1c1b8e11"
)

// sameNodePods are two pods on one node with the real same-node path:
// producer a serves its socket in the node directory (its references
// name node and pod; its object socket's puts are adopted), consumer c
// gets from it over that socket and passes the memfd on.
func sameNodePods(t *testing.T) (a, c *pod, sn *samenode.Server) {
	t.Helper()
	a, c = startPod(t, podOpts{}), startPod(t, podOpts{})
	nodeDir, err := os.MkdirTemp("", "ztnode")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(nodeDir) })
	kr, _ := a.api.KeySource.Keys(context.Background())
	sn = &samenode.Server{Store: a.api.Store, Keys: func() *ref.Keyring { return kr }, Addr: a.api.Addr, Pod: snPod}
	ln, err := sn.Listen(nodeDir)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = sn.Serve(ln) }()
	t.Cleanup(func() { _ = sn.Close() })
	a.api.Sealer = SealFunc(func(r ref.Record) ref.Record { r.Node, r.Pod = snNode, snPod; return r })
	a.api.Adopter = sn
	ckr, _ := c.api.KeySource.Keys(context.Background())
	c.api.SameNodeGet = func(ctx context.Context, r string) (*samenode.Object, bool, error) {
		o, err := (&samenode.Client{Dir: nodeDir, Node: snNode, Keys: ckr}).Get(ctx, r)
		if err != nil {
			return nil, !samenode.Fallback(err), err
		}
		return o, true, nil
	}
	serveObjects(t, a)
	serveObjects(t, c)
	return a, c, sn
}

// TestObjectSocketSameNode: a function's Alloc'd buffer is a memfd the
// producer's sidecar adopts (the same-node server holds it, no copy), and
// the consumer's get passes the memfd it received on to its function,
// which maps it read-only: no file in its directory, and neither it nor
// anyone can write, shrink or grow the object.
func TestObjectSocketSameNode(t *testing.T) {
	a, c, sn := sameNodePods(t)
	ctx := context.Background()
	want := random(3 << 20)
	buf, err := a.sdk.Alloc(ctx, len(want))
	if err != nil {
		t.Fatal(err)
	}
	if buf.memfd == nil {
		t.Fatal("with the same-node path on, Alloc should make a memfd")
	}
	copy(buf.Data, want)
	resp, err := buf.Put(ctx, &sidecarv1.PutRequest{Reads: 1})
	if err != nil {
		t.Fatal(err)
	}
	if sn.Cached() != 1 || a.api.adoption().held() != 1 {
		t.Fatalf("adopted: same-node server holds %d memfds, the local API %d; want 1 and 1", sn.Cached(), a.api.adoption().held())
	}
	got, m, err := c.sdk.GetMapped(ctx, resp.GetRef())
	if err != nil {
		t.Fatal(err)
	}
	if m.file == nil || got.GetSource() != "remote" || !bytes.Equal(m.Data, want) {
		t.Fatalf("get: memfd %v, source %q, equal %v", m.file != nil, got.GetSource(), bytes.Equal(m.Data, want))
	}
	if names, _ := os.ReadDir(c.dir); len(names) != 0 {
		t.Fatalf("the consumer's directory holds %d files; the memfd should have been passed on", len(names))
	}
	fd := int(m.file.Fd())
	if _, err := unix.Mmap(fd, 0, len(want), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
		t.Fatal("a writable shared mapping of the object succeeded")
	}
	if err := unix.Mprotect(m.Data, unix.PROT_READ|unix.PROT_WRITE); err == nil {
		t.Fatal("the read-only mapping could be made writable")
	}
	if _, err := unix.Pwrite(fd, []byte("x"), 0); err == nil {
		t.Fatal("a write to the object succeeded")
	}
	if err := unix.Ftruncate(fd, 1); err == nil {
		t.Fatal("shrinking the object succeeded")
	}
	if err := unix.Ftruncate(fd, int64(len(want))+4096); err == nil {
		t.Fatal("growing the object succeeded")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	// Read once: the producer lets go of its mapping and memfd.
	waitFreed(t, a.api.Store)
	sn.Sweep()
	if sn.Cached() != 0 || a.api.adoption().held() != 0 {
		t.Fatalf("after the last read: same-node server holds %d memfds, the local API %d", sn.Cached(), a.api.adoption().held())
	}
}

// TestObjectSocketGetsLeaveNoDescriptor: many same-node gets on the
// client's pooled connection leave the consumer's sidecar holding no
// descriptor of the memfds it passed on (nor the producer's, once the
// objects are freed).
func TestObjectSocketGetsLeaveNoDescriptor(t *testing.T) {
	a, c, sn := sameNodePods(t)
	ctx := context.Background()
	want := random(64<<10 + 1)
	round := func() {
		resp, err := a.sdk.PutObject(ctx, want, &sidecarv1.PutRequest{Reads: 1})
		if err != nil {
			t.Fatal(err)
		}
		_, m, err := c.sdk.GetMapped(ctx, resp.GetRef())
		if err != nil {
			t.Fatal(err)
		}
		if m.file == nil || !bytes.Equal(m.Data, want) {
			t.Fatalf("get: memfd %v", m.file != nil)
		}
		m.Close()
	}
	round() // connections and pools made
	waitFreed(t, a.api.Store)
	sn.Sweep()
	base := openFDs(t)
	for range 20 {
		round()
	}
	waitFreed(t, a.api.Store)
	sn.Sweep()
	deadline := time.Now().Add(10 * time.Second)
	for openFDs(t) > base {
		if time.Now().After(deadline) {
			t.Fatalf("%d descriptors open after 20 gets, %d before", openFDs(t), base)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestObjectSocketFallback: without a memfd for the object (a file put,
// or the same-node path off) a get goes through the gRPC Get, and a
// memfd put is served to other pods over TCP from its mapping.
func TestObjectSocketFallback(t *testing.T) {
	a, c := startPod(t, podOpts{}), startPod(t, podOpts{})
	serveObjects(t, a)
	serveObjects(t, c)
	a.sdk.Memfds = MemfdAlways
	ctx := context.Background()
	want := random(2 << 20)
	resp, err := a.sdk.PutObject(ctx, want, &sidecarv1.PutRequest{Reads: 2})
	if err != nil {
		t.Fatal(err)
	}
	if a.api.adoption().held() != 1 {
		t.Fatal("MemfdAlways: the put should have gone as a memfd")
	}
	for _, p := range []*pod{c, a} { // over TCP, then this pod's own
		_, m, err := p.sdk.GetMapped(ctx, resp.GetRef())
		if err != nil {
			t.Fatal(err)
		}
		if m.file != nil || !bytes.Equal(m.Data, want) {
			t.Fatalf("get: memfd %v, equal %v", m.file != nil, bytes.Equal(m.Data, want))
		}
		m.Close()
	}
	waitFreed(t, a.api.Store)
	if a.api.adoption().held() != 0 {
		t.Fatal("the memfd outlived its object")
	}
}

// objRequest sends one raw object-socket message with fds attached and
// returns the status byte, the body, and the descriptors that came back.
// dialObjects connects to p's object socket as a function would.
func dialObjects(t *testing.T, p *pod) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: ObjectSocket(p.sock), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func objRequest(t *testing.T, conn *net.UnixConn, msg []byte, fds ...int) (byte, []byte, []int, error) {
	t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, _, err := conn.WriteMsgUnix(msg, oob, nil); err != nil {
		return 0, nil, nil, err
	}
	buf := make([]byte, maxObjResponse+64)
	roob := make([]byte, unix.CmsgSpace(16))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, roob)
	if err != nil {
		return 0, nil, nil, err
	}
	if n == 0 {
		return 0, nil, nil, errors.New("closed")
	}
	if n < 5 || string(buf[:4]) != "ZTO1" {
		t.Fatalf("malformed response %q", buf[:n])
	}
	return buf[4], buf[5:n], samenode.Rights(roob[:oobn]), nil
}

func putMsg(size uint64) []byte {
	b := append([]byte("ZTO1"), objPut)
	b = binary.LittleEndian.AppendUint32(b, 1)
	b = binary.LittleEndian.AppendUint64(b, 0)
	b = binary.LittleEndian.AppendUint64(b, size)
	return binary.LittleEndian.AppendUint16(b, 0)
}

// memfd makes a memfd of size bytes with the given seals added.
func memfd(t *testing.T, size int64, seals int) int {
	t.Helper()
	fd, err := unix.MemfdCreate("attack", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			t.Fatal(err)
		}
	}
	return fd
}

func openFDs(t *testing.T) int {
	t.Helper()
	names, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(names)
}

// TestObjectSocketAttacks: the function is hostile. Descriptors that are
// not a sealed memfd, of the wrong size, still writable, empty, too
// large, sent twice or where none belongs each get a clear error (a
// BAD_PAYLOAD or OBJECT_TOO_LARGE status), are closed, and leave nothing
// stored; the sidecar holds no descriptor of them afterwards.
func TestObjectSocketAttacks(t *testing.T) {
	p := startPod(t, podOpts{memory: 64 << 20})
	serveObjects(t, p)
	dial := func() *net.UnixConn { return dialObjects(t, p) }
	conn := dial()
	// Warm up what the server keeps open (its key ring, a served conn).
	if st, _, _, err := objRequest(t, conn, []byte("ZTO1\x01")); err != nil || st != objOK {
		t.Fatalf("hello: %d %v", st, err)
	}
	base := openFDs(t)
	const size = 1 << 20
	all := unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

	tmp, err := os.CreateTemp(p.dir, "plain")
	if err != nil {
		t.Fatal(err)
	}
	_ = tmp.Truncate(size)
	writable := memfd(t, size, 0)
	wmap, err := unix.Mmap(writable, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(writable), unix.F_ADD_SEALS, all); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("sealing a memfd with a writable mapping: %v, want EBUSY", err)
	}
	truncated := memfd(t, size, 0)
	_ = unix.Ftruncate(truncated, size/2)
	_, _ = unix.FcntlInt(uintptr(truncated), unix.F_ADD_SEALS, all)

	cases := []struct {
		name   string
		msg    []byte
		fds    []int
		reason string
		want   string
	}{
		{"a tmpfs file, not a memfd", putMsg(size), []int{int(tmp.Fd())}, ReasonBadPayload, "not a sealable memfd"},
		{"an unsealed memfd", putMsg(size), []int{memfd(t, size, 0)}, ReasonBadPayload, "not sealed"},
		{"sealed against shrinking and growing only", putMsg(size), []int{memfd(t, size, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)}, ReasonBadPayload, "not sealed"},
		{"a memfd its sender still maps writable", putMsg(size), []int{writable}, ReasonBadPayload, "not sealed"},
		{"announced larger than it is", putMsg(size + 1), []int{memfd(t, size, all)}, ReasonBadPayload, "announced"},
		{"truncated before sealing", putMsg(size), []int{truncated}, ReasonBadPayload, "announced"},
		{"empty", putMsg(0), []int{memfd(t, 0, all)}, ReasonBadPayload, "at least one byte"},
		{"above the store's cap", putMsg(128 << 20), []int{memfd(t, 128<<20, all)}, ReasonTooLarge, "cap"},
		{"two descriptors", putMsg(size), []int{memfd(t, size, all), memfd(t, size, all)}, ReasonBadPayload, "exactly one"},
		{"no descriptor", putMsg(size), nil, ReasonBadPayload, "exactly one"},
		{"a put message cut short", putMsg(size)[:12], []int{memfd(t, size, all)}, ReasonBadPayload, "short"},
	}
	for _, tc := range cases {
		st, body, fds, err := objRequest(t, conn, tc.msg, tc.fds...)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		samenode.CloseFDs(fds)
		if st != objError {
			t.Fatalf("%s: accepted (status %d)", tc.name, st)
		}
		serr := objStatus(body)
		if Reason(serr) != tc.reason || !strings.Contains(serr.Error(), tc.want) {
			t.Fatalf("%s: %v (reason %s), want %s mentioning %q", tc.name, serr, Reason(serr), tc.reason, tc.want)
		}
	}

	// The same memfd handed over twice: the second put is refused while
	// the first object lives.
	twice := memfd(t, size, all)
	st, first, _, err := objRequest(t, conn, putMsg(size), twice)
	if err != nil || st != objOK {
		t.Fatalf("first put: %d %v %s", st, err, first)
	}
	st, body, _, err := objRequest(t, conn, putMsg(size), twice)
	if err != nil || st != objError || !strings.Contains(objStatus(body).Error(), "already") {
		t.Fatalf("second put of the same memfd: status %d %v %s", st, err, body)
	}
	if p.api.Store.Len() != 1 {
		t.Fatalf("the store holds %d objects, want the one accepted", p.api.Store.Len())
	}

	// A descriptor with a request that takes none, an unknown op,
	// garbage: an error, then the connection ends.
	for _, tc := range []struct {
		name string
		msg  []byte
		fds  []int
	}{
		{"a descriptor with a hello", []byte("ZTO1\x01"), []int{memfd(t, size, all)}},
		{"a descriptor with a get", []byte("ZTO1\x03ref"), []int{memfd(t, size, all)}},
		{"an unknown op", []byte("ZTO1\x09"), nil},
		{"not the protocol", []byte("GET / HTTP/1.1\r\n"), nil},
		{"oversized", append([]byte("ZTO1\x03"), bytes.Repeat([]byte{'r'}, maxObjRequest+10)...), nil},
		{"an oversized get (op 5)", append([]byte("ZTO1\x05\x01\x00\x00"), bytes.Repeat([]byte{'r'}, maxObjRequest+10)...), nil},
		{"an oversized put of bytes", append([]byte("ZTO1\x04"), make([]byte, maxObjMessage+10)...), nil},
		{"a descriptor with a put of bytes", append([]byte("ZTO1\x04"), make([]byte, 64)...), []int{memfd(t, size, all)}},
		{"a descriptor with a get (op 5)", []byte("ZTO1\x05\x01\x00\x00ref"), []int{memfd(t, size, all)}},
	} {
		c := dial()
		st, _, fds, err := objRequest(t, c, tc.msg, tc.fds...)
		samenode.CloseFDs(fds)
		samenode.CloseFDs(tc.fds)
		if err != nil || st != objError {
			t.Fatalf("%s: status %d, %v", tc.name, st, err)
		}
		if _, _, _, err := objRequest(t, c, []byte("ZTO1\x01")); err == nil {
			t.Fatalf("%s: the connection stays open", tc.name)
		}
		c.Close()
	}

	// Nothing leaked: the descriptors the test holds are closed, the one
	// object is removed; the process is back to its descriptors before.
	_ = unix.Munmap(wmap)
	_ = unix.Close(twice)
	for _, tc := range cases {
		if len(tc.fds) > 0 && tc.fds[0] == int(tmp.Fd()) {
			continue
		}
		samenode.CloseFDs(tc.fds) // each made for its case (writable and truncated too)
	}
	tmp.Close()
	_ = os.Remove(filepath.Join(p.dir, filepath.Base(tmp.Name())))
	kr, _ := p.api.KeySource.Keys(context.Background())
	rec, err := kr.Open(string(first), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	p.api.Store.Remove(rec.Key)
	waitFreed(t, p.api.Store)
	deadline := time.Now().Add(10 * time.Second)
	for openFDs(t) > base || p.api.adoption().held() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("descriptors: %d open, %d before; the local API holds %d memfds", openFDs(t), base, p.api.adoption().held())
		}
		time.Sleep(10 * time.Millisecond)
	}
	conn.Close()
}
