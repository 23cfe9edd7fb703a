package engine

import (
	"testing"
	"time"
)

func TestReexecution(t *testing.T) {
	perObject := TriggerSpec{Name: "t", Bucket: "b", Primitive: Immediate, Targets: []string{"next"},
		Reruns: []RerunRule{{SourceFunction: "work", Scope: PerObject, Timeout: 100 * time.Millisecond, MaxAttempts: 2}}}
	perSession := perObject
	perSession.Reruns = []RerunRule{{SourceFunction: "work", Scope: PerSession, Timeout: 100 * time.Millisecond, MaxAttempts: 1}}
	ms := time.Millisecond
	runTable(t, []tableCase{
		{"output in time: no re-execution", []TriggerSpec{perObject}, []step{
			{do: start("s1")},
			{do: began("s1", "work", "s1.5")},
			{at: 50 * ms, do: putFrom("s1", "b", "k", "work", "s1.5"), want: []string{"next[k]"}},
			{at: 500 * ms, do: tick()},
		}},
		{"late output: re-executed with its arguments, up to maxAttempts", []TriggerSpec{perObject}, []step{
			{do: start("s1")},
			{do: began("s1", "work", "s1.5")},
			{at: 99 * ms, do: tick()},
			{at: 100 * ms, do: tick(), want: []string{"rerun:work#1"}},
			{at: 150 * ms, do: began("s1", "work", "s1.5.r1")},
			{at: 200 * ms, do: tick(), want: []string{"rerun:work#2"}},
			{at: 300 * ms, do: tick()}, // given up after two attempts
		}},
		{"the re-execution's output satisfies the original; the late original fires nothing twice", []TriggerSpec{perObject}, []step{
			{do: start("s1")},
			{do: began("s1", "work", "s1.5")},
			{at: 100 * ms, do: tick(), want: []string{"rerun:work#1"}},
			{at: 120 * ms, do: putFrom("s1", "b", "k", "work", "s1.5.r1"), want: []string{"next[k]"}},
			{at: 130 * ms, do: putFrom("s1", "b", "k", "work", "s1.5")},
			{at: 1000 * ms, do: tick()},
		}},
		{"per object: each invocation needs its own output", []TriggerSpec{perObject}, []step{
			{do: start("s1")},
			{do: began("s1", "work", "s1.1")},
			{do: began("s1", "work", "s1.2")},
			{at: 10 * ms, do: putFrom("s1", "b", "k1", "work", "s1.1"), want: []string{"next[k1]"}},
			{at: 100 * ms, do: tick(), want: []string{"rerun:work#1"}},
		}},
		{"per session: any output of the source will do", []TriggerSpec{perSession}, []step{
			{do: start("s1")},
			{do: began("s1", "work", "s1.1")},
			{do: began("s1", "work", "s1.2")},
			{at: 10 * ms, do: putFrom("s1", "b", "k1", "work", "s1.1"), want: []string{"next[k1]"}},
			{at: 100 * ms, do: tick()},
		}},
		{"sessions expire at their deadline", []TriggerSpec{perObject}, []step{
			{do: start("s1")},
			{at: time.Hour, do: tick(), want: []string{"expired"}},
			{at: time.Hour, do: put("s1", "b", "late")},
		}},
	})
}

// TestRerunActionCarriesArgs checks the re-invocation is self-contained.
func TestRerunActionCarriesArgs(t *testing.T) {
	e := single(t, TriggerSpec{Name: "t", Bucket: "b", Primitive: Immediate, Targets: []string{"n"},
		Reruns: []RerunRule{{SourceFunction: "work", Timeout: time.Second, MaxAttempts: 1}}})
	start("s1")(e, t0)
	e.FunctionStarted(wfName, "s1", "work", "s1.9", []byte("original args"), t0)
	acts := e.Tick(t0.Add(time.Second))
	if len(acts) != 1 || acts[0].Kind != ActRerun || string(acts[0].Args) != "original args" || acts[0].Invocation != "s1.9.r1" {
		t.Fatalf("%v", acts)
	}
	if next := e.NextDeadline(); !next.Equal(t0.Add(2 * time.Second)) {
		t.Errorf("next deadline %v", next)
	}
}

// A resent FunctionStarted (after the output arrived, or after the rule
// gave up) must not arm a new timeout (issue 15, item 11).
func TestDuplicateStartArmsNothing(t *testing.T) {
	trig := TriggerSpec{Name: "t", Bucket: "b", Primitive: Immediate, Targets: []string{"next"},
		Reruns: []RerunRule{{SourceFunction: "work", Scope: PerObject, Timeout: 100 * time.Millisecond, MaxAttempts: 1}}}
	ms := time.Millisecond
	runTable(t, []tableCase{
		{"after the output", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{do: began("s1", "work", "s1.5")},
			{at: 10 * ms, do: putFrom("s1", "b", "k", "work", "s1.5"), want: []string{"next[k]"}},
			{at: 50 * ms, do: began("s1", "work", "s1.5")},
			{at: 500 * ms, do: tick()},
		}},
		{"after the rule gave up", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{do: began("s1", "work", "s1.5")},
			{at: 100 * ms, do: tick(), want: []string{"rerun:work#1"}},
			{at: 200 * ms, do: tick()}, // given up
			{at: 250 * ms, do: began("s1", "work", "s1.5")},
			{at: 400 * ms, do: tick()},
		}},
	})
}
