package engine

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// A restored session whose workflow is not loaded yet (the operator's
// reconcilers load workflows while the checkpoint is restored) waits for it
// until its deadline instead of expiring on the next tick.
func TestRestoredSessionWaitsForItsWorkflow(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	src := single(t, TriggerSpec{Name: "next", Bucket: "b", Primitive: Immediate, Targets: []string{"f"}})
	if _, err := src.StartSession(wfName, "s1", Object{Bucket: "in", Key: "x"}, t0); err != nil {
		t.Fatal(err)
	}

	e := New(0)
	if err := e.Restore(src.Snapshot()); err != nil {
		t.Fatal(err)
	}
	for _, a := range e.Tick(t0.Add(time.Second)) {
		if a.Kind == ActSessionExpired {
			t.Fatalf("session expired before its workflow was loaded: %+v", a)
		}
	}
	if e.Sessions() != 1 {
		t.Fatalf("sessions after tick without workflow: %d, want 1", e.Sessions())
	}

	// Loaded late, the workflow picks its session up where it was.
	if err := e.SetWorkflow(src.workflow(wfName).spec); err != nil {
		t.Fatal(err)
	}
	acts := e.ObjectReady(wfName, Object{Bucket: "b", Key: "k", Session: "s1"}, t0.Add(2*time.Second))
	if len(acts) != 1 || acts[0].Kind != ActInvoke || acts[0].Function != "f" {
		t.Fatalf("after the workflow loaded: %v", describe(acts))
	}

	// Without its workflow, a session still ends at its deadline.
	e.RemoveWorkflow(wfName)
	expired := false
	for _, a := range e.Tick(t0.Add(2 * time.Hour)) {
		expired = expired || a.Kind == ActSessionExpired
	}
	if !expired || e.Sessions() != 0 {
		t.Fatalf("past its deadline: expired=%v sessions=%d", expired, e.Sessions())
	}
}

// An empty object is an object: it survives a checkpoint (issue 15, item 7).
func TestEmptyInlineSurvivesSnapshot(t *testing.T) {
	e := single(t, TriggerSpec{Name: "batch", Bucket: "b", Primitive: ByBatchSize, BatchSize: 2, Targets: []string{"f"}})
	start("s1")(e, t0)
	e.ObjectReady(wfName, Object{Bucket: "b", Key: "empty", Session: "s1", Inline: []byte{}}, t0)
	data, err := e.Snapshot().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	snap, err := UnmarshalSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	restored := single(t, TriggerSpec{Name: "batch", Bucket: "b", Primitive: ByBatchSize, BatchSize: 2, Targets: []string{"f"}})
	if err := restored.Restore(snap); err != nil {
		t.Fatal(err)
	}
	acts := restored.ObjectReady(wfName, Object{Bucket: "b", Key: "full", Session: "s1", Inline: []byte("x")}, t0)
	if len(acts) != 1 || len(acts[0].Objects) != 2 {
		t.Fatalf("after restore: %v", describe(acts))
	}
	if o := acts[0].Objects[0]; o.Key != "empty" || o.Inline == nil {
		t.Fatalf("the empty object came back without contents: %#v (snapshot %s)", o, data)
	}
}

// A new owner never hands out an invocation id its predecessor handed out
// after the snapshot it restored (issue 32, defect 3): the predecessor's
// invocation may still report, and its events would be taken for the new
// one's (or refused as another pod's). Twice restored from the same
// snapshot without a save in between, the ids still do not meet, as long
// as the jump is saved (the orchestrator's claim) before ids are issued.
func TestRestoredSessionsNeverReuseInvocationIDs(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	old := single(t, TriggerSpec{Name: "next", Bucket: "b", Primitive: Immediate, Targets: []string{"f"}})
	if _, err := old.StartSession(wfName, "s1", Object{Bucket: "in", Key: "x"}, t0); err != nil {
		t.Fatal(err)
	}
	snap := old.Snapshot()
	seen := map[string]string{}
	issue := func(e *Engine, who, key string) {
		t.Helper()
		for _, a := range e.ObjectReady(wfName, Object{Bucket: "b", Key: key, Session: "s1"}, t0.Add(time.Second)) {
			if a.Kind != ActInvoke {
				continue
			}
			if prev, ok := seen[a.Invocation]; ok {
				t.Fatalf("invocation id %s handed out by %s and again by %s", a.Invocation, prev, who)
			}
			seen[a.Invocation] = who
		}
	}
	issue(old, "the old owner after its last save", "k1")
	next := New(0)
	if err := next.SetWorkflow(old.workflow(wfName).spec); err != nil {
		t.Fatal(err)
	}
	if err := next.Restore(snap); err != nil {
		t.Fatal(err)
	}
	claimed := next.Snapshot() // the claim's save
	issue(next, "the next owner", "k2")
	third := New(0)
	if err := third.SetWorkflow(old.workflow(wfName).spec); err != nil {
		t.Fatal(err)
	}
	if err := third.Restore(claimed); err != nil {
		t.Fatal(err)
	}
	issue(third, "the owner after it", "k3")
	if len(seen) != 3 {
		t.Fatalf("ids: %v", seen)
	}
}

// An owner that decided invocations after its last save and crashed
// leaves orphans: their sidecars report outputs and outcomes to the next
// owner, whose restored state never decided them. Counted as invocations
// the engine did not issue, they held the triggers: a DynamicGroup waits
// for the session to be quiescent, and the orphans' outcomes, with outputs
// it would not count, kept it busy for ever (the chaos checker's stuck fan
// sessions: entry finished, reduce ran three times, collect never came).
// Now the restored engine drops an orphan's events, and the outcome that
// made the lost decision, sent again, makes it decide again under new ids.
func TestOrphansOfALostDecisionDoNotHoldTheTriggers(t *testing.T) {
	triggers := []TriggerSpec{
		{Name: "by-group", Bucket: "shuffle", Primitive: DynamicGroup, GroupMetadataKey: "g", Sources: []string{"entry"}, Targets: []string{"reduce"}},
		{Name: "gather", Bucket: "groups", Primitive: DynamicJoin, Targets: []string{"collect"}},
	}
	old := single(t, triggers...)
	acts, err := old.StartSession(wfName, "s1", Object{Inline: []byte("in")}, t0)
	if err != nil || len(acts) != 1 {
		t.Fatal(acts, err)
	}
	entry := acts[0].Invocation
	snap := old.Snapshot() // the last save: entry running
	// The old owner goes on: entry's outputs and outcome, three reduces
	// decided and run; then it is SIGKILLed before its next save.
	var shuffle []Object
	for i := range 6 {
		o := Object{Bucket: "shuffle", Key: fmt.Sprintf("k%d", i), Session: "s1", Metadata: map[string]string{"g": fmt.Sprintf("g%d", i%3)}, Producer: "entry", Invocation: entry}
		shuffle = append(shuffle, o)
		old.ObjectReady(wfName, o, t0)
	}
	var reduces []string
	for _, a := range old.FunctionEnded(wfName, "s1", "entry", entry, Finish{Outputs: 6}, t0) {
		if a.Kind == ActInvoke && a.Function == "reduce" {
			reduces = append(reduces, a.Invocation)
		}
	}
	if len(reduces) != 3 {
		t.Fatalf("the old owner decided %v, want 3 reduces", reduces)
	}

	e := single(t, triggers...)
	if err := e.Restore(snap); err != nil {
		t.Fatal(err)
	}
	// What the sidecars kept unacknowledged reaches the new owner: the
	// orphan reduces' outputs and outcomes first, then entry's.
	var fired []Action
	for i, r := range reduces {
		fired = append(fired, e.ObjectReady(wfName, Object{Bucket: "groups", Key: fmt.Sprintf("g%d", i), Session: "s1", Producer: "reduce", Invocation: r,
			Metadata: map[string]string{MetaExpectedCount: "3"}}, t0)...)
		fired = append(fired, e.FunctionEnded(wfName, "s1", "reduce", r, Finish{Outputs: 1}, t0)...)
	}
	for _, o := range shuffle {
		fired = append(fired, e.ObjectReady(wfName, o, t0)...)
	}
	fired = append(fired, e.FunctionEnded(wfName, "s1", "entry", entry, Finish{Outputs: 6}, t0)...)
	var again []string
	for _, a := range fired {
		if a.Kind == ActInvoke && a.Function == "reduce" {
			again = append(again, a.Invocation)
		} else if a.Kind != ActInvoke || a.Function != "reduce" {
			t.Fatalf("unexpected action %v", describe([]Action{a}))
		}
	}
	if len(again) != 3 {
		t.Fatalf("the new owner decided %v after entry's outcome, want the 3 reduces again (the session would be stuck)", describe(fired))
	}
	// The new decisions run to the end: collect once, then the session
	// completes.
	var collect []Action
	for i, r := range again {
		if r == reduces[i] {
			t.Fatalf("reduce id %s handed out again", r)
		}
		collect = append(collect, e.ObjectReady(wfName, Object{Bucket: "groups", Key: fmt.Sprintf("g%d", i), Session: "s1", Producer: "reduce", Invocation: r,
			Metadata: map[string]string{MetaExpectedCount: "3"}}, t0)...)
		collect = append(collect, e.FunctionEnded(wfName, "s1", "reduce", r, Finish{Outputs: 1}, t0)...)
	}
	if d := describe(collect); len(d) != 1 || !strings.HasPrefix(d[0], "collect") {
		t.Fatalf("after the new reduces: %v, want collect once", d)
	}
}
