package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// The headers of idempotency (invocation.HeaderIdempotencyKey,
// invocation.HeaderReplayed), spelled out.
const (
	hdrKey    = "Ziptrail-Idempotency-Key"
	hdrReplay = "Ziptrail-Idempotent-Replay"
)

// endsEvents hands every FunctionFinished a sidecar reports to a channel.
type endsEvents struct {
	orderedEvents
	ends chan *controlv1.FunctionFinished
}

func (e *endsEvents) FunctionFinished(ctx context.Context, id control.Identity, ev *controlv1.FunctionFinished) error {
	e.ends <- ev
	return e.orderedEvents.FunctionFinished(ctx, id, ev)
}

// countingFunction is a user container behind a reverse proxy, as behind
// queue-proxy: it counts its runs per invocation and attempt, answers
// with outputs (one of them large enough to become a reference) and a
// return value, or fails for invocation ids ending in "fail".
type countingFunction struct {
	mu   sync.Mutex
	runs map[string]int
}

func (f *countingFunction) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var env invocation.Envelope
	_ = json.NewDecoder(r.Body).Decode(&env)
	id := env.Invocation + "/" + strconv.Itoa(env.Attempt)
	f.mu.Lock()
	f.runs[id]++
	n := f.runs[id]
	f.mu.Unlock()
	if strings.HasSuffix(env.Invocation, "fail") {
		http.Error(w, "boom", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", invocation.OutputsContentType)
	_ = json.NewEncoder(w).Encode(invocation.Outputs{Return: []byte("ret " + id + " run " + string(rune('0'+n))),
		Objects: []invocation.Object{{Bucket: "out", Key: "big", Inline: bytes.Repeat([]byte("b"), 4096)}, {Bucket: "out", Key: "small", Inline: []byte("s")}}})
}

func (f *countingFunction) ran(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.runs[id]
}

// behindProxy serves h behind a reverse proxy wrapped by s, as
// queue-proxy-zl serves the user container.
func behindProxy(t *testing.T, s *Sidecar, h http.Handler) string {
	t.Helper()
	user := httptest.NewServer(h)
	t.Cleanup(user.Close)
	target, _ := url.Parse(user.URL)
	fn := httptest.NewServer(s.Wrap(httputil.NewSingleHostReverseProxy(target)))
	t.Cleanup(fn.Close)
	return fn.URL
}

// TestDuplicateKeyIsAnsweredFromTheRecord: a second delivery of an
// invocation's idempotency key (session, invocation, attempt) — a
// dispatcher's retry after a lost answer, a new operator's resend — gets
// the recorded answer (status, headers, body: the same references) and
// the function does not run again; its outcome is not reported twice. A
// new attempt is a new key and runs; a function's failure is recorded
// too.
func TestDuplicateKeyIsAnsweredFromTheRecord(t *testing.T) {
	ev := &endsEvents{ends: make(chan *controlv1.FunctionFinished, 16)}
	s := workflowSidecar(t, controlServer(t, ev), "p", "work")
	fn := &countingFunction{runs: map[string]int{}}
	u := behindProxy(t, s, fn)
	env := invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-work", Session: "s1", Invocation: "s1.0",
		Objects: []invocation.Object{{Bucket: "in", Key: "k", Inline: []byte("x")}}}

	first, body1 := post(t, u, env)
	second, body2 := post(t, u, env)
	if first.StatusCode != http.StatusOK || second.StatusCode != http.StatusOK || !bytes.Equal(body1, body2) ||
		second.Header.Get("Content-Type") != first.Header.Get("Content-Type") {
		t.Fatalf("first %d %s, duplicate %d %s", first.StatusCode, body1, second.StatusCode, body2)
	}
	if n := fn.ran("s1.0/0"); n != 1 {
		t.Fatalf("the function ran %d times for one key", n)
	}
	if first.Header.Get(hdrKey) != "s1/s1.0/0" || second.Header.Get(hdrKey) != "s1/s1.0/0" || first.Header.Get(hdrReplay) != "" ||
		second.Header.Get(hdrReplay) != "1" {
		t.Errorf("headers: first %v, duplicate %v", first.Header, second.Header)
	}
	outs, err := invocation.DecodeOutputs(body2)
	if err != nil || len(outs.Objects) != 2 || outs.Objects[0].Ref == "" {
		t.Fatalf("the replayed outputs %s: %v", body2, err)
	}

	// A new attempt is another key: it runs.
	env.Attempt = 1
	if resp, body := post(t, u, env); resp.StatusCode != http.StatusOK || fn.ran("s1.0/1") != 1 || bytes.Equal(body, body1) {
		t.Fatalf("attempt 1: %d %s, ran %d", resp.StatusCode, body, fn.ran("s1.0/1"))
	}

	// A failure is an outcome like another.
	env.Invocation, env.Attempt = "s1.fail", 0
	for range 2 {
		resp, body := post(t, u, env)
		if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(body), "boom") {
			t.Fatalf("failure: %d %s", resp.StatusCode, body)
		}
	}
	if n := fn.ran("s1.fail/0"); n != 1 {
		t.Fatalf("the failing function ran %d times for one key", n)
	}

	// One report per run: s1.0 twice (attempts 0 and 1), s1.fail once.
	ends := map[string]int{}
	for range 3 {
		select {
		case f := <-ev.ends:
			ends[f.InvocationId]++
		case <-time.After(time.Minute):
			t.Fatalf("ends reported: %v", ends)
		}
	}
	if ends["s1.0"] != 2 || ends["s1.fail"] != 1 {
		t.Fatalf("ends reported: %v", ends)
	}
	// A further duplicate reports nothing: the next report is a new run's.
	env.Invocation = "s1.2"
	post(t, u, env)
	if f := <-ev.ends; f.InvocationId != "s1.2" {
		t.Fatalf("a duplicate was reported again: %v", f)
	}
}

// TestOutcomeOutlivesItsCaller: the operator's HTTP client that sent an
// engine-dispatched invocation goes away (an operator restart, a demote)
// while the function runs. The function is not cancelled, it finishes,
// and its sidecar reports the outcome — its objects and its end with its
// return value — over the control stream, so that the session's next
// owner learns it; that owner's resend of the same key is answered from
// the record.
func TestOutcomeOutlivesItsCaller(t *testing.T) {
	ev := &endsEvents{ends: make(chan *controlv1.FunctionFinished, 16)}
	s := workflowSidecar(t, controlServer(t, ev), "c", "work")
	running := make(chan struct{}, 1)
	release := make(chan struct{})
	var mu sync.Mutex
	var runs, cancelled int
	u := behindProxy(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		runs++
		mu.Unlock()
		running <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
			mu.Lock()
			cancelled++
			mu.Unlock()
			return
		}
		w.Header().Set("Content-Type", invocation.OutputsContentType)
		_, _ = w.Write([]byte(`{"objects":[{"bucket":"out","key":"o","inline":"eQ=="}],"return":"cg=="}`))
	}))
	env := invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-work", Session: "s1", Invocation: "s1.7",
		Objects: []invocation.Object{{Bucket: "in", Key: "k", Inline: []byte("x")}}}
	body, _ := json.Marshal(env)

	// The caller goes away while the function runs.
	cctx, ccancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(cctx, http.MethodPost, u, bytes.NewReader(body))
	req.Header.Set("Content-Type", invocation.ContentType)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	select {
	case <-running:
	case <-time.After(time.Minute):
		t.Fatal("the invocation never reached the function")
	}
	ccancel()
	<-done
	close(release)

	select {
	case f := <-ev.ends:
		if f.InvocationId != "s1.7" || f.Failed || string(f.ReturnValue) != "r" || f.Function != "work" || f.OutputsSent != 1 {
			t.Fatalf("reported end %v", f)
		}
	case <-time.After(30 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("no end reported for an invocation whose caller went away (the function was cancelled %d times)", cancelled)
	}
	if got := ev.of("s1.7"); len(got) != 2 || got[0] != "object" || got[1] != "finished" {
		t.Fatalf("reported %v, want its object then its end", got)
	}

	// The next owner sends the invocation again: the record answers.
	resp, out := post(t, u, env)
	mu.Lock()
	defer mu.Unlock()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(out), `"return":"cg=="`) || runs != 1 || cancelled != 0 {
		t.Fatalf("resend: %d %s; the function ran %d times, cancelled %d", resp.StatusCode, out, runs, cancelled)
	}
}

// TestCutAnswerIsReportedFailedAndNotRunAgain: the user container's answer
// breaks off mid-body (it crashed). The function ran and its outcome is
// unknown: the end is reported failed (the engine's re-execution rules
// decide, under a new key) and a duplicate of the key is refused (409),
// not run again.
func TestCutAnswerIsReportedFailedAndNotRunAgain(t *testing.T) {
	ev := &endsEvents{ends: make(chan *controlv1.FunctionFinished, 16)}
	s := workflowSidecar(t, controlServer(t, ev), "p", "work")
	var mu sync.Mutex
	runs := 0
	u := behindProxy(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		runs++
		mu.Unlock()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		_, _ = conn.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort"))
		_ = conn.Close()
	}))
	env := invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-work", Session: "s1", Invocation: "s1.4"}
	body, _ := json.Marshal(env)
	if resp, err := http.Post(u, invocation.ContentType, bytes.NewReader(body)); err == nil {
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if rerr == nil && resp.StatusCode == http.StatusOK {
			t.Fatalf("a cut answer arrived whole: %d %q", resp.StatusCode, b)
		}
	}
	select {
	case f := <-ev.ends:
		if f.InvocationId != "s1.4" || !f.Failed {
			t.Fatalf("reported end %v", f)
		}
	case <-time.After(time.Minute):
		t.Fatal("no end reported for a cut answer")
	}
	resp, out := post(t, u, env)
	mu.Lock()
	defer mu.Unlock()
	if resp.StatusCode != http.StatusConflict || resp.Header.Get(hdrReplay) != "1" || runs != 1 {
		t.Fatalf("duplicate: %d %s; the function ran %d times", resp.StatusCode, out, runs)
	}
}
