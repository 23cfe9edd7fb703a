package orchestrator

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// countsWorkflow: split puts k0, k1, k2 into items; "each" fires once per
// item and invokes work and audit (two targets, one firing); work puts its
// item into done, where "join" waits for all three and invokes finish. The
// join's rule speculates on work after half of a wave finished: work's
// first execution for k1 hangs until release is closed, so k1 gets one
// speculative copy, which finishes the session.
func countsWorkflow(t *testing.T, release <-chan struct{}) (*v1alpha1.Workflow, *servers.Functions) {
	wf := testWorkflow("cnt", "split", "split", "work", "audit", "finish")
	wf.Spec.SessionDeadline = &metav1.Duration{Duration: 30 * time.Second}
	half := int32(50)
	wf.Spec.Triggers = []v1alpha1.NamedTrigger{
		{Name: "each", Spec: v1alpha1.TriggerSpec{Bucket: "items", Primitive: v1alpha1.Immediate, Targets: []string{"work", "audit"}}},
		{Name: "join", Spec: v1alpha1.TriggerSpec{Bucket: "done", Primitive: v1alpha1.BySet, BySet: &v1alpha1.BySetParams{Keys: []string{"k0", "k1", "k2"}},
			Targets: []string{"finish"},
			Reexecution: []v1alpha1.ReexecutionRule{{SourceFunction: "work", Scope: v1alpha1.RerunPerObject,
				Timeout: metav1.Duration{Duration: time.Minute}, MaxAttempts: 1, SpeculateAfter: &half}}}},
	}
	fns := &servers.Functions{}
	fns.Add(t, "cnt-split", ziptrail.FunctionHandler(func(ctx context.Context, _ *ziptrail.Invocation) ([]byte, error) {
		return nil, sendAll(ctx, "items", "k0", "k0", "items", "k1", "k1", "items", "k2", "k2")
	}))
	fns.Add(t, "cnt-work", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		k := string(inv.Objects[0].Bytes())
		if k == "k1" && inv.Attempt == 0 {
			select { // the straggler
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil, ziptrail.SendObject(ctx, "done", k, []byte(k), nil)
	}))
	fns.Add(t, "cnt-audit", ziptrail.FunctionHandler(func(context.Context, *ziptrail.Invocation) ([]byte, error) { return nil, nil }))
	fns.Add(t, "cnt-finish", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		return nil, ziptrail.SendObject(ctx, "output", "result", []byte("done"), nil)
	}))
	return wf, fns
}

// wantCounts compares what TriggerCounts reports with the expected
// firings, re-executions and speculative copies of each trigger.
func countsMatch(got map[string]v1alpha1.TriggerStatus, want map[string][3]int64) bool {
	if len(got) != len(want) {
		return false
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok || g.Firings != w[0] || g.Reexecutions != w[1] || g.SpeculativeCopies != w[2] || (w[0] > 0) != (g.LastFiredTime != nil) {
			return false
		}
	}
	return true
}

// A trigger's firings count once per firing (not per target), its rules'
// re-executions and speculative copies count on it, and the counts survive
// a new leader taking over from the checkpoint, and go on from there.
func TestTriggerCountsSurviveRestore(t *testing.T) {
	redis := servers.StartRedis(t)
	store := &checkpoint.Store{Client: redis.Client, Key: "ziptrail:test:counts"}
	release := make(chan struct{})
	wf, fns := countsWorkflow(t, release)
	t.Cleanup(func() { close(release) }) // before the servers close

	start := func() (*Orchestrator, func()) {
		o, err := New(Options{Resolver: fns, Checkpoint: store, CheckpointInterval: 20 * time.Millisecond, Log: logr.Discard()})
		if err != nil {
			t.Fatal(err)
		}
		if err := o.SetWorkflow(wf, true, ""); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- o.Run(ctx) }()
		return o, func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}

	first, stop := start()
	if s, result := session(t, first, wf, "in"); s.State != sessions.Completed || result != "done" {
		t.Fatalf("session %s %s (%s): result %q", s.ID, s.State, s.Error, result)
	}
	// each: 3 firings of 2 targets; join: 1 firing, k1's speculative copy.
	want := map[string][3]int64{"each": {3, 0, 0}, "join": {1, 1, 1}}
	var got map[string]v1alpha1.TriggerStatus
	waitFor(t, "the counts", func() bool { got = first.TriggerCounts("ns", "cnt"); return countsMatch(got, want) })
	if other := first.TriggerCounts("ns", "other"); len(other) != 0 {
		t.Errorf("counts of a workflow never loaded: %+v", other)
	}
	// Saves write only what changed: wait for the one with the counts.
	waitFor(t, "a checkpoint with the counts", func() bool {
		data, _, _, _ := store.Load(context.Background())
		var st state
		_ = json.Unmarshal(data, &st)
		saved := st.Triggers["ns/cnt"]
		return saved["each"].Firings == 3 && saved["join"].Firings == 1 && saved["join"].SpeculativeCopies == 1
	})
	stop()

	// A new leader: the counts come back from the checkpoint.
	second, stop2 := start()
	defer stop2()
	waitFor(t, "the counts restored", func() bool { got = second.TriggerCounts("ns", "cnt"); return countsMatch(got, want) })
	if !got["each"].LastFiredTime.Equal(first.TriggerCounts("ns", "cnt")["each"].LastFiredTime) {
		t.Errorf("lastFiredTime %v after the restore, want %v", got["each"].LastFiredTime, first.TriggerCounts("ns", "cnt")["each"].LastFiredTime)
	}
	// ... and go on from there.
	if s, result := session(t, second, wf, "in"); s.State != sessions.Completed || result != "done" {
		t.Fatalf("second session %s %s (%s): result %q", s.ID, s.State, s.Error, result)
	}
	want = map[string][3]int64{"each": {6, 0, 0}, "join": {2, 2, 2}}
	waitFor(t, "the counts of both sessions", func() bool { got = second.TriggerCounts("ns", "cnt"); return countsMatch(got, want) })

	// A trigger the workflow no longer declares loses its counts; a
	// removed workflow loses all.
	wf2 := wf.DeepCopy()
	wf2.Spec.Triggers = wf2.Spec.Triggers[1:]
	if err := second.SetWorkflow(wf2, true, ""); err != nil {
		t.Fatal(err)
	}
	if got := second.TriggerCounts("ns", "cnt"); len(got) != 1 || got["join"].Firings != 2 {
		t.Errorf("after dropping trigger each: %+v", got)
	}
	second.RemoveWorkflow("ns", "cnt")
	if got := second.TriggerCounts("ns", "cnt"); len(got) != 0 {
		t.Errorf("after removing the workflow: %+v", got)
	}
}

// A checkpoint written before the counts were kept restores as no counts.
func TestTriggerCountsFromOldCheckpoint(t *testing.T) {
	c := newTriggerCounts()
	c.setWorkflow(engineSpec(testWorkflow("w", "f", "f")))
	c.get("ns/w", "t").Firings = 4
	c.restore(nil)
	if got := c.export(); len(got) != 0 {
		t.Errorf("%+v", got)
	}
}
