package ziptrail

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

// The function server's own idempotency records (docs/guarantees.md): a
// delivery whose key the pod's sidecar put in the envelope runs the
// handler at most once per function process, whatever happened to the
// sidecar that delivered it.

// recordingFunction is a function whose every run is its side effect (kept
// in keys) and whose answer says which run made it.
type recordingFunction struct {
	mu      sync.Mutex
	keys    []string
	started chan string   // each run, as it starts
	release chan struct{} // closed: "block" runs go on
}

func newRecordingFunction() *recordingFunction {
	return &recordingFunction{started: make(chan string, 64), release: make(chan struct{})}
}

func (f *recordingFunction) handle(ctx context.Context, inv *Invocation) ([]byte, error) {
	f.mu.Lock()
	f.keys = append(f.keys, inv.IdempotencyKey)
	n := len(f.keys)
	f.mu.Unlock()
	f.started <- inv.IdempotencyKey
	switch string(inv.Args) {
	case "block":
		<-f.release
		if err := ctx.Err(); err != nil { // the caller went away: the run must still answer
			return nil, fmt.Errorf("run %d: %w", n, err)
		}
	case "fail":
		return nil, fmt.Errorf("failed in run %d", n)
	case "input":
		return inv.Objects[0].Bytes(), nil // the mapped input itself, unmapped after the call
	case "plain":
		return fmt.Appendf(nil, "run %d of %s", n, inv.IdempotencyKey), nil
	}
	if err := SendObject(ctx, "out", "o", fmt.Appendf(nil, "sent by run %d", n), map[string]string{"run": strconv.Itoa(n)}); err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, "run %d of %s", n, inv.IdempotencyKey), nil
}

func (f *recordingFunction) ran() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.keys)
}

// keyed is an envelope as the pod's sidecar hands it to the function:
// with its idempotency key.
func keyed(id string, attempt int, args string) invocation.Envelope {
	env := invocation.Envelope{Namespace: "ns", Function: "f", Session: "s", Invocation: id, Attempt: attempt, Args: []byte(args)}
	env.IdempotencyKey = env.Key()
	return env
}

type answer struct {
	code   int
	header http.Header
	body   []byte
}

func (a answer) same(b answer) bool {
	return a.code == b.code && a.header.Get("Content-Type") == b.header.Get("Content-Type") && bytes.Equal(a.body, b.body)
}

func (a answer) String() string {
	return fmt.Sprintf("%d %v %q", a.code, a.header, a.body)
}

// deliver sends env as a POST (or method) and returns the answer, or the
// error (a caller whose sidecar died).
func deliver(method, url string, env invocation.Envelope, header http.Header) (answer, error) {
	data, _ := json.Marshal(env)
	req, err := http.NewRequest(method, url, bytes.NewReader(data))
	if err != nil {
		return answer{}, err
	}
	maps.Copy(req.Header, header)
	req.Header.Set("Content-Type", invocation.ContentType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, body}, err
}

func mustDeliver(t *testing.T, url string, env invocation.Envelope) answer {
	t.Helper()
	a, err := deliver(http.MethodPost, url, env, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// outputsOf is an answer's return value and objects (bucket/key=data).
func outputsOf(t *testing.T, a answer) (string, []string) {
	t.Helper()
	if a.code != 200 || a.header.Get("Content-Type") != invocation.OutputsContentType {
		t.Fatalf("answer %v, want 200 with outputs", a)
	}
	outs, err := invocation.DecodeOutputs(a.body)
	if err != nil {
		t.Fatal(err)
	}
	var objs []string
	for _, o := range outs.Objects {
		objs = append(objs, o.Bucket+"/"+o.Key+"="+string(o.Inline))
	}
	return string(outs.Return), objs
}

func TestFunctionRecordsRunAKeyOnce(t *testing.T) {
	f := newRecordingFunction()
	srv := httptest.NewServer(FunctionHandler(f.handle))
	defer srv.Close()

	first, second := mustDeliver(t, srv.URL, keyed("s.1", 0, "")), mustDeliver(t, srv.URL, keyed("s.1", 0, ""))
	if ret, objs := outputsOf(t, first); ret != "run 1 of s/s.1/0" || !slices.Equal(objs, []string{"out/o=sent by run 1"}) {
		t.Fatalf("first answer %q %q", ret, objs)
	}
	if !first.same(second) || first.header.Get(invocation.HeaderReplayed) != "" || second.header.Get(invocation.HeaderReplayed) != "1" {
		t.Fatalf("a second delivery of the key:\n%v\nafter\n%v", second, first)
	}
	// A plain answer and a failure are replayed the same way.
	for _, args := range []string{"plain", "fail"} {
		a, b := mustDeliver(t, srv.URL, keyed("s."+args, 0, args)), mustDeliver(t, srv.URL, keyed("s."+args, 0, args))
		if !a.same(b) || b.header.Get(invocation.HeaderReplayed) != "1" {
			t.Fatalf("%s: %v, then %v", args, a, b)
		}
	}
	// Another attempt is another key: it runs.
	mustDeliver(t, srv.URL, keyed("s.1", 1, ""))
	// Without the sidecar's key in the envelope (a request straight to the
	// function's port) nothing is recorded, even with the dispatcher's
	// header; nor is a request that is not an invocation (a POST).
	noKey := keyed("s.9", 0, "plain")
	noKey.IdempotencyKey = ""
	for range 2 {
		if a, err := deliver(http.MethodPost, srv.URL, noKey, http.Header{invocation.HeaderIdempotencyKey: {"s/s.9/0"}}); err != nil || a.code != 200 || a.header.Get(invocation.HeaderReplayed) != "" {
			t.Fatalf("without a key: %v %v", a, err)
		}
		if a, err := deliver(http.MethodPut, srv.URL, keyed("s.10", 0, "plain"), nil); err != nil || a.code != 200 || a.header.Get(invocation.HeaderReplayed) != "" {
			t.Fatalf("a PUT: %v %v", a, err)
		}
	}
	want := []string{"s/s.1/0", "s/s.plain/0", "s/s.fail/0", "s/s.1/1", "s/s.9/0", "s/s.10/0", "s/s.9/0", "s/s.10/0"}
	if got := f.ran(); !slices.Equal(got, want) {
		t.Fatalf("runs %q, want %q", got, want)
	}
}

func TestFunctionRecordsConcurrentDeliveriesRunOnce(t *testing.T) {
	f := newRecordingFunction()
	arrived := make(chan struct{}, 2)
	fh := FunctionHandler(f.handle)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		fh.ServeHTTP(w, r)
	}))
	defer srv.Close()

	answers := make([]answer, 2)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			var err error
			if answers[i], err = deliver(http.MethodPost, srv.URL, keyed("s.1", 0, "block"), nil); err != nil {
				t.Error(err)
			}
		})
		<-arrived
		if i == 0 {
			<-f.started
		}
	}
	time.Sleep(100 * time.Millisecond) // the second one waits for the first (TestFunctionRecordsBounds sees it wait)
	close(f.release)
	wg.Wait()
	if !answers[0].same(answers[1]) || answers[0].code != 200 {
		t.Fatalf("answers\n%v\n%v", answers[0], answers[1])
	}
	if got := f.ran(); !slices.Equal(got, []string{"s/s.1/0"}) {
		t.Fatalf("runs %q", got)
	}
}

// TestFunctionRecordsReplayNeedsNoInputs: the handler answers with its
// mapped input, which is unmapped after the call and whose file the
// sidecar removes once the answer passed. The record is a copy: a replay
// needs neither (and the resend's inputs are not opened at all).
func TestFunctionRecordsReplayNeedsNoInputs(t *testing.T) {
	shm := functionShm(t)
	if err := os.MkdirAll(shm, 0o755); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<14) // 256 KiB: mapped
	name := invocation.NewInputName()
	if err := os.WriteFile(filepath.Join(shm, name), data, 0o600); err != nil {
		t.Fatal(err)
	}
	f := newRecordingFunction()
	srv := httptest.NewServer(FunctionHandler(f.handle))
	defer srv.Close()
	env := keyed("s.1", 0, "input")
	env.Objects = []invocation.Object{{Bucket: "b", Key: "k", Size: int64(len(data)), Path: name}}
	first := mustDeliver(t, srv.URL, env)
	if first.code != 200 || !bytes.Equal(first.body, data) {
		t.Fatalf("first answer %d, %d bytes", first.code, len(first.body))
	}
	if err := os.Remove(filepath.Join(shm, name)); err != nil {
		t.Fatal(err)
	}
	env.Objects[0].Path = invocation.NewInputName() // the resend's inputs: not there
	if again := mustDeliver(t, srv.URL, env); !first.same(again) || again.header.Get(invocation.HeaderReplayed) != "1" {
		t.Fatalf("replay %d %v, %d bytes", again.code, again.header, len(again.body))
	}
	// A path the sidecar cannot have given is refused all the same.
	env.Objects[0].Path = "../objects/" + name
	if a := mustDeliver(t, srv.URL, env); a.code != 400 || !bytes.Contains(a.body, []byte("not a name the pod's sidecar gives")) {
		t.Fatalf("a foreign path with a recorded key: %v", a)
	}
	if got := f.ran(); len(got) != 1 {
		t.Fatalf("runs %q", got)
	}
}

// TestFunctionRecordsSidecarKilledMidCall is the chaos checker's
// kill-queue-proxy: the sidecar dies (SIGKILL) while the handler runs; the
// handler finishes (its effect happens), its answer is lost with the
// sidecar; the dispatcher resends the key to the sidecar restarted on the
// same ports, which has no record and forwards it. The function runs it
// once, and the resend gets the first run's answer.
func TestFunctionRecordsSidecarKilledMidCall(t *testing.T) {
	shm := functionShm(t)
	keys := keyFile(t, "k1", 1)
	f := newRecordingFunction()
	fn := httptest.NewServer(FunctionHandler(f.handle))
	defer fn.Close()
	sc := startSidecar(t, sidecarOpts{keys: keys, upstream: fn.URL, shm: shm})

	env := keyed("s.1", 0, "block")
	lost := make(chan error, 1)
	go func() {
		_, err := deliver(http.MethodPost, sc.url(), env, nil)
		lost <- err
	}()
	<-f.started
	sc.kill()
	if err := <-lost; err == nil {
		t.Fatal("the call answered although its sidecar was killed")
	}
	sc = startSidecar(t, sidecarOpts{keys: keys, upstream: fn.URL, shm: shm, in: sc})

	// The resend while the first run still goes on: it waits for it.
	resent := make(chan answer, 1)
	go func() {
		a, err := deliver(http.MethodPost, sc.url(), env, nil)
		if err != nil {
			t.Error(err)
		}
		resent <- a
	}()
	time.Sleep(300 * time.Millisecond)
	close(f.release)
	a := <-resent
	ret, objs := outputsOf(t, a)
	if ret != "run 1 of s/s.1/0" || !slices.Equal(objs, []string{"out/o=sent by run 1"}) || a.header.Get(invocation.HeaderIdempotencyKey) != "s/s.1/0" {
		t.Fatalf("the resend got %v", a)
	}
	// Once it finished: a sidecar restarted again has no record either.
	sc.kill()
	sc = startSidecar(t, sidecarOpts{keys: keys, upstream: fn.URL, shm: shm, in: sc})
	again := mustDeliver(t, sc.url(), env)
	if r2, o2 := outputsOf(t, again); r2 != ret || !slices.Equal(o2, objs) || again.header.Get(invocation.HeaderReplayed) != "1" {
		t.Fatalf("the second resend got %v", again)
	}
	if got := f.ran(); !slices.Equal(got, []string{"s/s.1/0"}) {
		t.Fatalf("the handler ran %q: twice for one key", got)
	}
}

// hostAddr is an address of this host other than loopback, where a
// listener on all interfaces is reached as from another pod.
func hostAddr(t *testing.T) netip.Addr {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if p, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(p.IP); ok && ip.Unmap().Is4() && !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
				return ip.Unmap()
			}
		}
	}
	t.Fatal("this host has no IPv4 address but loopback: the test needs one to come from outside the pod")
	return netip.Addr{}
}

// TestFunctionRecordsAnswerOnlyThePodsSidecar: the function's port is
// reachable from any pod of the cluster at the pod's IP. A caller there
// that forges another invocation's idempotency key (its format is
// public) must not read that invocation's recorded answer: only requests
// over the loopback interface, the pod's sidecar, use the records. One
// from elsewhere runs the handler, and records nothing either.
func TestFunctionRecordsAnswerOnlyThePodsSidecar(t *testing.T) {
	f := newRecordingFunction()
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(FunctionHandler(f.handle))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	defer srv.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	sidecar := fmt.Sprintf("http://127.0.0.1:%d", port)
	outside := "http://" + netip.AddrPortFrom(hostAddr(t), uint16(port)).String()

	secret := mustDeliver(t, sidecar, keyed("s.1", 0, "plain"))
	forged := mustDeliver(t, outside, keyed("s.1", 0, "plain"))
	if forged.header.Get(invocation.HeaderReplayed) != "" || forged.same(secret) {
		t.Fatalf("a forged key from outside the pod read the recorded answer:\n%v\n(recorded: %v)", forged, secret)
	}
	// Nor did it record anything: a key first seen from outside runs
	// again through the sidecar.
	mustDeliver(t, outside, keyed("s.2", 0, "plain"))
	if a := mustDeliver(t, sidecar, keyed("s.2", 0, "plain")); a.header.Get(invocation.HeaderReplayed) != "" {
		t.Fatalf("a run from outside the pod was recorded: %v", a)
	}
	// The sidecar's deliveries still replay.
	if a := mustDeliver(t, sidecar, keyed("s.1", 0, "plain")); !a.same(secret) || a.header.Get(invocation.HeaderReplayed) != "1" {
		t.Fatalf("the sidecar's resend: %v, want the record %v", a, secret)
	}
	if got, want := f.ran(), []string{"s/s.1/0", "s/s.1/0", "s/s.2/0", "s/s.2/0"}; !slices.Equal(got, want) {
		t.Fatalf("runs %q, want %q", got, want)
	}
}
