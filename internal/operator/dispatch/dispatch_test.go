package dispatch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/invocation/call"
)

// staticResolver maps every service to one base URL.
type staticResolver struct{ base string }

func (s staticResolver) URL(_ context.Context, ns, svc string) (*url.URL, error) {
	return url.Parse(strings.ReplaceAll(strings.ReplaceAll(s.base, "{ns}", ns), "{svc}", svc))
}

func envelope(i int) *invocation.Envelope {
	return &invocation.Envelope{Namespace: "ns", Function: "f", Session: "s", Invocation: fmt.Sprint(i),
		Objects: []invocation.Object{{Bucket: "b", Key: "k", Ref: "zt1.x"}}}
}

// run dispatches n envelopes and returns their results.
func run(t *testing.T, opts Options, n int) []Result {
	t.Helper()
	var mu sync.Mutex
	var results []Result
	done := make(chan struct{}, n)
	opts.OnResult = func(r Result) {
		mu.Lock()
		results = append(results, r)
		mu.Unlock()
		done <- struct{}{}
	}
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.Start(ctx)
	for i := 0; i < n; i++ {
		if err := d.Submit(envelope(i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d of %d results", i, n)
		}
	}
	cancel()
	d.Wait()
	return results
}

func TestDeliversEnvelopeAndHeaders(t *testing.T) {
	var got *invocation.Envelope
	var hdr http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hdr = r.Header.Clone()
		env, err := invocation.Decode(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		got = env
		fmt.Fprint(w, "ok")
	}))
	defer srv.Close()
	res := run(t, Options{Resolver: staticResolver{srv.URL}}, 1)
	if res[0].Err != nil || string(res[0].Body) != "ok" || res[0].Tries != 1 {
		t.Fatalf("result %+v", res[0])
	}
	if got.Objects[0].Ref != "zt1.x" || hdr.Get(invocation.HeaderSession) != "s" || hdr.Get(invocation.HeaderRefs) != "zt1.x" ||
		hdr.Get("Content-Type") != invocation.ContentType {
		t.Errorf("envelope %+v headers %v", got, hdr)
	}
}

// The producer node Options.ProducerNode names travels in
// Ziptrail-Producer-Node, on every try; without one (no ProducerNode, an
// unknown producer, a value no header can carry) the header is absent.
func TestProducerNodeHeader(t *testing.T) {
	for _, tc := range []struct {
		name string
		fn   func(*invocation.Envelope) string
		want []string
	}{
		{"named", func(env *invocation.Envelope) string {
			if env.Namespace != "ns" || len(env.Objects) != 1 || env.Objects[0].Ref != "zt1.x" {
				return "wrong-envelope"
			}
			return "node-7"
		}, []string{"node-7"}},
		{"unknown producer", func(*invocation.Envelope) string { return "" }, nil},
		{"no ProducerNode", nil, nil},
		{"not a header value", func(*invocation.Envelope) string { return "node\r\nX-Evil: 1" }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			var mu sync.Mutex
			var got [][]string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				got = append(got, r.Header.Values(invocation.HeaderProducerNode))
				mu.Unlock()
				if calls.Add(1) == 1 {
					http.Error(w, "starting", http.StatusServiceUnavailable) // retried: the header again
					return
				}
				fmt.Fprint(w, "ok")
			}))
			defer srv.Close()
			res := run(t, Options{Resolver: staticResolver{srv.URL}, BaseBackoff: time.Millisecond, ProducerNode: tc.fn}, 1)
			if res[0].Err != nil || res[0].Tries != 2 {
				t.Fatalf("result %+v", res[0])
			}
			mu.Lock()
			defer mu.Unlock()
			for i, h := range got {
				if fmt.Sprint(h) != fmt.Sprint(tc.want) {
					t.Errorf("try %d: %s %q, want %q", i+1, invocation.HeaderProducerNode, h, tc.want)
				}
			}
		})
	}
}

func TestRetriesTransientFailuresOnly(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get(invocation.HeaderInvocation) {
		case "0": // cold start: 503 twice, then served
			if calls.Add(1) <= 2 {
				http.Error(w, "activating", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprint(w, "warm")
		default: // the function itself fails: not the dispatcher's to retry
			http.Error(w, "boom", http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	res := run(t, Options{Resolver: staticResolver{srv.URL}, BaseBackoff: time.Millisecond}, 2)
	for _, r := range res {
		switch r.Envelope.Invocation {
		case "0":
			if r.Err != nil || r.Tries != 3 || string(r.Body) != "warm" {
				t.Errorf("transient: %+v", r)
			}
		case "1":
			if r.Err == nil || r.Tries != 1 || r.Status != 500 || !strings.Contains(r.Err.Error(), "boom") {
				t.Errorf("function error: %+v", r)
			}
		}
	}
}

// listenOnRetry is a resolver whose second call starts the server: so the
// first try finds nothing listening and only a retry can succeed.
type listenOnRetry struct {
	addr  string
	calls atomic.Int32
	srv   *http.Server
}

func (l *listenOnRetry) URL(context.Context, string, string) (*url.URL, error) {
	if l.calls.Add(1) == 2 {
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			return nil, err
		}
		l.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "up") })}
		go l.srv.Serve(ln)
	}
	return url.Parse("http://" + l.addr)
}

func TestRetriesUntilTheServerListens(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &listenOnRetry{addr: ln.Addr().String()}
	ln.Close() // nothing listens yet: connection refused
	res := run(t, Options{Resolver: r, BaseBackoff: time.Millisecond}, 1)
	if r.srv != nil {
		defer r.srv.Close()
	}
	if res[0].Err != nil || res[0].Tries != 2 || string(res[0].Body) != "up" {
		t.Fatalf("%+v", res[0])
	}
}

func TestBoundsConcurrency(t *testing.T) {
	var cur, peak atomic.Int32
	arrived := make(chan struct{}, 100)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := cur.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		arrived <- struct{}{}
		<-release
		cur.Add(-1)
	}))
	defer srv.Close()
	go func() {
		// Hold the first three requests until all three are in flight, so
		// a fourth would be visible if the bound were not enforced.
		for i := 0; i < 3; i++ {
			<-arrived
		}
		close(release)
	}()
	run(t, Options{Resolver: staticResolver{srv.URL}, Concurrency: 3}, 12)
	if p := peak.Load(); p != 3 {
		t.Errorf("peak concurrency %d, want 3", p)
	}
}

func TestIngressRoutesByHost(t *testing.T) {
	var host string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { host = r.Host }))
	defer srv.Close()
	ingress := strings.TrimPrefix(srv.URL, "http://")
	res := run(t, Options{Resolver: staticResolver{"http://{svc}.{ns}.ziptrail.local"}, Ingress: ingress}, 1)
	if res[0].Err != nil || host != "f.ns.ziptrail.local" {
		t.Errorf("host %q result %+v", host, res[0])
	}
}

func TestSubmitRejectsInvalidAndFull(t *testing.T) {
	d, err := New(Options{Resolver: staticResolver{"http://127.0.0.1:1"}, Queue: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Submit(&invocation.Envelope{}); err == nil {
		t.Error("an envelope without session was accepted")
	}
	if err := d.Submit(envelope(1)); err != nil {
		t.Fatal(err)
	}
	if err := d.Submit(envelope(2)); !errors.Is(err, ErrQueueFull) {
		t.Errorf("second submit with no workers: %v, want ErrQueueFull", err)
	}
}

// TestFloodFailsLoudlyInsteadOfWaiting floods the dispatcher the way the
// orchestrator hands it invocations (SubmitWait, one after the other) while
// the functions do not answer. No call may wait for a function: the
// orchestrator would pile the rest up in memory meanwhile. What does not
// fit fails at once, through OnResult (its session learns) and SubmitWait's
// error; once the functions answer, every invocation has exactly one
// result: nothing is lost.
func TestFloodFailsLoudlyInsteadOfWaiting(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		fmt.Fprint(w, "ok")
	}))
	defer srv.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	const concurrency, queue, flood = 2, 8, 1000
	results := make(chan Result, flood)
	d, err := New(Options{Resolver: staticResolver{srv.URL}, Concurrency: concurrency, Queue: queue,
		OnResult: func(r Result) { results <- r }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); d.Wait() }()
	d.Start(ctx)

	// A watchdog, not a speed bound: the old dispatcher made the caller
	// wait for the stalled functions forever.
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	accepted, refused := 0, 0
	for i := range flood {
		switch err := d.SubmitWait(wctx, envelope(i)); {
		case err == nil:
			accepted++
		case errors.Is(err, ErrQueueFull):
			refused++
			if !strings.Contains(err.Error(), "retry") {
				t.Fatalf("refusal %q does not tell the user what to do", err)
			}
		default:
			t.Fatalf("SubmitWait of invocation %d with %d accepted: %v: the caller waits for stalled functions while its outbox grows", i, accepted, err)
		}
	}
	if accepted < queue || accepted > queue+concurrency {
		t.Errorf("%d invocations accepted, want the queue (%d) plus at most the workers (%d)", accepted, queue, concurrency)
	}
	// Refusals are reported before SubmitWait returns.
	for i := range refused {
		select {
		case r := <-results:
			if !errors.Is(r.Err, ErrQueueFull) || r.Tries != 0 {
				t.Fatalf("refused invocation %s reported as %+v", r.Envelope.Invocation, r)
			}
		default:
			t.Fatalf("only %d of %d refused invocations were reported", i, refused)
		}
	}
	close(release)
	seen := map[string]bool{}
	for i := range accepted {
		var r Result
		select {
		case r = <-results:
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d of %d accepted invocations answered", i, accepted)
		}
		if r.Err != nil || string(r.Body) != "ok" || seen[r.Envelope.Invocation] {
			t.Fatalf("accepted invocation %s: %+v", r.Envelope.Invocation, r)
		}
		seen[r.Envelope.Invocation] = true
	}
}

// TestQueueBoundsBytesAndReportsInvalid: large inline inputs fill the queue
// by bytes long before its count; an invalid envelope handed to SubmitWait
// is reported too, not only logged by the caller.
func TestQueueBoundsBytesAndReportsInvalid(t *testing.T) {
	results := make(chan Result, 64)
	// Nothing listens and no worker runs: every accepted invocation waits.
	d, err := New(Options{Resolver: staticResolver{"http://127.0.0.1:1"}, QueueBytes: 4 << 20,
		OnResult: func(r Result) { results <- r }})
	if err != nil {
		t.Fatal(err)
	}
	big := func(i int) *invocation.Envelope {
		env := envelope(i)
		env.Objects = []invocation.Object{{Bucket: "input", Key: "input", Inline: make([]byte, 1<<20)}}
		return env
	}
	accepted := 0
	for i := range 10 {
		if err := d.SubmitWait(context.Background(), big(i)); err == nil {
			accepted++
		} else if !errors.Is(err, ErrQueueFull) || !strings.Contains(err.Error(), "bytes") {
			t.Fatalf("invocation %d: %v", i, err)
		}
	}
	if accepted != 3 {
		t.Errorf("%d invocations of 1 MiB queued under a 4 MiB bound, want 3", accepted)
	}
	if len(results) != 10-accepted {
		t.Errorf("%d refusals reported, want %d", len(results), 10-accepted)
	}
	for len(results) > 0 {
		<-results
	}
	if err := d.SubmitWait(context.Background(), &invocation.Envelope{Session: "s"}); err == nil {
		t.Fatal("an envelope without function was accepted")
	}
	if r := <-results; r.Err == nil || r.Envelope.Session != "s" {
		t.Errorf("invalid envelope reported as %+v", r)
	}
}

// TestConnectionsAreKeptAcrossManyFunctions: a chain of more functions than
// http.DefaultTransport keeps idle connections for (100) reuses one
// connection per function host, round after round. With the default, the
// least recently used connection, which a cycle through the functions
// needs next, was closed each time: every step dialed anew.
func TestConnectionsAreKeptAcrossManyFunctions(t *testing.T) {
	const functions = 150
	var dialed atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dialed.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	results := make(chan Result, 1)
	d, err := New(Options{Resolver: staticResolver{"http://{svc}.{ns}.ziptrail.local"}, Ingress: strings.TrimPrefix(srv.URL, "http://"),
		Concurrency: 1, OnResult: func(r Result) { results <- r }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d.Start(ctx)
	for round := 0; round < 3; round++ {
		for i := 0; i < functions; i++ {
			env := &invocation.Envelope{Namespace: "ns", Function: fmt.Sprintf("f%d", i), Session: "s", Invocation: fmt.Sprintf("%d.%d", round, i)}
			if err := d.Submit(env); err != nil {
				t.Fatal(err)
			}
			if r := <-results; r.Err != nil {
				t.Fatal(r.Err)
			}
		}
	}
	if n := dialed.Load(); n != functions {
		t.Errorf("%d connections for 3 rounds through %d functions, want %d (one per function host)", n, functions, functions)
	}
	if tr := call.DirectTransport(nil, 4); tr.MaxIdleConns != call.MaxIdleConns {
		t.Errorf("requests straight to pods keep %d idle connections in all, want %d", tr.MaxIdleConns, call.MaxIdleConns)
	}
}
