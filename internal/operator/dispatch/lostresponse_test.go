package dispatch

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

// lostResponseServer runs the "function" (counts it) for every request,
// then kills the connection without an answer: the function ran, its
// response is lost.
func lostResponseServer(t *testing.T, runs *atomic.Int32) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		_ = conn.Close()
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestLostResponseIsNotRunAgain: the function ran and the connection broke
// before its answer. Nothing proves the request did not reach the
// function, and the receiver never said it honours idempotency keys: the
// dispatcher reports the failure (the engine's re-execution rules decide)
// instead of running the function again.
func TestLostResponseIsNotRunAgain(t *testing.T) {
	var runs atomic.Int32
	srv := lostResponseServer(t, &runs)
	res := run(t, Options{Resolver: staticResolver{srv.URL}, BaseBackoff: time.Millisecond}, 1)
	if res[0].Err == nil {
		t.Fatalf("a lost response succeeded: %+v", res[0])
	}
	if n := runs.Load(); n != 1 || res[0].Tries != 1 {
		t.Fatalf("the function ran %d times in %d tries, want once", n, res[0].Tries)
	}
}

// TestClientTimeoutIsNotRetried: the client's own timeout passes while the
// function runs; the call is reported failed, never sent again.
func TestClientTimeoutIsNotRetried(t *testing.T) {
	var runs atomic.Int32
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	res := run(t, Options{Resolver: staticResolver{srv.URL}, BaseBackoff: time.Millisecond, Client: &http.Client{Timeout: 50 * time.Millisecond}}, 1)
	if res[0].Err == nil {
		t.Fatalf("a timed-out call succeeded: %+v", res[0])
	}
	if n := runs.Load(); n != 1 || res[0].Tries != 1 {
		t.Fatalf("the function ran %d times in %d tries, want once", n, res[0].Tries)
	}
}

// TestIdempotencyKeyHeader: every request carries its envelope's key.
func TestIdempotencyKeyHeader(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get(invocation.HeaderIdempotencyKey)
	}))
	defer srv.Close()
	run(t, Options{Resolver: staticResolver{srv.URL}}, 1)
	if k := <-got; k != "s/0/0" {
		t.Fatalf("key %q, want s/0/0", k)
	}
}

// TestLostResponseRetriedWhenTheKeyIsHonoured: a service whose answers
// echo the idempotency key (its sidecar records outcomes by key) gets a
// delivery whose answer was lost again; its record answers the duplicate,
// so the function ran once per invocation. An answer that echoes the key
// is the function's, not Knative's: its 503 is not retried.
func TestLostResponseRetriedWhenTheKeyIsHonoured(t *testing.T) {
	var mu sync.Mutex
	runs := map[string]int{}
	record := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(invocation.HeaderIdempotencyKey)
		mu.Lock()
		out, seen := record[key]
		if !seen {
			runs[key]++
			out = "ran " + key
			record[key] = out
		}
		mu.Unlock()
		w.Header().Set(invocation.HeaderIdempotencyKey, key)
		switch {
		case !seen && key == "s/1/0": // ran, then the answer is lost
			conn, _, _ := http.NewResponseController(w).Hijack()
			_ = conn.Close()
		case key == "s/2/0":
			http.Error(w, "the function's own 503", http.StatusServiceUnavailable)
		default:
			fmt.Fprint(w, out)
		}
	}))
	defer srv.Close()
	// One worker: invocation 0 answers (and teaches that the service
	// honours keys) before 1 is sent.
	res := run(t, Options{Resolver: staticResolver{srv.URL}, BaseBackoff: time.Millisecond, Concurrency: 1}, 3)
	for _, r := range res {
		switch r.Envelope.Invocation {
		case "1":
			if r.Err != nil || r.Tries != 2 || string(r.Body) != "ran s/1/0" {
				t.Errorf("lost answer: %+v", r)
			}
		case "2":
			if r.Err == nil || r.Tries != 1 {
				t.Errorf("the function's 503 was retried: %+v", r)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for k, n := range runs {
		if n != 1 {
			t.Errorf("%s ran %d times", k, n)
		}
	}
}
