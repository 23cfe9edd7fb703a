package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/operator/orchestrator"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// clock is the orchestrator's injectable clock: real time plus an offset
// the test advances.
type clock struct{ off atomic.Int64 }

func (c *clock) now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *clock) advance(d time.Duration) { c.off.Add(int64(d)) }
func withClock(c *clock) func(*fixture, *orchestrator.Options) {
	return func(_ *fixture, o *orchestrator.Options) { o.Now = c.now }
}

// resultSession starts a session of a one-function workflow whose result
// is data, held by reference in the producer's pod, and waits for it to
// complete (without reading its result).
func resultSession(t *testing.T, f *fixture, token, wf string) string {
	t.Helper()
	resp, body := f.do(t, token, http.MethodPost, "/v1/namespaces/a/workflows/"+wf+"/sessions", strings.NewReader("go"))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("start: %d %s", resp.StatusCode, body)
	}
	var s sessions.Session
	_ = json.Unmarshal([]byte(body), &s)
	if _, err := f.orch.Sessions().Wait(context.Background(), s.ID); err != nil {
		t.Fatal(err)
	}
	return s.ID
}

// TestResultSurvivesABrokenRead: a client whose connection breaks in the
// middle of a result's body (it reads 64 KiB, then resets the connection)
// reads the whole result when it asks again. A 1 MB result fits in the
// sockets' buffers: the gateway wrote it all before the client went, so
// only the client's acknowledgement (or the grace) may free it. A 24 MiB
// one does not: the gateway's writes fail, and that read starts no grace
// either (the result is still there once the grace has passed).
func TestResultSurvivesABrokenRead(t *testing.T) {
	clk := &clock{}
	f := newFixture(t, withClock(clk))
	f.namespace(t, "a")
	token := f.serviceAccount(t, "a", "runner", "a")
	// A gateway server of its own, telling when a request's handler ended.
	ended := make(chan struct{}, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { ended <- struct{}{} }()
		f.h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	for _, c := range []struct {
		name      string
		size      int
		pastGrace bool
	}{{"1MB", 1_000_000, false}, {"24MiB", 24 << 20, true}} {
		t.Run(c.name, func(t *testing.T) {
			data := pattern(c.size)
			wf := "big-" + strings.ToLower(c.name)
			sc := f.sidecarFunction(t, "a", wf, func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
				return nil, ziptrail.SendObject(ctx, "output", "result", data, nil)
			})
			id := resultSession(t, f, token, wf)

			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(conn, "GET /v1/namespaces/a/sessions/%s/result HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n\r\n", id, token)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("result: %d", resp.StatusCode)
			}
			if _, err := io.ReadFull(resp.Body, make([]byte, 64<<10)); err != nil {
				t.Fatal(err)
			}
			_ = conn.(*net.TCPConn).SetLinger(0) // a reset, as a dying client's kernel sends
			_ = conn.Close()
			<-ended // the gateway is done with that request

			if c.pastGrace {
				// Past the grace a full read would have started (within
				// the hold of an unread result).
				clk.advance(6 * time.Minute)
				f.orch.ReleaseResults()
				if sc.Store.Len() == 0 {
					t.Fatal("the producer freed the result after a read that broke mid-body")
				}
			}
			resp2, body := f.do(t, token, http.MethodGet, "/v1/namespaces/a/sessions/"+id+"/result", nil)
			if resp2.StatusCode != http.StatusOK || len(body) != len(data) || body != string(data) {
				t.Fatalf("result read again after a broken read: %d, %d bytes, want 200 with all %d bytes: %.200s", resp2.StatusCode, len(body), len(data), body)
			}
		})
	}
}

// TestWaitSessionResultReadableAgain: WaitSession's inline result (held by
// reference, at most 1 MiB) stays readable after WaitSession returned it:
// by WaitSession again, ReadResult and the HTTP result.
func TestWaitSessionResultReadableAgain(t *testing.T) {
	f := newFixture(t, nil)
	f.namespace(t, "a")
	token := f.serviceAccount(t, "a", "runner", "a")
	big := pattern(1_000_000)
	f.sidecarFunction(t, "a", "big", func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		return nil, ziptrail.SendObject(ctx, "output", "result", big, nil)
	})
	ctx := withToken(context.Background(), token)
	gs, err := f.gw.StartSession(ctx, &gatewayv1.StartSessionRequest{Namespace: "a", Workflow: "big", Input: []byte("go")})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		r, err := f.gw.WaitSession(ctx, &gatewayv1.WaitSessionRequest{Namespace: "a", Id: gs.Id, TimeoutMs: 60_000})
		if err != nil || string(r.Result) != string(big) {
			t.Fatalf("WaitSession #%d: %d bytes, %v; want the %d-byte result", i+1, len(r.GetResult()), err, len(big))
		}
	}
	if _, n, err := readResult(ctx, f.gw, "a", gs.Id); err != nil || n != int64(len(big)) {
		t.Fatalf("ReadResult after WaitSession: %d bytes, %v", n, err)
	}
	resp, body := f.do(t, token, http.MethodGet, "/v1/namespaces/a/sessions/"+gs.Id+"/result", nil)
	if resp.StatusCode != http.StatusOK || body != string(big) {
		t.Fatalf("HTTP result after WaitSession: %d, %d bytes: %.200s", resp.StatusCode, len(body), body)
	}
}

// TestResultFreedOnAckOrGrace: a result read whole stays readable until
// the client acknowledges it (HTTP DELETE …/result, gRPC AckResult), which
// frees the session's objects at once, or until the grace after its
// first full read passes (the orchestrator's clock, advanced here).
func TestResultFreedOnAckOrGrace(t *testing.T) {
	clk := &clock{}
	f := newFixture(t, withClock(clk))
	f.namespace(t, "a")
	token := f.serviceAccount(t, "a", "runner", "a")
	big := pattern(1_000_000)
	sc := f.sidecarFunction(t, "a", "big", func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		return nil, ziptrail.SendObject(ctx, "output", "result", big, nil)
	})
	read := func(t *testing.T, id string) {
		t.Helper()
		resp, body := f.do(t, token, http.MethodGet, "/v1/namespaces/a/sessions/"+id+"/result", nil)
		if resp.StatusCode != http.StatusOK || body != string(big) {
			t.Fatalf("result: %d, %d bytes, want 200 with the %d-byte result: %.200s", resp.StatusCode, len(body), len(big), body)
		}
	}
	gone := func(t *testing.T, id string) {
		t.Helper()
		waitFor(t, "the producer to free the result", func() bool { f.orch.ReleaseResults(); return sc.Store.Len() == 0 })
		resp, body := f.do(t, token, http.MethodGet, "/v1/namespaces/a/sessions/"+id+"/result", nil)
		if resp.StatusCode != http.StatusGone || !strings.Contains(body, "no longer available") {
			t.Fatalf("result read after it was freed: %d %s, want 410", resp.StatusCode, body)
		}
	}

	t.Run("http ack", func(t *testing.T) {
		id := resultSession(t, f, token, "big")
		read(t, id)
		read(t, id) // read whole, it stays until acknowledged
		resp, body := f.do(t, token, http.MethodDelete, "/v1/namespaces/a/sessions/"+id+"/result", nil)
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("ack: %d %s, want 204", resp.StatusCode, body)
		}
		gone(t, id)
		// An acknowledgement is idempotent.
		if resp, body := f.do(t, token, http.MethodDelete, "/v1/namespaces/a/sessions/"+id+"/result", nil); resp.StatusCode != http.StatusNoContent {
			t.Fatalf("second ack: %d %s, want 204", resp.StatusCode, body)
		}
	})
	t.Run("grpc ack", func(t *testing.T) {
		id := resultSession(t, f, token, "big")
		ctx := withToken(context.Background(), token)
		r, err := f.gw.WaitSession(ctx, &gatewayv1.WaitSessionRequest{Namespace: "a", Id: id, TimeoutMs: 1000})
		if err != nil || string(r.Result) != string(big) {
			t.Fatalf("WaitSession: %d bytes, %v", len(r.GetResult()), err)
		}
		if _, err := f.gw.AckResult(ctx, &gatewayv1.AckResultRequest{Namespace: "a", Id: id}); err != nil {
			t.Fatalf("AckResult: %v", err)
		}
		gone(t, id)
	})
	t.Run("grace", func(t *testing.T) {
		id := resultSession(t, f, token, "big")
		read(t, id)
		clk.advance(4 * time.Minute)
		f.orch.ReleaseResults()
		read(t, id) // within the grace of 5m after the first full read
		clk.advance(time.Minute + time.Second)
		gone(t, id)
	})
	t.Run("unread", func(t *testing.T) {
		// Unread, a result is freed after the hold (10m), as before.
		id := resultSession(t, f, token, "big")
		clk.advance(9 * time.Minute)
		f.orch.ReleaseResults()
		if sc.Store.Len() == 0 {
			t.Fatal("an unread result was freed before its hold passed")
		}
		clk.advance(time.Minute + time.Second)
		gone(t, id)
	})
}

// TestStartIdempotencyKey: starts carrying the same Idempotency-Key (HTTP
// header, gRPC metadata) answer the same session, however many arrive at
// once; another key, or none, starts another session.
func TestStartIdempotencyKey(t *testing.T) {
	f := newFixture(t, nil)
	f.namespace(t, "a")
	token := f.serviceAccount(t, "a", "runner", "a")
	var runs atomic.Int32
	f.workflow(t, "a", "count", ziptrail.FunctionHandler(func(_ context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		runs.Add(1)
		return []byte("ok"), nil
	}))
	start := func(key string) string {
		h := http.Header{}
		if key != "" {
			h.Set("Idempotency-Key", key)
		}
		resp, body := f.doHeader(t, token, http.MethodPost, "/v1/namespaces/a/workflows/count/sessions", strings.NewReader("go"), h)
		if resp.StatusCode != http.StatusCreated {
			t.Errorf("start with key %q: %d %s", key, resp.StatusCode, body)
			return ""
		}
		var s sessions.Session
		_ = json.Unmarshal([]byte(body), &s)
		return s.ID
	}
	ids := make(chan string, 8)
	for range 8 {
		go func() { ids <- start("k-1") }()
	}
	first := <-ids
	for range 7 {
		if id := <-ids; id != first {
			t.Fatalf("starts with one key answered sessions %s and %s", first, id)
		}
	}
	ctx := metadata.AppendToOutgoingContext(withToken(context.Background(), token), "idempotency-key", "k-1")
	gs, err := f.gw.StartSession(ctx, &gatewayv1.StartSessionRequest{Namespace: "a", Workflow: "count", Input: []byte("go")})
	if err != nil || gs.Id != first {
		t.Fatalf("gRPC start with the same key: %v, %v; want session %s", gs.GetId(), err, first)
	}
	if other := start("k-2"); other == first || other == "" {
		t.Fatalf("another key answered session %q", other)
	}
	if none := start(""); none == first || none == "" {
		t.Fatalf("no key answered session %q", none)
	}
	if _, err := f.orch.Sessions().Wait(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	resp, body := f.doHeader(t, token, http.MethodPost, "/v1/namespaces/a/workflows/count/sessions", strings.NewReader("go"), http.Header{"Idempotency-Key": {"bad key"}})
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a key with a space: %d %s, want 400", resp.StatusCode, body)
	}
	list := f.orch.Sessions().List("a", "count")
	if len(list) != 3 {
		t.Errorf("%d sessions, want 3 (one per key and one without)", len(list))
	}
}
