package gateway_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// pacedTotal is ziptrail_gateway_refusals_paced_total.
func pacedTotal(t *testing.T) float64 {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "ziptrail_gateway_refusals_paced_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// TestRefusedRequestsArePacedPerConnection: a connection whose requests
// are refused (here 401) faster than RefusalsPerSecond has its next
// requests wait, each still answered 401; a connection within the rate,
// and a client on another connection, never wait (issue 33: a loop of
// refused session starts from one tenant was served 4,000 times a second
// and slowed the others').
func TestRefusedRequestsArePacedPerConnection(t *testing.T) {
	h := gateway.New(&gateway.Handler{Sessions: sessions.NewRegistry(), Auth: tokenAuth{}, RefusalsPerSecond: 50})
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnContext = h.ConnContext
	srv.Start()
	defer srv.Close()
	url := srv.URL + "/v1/namespaces/team-a/sessions?workflow=wf"
	// Each client its own connection (keep-alive: one after another).
	do := func(c *http.Client, token string) int {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	attacker := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	other := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	before := pacedTotal(t)
	for i := 0; i < 40; i++ { // within the burst of 50
		if code := do(attacker, "forged"); code != http.StatusUnauthorized {
			t.Fatalf("request %d: %d", i, code)
		}
	}
	if n := pacedTotal(t) - before; n != 0 {
		t.Fatalf("%v requests paced within the rate", n)
	}
	for i := 0; i < 30; i++ {
		if code := do(attacker, "forged"); code != http.StatusUnauthorized {
			t.Fatalf("request %d past the rate: %d", i, code)
		}
	}
	paced := pacedTotal(t) - before
	if paced == 0 {
		t.Fatal("no request paced after 70 refusals on one connection at a rate of 50 a second, bursts of 50")
	}
	for i := 0; i < 20; i++ {
		if code := do(other, "good"); code != http.StatusOK {
			t.Fatalf("another client's request %d: %d", i, code)
		}
	}
	if n := pacedTotal(t) - before; n != paced {
		t.Errorf("another connection's accepted requests were paced (%v more)", n-paced)
	}
}

// TestRequestsForwardedByAReplicaAreNotPaced: a replica's connections to
// another carry every client's forwarded requests, so refusals on them are
// not paced (the forwarding replica paced its client's own connection);
// the same header from an address that is no replica's is paced as any
// request (anyone can set it).
func TestRequestsForwardedByAReplicaAreNotPaced(t *testing.T) {
	for _, c := range []struct {
		name  string
		peers peersAt
		paced bool
	}{{"from a replica", peersAt{"127.0.0.1:9"}, false}, {"from elsewhere", peersAt{"10.9.9.9:9"}, true}} {
		t.Run(c.name, func(t *testing.T) {
			h := gateway.New(&gateway.Handler{Sessions: sessions.NewRegistry(), Auth: tokenAuth{}, RefusalsPerSecond: 5, Owners: c.peers})
			srv := httptest.NewUnstartedServer(h)
			srv.Config.ConnContext = h.ConnContext
			srv.Start()
			defer srv.Close()
			client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
			before := pacedTotal(t)
			for i := 0; i < 12; i++ {
				req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/namespaces/team-a/sessions/s1", nil)
				req.Header.Set("Authorization", "Bearer forged")
				req.Header.Set(gateway.ProxiedHeader, "1")
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusUnauthorized {
					t.Fatalf("request %d: %d", i, resp.StatusCode)
				}
			}
			if got := pacedTotal(t) > before; got != c.paced {
				t.Errorf("12 refusals on one connection at 5 a second paced: %v, want %v", got, c.paced)
			}
		})
	}
}
