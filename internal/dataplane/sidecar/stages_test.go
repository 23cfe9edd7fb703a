package sidecar

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

// Wrap's stages, each alone, with a stage of the test's behind it.

func stageSidecar() *Sidecar {
	return New(Config{Namespace: "ns", Workflow: "wf", Function: "f", Pod: "p", ShmDir: "/nonexistent", MemoryLimit: 1 << 20, ObjectTTL: time.Minute})
}

func envelopeRequest(t *testing.T, env invocation.Envelope) *http.Request {
	t.Helper()
	body, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	r.Header.Set("Content-Type", invocation.ContentType)
	return r
}

// TestEnvelopesStage: a stock request goes to the function untouched; an
// envelope that names files, or is no envelope at all, is refused with
// 400 before any later stage; a good one reaches the next stage decoded.
func TestEnvelopesStage(t *testing.T) {
	s := stageSidecar()
	var stock, staged int
	var got *invocation.Envelope
	h := s.envelopes(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { stock++ }),
		func(_ http.ResponseWriter, _ *http.Request, c *passage) { staged++; got = c.env })

	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if stock != 1 || staged != 0 {
		t.Fatalf("a stock request: %d to the function, %d to the stages", stock, staged)
	}
	bad := envelopeRequest(t, invocation.Envelope{Function: "f", Session: "s", Invocation: "s.1",
		Objects: []invocation.Object{{Bucket: "b", Key: "k", Path: "../../etc/passwd"}}})
	w := httptest.NewRecorder()
	h.ServeHTTP(w, bad)
	if w.Code != http.StatusBadRequest || staged != 0 {
		t.Fatalf("an envelope naming a file: %d, %d staged; want 400, none", w.Code, staged)
	}
	garbage := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("{not json"))
	garbage.Header.Set("Content-Type", invocation.ContentType)
	w = httptest.NewRecorder()
	h.ServeHTTP(w, garbage)
	if w.Code != http.StatusBadRequest || staged != 0 {
		t.Fatalf("a malformed envelope: %d, %d staged; want 400, none", w.Code, staged)
	}
	h.ServeHTTP(httptest.NewRecorder(), envelopeRequest(t, invocation.Envelope{Namespace: "ns", Function: "f", Session: "s", Invocation: "s.2"}))
	if staged != 1 || got.Invocation != "s.2" {
		t.Fatalf("a good envelope: %d staged, %+v", staged, got)
	}
}

// TestRecordStage: a key whose function ran is answered from its record
// the next time (the stage behind is not called again); a key whose
// function did not run (its inputs could not be resolved) is run again
// by the next delivery; a panic behind the stage records the key as run
// with its answer unknown.
func TestRecordStage(t *testing.T) {
	s := stageSidecar()
	calls := 0
	ran := true
	h := s.envelopes(http.NotFoundHandler(), s.withRecord(func(w http.ResponseWriter, _ *http.Request, c *passage) {
		calls++
		if c.env.IdempotencyKey == "" || w.Header().Get(invocation.HeaderIdempotencyKey) != c.env.IdempotencyKey {
			t.Errorf("the stage behind got key %q, the answer's header %q", c.env.IdempotencyKey, w.Header().Get(invocation.HeaderIdempotencyKey))
		}
		c.ran = ran
		if c.env.Invocation == "s.panic" {
			panic(http.ErrAbortHandler)
		}
		_, _ = w.Write([]byte("answer " + c.env.Invocation))
	}))
	deliver := func(inv string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, envelopeRequest(t, invocation.Envelope{Namespace: "ns", Function: "f", Session: "s", Invocation: inv}))
		return w
	}
	first, again := deliver("s.1"), deliver("s.1")
	if calls != 1 || again.Body.String() != "answer s.1" || again.Header().Get(invocation.HeaderReplayed) == "" {
		t.Fatalf("a duplicate: %d calls, answer %q, replayed %q; want 1 call and the recorded answer", calls, again.Body, again.Header().Get(invocation.HeaderReplayed))
	}
	if first.Header().Get(invocation.HeaderReplayed) != "" {
		t.Fatal("the first delivery was marked replayed")
	}

	ran = false
	deliver("s.2")
	ran = true
	deliver("s.2")
	if calls != 3 {
		t.Fatalf("a key whose function did not run was not run again: %d calls, want 3", calls)
	}

	func() {
		defer func() { _ = recover() }()
		deliver("s.panic")
	}()
	w := deliver("s.panic")
	if calls != 4 || w.Header().Get(invocation.HeaderReplayed) == "" {
		t.Fatalf("after a panic the key ran, its answer unknown: %d calls (want 4), replayed %q", calls, w.Header().Get(invocation.HeaderReplayed))
	}
}
