package gateway_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"math"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onsi/gomega"

	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// pattern is n deterministic bytes.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>11)
	}
	return b
}

// TestResultByReference: a function's 1 MB result stays in its pod (the
// sidecar turns it into a reference) and the gateway streams it to the
// client over HTTP and gRPC, pulled from the producer's sidecar; the
// session's objects stay until the result has been acknowledged, then are
// freed.
func TestResultByReference(t *testing.T) {
	f := newFixture(t, nil)
	f.namespace(t, "a")
	token := f.serviceAccount(t, "a", "runner", "a")
	big := pattern(1_000_000)
	sc := f.sidecarFunction(t, "a", "big", func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		return nil, ziptrail.SendObject(ctx, "output", "result", big, nil)
	})

	// HTTP: the result arrives whole, with its length announced.
	resp, body := f.do(t, token, http.MethodPost, "/v1/namespaces/a/workflows/big/sessions", strings.NewReader("go"))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("start: %d %s", resp.StatusCode, body)
	}
	var s sessions.Session
	_ = json.Unmarshal([]byte(body), &s)
	resp, body = f.do(t, token, http.MethodGet, "/v1/namespaces/a/sessions/"+s.ID+"/result?wait=1m", nil)
	if resp.StatusCode != http.StatusOK || body != string(big) || resp.ContentLength != int64(len(big)) {
		t.Fatalf("result: %d, %d bytes (Content-Length %d), want 200 with the %d-byte result: %.300s", resp.StatusCode, len(body), resp.ContentLength, len(big), body)
	}
	// Read whole and acknowledged, the session's objects are freed in the
	// producer's pod.
	if resp, body := f.do(t, token, http.MethodDelete, "/v1/namespaces/a/sessions/"+s.ID+"/result", nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("ack: %d %s", resp.StatusCode, body)
	}
	waitFor(t, "the producer to free the acknowledged result", func() bool { return sc.Store.Len() == 0 })
	resp, body = f.do(t, token, http.MethodGet, "/v1/namespaces/a/sessions/"+s.ID+"/result", nil)
	if resp.StatusCode != http.StatusGone || !strings.Contains(body, "no longer available") {
		t.Errorf("result read a second time: %d %s, want 410", resp.StatusCode, body)
	}

	// gRPC: ReadResult streams it.
	ctx := withToken(context.Background(), token)
	gs, err := f.gw.StartSession(ctx, &gatewayv1.StartSessionRequest{Namespace: "a", Workflow: "big", Input: []byte("go")})
	if err != nil {
		t.Fatal(err)
	}
	watch, err := f.gw.WatchSession(ctx, &gatewayv1.SessionRef{Namespace: "a", Id: gs.Id})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := watch.Recv(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if sum, n, err := readResult(ctx, f.gw, "a", gs.Id); err != nil || n != int64(len(big)) || sum != sha256.Sum256(big) {
		t.Fatalf("gRPC ReadResult: %d bytes, %v", n, err)
	}
	// WaitSession returns a result this small in its answer (read again
	// from the pod: a fresh session).
	gs, err = f.gw.StartSession(ctx, &gatewayv1.StartSessionRequest{Namespace: "a", Workflow: "big", Input: []byte("go")})
	if err != nil {
		t.Fatal(err)
	}
	r, err := f.gw.WaitSession(ctx, &gatewayv1.WaitSessionRequest{Namespace: "a", Id: gs.Id, TimeoutMs: 60_000})
	if err != nil || string(r.Result) != string(big) || r.ResultStreamed || r.Session.ResultSize != int64(len(big)) {
		t.Fatalf("gRPC WaitSession: %d bytes, streamed %v, %v", len(r.GetResult()), r.GetResultStreamed(), err)
	}
}

// readResult drains ReadResult, hashing as it goes.
func readResult(ctx context.Context, gw gatewayv1.GatewayClient, ns, id string) ([32]byte, int64, error) {
	st, err := gw.ReadResult(ctx, &gatewayv1.SessionRef{Namespace: ns, Id: id})
	if err != nil {
		return [32]byte{}, 0, err
	}
	h := sha256.New()
	var n int64
	for {
		c, err := st.Recv()
		if err == io.EOF {
			var sum [32]byte
			copy(sum[:], h.Sum(nil))
			return sum, n, nil
		}
		if err != nil {
			return [32]byte{}, n, err
		}
		h.Write(c.Data)
		n += int64(len(c.Data))
	}
}

// TestResult1GiBStreams: a 1 GiB result held by reference in a producer's
// data plane (the sidecar's server and store, here in this process) goes
// through the gateway over HTTP and over gRPC while the gateway's side
// stays far below the result's size: it is streamed, never held whole.
func TestResult1GiBStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 1 GiB twice")
	}
	const size = 1 << 30
	f := newFixture(t, nil)
	f.namespace(t, "a")
	token := f.serviceAccount(t, "a", "runner", "a")
	ctx := context.Background()

	// The producer: a data-plane server holding the result, sealed with
	// namespace a's keys as its sidecar would.
	keys, err := f.keys.Keys(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string][]byte{}
	for _, k := range keys.Keys {
		secrets[k.Id] = k.Secret
	}
	kr, err := ref.NewKeyring("a", secrets, keys.ActiveKeyId)
	if err != nil {
		t.Fatal(err)
	}
	data := pattern(size)
	want := sha256.Sum256(data)
	st := store.New(size+1, nil)
	if err := st.Put(ctx, store.Meta{ID: "s1/output/result", Session: "s1", Bucket: "output", Key: "result", Reads: math.MaxUint32, Expires: time.Now().Add(time.Hour)}, data); err != nil {
		t.Fatal(err)
	}
	data = nil
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &pull.Server{Store: st, Keys: kr}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	rf, err := kr.Seal(ref.Record{Addr: ln.Addr().String(), Key: "s1/output/result", Expires: time.Now().Add(time.Hour), Reads: math.MaxUint32})
	if err != nil {
		t.Fatal(err)
	}
	// A completed session of a workflow of a, whose result is that object.
	reg := f.orch.Sessions()
	if err := reg.Start("huge-1", "a", "huge"); err != nil {
		t.Fatal(err)
	}
	if err := reg.Finish("huge-1", sessions.Completed, &sessions.Result{Bucket: "output", Key: "result", Size: size, Ref: rf}, ""); err != nil {
		t.Fatal(err)
	}

	t.Run("http", func(t *testing.T) {
		peak := watchHeap(t)
		req, _ := http.NewRequest(http.MethodGet, f.url+"/v1/namespaces/a/sessions/huge-1/result", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		h := sha256.New()
		n, err := io.Copy(h, resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK || n != size || [32]byte(h.Sum(nil)) != want {
			t.Fatalf("HTTP result: %d, %d bytes, %v", resp.StatusCode, n, err)
		}
		peak.check(t, "HTTP")
	})
	t.Run("grpc", func(t *testing.T) {
		peak := watchHeap(t)
		sum, n, err := readResult(withToken(ctx, token), f.gw, "a", "huge-1")
		if err != nil || n != size || sum != want {
			t.Fatalf("gRPC ReadResult: %d bytes, %v", n, err)
		}
		r, err := f.gw.WaitSession(withToken(ctx, token), &gatewayv1.WaitSessionRequest{Namespace: "a", Id: "huge-1", TimeoutMs: 1000})
		if err != nil || !r.ResultStreamed || len(r.Result) != 0 || r.Session.ResultSize != size {
			t.Errorf("WaitSession of a 1 GiB result: %v (streamed %v, %d bytes inline)", err, r.GetResultStreamed(), len(r.GetResult()))
		}
		peak.check(t, "gRPC")
	})
}

// heapWatch records the largest heap in use while a transfer runs.
type heapWatch struct {
	base uint64
	mu   sync.Mutex
	max  uint64
	stop chan struct{}
	done chan struct{}
}

// watchHeap samples the heap in use every 20ms until check. The producer's
// 1 GiB lives in this process too, and with it the default GC target lets
// up to another GiB of garbage pile up before a collection: the collector
// runs at 5% growth meanwhile, so what the heap holds is what is retained.
func watchHeap(t *testing.T) *heapWatch {
	old := debug.SetGCPercent(5)
	t.Cleanup(func() { debug.SetGCPercent(old) })
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	w := &heapWatch{base: m.HeapInuse, max: m.HeapInuse, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			w.mu.Lock()
			w.max = max(w.max, m.HeapInuse)
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		select {
		case <-w.stop:
		default:
			close(w.stop)
		}
	})
	return w
}

// check fails unless the heap grew by well under the 1 GiB moved.
func (w *heapWatch) check(t *testing.T, what string) {
	close(w.stop)
	<-w.done
	grew := int64(w.max) - int64(w.base)
	t.Logf("%s: heap in use grew by at most %.1f MiB while streaming 1 GiB", what, float64(grew)/(1<<20))
	if grew > 256<<20 {
		t.Errorf("%s: the heap grew by %d MiB while streaming a 1 GiB result: it is being buffered", what, grew>>20)
	}
}

// waitFor polls cond (every 20ms, for up to a minute).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	gomega.NewWithT(t).Eventually(cond).WithTimeout(time.Minute).WithPolling(20*time.Millisecond).Should(gomega.BeTrue(), what)
}
