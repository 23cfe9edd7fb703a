package orchestrator

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// A straggler overtaken by its speculative copy, through a real
// orchestrator, dispatcher and function servers: ten mappers feed a
// DynamicGroup and send completion markers to a ledger whose rule
// speculates after 90 % (as examples/sort does). Mapper 7's first execution
// hangs until the test ends; once the other nine sent their markers, its
// copy runs, and the session completes with all ten pieces, exactly once,
// long before the rule's timeout (a minute) — while the straggler still
// runs. Released afterwards, the straggler's duplicate outputs change
// nothing.
func TestSpeculativeCopyOvertakesStraggler(t *testing.T) {
	const mappers = 10
	wf := testWorkflow("spec", "split", "split", "map", "reduce")
	wf.Spec.SessionDeadline = &metav1.Duration{Duration: 30 * time.Second}
	x := int32(90)
	wf.Spec.Triggers = []v1alpha1.NamedTrigger{
		immediate("to-map", "chunks", "map"),
		{Name: "grp", Spec: v1alpha1.TriggerSpec{Bucket: "shuffle", Primitive: v1alpha1.DynamicGroup, Targets: []string{"reduce"},
			DynamicGroup: &v1alpha1.DynamicGroupParams{GroupMetadataKey: "group", Sources: []string{"split"}}}},
		{Name: "ledger", Spec: v1alpha1.TriggerSpec{Bucket: "ledger", Primitive: v1alpha1.DynamicJoin, DynamicJoin: &v1alpha1.DynamicJoinParams{},
			Targets: []string{"reduce"},
			Reexecution: []v1alpha1.ReexecutionRule{{SourceFunction: "map", Scope: v1alpha1.RerunPerObject,
				Timeout: metav1.Duration{Duration: time.Minute}, MaxAttempts: 1, SpeculateAfter: &x}}}},
	}
	fns := &servers.Functions{}
	fns.Add(t, "spec-split", ziptrail.FunctionHandler(func(ctx context.Context, _ *ziptrail.Invocation) ([]byte, error) {
		for m := 0; m < mappers; m++ {
			if err := ziptrail.SendObject(ctx, "chunks", fmt.Sprintf("c%d", m), []byte(fmt.Sprint(m)), nil); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}))
	release := make(chan struct{})
	var stragglerDone atomic.Bool
	var copies atomic.Int32
	fns.Add(t, "spec-map", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		m := string(inv.Objects[0].Bytes())
		if m == "7" {
			if inv.Attempt == 0 {
				<-release // the straggler
				defer stragglerDone.Store(true)
			} else {
				copies.Add(1)
			}
		}
		// The same keys whichever execution sends them; the marker last.
		if err := ziptrail.SendObject(ctx, "shuffle", "piece-"+m, []byte(m), map[string]string{"group": "g"}); err != nil {
			return nil, err
		}
		return nil, ziptrail.SendObject(ctx, "ledger", "done."+inv.ID, nil, nil)
	}))
	var reduces atomic.Int32
	fns.Add(t, "spec-reduce", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		reduces.Add(1)
		parts := inputs(inv)
		sort.Slice(parts, func(i, j int) bool { return len(parts[i]) < len(parts[j]) || parts[i] < parts[j] })
		return nil, ziptrail.SendObject(ctx, "output", "result", []byte(strings.Join(parts, ",")), nil)
	}))
	t.Cleanup(func() { // before the servers close (cleanups run last first)
		select {
		case <-release:
		default:
			close(release)
		}
	})
	o := runWorkflow(t, wf, fns)
	before := testutil.ToFloat64(speculativeCopies)
	start := time.Now()
	s, result := session(t, o, wf, "in")
	took := time.Since(start)
	if s.State != sessions.Completed || result != "0,1,2,3,4,5,6,7,8,9" {
		t.Fatalf("session %s %s (%s): result %q; its log: %+v", s.ID, s.State, s.Error, result, s.Events)
	}
	if stragglerDone.Load() {
		t.Fatal("the straggler finished first: nothing was overtaken")
	}
	if copies.Load() != 1 || reduces.Load() != 1 {
		t.Fatalf("%d copies of the straggler, %d reduces; want 1 and 1", copies.Load(), reduces.Load())
	}
	if got := testutil.ToFloat64(speculativeCopies) - before; got != 1 {
		t.Errorf("ziptrail_engine_speculative_copies_total rose by %v, want 1", got)
	}
	logged := false
	for _, ev := range s.Events {
		logged = logged || (ev.Kind == "Rerun" && strings.Contains(ev.Message, "speculative copy of map"))
	}
	if !logged {
		t.Errorf("no speculative copy in the session's log: %+v", s.Events)
	}
	t.Logf("completed in %v with the straggler still running (the rule's timeout is a minute)", took)

	// The straggler finishes late: its outputs are duplicates of a session
	// that has ended.
	close(release)
	waitFor(t, "the straggler's end", stragglerDone.Load)
	if reduces.Load() != 1 {
		t.Fatalf("the straggler's late outputs fired reduce again (%d)", reduces.Load())
	}
}

// The API's percentage is the engine's fraction; unset is no speculation.
func TestEngineRuleSpeculateAfter(t *testing.T) {
	x := int32(90)
	got := engineTrigger("t", v1alpha1.TriggerSpec{Bucket: "b", Primitive: v1alpha1.Immediate, Targets: []string{"f"},
		Reexecution: []v1alpha1.ReexecutionRule{
			{SourceFunction: "map", Timeout: metav1.Duration{Duration: time.Minute}, SpeculateAfter: &x},
			{SourceFunction: "merge", Timeout: metav1.Duration{Duration: time.Minute}, MaxAttempts: 2},
		}})
	if r := got.Reruns[0]; r.SpeculateAfter != 0.9 || r.MaxAttempts != 3 {
		t.Errorf("%+v", r)
	}
	if r := got.Reruns[1]; r.SpeculateAfter != 0 {
		t.Errorf("%+v", r)
	}
}
