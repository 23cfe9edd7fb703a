package engine

import (
	"testing"
	"time"
)

func TestDynamicGroup(t *testing.T) {
	trig := TriggerSpec{Name: "t", Bucket: "shuffle", Primitive: DynamicGroup, GroupMetadataKey: "group", Sources: []string{"map"}, Targets: []string{"reduce"}}
	runTable(t, []tableCase{
		{"each group fires once all mappers are done", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{do: ended("s1", "entry", "s1.0", false)},
			{do: began("s1", "map", "s1.m1")},
			{do: began("s1", "map", "s1.m2")},
			{do: putFrom("s1", "shuffle", "m1-a", "map", "s1.m1", "group", "a")},
			{do: putFrom("s1", "shuffle", "m1-b", "map", "s1.m1", "group", "b")},
			{do: ended("s1", "map", "s1.m1", false)},
			{do: putFrom("s1", "shuffle", "m2-a", "map", "s1.m2", "group", "a")},
			{do: ended("s1", "map", "s1.m2", false), want: []string{"reduce{a}[m1-a m2-a]", "reduce{b}[m1-b]"}},
			{do: ended("s1", "map", "s1.m2", false)},
		}},
		{"a mapper not yet started keeps the groups open", []TriggerSpec{
			{Name: "fan", Bucket: "chunks", Primitive: Immediate, Targets: []string{"map"}}, trig}, []step{
			{do: start("s1")},
			{do: put("s1", "chunks", "c1"), want: []string{"map[c1]"}},
			{do: put("s1", "chunks", "c2"), want: []string{"map[c2]"}},
			{do: ended("s1", "entry", "s1.0", false)},
			// The engine dispatched s1.1 and s1.2; only one has run.
			{do: began("s1", "map", "s1.1")},
			{do: putFrom("s1", "shuffle", "x", "map", "s1.1", "group", "g")},
			{do: ended("s1", "map", "s1.1", false)},
			{do: began("s1", "map", "s1.2")},
			{do: ended("s1", "map", "s1.2", false), want: []string{"reduce{g}[x]"}},
		}},
		{"groups are per session", []TriggerSpec{trig}, []step{
			{do: start("s1")}, {do: start("s2")},
			{do: ended("s1", "entry", "s1.0", false)}, {do: ended("s2", "entry", "s2.0", false)},
			{do: began("s1", "map", "s1.m")}, {do: began("s2", "map", "s2.m")},
			{do: putFrom("s1", "shuffle", "k", "map", "s1.m", "group", "a")},
			{do: putFrom("s2", "shuffle", "k", "map", "s2.m", "group", "b")},
			{do: ended("s2", "map", "s2.m", false), want: []string{"reduce{b}[k]"}},
			{do: ended("s1", "map", "s1.m", false), want: []string{"reduce{a}[k]"}},
		}},
	})
}

// Item 10 of issue 15: a group may close only when nothing that could still
// dispatch a source is running.
func TestDynamicGroupWaitsForLaterMappers(t *testing.T) {
	trig := TriggerSpec{Name: "t", Bucket: "shuffle", Primitive: DynamicGroup, GroupMetadataKey: "group", Sources: []string{"map"}, Targets: []string{"reduce"}}
	fan := TriggerSpec{Name: "fan", Bucket: "chunks", Primitive: Immediate, Targets: []string{"map"}}
	runTable(t, []tableCase{
		{"a mapper the running splitter causes later still counts", []TriggerSpec{fan, trig}, []step{
			{do: start("s1")}, // the splitter is the entry, s1.0
			{do: began("s1", "entry", "s1.0")},
			{do: putFrom("s1", "chunks", "c1", "entry", "s1.0"), want: []string{"map[c1]"}},
			{do: began("s1", "map", "s1.1")},
			{do: putFrom("s1", "shuffle", "x1", "map", "s1.1", "group", "g")},
			{do: ended("s1", "map", "s1.1", false)}, // the only mapper so far is done, the splitter is not
			{do: putFrom("s1", "chunks", "c2", "entry", "s1.0"), want: []string{"map[c2]"}},
			{do: began("s1", "map", "s1.2")},
			{do: putFrom("s1", "shuffle", "x2", "map", "s1.2", "group", "g")},
			{do: ended("s1", "map", "s1.2", false)},
			{do: ended("s1", "entry", "s1.0", false), want: []string{"reduce{g}[x1 x2]"}},
		}},
	})
}

func endedSent(session, fn, inv string, outputs int) func(*Engine, time.Time) []Action {
	return func(e *Engine, now time.Time) []Action {
		return e.FunctionEnded(wfName, session, fn, inv, Finish{Outputs: outputs}, now)
	}
}

// Outputs a mapper sent through its sidecar are reported on their own and
// may arrive after its finish: the group waits until the finish's count of
// outputs has arrived, whichever bucket they went to.
func TestDynamicGroupCountsLateOutputs(t *testing.T) {
	trig := TriggerSpec{Name: "t", Bucket: "shuffle", Primitive: DynamicGroup, Sources: []string{"map"}, Targets: []string{"reduce"}}
	runTable(t, []tableCase{
		{"an output after the finish", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{do: ended("s1", "entry", "s1.0", false)},
			{do: began("s1", "map", "s1.m")},
			{do: putFrom("s1", "shuffle", "a", "map", "s1.m", "group", "g")},
			{do: endedSent("s1", "map", "s1.m", 3)},
			{do: putFrom("s1", "shuffle", "b", "map", "s1.m", "group", "g")},
			{do: putFrom("s1", "shuffle", "b", "map", "s1.m", "group", "g")}, // a resend counts once
			{do: putFrom("s1", "elsewhere", "c", "map", "s1.m.r1"), want: []string{"reduce{g}[a b]"}},
		}},
		{"the same name from two mappers counts for each", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{do: ended("s1", "entry", "s1.0", false)},
			{do: began("s1", "map", "s1.m1")},
			{do: began("s1", "map", "s1.m2")},
			{do: putFrom("s1", "shuffle", "x", "map", "s1.m1", "group", "g")},
			{do: endedSent("s1", "map", "s1.m1", 1)},
			{do: endedSent("s1", "map", "s1.m2", 1)},
			{do: putFrom("s1", "shuffle", "x", "map", "s1.m2", "group", "g"), want: []string{"reduce{g}[x]"}},
		}},
	})
}
