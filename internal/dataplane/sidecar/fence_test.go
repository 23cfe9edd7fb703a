package sidecar

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

// The fence headers (invocation.HeaderOwnerFence, HeaderStaleOwner),
// spelled out.
const (
	hdrFence = "Ziptrail-Owner-Fence"
	hdrStale = "Ziptrail-Stale-Owner"
)

// postFenced posts env with the owner fence header fence ("" for none).
func postFenced(t *testing.T, url string, env invocation.Envelope, fence string) (*http.Response, string) {
	t.Helper()
	data, _ := json.Marshal(env)
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", invocation.ContentType)
	if fence != "" {
		req.Header.Set(hdrFence, fence)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestStaleOwnersInvocationIsRefused: the pod's real sidecar in front of
// a function (behind a reverse proxy, as queue-proxy-zl serves it). Once
// it has seen an engine owner's fence for a checkpoint key, an invocation
// with a lower generation for that key — from a superseded owner — is
// refused with 409 and the newer fence, the function does not run and the
// idempotency key is not recorded (the current owner's delivery of the
// same key runs). The same or a higher generation, another key's fence
// and an invocation without a fence are accepted; a malformed fence is
// refused with 400; a function cannot answer "stale owner" itself.
func TestStaleOwnersInvocationIsRefused(t *testing.T) {
	s := start(t, writeKeyFile(t, 7))
	var mu sync.Mutex
	runs := map[string]int{}
	u := behindProxy(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var env invocation.Envelope
		_ = json.NewDecoder(r.Body).Decode(&env)
		mu.Lock()
		runs[env.Invocation]++
		mu.Unlock()
		if env.Invocation == "forge" {
			w.Header().Set(hdrStale, "k/99")
			http.Error(w, "stale owner, says the function", http.StatusConflict)
			return
		}
		_, _ = io.WriteString(w, "ran "+env.Invocation)
	}))
	ran := func(inv string) int {
		mu.Lock()
		defer mu.Unlock()
		return runs[inv]
	}
	env := func(inv string) invocation.Envelope {
		return invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-f", Session: "s1", Invocation: inv,
			Objects: []invocation.Object{{Bucket: "b", Key: "k", Inline: []byte("x")}}}
	}
	accepted := func(inv, fence string) {
		t.Helper()
		resp, body := postFenced(t, u, env(inv), fence)
		if resp.StatusCode != http.StatusOK || body != "ran "+inv || resp.Header.Get(hdrReplay) != "" {
			t.Fatalf("%s under fence %q: %d %q (replayed %q), want it run", inv, fence, resp.StatusCode, body, resp.Header.Get(hdrReplay))
		}
	}
	refused0 := testutil.ToFloat64(staleOwnerRefused)

	accepted("none-1", "")
	accepted("old-1", "ziptrail:engine:snapshot/5")
	accepted("new-1", "ziptrail:engine:snapshot/7") // a new owner claimed the checkpoint

	// The old owner's next invocation.
	resp, body := postFenced(t, u, env("old-2"), "ziptrail:engine:snapshot/5")
	if resp.StatusCode != http.StatusConflict || resp.Header.Get(hdrStale) != "ziptrail:engine:snapshot/7" ||
		!strings.Contains(body, "stale owner") || !strings.Contains(body, "generation 5") || !strings.Contains(body, "generation 7") {
		t.Fatalf("the old owner's invocation: %d %q %v, want 409 stale owner naming generation 7", resp.StatusCode, body, resp.Header)
	}
	if resp.Header.Get(hdrKey) != "" {
		t.Errorf("the refusal echoes the idempotency key %q: it was not taken", resp.Header.Get(hdrKey))
	}
	if n := ran("old-2"); n != 0 {
		t.Fatalf("the function ran %d times for a stale owner", n)
	}
	if got := testutil.ToFloat64(staleOwnerRefused) - refused0; got != 1 {
		t.Errorf("ziptrail_sidecar_stale_owner_refused_total grew by %v, want 1", got)
	}
	// The key was not recorded: the current owner's delivery of it runs.
	accepted("old-2", "ziptrail:engine:snapshot/7")
	if n := ran("old-2"); n != 1 {
		t.Fatalf("old-2 ran %d times", n)
	}

	accepted("new-2", "ziptrail:engine:snapshot/7")           // the same owner again
	accepted("newer-1", "ziptrail:engine:snapshot/8")         // a later one
	accepted("bucket-1", "ziptrail:engine:bucket.01-of-04/3") // another checkpoint: its own fence
	accepted("none-2", "")                                    // no fence: not fenced
	if resp, _ := postFenced(t, u, env("old-3"), "ziptrail:engine:snapshot/7"); resp.StatusCode != http.StatusConflict ||
		resp.Header.Get(hdrStale) != "ziptrail:engine:snapshot/8" {
		t.Fatalf("generation 7 after 8: %d %v", resp.StatusCode, resp.Header)
	}

	for _, bad := range []string{"ziptrail:engine:snapshot", "ziptrail:engine:snapshot/-1", "/7", "ziptrail:engine:snapshot/seven"} {
		resp, body := postFenced(t, u, env("bad"), bad)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "malformed owner fence") {
			t.Errorf("fence %q: %d %q, want 400 malformed owner fence", bad, resp.StatusCode, body)
		}
	}
	if n := ran("bad"); n != 0 {
		t.Fatalf("the function ran %d times under malformed fences", n)
	}
	if got := testutil.ToFloat64(staleOwnerRefused) - refused0; got != 2 {
		t.Errorf("ziptrail_sidecar_stale_owner_refused_total grew by %v, want 2", got)
	}

	// Only the sidecar says "stale owner": a function's 409 carrying the
	// header reaches the caller without it.
	resp, body = postFenced(t, u, env("forge"), "ziptrail:engine:snapshot/8")
	if resp.StatusCode != http.StatusConflict || resp.Header.Get(hdrStale) != "" || !strings.Contains(body, "says the function") {
		t.Fatalf("the function's own 409: %d %q %v", resp.StatusCode, body, resp.Header)
	}
}

// TestFencesAreBounded: at most max checkpoint keys are remembered; the
// one seen least recently is forgotten first (its next fence is accepted,
// whatever its generation).
func TestFencesAreBounded(t *testing.T) {
	fs := newFences(2)
	admit := func(key string, gen int64) bool {
		ok, _ := fs.admit(invocation.Fence{Key: key, Generation: gen})
		return ok
	}
	if !admit("a", 5) || !admit("b", 5) || admit("a", 4) {
		t.Fatal("a lower generation of a remembered key was accepted")
	}
	if !admit("a", 6) || !admit("c", 1) { // b is now the least recently seen: forgotten
		t.Fatal("a current fence was refused")
	}
	if len(fs.by) != 2 || fs.order.Len() != 2 {
		t.Fatalf("%d keys remembered (%d in order), want 2", len(fs.by), fs.order.Len())
	}
	if !admit("b", 1) { // a is forgotten now
		t.Error("a forgotten key's fence was refused")
	}
	if admit("c", 0) {
		t.Error("c, seen more recently than a, was forgotten")
	}
	if !admit("a", 0) {
		t.Error("a, forgotten, still refuses")
	}
}
