package orchestrator

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// TestShardedListingAgreesWithOneRegistry: the sessions of a namespace
// spread over the buckets a replica serves are listed in the order one
// registry holding them all lists them: newest first (ties by id), what
// `ziptrail sessions` shows. Issue 31: the sharded listing sorted oldest
// first, the unsharded one newest first.
func TestShardedListingAgreesWithOneRegistry(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	var at time.Time
	clock := func() time.Time { return at }
	one := sessions.NewRegistry()
	one.Now = clock
	s := &Sharded{shards: map[string]*shard{}}
	var regs []*sessions.Registry
	for i := range 3 {
		r := sessions.NewRegistry()
		r.Now = clock
		regs = append(regs, r)
		s.shards[fmt.Sprintf("bucket-%d", i)] = &shard{o: &Orchestrator{sessions: r}}
	}
	// Starts interleaved across the buckets, two at the same instant.
	starts := []time.Duration{5, 1, 9, 3, 7, 7, 2}
	for i, d := range starts {
		at = base.Add(d * time.Second)
		id := fmt.Sprintf("wf-%012x", i)
		for _, r := range []*sessions.Registry{one, regs[i%len(regs)]} {
			if err := r.Start(id, "team-a", "wf"); err != nil {
				t.Fatal(err)
			}
		}
	}
	ids := func(list []sessions.Session) []string {
		var out []string
		for _, s := range list {
			out = append(out, s.ID)
		}
		return out
	}
	want := ids(one.List("team-a", ""))
	got := ids(s.Sessions().List("team-a", ""))
	if !slices.Equal(got, want) {
		t.Fatalf("sharded listing %v, one registry's %v", got, want)
	}
	list := one.List("team-a", "")
	for i := 1; i < len(list); i++ {
		if list[i].Started.After(list[i-1].Started) {
			t.Fatalf("listing not newest first: %v", want)
		}
	}
	if want[0] != "wf-000000000002" || want[len(want)-1] != "wf-000000000001" {
		t.Errorf("listing %v: want the session started last (wf-…2) first and the first one (wf-…1) last", want)
	}
}
