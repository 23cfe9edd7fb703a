package gateway_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// tokenAuth allows the bearer of token "good" only.
type tokenAuth struct{}

func (tokenAuth) Authorize(_ context.Context, token string, _ gateway.Attributes) (string, error) {
	if token != "good" {
		return "", &gateway.AuthError{Code: http.StatusUnauthorized, Msg: "no"}
	}
	return "alice", nil
}

func refused(t *testing.T, limit, ns string) float64 {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ziptrail_limits_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if got["limit"] == limit && got["namespace"] == ns {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func get(t *testing.T, url, token string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// TestRateLimitPerNamespace: each namespace has its own bucket of
// requests; past it, 429 naming the limit with Retry-After, counted, and
// another namespace is served as before. Unauthenticated requests spend
// nothing of a namespace's budget.
func TestRateLimitPerNamespace(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_700_000_000, 0)
	var refusals []string
	rl := &gateway.RateLimit{PerSecond: 2, Burst: 3,
		Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
		Refused: func(ns, wf string, err *gateway.LimitError) {
			mu.Lock()
			refusals = append(refusals, ns+"/"+wf+": "+err.Limit)
			mu.Unlock()
		}}
	srv := httptest.NewServer(gateway.New(&gateway.Handler{Sessions: sessions.NewRegistry(), Auth: tokenAuth{}, Limit: rl}))
	defer srv.Close()
	list := func(ns string) string { return srv.URL + "/v1/namespaces/" + ns + "/sessions?workflow=wf" }

	for range 10 { // refused before the limit is asked
		if resp, _ := get(t, list("team-a"), "forged"); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("a forged token: %s", resp.Status)
		}
	}
	for i := range 3 {
		if resp, body := get(t, list("team-a"), "good"); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d of a burst of 3: %s %s", i+1, resp.Status, body)
		}
	}
	before := refused(t, "requestsPerSecond", "team-a")
	resp, body := get(t, list("team-a"), "good")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the 4th request at once: %s, want 429", resp.Status)
	}
	var e struct{ Error string }
	_ = json.Unmarshal([]byte(body), &e)
	if !strings.Contains(e.Error, "namespace team-a") || !strings.Contains(e.Error, "the limit requestsPerSecond is 2 a second") {
		t.Errorf("429 says %q, want the namespace and the limit", e.Error)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "1" {
		t.Errorf("Retry-After %q, want 1", ra)
	}
	if got := refused(t, "requestsPerSecond", "team-a") - before; got != 1 {
		t.Errorf("ziptrail_limits_refused_total{requestsPerSecond,team-a} grew by %v, want 1", got)
	}
	mu.Lock()
	if len(refusals) != 1 || refusals[0] != "team-a/wf: requestsPerSecond" {
		t.Errorf("refusals reported: %q", refusals)
	}
	mu.Unlock()
	// Another namespace has its own budget.
	if resp, body := get(t, list("team-b"), "good"); resp.StatusCode != http.StatusOK {
		t.Fatalf("namespace team-b: %s %s", resp.Status, body)
	}
	// A second later, two more requests of team-a pass.
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	for i := range 2 {
		if resp, body := get(t, list("team-a"), "good"); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d a second later: %s %s", i+1, resp.Status, body)
		}
	}
	if resp, _ := get(t, list("team-a"), "good"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a third request in that second: %s, want 429", resp.Status)
	}
}

// limitedStarter refuses every start as the orchestrator does at a limit.
type limitedStarter struct{}

func (limitedStarter) Start(context.Context, string, string, io.Reader, int64) (string, error) {
	return "", &gateway.LimitError{Limit: "sessionsPerNamespace", Namespace: "team-a", RetryAfter: 5 * time.Second,
		Msg: "namespace team-a has 1000 running sessions, the limit sessionsPerNamespace is 1000"}
}

// TestStartOverLimitIs429: a start a limit refuses is answered 429 with
// the limit's message and Retry-After.
func TestStartOverLimitIs429(t *testing.T) {
	srv := httptest.NewServer(gateway.New(&gateway.Handler{Starter: limitedStarter{}, Sessions: sessions.NewRegistry(), Auth: tokenAuth{}}))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/namespaces/team-a/workflows/wf/sessions", strings.NewReader("in"))
	req.Header.Set("Authorization", "Bearer good")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct{ Error string }
	_ = json.NewDecoder(resp.Body).Decode(&e)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "5" ||
		e.Error != "namespace team-a has 1000 running sessions, the limit sessionsPerNamespace is 1000" {
		t.Fatalf("start over the limit: %s, Retry-After %q, %q", resp.Status, resp.Header.Get("Retry-After"), e.Error)
	}
}

// TestStartOverLimitIsResourceExhausted: over gRPC, the same refusal is
// RESOURCE_EXHAUSTED with the limit's message.
func TestStartOverLimitIsResourceExhausted(t *testing.T) {
	g := &gateway.GRPC{H: &gateway.Handler{Starter: limitedStarter{}, Sessions: sessions.NewRegistry(), Auth: tokenAuth{}, MaxInput: 1 << 20}}
	srv := grpc.NewServer(g.ServerOptions()...)
	gatewayv1.RegisterGatewayServer(srv, g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(g.Listener(ln)) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer good")
	_, err = gatewayv1.NewGatewayClient(conn).StartSession(ctx, &gatewayv1.StartSessionRequest{Namespace: "team-a", Workflow: "wf", Input: []byte("in")})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "the limit sessionsPerNamespace is 1000") {
		t.Fatalf("start over the limit: %v, want ResourceExhausted naming sessionsPerNamespace", err)
	}
}
