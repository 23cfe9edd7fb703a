package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// lines is a progress writer that hands every notice of a retry to a
// channel as it is printed (the CLI writes from two goroutines).
type lines struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	retries chan string
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range strings.Split(strings.TrimSpace(string(p)), "\n") {
		if strings.Contains(line, "retrying in") || strings.Contains(line, "reading the rest in") {
			select {
			case l.retries <- line:
			default:
			}
		}
	}
	return l.buf.Write(p)
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// cutWriter breaks its connection after left bytes of body.
type cutWriter struct {
	http.ResponseWriter
	left int
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if len(p) >= c.left {
		_, _ = c.ResponseWriter.Write(p[:c.left])
		http.NewResponseController(c.ResponseWriter).Flush()
		panic(http.ErrAbortHandler) // the connection breaks mid-body
	}
	c.left -= len(p)
	return c.ResponseWriter.Write(p)
}

// TestRunSurvivesAnUnavailableGateway: `ziptrail run` through a gateway
// that refuses connections until the CLI has retried three times (its
// listener starts late), then answers 503 with Retry-After: 2 three times (the first pause,
// 0.8–1.6 s by the back-off alone, is 2 s),
// then breaks the result's connection after 100 kB: the CLI says it
// retries, starts one session, writes the whole result once, and
// acknowledges it.
func TestRunSurvivesAnUnavailableGateway(t *testing.T) {
	e := startGateway(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // refused until it listens again

	var unavailable atomic.Int32
	unavailable.Store(3)
	var cut atomic.Bool
	var acks, starts atomic.Int32
	keys := make(chan string, 16)
	flaky := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if unavailable.Add(-1) >= 0 {
			w.Header().Set("Retry-After", "2")
			http.Error(w, `{"error":"the session inputs are using all the memory reserved for them"}`, http.StatusServiceUnavailable)
			return
		}
		switch {
		case r.Method == http.MethodPost:
			starts.Add(1)
			keys <- r.Header.Get("Idempotency-Key")
		case r.Method == http.MethodDelete && strings.HasSuffix(r.URL.Path, "/result"):
			acks.Add(1)
		case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/result") && cut.CompareAndSwap(false, true):
			w = &cutWriter{ResponseWriter: w, left: 100_000}
		}
		e.gateway.ServeHTTP(w, r)
	})

	text := strings.Repeat("hello ziptrail ", 4_000) // a 300 kB result
	progress := &lines{retries: make(chan string, 64)}
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- runRun(context.Background(), []string{"upper", "--input", "-", "-n", "team-a", "--gateway", addr, "--token", e.tok},
			strings.NewReader(text), &out, progress)
	}()
	for range 3 {
		select {
		case l := <-progress.retries:
			if !strings.Contains(l, "gateway unreachable (dial: connect: connection refused), retrying in") {
				t.Fatalf("notice %q", l)
			}
		case err := <-done:
			t.Fatalf("run gave up while the gateway was down: %v\n%s", err, progress)
		}
	}
	ln, err = net.Listen("tcp", addr) // the gateway comes up
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: flaky}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	if err := <-done; err != nil {
		t.Fatalf("run: %v\n%s", err, progress)
	}
	if out.String() != strings.Repeat(strings.ToUpper(text), 5) { // not a terminal: the bytes as they are
		t.Errorf("result: %d bytes, want %d", out.Len(), 5*len(text))
	}
	for _, want := range []string{"gateway unavailable (503), retrying in 2s…", "result cut off after 100000 bytes", "==> Completed in "} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, progress)
		}
	}
	if n := len(e.orch.Sessions().List("team-a", "upper")); n != 1 || starts.Load() != 1 || len(<-keys) != 32 {
		t.Errorf("%d sessions from %d starts, want 1 from 1 (with an idempotency key)", n, starts.Load())
	}
	if acks.Load() != 1 {
		t.Errorf("%d acknowledgements of the result, want 1", acks.Load())
	}
}
