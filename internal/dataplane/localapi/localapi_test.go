package localapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/dataplane/tier"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

var secret = bytes.Repeat([]byte{9}, 32)

func keyring(t testing.TB, ns, id string) *ref.Keyring {
	t.Helper()
	kr, err := ref.NewKeyring(ns, map[string][]byte{id: secret}, id)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// pod is one function pod's data plane in-process: its store, the Cap'n
// Proto producer server on loopback, the consumer client and the local API
// on a unix socket, with an SDK client connected to it.
type pod struct {
	api    *Server
	sdk    *Client
	server *pull.Server
	dir    string
	sock   string // the local API's socket
	events chan *controlv1.ObjectReady
}

type podOpts struct {
	memory  int64
	now     func() time.Time
	redis   *tier.Redis
	persist tier.Tier
	timeout time.Duration
	dir     string // shared-memory directory; default a test temp dir
	objects bool   // serve the object socket too (as every sidecar does)
}

// bothSockets runs f for pods without the object socket (the gRPC Put
// and Get, as an SDK older than it, or Python's, uses) and with it (small
// puts and every get on it, objbytes.go).
func bothSockets(t *testing.T, f func(t *testing.T, o podOpts)) {
	t.Run("grpc", func(t *testing.T) { f(t, podOpts{}) })
	t.Run("object socket", func(t *testing.T) { f(t, podOpts{objects: true}) })
}

func startPod(t testing.TB, o podOpts) *pod {
	t.Helper()
	if o.memory == 0 {
		o.memory = 256 << 20
	}
	kr := keyring(t, "ns", "k1")
	st := store.New(o.memory, o.now)
	if o.redis != nil {
		st.Spill = func(ctx context.Context, m store.Meta, data []byte) error {
			return o.redis.Put(ctx, m.ID, data, time.Hour)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &pull.Server{Store: st, Keys: kr}
	if o.redis != nil {
		srv.Fallback = tier.Chain{o.redis}
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	client := &pull.Client{Keys: kr, Now: o.now}
	t.Cleanup(client.Close)

	// Unix socket paths are limited to ~108 bytes: keep it short.
	sockDir, err := os.MkdirTemp("", "ztapi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	if o.dir == "" {
		o.dir = t.TempDir()
	}
	p := &pod{dir: o.dir, server: srv, events: make(chan *controlv1.ObjectReady, 16)}
	p.api = &Server{Store: st, Addr: ln.Addr().String(), Dir: p.dir, Namespace: "ns", Function: "f",
		TTL: time.Minute, InlineThreshold: 1024, Now: o.now, PutTimeout: o.timeout, MaxObjectBytes: o.memory,
		KeySource: KeysFunc(func(context.Context) (*ref.Keyring, error) { return kr, nil }),
		Puller:    client, Persist: o.persist,
		Reporter: ReportFunc(func(ev *controlv1.ObjectReady) error { p.events <- ev; return nil })}
	if o.redis != nil {
		p.api.Spilled = tier.Chain{o.redis}
	}
	sock := filepath.Join(sockDir, "s")
	p.sock = sock
	apiLn, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.api.Serve(apiLn) }()
	t.Cleanup(func() {
		p.api.Stop()
		if err := <-served; err != nil {
			t.Errorf("local API: %v", err)
		}
	})
	if p.sdk, err = Dial(sock, p.dir); err != nil {
		t.Fatal(err)
	}
	p.sdk.InlineThreshold = 1024
	t.Cleanup(func() { p.sdk.Close() })
	if o.objects {
		serveObjects(t, p)
	}
	return p
}

// waitFreed waits (bounded) until the store holds nothing: a consumer's
// release of its reader reaches the producer asynchronously.
func waitFreed(t *testing.T, s *store.Store) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.Used() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the store still holds %d bytes", s.Used())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// manualClock moves only when told, so expiry needs no sleeping.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func random(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// wantReason fails unless err carries the error class.
func wantReason(t *testing.T, what string, err error, reason string) {
	t.Helper()
	if got := Reason(err); got != reason {
		t.Errorf("%s: got class %q (%v), want %s", what, got, err, reason)
	}
}

// entries lists a shared-memory directory (files left behind are leaks).
func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestPutGetAcrossPods(t *testing.T) {
	a, b := startPod(t, podOpts{}), startPod(t, podOpts{})
	ctx := context.Background()
	small, large := []byte("ten bytes!"), random(5<<20+3)

	rs, err := a.sdk.Put(ctx, small, 2)
	if err != nil {
		t.Fatal(err)
	}
	rl, err := a.sdk.Put(ctx, large, 1)
	if err != nil {
		t.Fatal(err)
	}
	// The large object's file stays, named, until the object is freed
	// and the sidecar gives it back to this client (putreturn.go).
	if left := entries(t, a.dir); len(left) != 1 || !strings.HasPrefix(left[0], "put-"+a.sdk.id+"-") {
		t.Errorf("the producer's directory holds %v, want the large object's file", left)
	}
	for i := 0; i < 2; i++ {
		got, err := b.sdk.Get(ctx, rs)
		if err != nil || !bytes.Equal(got, small) {
			t.Fatalf("small read %d: %q %v", i, got, err)
		}
	}
	resp, err := b.sdk.RPC().Get(ctx, &sidecarv1.GetRequest{Ref: rl})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetObject().GetPath() == "" || resp.GetSource() != "remote" || resp.GetSize() != int64(len(large)) {
		t.Fatalf("large object: want a file pulled from the producer, got %+v", resp)
	}
	got, err := b.sdk.Bytes(resp.GetObject())
	if err != nil || !bytes.Equal(got, large) {
		t.Fatalf("large object: %d bytes, %v", len(got), err)
	}
	if left := entries(t, b.dir); len(left) != 0 {
		t.Errorf("consumer files left behind: %v", left)
	}
	// N reads used up: both refs now fail with the exhausted class, and the
	// producer's memory is free.
	_, err = b.sdk.Get(ctx, rs)
	wantReason(t, "third read of a 2-read object", err, ReasonExhausted)
	_, err = b.sdk.Get(ctx, rl)
	wantReason(t, "second read of a 1-read object", err, ReasonExhausted)
	waitFreed(t, a.api.Store)

	// A reference to the pod's own object is served from its memory.
	own, err := a.sdk.Put(ctx, large, 1)
	if err != nil {
		t.Fatal(err)
	}
	resp, err = a.sdk.RPC().Get(ctx, &sidecarv1.GetRequest{Ref: own})
	if err != nil || resp.GetSource() != "local" {
		t.Fatalf("own object: %+v %v", resp, err)
	}
	if got, err := a.sdk.Bytes(resp.GetObject()); err != nil || !bytes.Equal(got, large) {
		t.Fatalf("own object: %d bytes, %v", len(got), err)
	}
}

func TestBadReferenceClasses(t *testing.T) {
	clk := &manualClock{t: time.Now()}
	a := startPod(t, podOpts{now: clk.Now})
	ctx := context.Background()
	good, err := a.sdk.Put(ctx, []byte("x"), 1)
	if err != nil {
		t.Fatal(err)
	}
	tampered := []byte(good)
	if tampered[len(tampered)-5] == 'A' { // another valid base64url character
		tampered[len(tampered)-5] = 'B'
	} else {
		tampered[len(tampered)-5] = 'A'
	}
	foreign, _ := keyring(t, "other", "k1").Seal(ref.Record{Addr: a.api.Addr, Key: "put-1", Expires: clk.Now().Add(time.Hour), Reads: 1})
	unknown, _ := keyring(t, "ns", "k2").Seal(ref.Record{Addr: a.api.Addr, Key: "put-1", Expires: clk.Now().Add(time.Hour), Reads: 1})
	for _, tc := range []struct{ name, ref, reason string }{
		{"malformed", "zt1.%%%", ReasonMalformed},
		{"no prefix", "hello", ReasonMalformed},
		{"tampered", string(tampered), ReasonTampered},
		{"foreign namespace", foreign, ReasonForeign},
		{"unknown key id", unknown, ReasonUnknownKey},
	} {
		_, err := a.sdk.Get(ctx, tc.ref)
		wantReason(t, tc.name, err, tc.reason)
	}
	clk.advance(2 * time.Minute) // past the pod's one-minute TTL
	_, err = a.sdk.Get(ctx, good)
	wantReason(t, "expired", err, ReasonExpired)
}

func TestPayloadFilesOutsideTheDirectoryAreRefused(t *testing.T) {
	a := startPod(t, podOpts{})
	ctx := context.Background()
	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, []byte("keys"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(a.dir, "link")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(a.dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{
		"absolute outside": outside,
		"dot-dot":          filepath.Join(a.dir, "..", filepath.Base(filepath.Dir(outside)), "secret"),
		"symlink":          link,
		"directory":        filepath.Join(a.dir, "sub"),
		"missing":          filepath.Join(a.dir, "nope"),
	} {
		_, err := a.sdk.RPC().Put(ctx, &sidecarv1.PutRequest{Object: pathPayload(path), Reads: 1})
		wantReason(t, name, err, ReasonBadPayload)
	}
	_, err := a.sdk.RPC().Put(ctx, &sidecarv1.PutRequest{Reads: 1})
	wantReason(t, "no payload", err, ReasonBadPayload)
	if _, err := os.Stat(outside); err != nil {
		t.Errorf("the file outside was touched: %v", err)
	}
}

func TestProducerGone(t *testing.T) {
	a, b := startPod(t, podOpts{}), startPod(t, podOpts{})
	ctx := context.Background()
	r, err := a.sdk.Put(ctx, random(3<<20), 1)
	if err != nil {
		t.Fatal(err)
	}
	a.server.Close()
	_, err = b.sdk.Get(ctx, r)
	wantReason(t, "producer closed", err, ReasonProducerGone)
	if left := entries(t, b.dir); len(left) != 0 {
		t.Errorf("partial files left behind: %v", left)
	}
}

func TestStoreFullBlocksThenFails(t *testing.T) {
	a := startPod(t, podOpts{memory: 4 << 20, timeout: 100 * time.Millisecond})
	ctx := context.Background()
	first, err := a.sdk.Put(ctx, random(3<<20), 1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.sdk.Put(ctx, random(2<<20), 1)
	wantReason(t, "put over the cap without a spill tier", err, ReasonStoreFull)
	// The errors name the object's bucket and the limit that stopped it.
	_, err = a.sdk.SendObject(ctx, "s1", "out", "k", random(2<<20), false)
	wantReason(t, "send_object over the cap without a spill tier", err, ReasonStoreFull)
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "object k of bucket out (2097152 bytes)") ||
		!strings.Contains(msg, "memoryLimitPerPod of 4194304 bytes") || !strings.Contains(msg, "spillTiers") {
		t.Errorf("store full: %q does not name the bucket, the limit and the way out", msg)
	}
	_, err = a.sdk.SendObject(ctx, "s1", "out", "huge", random(5<<20), false)
	wantReason(t, "object larger than the cap", err, ReasonTooLarge)
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "object huge of bucket out") || !strings.Contains(msg, "5242880 bytes, cap 4194304") ||
		!strings.Contains(msg, "memoryLimitPerPod") {
		t.Errorf("too large: %q does not name the bucket and the limit", msg)
	}
	_, err = a.sdk.Put(ctx, random(5<<20), 1)
	wantReason(t, "object larger than the cap", err, ReasonTooLarge)

	// A put waiting for memory goes through once a read frees some.
	done := make(chan error, 1)
	a.api.PutTimeout = time.Minute
	go func() { _, err := a.sdk.Put(ctx, random(2<<20), 1); done <- err }()
	if _, err := a.sdk.Get(ctx, first); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("waiting put: %v", err)
	}
}

func TestSpilledObjectsAreServedFromRedis(t *testing.T) {
	rds := servers.StartRedis(t)
	red := &tier.Redis{Client: rds.Client, Prefix: "zt:test:"}
	a := startPod(t, podOpts{memory: 3 << 20, redis: red})
	b := startPod(t, podOpts{})
	ctx := context.Background()
	objs := make([][]byte, 5)
	refs := make([]string, len(objs))
	for i := range objs {
		objs[i] = random(1 << 20)
		var err error
		if refs[i], err = a.sdk.Put(ctx, objs[i], 1); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	if used := a.api.Store.Used(); used > 3<<20 {
		t.Fatalf("store holds %d bytes over its cap", used)
	}
	// Every object readable: spilled ones through the producer from Redis,
	// and one through the producer's own local API.
	for i, r := range refs[1:] {
		got, err := b.sdk.Get(ctx, r)
		if err != nil || !bytes.Equal(got, objs[i+1]) {
			t.Fatalf("object %d: %d bytes, %v", i+1, len(got), err)
		}
	}
	resp, err := a.sdk.RPC().Get(ctx, &sidecarv1.GetRequest{Ref: refs[0]})
	if err != nil || resp.GetSource() != "redis" {
		t.Fatalf("oldest object: want it from redis, got %+v %v", resp, err)
	}
	if got, _ := a.sdk.Bytes(resp.GetObject()); !bytes.Equal(got, objs[0]) {
		t.Fatal("oldest object corrupted in the spill")
	}
}

func TestSendObjectPersistAndGetObject(t *testing.T) {
	s3 := servers.StartMinIO(t)
	persist := s3.Tier(t, s3.Bucket(t, "ziptrail"), "ns/")
	a := startPod(t, podOpts{persist: persist})
	ctx := context.Background()
	big, small := random(2<<20), []byte("small")

	resp, err := a.sdk.SendObject(ctx, "s1", "out", "big", big, true)
	if err != nil || !resp.GetPersisted() || resp.GetRef() == "" {
		t.Fatalf("send big: %+v %v", resp, err)
	}
	bigRef := resp.GetRef()
	ev := <-a.events
	if ev.Ref != resp.GetRef() || ev.Inline != nil || ev.Bucket != "out" || ev.Key != "big" || ev.Session != "s1" || !ev.Persisted || ev.ProducerFunction != "f" {
		t.Errorf("object-ready event: %+v", ev)
	}
	if resp, err = a.sdk.SendObject(ctx, "s1", "out", "small", small, false); err != nil || resp.GetRef() != "" {
		t.Fatalf("send small: %+v %v", resp, err)
	}
	if ev := <-a.events; !bytes.Equal(ev.Inline, small) || ev.Ref != "" {
		t.Errorf("small object-ready event: %+v", ev)
	}
	for key, want := range map[string][]byte{"big": big, "small": small} {
		got, err := a.sdk.GetObject(ctx, "s1", "out", key)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("get_object %s: %d bytes, %v", key, len(got), err)
		}
	}
	// The consumer reads the big object by its reference any number of times.
	b := startPod(t, podOpts{})
	for i := 0; i < 3; i++ {
		if got, err := b.sdk.Get(ctx, bigRef); err != nil || !bytes.Equal(got, big) {
			t.Fatalf("read %d by reference: %v", i, err)
		}
	}

	// After the session is collected only the persisted object remains,
	// read back from S3.
	a.api.Store.DropSession("s1")
	rresp, err := a.sdk.RPC().GetObject(ctx, &sidecarv1.GetObjectRequest{Session: "s1", Bucket: "out", Key: "big"})
	if err != nil || rresp.GetSource() != "s3" {
		t.Fatalf("persisted object after GC: %+v %v", rresp, err)
	}
	if got, _ := a.sdk.Bytes(rresp.GetObject()); !bytes.Equal(got, big) {
		t.Fatal("persisted object differs")
	}
	_, err = a.sdk.GetObject(ctx, "s1", "out", "small")
	wantReason(t, "collected, not persisted", err, ReasonNotFound)

	noS3 := startPod(t, podOpts{})
	_, err = noS3.sdk.SendObject(ctx, "s1", "out", "k", small, true)
	wantReason(t, "persist without an S3 tier", err, ReasonBadPayload)
}

func TestInvokePassesTheObjectByReference(t *testing.T) {
	a := startPod(t, podOpts{})
	ctx := context.Background()
	// The callee pulls a referenced object as its sidecar would and answers
	// with the size and hash of what it received.
	var mu sync.Mutex
	var seen []invocation.Object
	callee := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		env, err := invocation.Decode(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		o := env.Objects[0]
		mu.Lock()
		seen = append(seen, o)
		mu.Unlock()
		data := o.Inline
		if o.Ref != "" {
			c := &pull.Client{Keys: keyring(t, "ns", "k1")}
			defer c.Close()
			if data, _, err = c.Pull(r.Context(), o.Ref); err != nil {
				http.Error(w, err.Error(), http.StatusFailedDependency)
				return
			}
		}
		sum := sha256.Sum256(data)
		fmt.Fprintf(w, "%d %s", len(data), hex.EncodeToString(sum[:]))
	}))
	defer callee.Close()

	for _, obj := range [][]byte{[]byte("inline please"), random(3 << 20)} {
		resp, err := a.sdk.Invoke(ctx, callee.URL, "callee", obj)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(obj)
		if want := fmt.Sprintf("%d %s", len(obj), hex.EncodeToString(sum[:])); resp.GetStatus() != 200 || string(resp.GetBody()) != want {
			t.Fatalf("invoke with %d bytes: %d %q", len(obj), resp.GetStatus(), resp.GetBody())
		}
	}
	if len(seen) != 2 || seen[0].Inline == nil || seen[0].Ref != "" || seen[1].Ref == "" || seen[1].Inline != nil {
		t.Errorf("small objects must travel inline, large ones by reference: %+v", seen)
	}
	waitFreed(t, a.api.Store)
	resp, err := a.sdk.Invoke(ctx, "http://127.0.0.1:1/unreachable", "x", []byte("y"))
	if err == nil {
		t.Fatalf("invoke of an unreachable URL: %+v", resp)
	}
}

// TestPayloadReadWaitsForRoom: while puts holding the store's cap in bytes
// wait, a further payload file is not read into memory; it stays in the
// shared-memory directory until there is room.
func TestPayloadReadWaitsForRoom(t *testing.T) {
	dir := t.TempDir()
	s := &Server{Dir: dir, MaxObjectBytes: 4 << 20, Store: store.New(4<<20, nil)}
	file := func(name string, n int) *sidecarv1.Payload {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, random(n), 0o600); err != nil {
			t.Fatal(err)
		}
		return pathPayload(path)
	}
	ctx := context.Background()
	first, releaseFirst, err := s.load(ctx, file("first", 3<<20))
	if err != nil || len(first) != 3<<20 {
		t.Fatalf("first: %d bytes, %v", len(first), err)
	}
	// The sidecar's own bound on the wait ends it: STORE_FULL.
	s.PutTimeout = 50 * time.Millisecond
	_, _, err = s.load(ctx, file("second", 2<<20))
	wantReason(t, "second payload while the first is unstored", toStatus(err), ReasonStoreFull)
	// The caller's deadline ends it first: a timeout, not STORE_FULL.
	s.PutTimeout = time.Minute
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, _, err = s.load(short, file("second", 2<<20))
	cancel()
	if code := status.Code(toStatus(err)); code != codes.DeadlineExceeded {
		t.Errorf("caller's deadline while waiting for room: %v (code %s), want DeadlineExceeded", err, code)
	}
	if _, err := os.Stat(filepath.Join(dir, "second")); err != nil {
		t.Fatalf("the waiting payload's file was consumed: %v", err)
	}
	releaseFirst()
	second, releaseSecond, err := s.load(ctx, pathPayload(filepath.Join(dir, "second")))
	if err != nil || len(second) != 2<<20 {
		t.Fatalf("second after room: %d bytes, %v", len(second), err)
	}
	releaseSecond()
	if left := entries(t, dir); len(left) != 0 {
		t.Errorf("files left: %v", left)
	}
}

// TestFullSharedMemoryIsStoreFull: a write that finds the pod's shared
// memory full (ENOSPC) is the STORE_FULL class the SDKs tell apart, not
// an internal error.
func TestFullSharedMemoryIsStoreFull(t *testing.T) {
	err := toStatus(&os.PathError{Op: "write", Path: "/dev/shm/ziptrail/objects/get-1", Err: syscall.ENOSPC})
	if r := Reason(err); r != ReasonStoreFull {
		t.Fatalf("reason %q (%v), want %s", r, err, ReasonStoreFull)
	}
}
