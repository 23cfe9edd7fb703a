package engine

import (
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
