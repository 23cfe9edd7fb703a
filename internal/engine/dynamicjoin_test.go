package engine

import (
	"testing"
	"time"
)

func TestDynamicJoin(t *testing.T) {
	trig := TriggerSpec{Name: "t", Bucket: "b", Primitive: DynamicJoin, Sources: []string{"split"}, Targets: []string{"merge"}}
	runTable(t, []tableCase{
		{"a declared key set", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{do: put("s1", "b", "p2")},
			{do: putFrom("s1", "b", "plan", "split", "s1.0", MetaExpectedKeys, "p1,p2", MetaDeclareOnly, "true")},
			{do: put("s1", "b", "p1"), want: []string{"merge[p1 p2]"}},
			{do: put("s1", "b", "p3")},
		}},
		{"a declared count", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{do: putFrom("s1", "b", "p1", "split", "s1.0", MetaExpectedCount, "3")},
			{do: put("s1", "b", "p2")},
			{do: put("s1", "b", "p3"), want: []string{"merge[p1 p2 p3]"}},
		}},
		{"only the sources may declare", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{do: putFrom("s1", "b", "p1", "intruder", "", MetaExpectedCount, "1")},
			{do: putFrom("s1", "b", "p2", "split", "", MetaExpectedCount, "2"), want: []string{"merge[p1 p2]"}},
		}},
		{"nothing fires before a declaration", []TriggerSpec{trig}, []step{
			{do: start("s1")}, {do: start("s2")},
			{do: put("s1", "b", "p1")},
			{do: putFrom("s2", "b", "p1", "split", "", MetaExpectedCount, "1"), want: []string{"merge[p1]"}},
		}},
	})
}

// Item 11 of issue 15: DynamicJoin edge cases.
func TestDynamicJoinEdgeCases(t *testing.T) {
	trig := TriggerSpec{Name: "t", Bucket: "b", Primitive: DynamicJoin, Sources: []string{"split"}, Targets: []string{"merge"}}
	rerun := trig
	rerun.Reruns = []RerunRule{{SourceFunction: "split", Scope: PerObject, Timeout: 100 * time.Millisecond, MaxAttempts: 1}}
	ms := time.Millisecond
	runTable(t, []tableCase{
		{"objects outside the declared keys are not members", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{do: put("s1", "b", "stray")},
			{do: putFrom("s1", "b", "plan", "split", "s1.0", MetaExpectedKeys, "p1,p2", MetaDeclareOnly, "true")},
			{do: put("s1", "b", "p1")},
			{do: put("s1", "b", "other")},
			{do: put("s1", "b", "p2"), want: []string{"merge[p1 p2]"}},
		}},
		{"non-members do not count toward a declared count", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{do: putFrom("s1", "b", "plan", "split", "s1.0", MetaExpectedKeys, "p1,p2", MetaExpectedCount, "2", MetaDeclareOnly, "true")},
			{do: put("s1", "b", "stray")},
			{do: put("s1", "b", "p1")},
			{do: put("s1", "b", "p2"), want: []string{"merge[p1 p2]"}},
		}},
		{"two producers' declarations: the join waits for both", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{do: began("s1", "split", "s1.5")},
			{do: began("s1", "split", "s1.6")},
			{do: putFrom("s1", "b", "plan-a", "split", "s1.5", MetaExpectedKeys, "p1", MetaDeclareOnly, "true")},
			{do: ended("s1", "split", "s1.5", false)},
			{do: put("s1", "b", "p1")},
			{do: putFrom("s1", "b", "plan-b", "split", "s1.6", MetaExpectedKeys, "q1", MetaDeclareOnly, "true")},
			{do: put("s1", "b", "q1")},
			{do: ended("s1", "split", "s1.6", false), want: []string{"merge[p1 q1]"}},
		}},
		{"members that each declare the total: the join waits for every producer", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{do: began("s1", "split", "s1.5")},
			{do: began("s1", "split", "s1.6")},
			{do: began("s1", "split", "s1.7")},
			{do: putFrom("s1", "b", "p1", "split", "s1.5", MetaExpectedCount, "3")},
			{do: ended("s1", "split", "s1.5", false)},
			{do: putFrom("s1", "b", "p2", "split", "s1.6", MetaExpectedCount, "3")},
			{do: putFrom("s1", "b", "p3", "split", "s1.7", MetaExpectedCount, "3")},
			{do: ended("s1", "split", "s1.6", false)},
			{do: ended("s1", "split", "s1.7", false), want: []string{"merge[p1 p2 p3]"}},
		}},
		{"a duplicate start after the output arrived re-executes nothing", []TriggerSpec{rerun}, []step{
			{do: start("s1")},
			{do: began("s1", "split", "s1.5")},
			{at: 10 * ms, do: putFrom("s1", "b", "p1", "split", "s1.5", MetaExpectedCount, "1")},
			{at: 20 * ms, do: ended("s1", "split", "s1.5", false), want: []string{"merge[p1]"}},
			{at: 50 * ms, do: began("s1", "split", "s1.5")}, // a resent FunctionStarted
			{at: 500 * ms, do: tick()},
		}},
	})
}
