package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// TestAuth plays users against the gateway over HTTP and gRPC with real
// ServiceAccount tokens checked by a real API server: no token or a forged
// one is 401; a ServiceAccount without the session-runner role is 403 with
// the reason; one bound to it in its namespace runs and reads sessions
// there; a token bound in namespace b cannot read a's sessions.
func TestAuth(t *testing.T) {
	f := newFixture(t, nil)
	f.namespace(t, "a")
	f.namespace(t, "b")
	runnerA := f.serviceAccount(t, "a", "runner", "a")
	nobodyA := f.serviceAccount(t, "a", "nobody", "")
	runnerB := f.serviceAccount(t, "b", "runner", "b")
	f.workflow(t, "a", "echo", echo)
	f.workflow(t, "b", "echo", echo)
	ctx := context.Background()
	start := "/v1/namespaces/a/workflows/echo/sessions"

	// Strangers.
	for name, token := range map[string]string{"no token": "", "forged token": "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhZG1pbiJ9.c2ln"} {
		resp, body := f.do(t, token, http.MethodPost, start, strings.NewReader("hi"))
		if resp.StatusCode != http.StatusUnauthorized || !contains(body, `"error"`) {
			t.Errorf("%s: start answered %d %s, want 401", name, resp.StatusCode, body)
		}
		resp, body = f.do(t, token, http.MethodGet, "/v1/namespaces/a/sessions", nil)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: list answered %d %s, want 401", name, resp.StatusCode, body)
		}
	}

	// Over gRPC, an anonymous call is refused before its message is read.
	if _, err := f.gw.StartSession(ctx, &gatewayv1.StartSessionRequest{Namespace: "a", Workflow: "echo", Input: make([]byte, 4<<20)}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("anonymous gRPC start: %v, want Unauthenticated", err)
	}
	if _, err := f.gw.GetSession(withToken(ctx, "forged"), &gatewayv1.SessionRef{Namespace: "a", Id: "x"}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("gRPC with a forged token: %v, want Unauthenticated", err)
	}

	// Authenticated, but without the role.
	resp, body := f.do(t, nobodyA, http.MethodPost, start, strings.NewReader("hi"))
	if resp.StatusCode != http.StatusForbidden || !contains(body, "system:serviceaccount:a:nobody", "create", "ziptrail-session-runner") {
		t.Fatalf("ServiceAccount without the role: start answered %d %s, want 403 naming the user, the verb and the role to bind", resp.StatusCode, body)
	}
	if n := len(f.orch.Sessions().List("a", "")); n != 0 {
		t.Errorf("a refused request started %d sessions", n)
	}
	if _, err := f.gw.StartSession(withToken(ctx, nobodyA), &gatewayv1.StartSessionRequest{Namespace: "a", Workflow: "echo", Input: []byte("hi")}); status.Code(err) != codes.PermissionDenied ||
		!strings.Contains(err.Error(), "ziptrail-session-runner") {
		t.Errorf("gRPC start without the role: %v, want PermissionDenied with the reason", err)
	}

	// With the role, in its namespace.
	resp, body = f.do(t, runnerA, http.MethodPost, start, strings.NewReader("hello a"))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("runner of a: start answered %d %s", resp.StatusCode, body)
	}
	var s sessions.Session
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatal(err)
	}
	resp, body = f.do(t, runnerA, http.MethodGet, "/v1/namespaces/a/sessions/"+s.ID+"/result?wait=1m", nil)
	if resp.StatusCode != http.StatusOK || body != "hello a" {
		t.Fatalf("runner of a: result %d %q", resp.StatusCode, body)
	}
	gs, err := f.gw.StartSession(withToken(ctx, runnerA), &gatewayv1.StartSessionRequest{Namespace: "a", Workflow: "echo", Input: []byte("by grpc")})
	if err != nil {
		t.Fatalf("gRPC start with the role: %v", err)
	}
	if r, err := f.gw.WaitSession(withToken(ctx, runnerA), &gatewayv1.WaitSessionRequest{Namespace: "a", Id: gs.Id, TimeoutMs: 60_000}); err != nil || string(r.Result) != "by grpc" {
		t.Fatalf("gRPC wait with the role: %v %v", r, err)
	}

	// A token of namespace b reads nothing of a, and learns nothing either.
	for _, path := range []string{"/v1/namespaces/a/sessions/" + s.ID, "/v1/namespaces/a/sessions/" + s.ID + "/result",
		"/v1/namespaces/a/sessions/" + s.ID + "/events", "/v1/namespaces/a/sessions", "/v1/namespaces/a/sessions/no-such-session"} {
		resp, body := f.do(t, runnerB, http.MethodGet, path, nil)
		if resp.StatusCode != http.StatusForbidden || strings.Contains(body, "hello a") || strings.Contains(body, `"id"`) {
			t.Errorf("b's token: GET %s answered %d %s, want 403", path, resp.StatusCode, body)
		}
	}
	if resp, body := f.do(t, runnerB, http.MethodPost, start, strings.NewReader("x")); resp.StatusCode != http.StatusForbidden {
		t.Errorf("b's token: start in a answered %d %s", resp.StatusCode, body)
	}
	for name, call := range map[string]func() error{
		"get": func() error {
			_, err := f.gw.GetSession(withToken(ctx, runnerB), &gatewayv1.SessionRef{Namespace: "a", Id: gs.Id})
			return err
		},
		"wait": func() error {
			_, err := f.gw.WaitSession(withToken(ctx, runnerB), &gatewayv1.WaitSessionRequest{Namespace: "a", Id: gs.Id})
			return err
		},
		"watch": func() error {
			st, err := f.gw.WatchSession(withToken(ctx, runnerB), &gatewayv1.SessionRef{Namespace: "a", Id: gs.Id})
			if err != nil {
				return err
			}
			_, err = st.Recv()
			return err
		},
	} {
		if err := call(); status.Code(err) != codes.PermissionDenied {
			t.Errorf("b's token: gRPC %s of a's session: %v, want PermissionDenied", name, err)
		}
	}
	// b's runner works in b.
	if resp, body := f.do(t, runnerB, http.MethodPost, "/v1/namespaces/b/workflows/echo/sessions", strings.NewReader("x")); resp.StatusCode != http.StatusCreated {
		t.Errorf("b's token in b: %d %s", resp.StatusCode, body)
	}
}

// reviews counts the reviews the gateway asks the API server for.
type reviews struct {
	client.Client
	n atomic.Int64
}

func (r *reviews) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	r.n.Add(1)
	return r.Client.Create(ctx, obj, opts...)
}

// TestAuthDecisionCache: a decision is reused for its TTL (one TokenReview
// and one SubjectAccessReview for many requests); a revoked binding stops
// working once the TTL has passed, a new one once the shorter denial TTL
// has.
func TestAuthDecisionCache(t *testing.T) {
	f := newFixture(t, nil)
	f.namespace(t, "a")
	token := f.serviceAccount(t, "a", "runner", "a")
	ctx := context.Background()
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	rc := &reviews{Client: f.k8s}
	auth := &gateway.KubeAuth{Client: rc, Now: clock, TTL: 10 * time.Second, DenyTTL: 2 * time.Second}
	start := gateway.Attributes{Verb: "create", Namespace: "a", Workflow: "echo"}

	for range 20 {
		if user, err := auth.Authorize(ctx, token, start); err != nil || user != "system:serviceaccount:a:runner" {
			t.Fatalf("runner: %q %v", user, err)
		}
	}
	if n := rc.n.Load(); n != 2 {
		t.Errorf("20 requests asked the API server %d times, want 2 (one TokenReview, one SubjectAccessReview)", n)
	}

	// Revoked: still allowed while the decision is fresh, refused after.
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "a-runner-sessions"}}
	if err := f.k8s.Delete(ctx, rb); err != nil {
		t.Fatal(err)
	}
	if _, err := auth.Authorize(ctx, token, start); err != nil {
		t.Errorf("within the TTL: %v", err)
	}
	advance(11 * time.Second)
	refused := func() bool {
		_, err := auth.Authorize(ctx, token, start)
		var ae *gateway.AuthError
		if errors.As(err, &ae) && ae.Code == http.StatusForbidden {
			return true
		}
		advance(3 * time.Second) // the API server's RBAC cache may lag: ask again
		return false
	}
	waitFor(t, "the revoked binding to be refused", refused)

	// Bound again: refused while the denial is fresh, allowed after.
	f.bind(t, "a", "runner", "a")
	if _, err := auth.Authorize(ctx, token, start); err == nil {
		t.Errorf("within the denial TTL: allowed")
	}
	waitFor(t, "the new binding to count", func() bool {
		advance(3 * time.Second)
		_, err := auth.Authorize(ctx, token, start)
		return err == nil
	})

	// A rejected token stays rejected; the cache stays bounded.
	small := &gateway.KubeAuth{Client: f.k8s, MaxEntries: 4}
	for i := range 10 {
		if _, err := small.Authorize(ctx, fmt.Sprintf("forged-%d", i), start); err == nil {
			t.Fatal("a forged token was accepted")
		}
	}
	if _, err := small.Authorize(ctx, token, start); err != nil {
		t.Errorf("after the cache turned over: %v", err)
	}
}
