package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// owners is a fixed ownership: workflow (ns/name) -> owner address, or
// moving (no owner now).
type owners struct {
	mu     sync.Mutex
	at     map[string]string
	moving bool
}

func (o *owners) Route(_ context.Context, ns, wf string) (string, string, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.moving {
		return "", "b7", errors.New("the bucket has no owner at the moment")
	}
	return o.at[ns+"/"+wf], "b7", nil
}

func (o *owners) Peers(context.Context) ([]string, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	seen := map[string]bool{}
	var out []string
	for _, a := range o.at {
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	return out, nil
}

// TestGatewayProxiesToTheOwner: two operator replicas (each its engine and
// gateway, on one API server); workflow team-a/far is served by replica B.
// Through replica A, a user starts its session, reads its state, waits
// for its result and lists it, over HTTP and gRPC, as if A served it: A
// authorizes each call and forwards it to B with the user's credentials.
// A caller without access, or without credentials, is refused by A and
// learns nothing of B; while the workflow has no owner, A answers 503.
func TestGatewayProxiesToTheOwner(t *testing.T) {
	a, b, alice, eve := twoReplicas(t)
	bHost := mustHost(t, b.url)
	httpOwners := &owners{at: map[string]string{"team-a/far": bHost}}
	a.h.Owners = httpOwners
	a.g.Owners = &owners{at: map[string]string{"team-a/far": b.grpcAddr}}

	resp, body := a.do(t, alice, http.MethodPost, "/v1/namespaces/team-a/workflows/far/sessions", strings.NewReader("over there"))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("start through A: %d %s", resp.StatusCode, body)
	}
	var s sessions.Session
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatal(err)
	}
	if gateway.WorkflowOfSession(s.ID) != "far" {
		t.Errorf("session id %q does not name its workflow", s.ID)
	}
	if _, err := a.orch.Sessions().Get(s.ID); err == nil {
		t.Errorf("replica A holds session %s: it was not forwarded", s.ID)
	}
	if _, err := b.orch.Sessions().Get(s.ID); err != nil {
		t.Errorf("the owner B does not hold session %s: %v", s.ID, err)
	}
	resp, body = a.do(t, alice, http.MethodGet, "/v1/namespaces/team-a/sessions/"+s.ID+"/result?wait=30s", nil)
	if resp.StatusCode != http.StatusOK || body != "over there" {
		t.Errorf("result through A: %d %q", resp.StatusCode, body)
	}
	resp, body = a.do(t, alice, http.MethodGet, "/v1/namespaces/team-a/sessions", nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, s.ID) {
		t.Errorf("A's listing of team-a (every replica's): %d %s", resp.StatusCode, body)
	}
	// The result's acknowledgement and keyed starts go to the owner too.
	if resp, body := a.do(t, alice, http.MethodDelete, "/v1/namespaces/team-a/sessions/"+s.ID+"/result", nil); resp.StatusCode != http.StatusNoContent {
		t.Errorf("ack through A: %d %s", resp.StatusCode, body)
	}
	var keyed []string
	for range 2 {
		resp, body := a.doHeader(t, alice, http.MethodPost, "/v1/namespaces/team-a/workflows/far/sessions", strings.NewReader("k"), http.Header{"Idempotency-Key": {"through-a"}})
		var ks sessions.Session
		if resp.StatusCode != http.StatusCreated || json.Unmarshal([]byte(body), &ks) != nil {
			t.Fatalf("keyed start through A: %d %s", resp.StatusCode, body)
		}
		keyed = append(keyed, ks.ID)
	}
	if keyed[0] != keyed[1] {
		t.Errorf("keyed starts through A answered %v, want one session", keyed)
	}

	// Refused by A itself, with nothing about B.
	for _, c := range []struct {
		name, token, method, path string
		code                      int
	}{
		{"no credentials", "", http.MethodPost, "/v1/namespaces/team-a/workflows/far/sessions", http.StatusUnauthorized},
		{"forged token", "not-a-token", http.MethodGet, "/v1/namespaces/team-a/sessions/" + s.ID, http.StatusUnauthorized},
		{"another namespace's user", eve, http.MethodPost, "/v1/namespaces/team-a/workflows/far/sessions", http.StatusForbidden},
		{"another namespace's user reading", eve, http.MethodGet, "/v1/namespaces/team-a/sessions/" + s.ID + "/result", http.StatusForbidden},
		{"another namespace's user acknowledging", eve, http.MethodDelete, "/v1/namespaces/team-a/sessions/" + s.ID + "/result", http.StatusForbidden},
		{"another namespace's user listing", eve, http.MethodGet, "/v1/namespaces/team-a/sessions", http.StatusForbidden},
	} {
		resp, body := a.do(t, c.token, c.method, c.path, strings.NewReader("x"))
		if resp.StatusCode != c.code {
			t.Errorf("%s: %d %s, want %d", c.name, resp.StatusCode, body, c.code)
		}
		if strings.Contains(body, bHost) || strings.Contains(body, "b7") {
			t.Errorf("%s: the answer names the owner: %s", c.name, body)
		}
	}

	// gRPC through A.
	ctx := withToken(context.Background(), alice)
	gs, err := a.gw.StartSession(ctx, &gatewayv1.StartSessionRequest{Namespace: "team-a", Workflow: "far", Input: []byte("by grpc")})
	if err != nil {
		t.Fatalf("gRPC start through A: %v", err)
	}
	res, err := a.gw.WaitSession(ctx, &gatewayv1.WaitSessionRequest{Namespace: "team-a", Id: gs.Id, TimeoutMs: 30000})
	if err != nil || string(res.Result) != "by grpc" {
		t.Errorf("gRPC wait through A: %v %q", err, res.GetResult())
	}
	if _, err := a.gw.AckResult(ctx, &gatewayv1.AckResultRequest{Namespace: "team-a", Id: gs.Id}); err != nil {
		t.Errorf("gRPC ack through A: %v", err)
	}
	kctx := metadata.AppendToOutgoingContext(ctx, "idempotency-key", "through-a")
	if ks, err := a.gw.StartSession(kctx, &gatewayv1.StartSessionRequest{Namespace: "team-a", Workflow: "far", Input: []byte("k")}); err != nil || ks.Id != keyed[0] {
		t.Errorf("gRPC keyed start through A: %v %v, want session %s", ks.GetId(), err, keyed[0])
	}
	rs, err := a.gw.ReadResult(ctx, &gatewayv1.SessionRef{Namespace: "team-a", Id: gs.Id})
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	for {
		ch, err := rs.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("gRPC ReadResult through A: %v", err)
		}
		got = append(got, ch.Data...)
	}
	if string(got) != "by grpc" {
		t.Errorf("gRPC ReadResult through A: %q", got)
	}
	_, err = a.gw.GetSession(withToken(context.Background(), eve), &gatewayv1.SessionRef{Namespace: "team-a", Id: gs.Id})
	if status.Code(err) != codes.PermissionDenied || strings.Contains(err.Error(), b.grpcAddr) {
		t.Errorf("gRPC: another namespace's user through A: %v, want PermissionDenied naming no owner", err)
	}

	// Nobody owns the workflow's bucket for a moment: retry later.
	httpOwners.mu.Lock()
	httpOwners.moving = true
	httpOwners.mu.Unlock()
	resp, body = a.do(t, alice, http.MethodPost, "/v1/namespaces/team-a/workflows/far/sessions", strings.NewReader("x"))
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("start while the bucket moves: %d %s (Retry-After %q), want 503 with Retry-After", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
}

// twoReplicas are two operator replicas (each its engine and gateway) on
// one API server; B has workflow team-a/far; alice may run team-a's
// sessions, eve only team-b's.
func twoReplicas(t *testing.T) (a, b *fixture, alice, eve string) {
	t.Helper()
	a = newFixture(t, nil)
	b = fixtureOn(t, a.env.Config, nil)
	a.namespace(t, "team-a")
	a.namespace(t, "team-b")
	b.workflow(t, "team-a", "far", echo)
	return a, b, a.serviceAccount(t, "team-a", "alice", "team-a"), a.serviceAccount(t, "team-b", "eve", "team-b")
}

func mustHost(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// TestForgedProxiedHeader: a client sends replica A, which does not serve
// team-a/far, the mark of a request another replica forwarded
// (Ziptrail-Proxied, or the gRPC metadata ziptrail-proxied), straight to
// A's ports. The mark grants nothing: outsiders are refused as before and
// learn nothing of the owner; an authorized caller gets 503 with
// Retry-After (never a session started on an engine that does not hold
// the workflow, nor a 404 for a session that exists on the owner); the
// owner B still answers forwarded requests as before.
func TestForgedProxiedHeader(t *testing.T) {
	a, b, alice, eve := twoReplicas(t)
	bHost := mustHost(t, b.url)
	a.h.Owners = &owners{at: map[string]string{"team-a/far": bHost}}
	a.g.Owners = &owners{at: map[string]string{"team-a/far": b.grpcAddr}}
	b.h.Owners = &owners{at: map[string]string{}} // B serves it
	b.g.Owners = &owners{at: map[string]string{}}

	resp, body := a.do(t, alice, http.MethodPost, "/v1/namespaces/team-a/workflows/far/sessions", strings.NewReader("real"))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("start through A: %d %s", resp.StatusCode, body)
	}
	var s sessions.Session
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatal(err)
	}
	before := len(b.orch.Sessions().List("team-a", ""))

	forged := http.Header{gateway.ProxiedHeader: {"1"}}
	for _, c := range []struct {
		name, token, method, path string
		code                      int
	}{
		{"start", alice, http.MethodPost, "/v1/namespaces/team-a/workflows/far/sessions", http.StatusServiceUnavailable},
		{"state", alice, http.MethodGet, "/v1/namespaces/team-a/sessions/" + s.ID, http.StatusServiceUnavailable},
		{"result", alice, http.MethodGet, "/v1/namespaces/team-a/sessions/" + s.ID + "/result", http.StatusServiceUnavailable},
		{"no credentials", "", http.MethodPost, "/v1/namespaces/team-a/workflows/far/sessions", http.StatusUnauthorized},
		{"forged token", "not-a-token", http.MethodGet, "/v1/namespaces/team-a/sessions/" + s.ID, http.StatusUnauthorized},
		{"another namespace's user", eve, http.MethodPost, "/v1/namespaces/team-a/workflows/far/sessions", http.StatusForbidden},
		{"another namespace's user reading", eve, http.MethodGet, "/v1/namespaces/team-a/sessions/" + s.ID + "/result", http.StatusForbidden},
		{"another namespace's user listing", eve, http.MethodGet, "/v1/namespaces/team-a/sessions", http.StatusForbidden},
	} {
		resp, body := a.doHeader(t, c.token, c.method, c.path, strings.NewReader("forged"), forged)
		if resp.StatusCode != c.code {
			t.Errorf("%s with a forged %s: %d %s, want %d", c.name, gateway.ProxiedHeader, resp.StatusCode, body, c.code)
		}
		if c.code == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s with a forged %s: 503 without Retry-After", c.name, gateway.ProxiedHeader)
		}
		if strings.Contains(body, bHost) {
			t.Errorf("%s with a forged %s: the answer names the owner: %s", c.name, gateway.ProxiedHeader, body)
		}
	}
	if n := len(a.orch.Sessions().List("team-a", "")); n != 0 {
		t.Errorf("replica A, which does not serve team-a/far, holds %d sessions", n)
	}
	if n := len(b.orch.Sessions().List("team-a", "")); n != before {
		t.Errorf("the owner holds %d sessions after the forged calls, want %d", n, before)
	}

	// gRPC, the same mark in metadata.
	forgedCtx := func(token string) context.Context {
		return metadata.AppendToOutgoingContext(withToken(context.Background(), token), "ziptrail-proxied", "1")
	}
	_, err := a.gw.StartSession(forgedCtx(alice), &gatewayv1.StartSessionRequest{Namespace: "team-a", Workflow: "far", Input: []byte("forged")})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("gRPC start with a forged mark: %v, want Unavailable", err)
	}
	_, err = a.gw.GetSession(forgedCtx(alice), &gatewayv1.SessionRef{Namespace: "team-a", Id: s.ID})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("gRPC state with a forged mark: %v, want Unavailable (not NotFound)", err)
	}
	_, err = a.gw.GetSession(forgedCtx(eve), &gatewayv1.SessionRef{Namespace: "team-a", Id: s.ID})
	if status.Code(err) != codes.PermissionDenied || strings.Contains(err.Error(), b.grpcAddr) {
		t.Errorf("gRPC: another namespace's user with a forged mark: %v, want PermissionDenied naming no owner", err)
	}

	// Forwarded requests still reach the owner's engine, which answers them.
	resp, body = a.do(t, alice, http.MethodGet, "/v1/namespaces/team-a/sessions/"+s.ID+"/result?wait=30s", nil)
	if resp.StatusCode != http.StatusOK || body != "real" {
		t.Errorf("result through A: %d %q", resp.StatusCode, body)
	}
	resp, body = a.do(t, alice, http.MethodGet, "/v1/namespaces/team-a/sessions", nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, s.ID) {
		t.Errorf("A's listing of team-a (every replica's): %d %s", resp.StatusCode, body)
	}
}
