package engine

import (
	"testing"
	"time"
)

// A function that fails with no re-execution rule ends the session in the
// engine too: it reports why, drops the session's objects and fires nothing
// for the session's other branches afterwards.
func TestFailedFunctionEndsSession(t *testing.T) {
	branches := []TriggerSpec{
		{Name: "a", Bucket: "a", Primitive: Immediate, Targets: []string{"fa"}},
		{Name: "b", Bucket: "b", Primitive: Immediate, Targets: []string{"fb"},
			Reruns: []RerunRule{{SourceFunction: "covered", Timeout: time.Second, MaxAttempts: 1}}},
	}
	runTable(t, []tableCase{
		{"an uncovered failure fails the session", branches, []step{
			{do: start("s1")},
			{do: put("s1", "a", "k1"), want: []string{"fa[k1]"}},
			{do: ended("s1", "fa", "s1.1", true), want: []string{"failed", "drop"}},
			{do: put("s1", "b", "k2")},
			{do: tick()},
			{at: 2 * time.Hour, do: tick()},
		}},
		{"a failure a re-execution rule covers leaves the session running", branches, []step{
			{do: start("s1")},
			{do: began("s1", "covered", "s1.7")},
			{do: ended("s1", "covered", "s1.7", true)},
			{do: put("s1", "b", "k"), want: []string{"fb[k]"}},
		}},
	})
}

// An expired session, too, drops its objects once.
func TestFailedSessionLeavesNothingRunning(t *testing.T) {
	e := single(t, TriggerSpec{Name: "a", Bucket: "a", Primitive: Immediate, Targets: []string{"fa"}})
	start("s1")(e, t0)
	e.FunctionFinished(wfName, "s1", "entry", "s1.0", true, t0)
	if n := e.Sessions(); n != 0 {
		t.Fatalf("%d sessions still running after a function failed with no re-execution rule", n)
	}
	if acts := e.ObjectReady(wfName, Object{Bucket: "a", Key: "late", Session: "s1"}, t0); len(acts) != 0 {
		t.Fatalf("a failed session still fires: %v", describe(acts))
	}
}
