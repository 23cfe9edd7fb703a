package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// allowAll authorizes every request (the listing's order is under test).
type allowAll struct{}

func (allowAll) Authorize(context.Context, string, gateway.Attributes) (string, error) {
	return "alice", nil
}

// peersAt is an ownership where every workflow is served here and the
// other replicas are at addrs.
type peersAt []string

func (peersAt) Route(context.Context, string, string) (string, string, error) { return "", "b0", nil }
func (p peersAt) Peers(context.Context) ([]string, error)                     { return p, nil }

// TestReplicasListingAgreesWithOneRegistry: a namespace's sessions spread
// over two replicas are listed through either in the order one registry
// holding them all lists them (newest first, ties by id). Issue 31: the
// gateway's listing across replicas sorted oldest first.
func TestReplicasListingAgreesWithOneRegistry(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	var at time.Time
	clock := func() time.Time { return at }
	one, ra, rb := sessions.NewRegistry(), sessions.NewRegistry(), sessions.NewRegistry()
	for _, r := range []*sessions.Registry{one, ra, rb} {
		r.Now = clock
	}
	for i, d := range []time.Duration{4, 8, 1, 8, 6, 2} {
		at = base.Add(d * time.Second)
		id := fmt.Sprintf("wf-%012x", i)
		for _, r := range []*sessions.Registry{one, []*sessions.Registry{ra, rb}[i%2]} {
			if err := r.Start(id, "team-a", "wf"); err != nil {
				t.Fatal(err)
			}
		}
	}
	b := httptest.NewServer(gateway.New(&gateway.Handler{Sessions: rb, Auth: allowAll{}, Owners: peersAt{}}))
	defer b.Close()
	a := httptest.NewServer(gateway.New(&gateway.Handler{Sessions: ra, Auth: allowAll{}, Owners: peersAt{strings.TrimPrefix(b.URL, "http://")}}))
	defer a.Close()

	resp, err := http.Get(a.URL + "/v1/namespaces/team-a/sessions")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list []sessions.Session
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("listing: %s, %v", resp.Status, err)
	}
	var got, want []string
	for _, s := range list {
		got = append(got, s.ID)
	}
	for _, s := range one.List("team-a", "") {
		want = append(want, s.ID)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("listing across replicas %v, one registry's %v (newest first)", got, want)
	}
}
