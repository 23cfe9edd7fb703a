package dispatch

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/sidecar"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// TestLostAnswerOfASidecarIsReplayedNotRerun: the function's pod runs the
// real sidecar handler in front of the user container. The first answer
// teaches the dispatcher that the service honours idempotency keys; the
// answer to the next invocation is lost after the function ran (the
// connection is cut). The dispatcher sends it again, the sidecar answers
// from its record: the caller gets the function's answer and the
// function ran once.
func TestLostAnswerOfASidecarIsReplayedNotRerun(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "keys.json")
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{3}, 32))
	if err := os.WriteFile(keyFile, []byte(`{"active":"k1","keys":{"k1":"`+key+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	sc := sidecar.New(sidecar.Config{Namespace: "ns", PodIP: "127.0.0.1", DataplanePort: servers.FreePort(t), ShmDir: t.TempDir(),
		MemoryLimit: 64 << 20, InlineThreshold: 1024, ObjectTTL: time.Minute, KeyFile: keyFile})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := sc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs := map[string]int{}
	user := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		env, err := invocation.Decode(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		runs[env.Invocation]++
		mu.Unlock()
		_, _ = io.WriteString(w, "ran "+env.IdempotencyKey)
	}))
	defer user.Close()
	target, _ := url.Parse(user.URL)
	pod := sc.Wrap(httputil.NewSingleHostReverseProxy(target))
	cut := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(invocation.HeaderIdempotencyKey)
		rec := httptest.NewRecorder()
		pod.ServeHTTP(rec, r)
		mu.Lock()
		lose := key == "s/1/0" && !cut[key]
		cut[key] = true
		mu.Unlock()
		if lose { // the function ran; its answer is lost with the connection
			conn, _, _ := http.NewResponseController(w).Hijack()
			_ = conn.Close()
			return
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	defer srv.Close()

	var envs []*invocation.Envelope
	for i := range 2 {
		env := envelope(i)
		env.Objects = []invocation.Object{{Bucket: "b", Key: "k", Inline: []byte("x")}}
		envs = append(envs, env)
	}
	res := runEnvelopes(t, Options{Resolver: staticResolver{srv.URL}, BaseBackoff: time.Millisecond, Concurrency: 1}, envs)
	for _, r := range res {
		want := "ran s/" + r.Envelope.Invocation + "/0"
		if r.Err != nil || string(r.Body) != want {
			t.Errorf("%s: %+v", r.Envelope.Invocation, r)
		}
		if r.Envelope.Invocation == "1" && (r.Tries != 2 || r.Header.Get(invocation.HeaderReplayed) != "1") {
			t.Errorf("the lost answer: %d tries, replayed %q", r.Tries, r.Header.Get(invocation.HeaderReplayed))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if runs["0"] != 1 || runs["1"] != 1 {
		t.Fatalf("runs %v, want each once", runs)
	}
}

// runEnvelopes dispatches envs, in order, and returns their results.
func runEnvelopes(t *testing.T, opts Options, envs []*invocation.Envelope) []Result {
	t.Helper()
	results := make(chan Result, len(envs))
	opts.OnResult = func(r Result) { results <- r }
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); d.Wait() }()
	d.Start(ctx)
	for _, env := range envs {
		if err := d.Submit(env); err != nil {
			t.Fatal(err)
		}
	}
	var out []Result
	for range envs {
		select {
		case r := <-results:
			out = append(out, r)
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d of %d results", len(out), len(envs))
		}
	}
	return out
}

// TestAStaleOwnersInvocationIsRefusedNotRetried: two engine owners of one
// checkpoint dispatch to a pod's real sidecar, each under its own owner
// fence. Once the newer owner's invocation reached the pod, the older
// owner's next one is refused: its result is a StaleOwnerError naming
// both fences (errors.Is ErrStaleOwner), after one try, and the function
// did not run. A 409 that is not the sidecar's refusal of the fence sent
// stays an ordinary failure.
func TestAStaleOwnersInvocationIsRefusedNotRetried(t *testing.T) {
	sc := sidecar.New(sidecar.Config{Namespace: "ns", PodIP: "127.0.0.1", DataplanePort: servers.FreePort(t), ShmDir: t.TempDir(),
		MemoryLimit: 64 << 20, InlineThreshold: 1024, ObjectTTL: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := sc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs := map[string]int{}
	user := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		env, err := invocation.Decode(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		runs[env.Invocation]++
		mu.Unlock()
		_, _ = io.WriteString(w, "ran")
	}))
	defer user.Close()
	target, _ := url.Parse(user.URL)
	pod := httptest.NewServer(sc.Wrap(httputil.NewSingleHostReverseProxy(target)))
	defer pod.Close()

	owner := func(fence string) Options {
		return Options{Resolver: staticResolver{pod.URL}, BaseBackoff: time.Millisecond, Concurrency: 1,
			Fence: func(*invocation.Envelope) string { return fence }}
	}
	withInline := func(i int) *invocation.Envelope {
		env := envelope(i)
		env.Objects = []invocation.Object{{Bucket: "b", Key: "k", Inline: []byte("x")}}
		return env
	}
	const key = "ziptrail:engine:ziptrail-engine.00-of-01"
	old, heir := owner(key+"/"+fmt.Sprint(3<<32+1)), owner(key+"/"+fmt.Sprint(4<<32+1))
	if r := runEnvelopes(t, old, []*invocation.Envelope{withInline(0)})[0]; r.Err != nil {
		t.Fatalf("the old owner before the new one: %v", r.Err)
	}
	if r := runEnvelopes(t, heir, []*invocation.Envelope{withInline(1)})[0]; r.Err != nil {
		t.Fatalf("the new owner: %v", r.Err)
	}
	r := runEnvelopes(t, old, []*invocation.Envelope{withInline(2)})[0]
	var stale *StaleOwnerError
	if !errors.Is(r.Err, ErrStaleOwner) || !errors.As(r.Err, &stale) {
		t.Fatalf("the old owner after the new one: %d %v, want ErrStaleOwner", r.Status, r.Err)
	}
	if stale.Sent.Generation != 3<<32+1 || stale.Seen.Generation != 4<<32+1 || stale.Seen.Key != key || r.Tries != 1 || r.Status != http.StatusConflict {
		t.Errorf("refusal %+v after %d tries (status %d)", stale, r.Tries, r.Status)
	}
	mu.Lock()
	if runs["0"] != 1 || runs["1"] != 1 || runs["2"] != 0 {
		t.Errorf("runs %v: want 0 and 1 once, 2 never", runs)
	}
	mu.Unlock()

	// Other 409s are the function's failures, not a stale owner.
	var answer atomic.Value
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := answer.Load().(string); v != "" {
			w.Header().Set(invocation.HeaderStaleOwner, v)
		}
		http.Error(w, "conflict", http.StatusConflict)
	}))
	defer fake.Close()
	for _, tc := range []struct{ fence, answer string }{
		{key + "/5", ""},              // a plain 409
		{key + "/5", key + "/4"},      // not newer than the fence sent
		{key + "/5", "another:key/9"}, // another checkpoint's
		{key + "/5", "garbage"},       // malformed
		{"", key + "/9"},              // sent without a fence
	} {
		answer.Store(tc.answer)
		opts := owner(tc.fence)
		opts.Resolver = staticResolver{fake.URL}
		r := runEnvelopes(t, opts, []*invocation.Envelope{withInline(3)})[0]
		if r.Err == nil || errors.Is(r.Err, ErrStaleOwner) || r.Tries != 1 {
			t.Errorf("fence %q, answer %q: %v after %d tries, want an ordinary failure", tc.fence, tc.answer, r.Err, r.Tries)
		}
	}
}
