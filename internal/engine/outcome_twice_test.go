package engine

import (
	"testing"
	"time"
)

// Every invocation's outcome may reach the engine twice: from the
// dispatcher's HTTP response and from the function's sidecar over the
// control stream (it reports every invocation's outcome, so that an owner
// whose HTTP client lost the response learns it), in either order, the
// return value's objects included. The engine applies it once: nothing
// fires, completes or fails twice.
func TestOutcomeReportedTwiceIsAppliedOnce(t *testing.T) {
	chain := TriggerSpec{Name: "t", Bucket: "b", Primitive: Immediate, Targets: []string{"next"}}
	join := TriggerSpec{Name: "j", Bucket: "b", Primitive: BySet, Keys: []string{"k1", "k2"}, Targets: []string{"join"}}
	group := TriggerSpec{Name: "g", Bucket: "b", Primitive: DynamicGroup, GroupMetadataKey: "g", Sources: []string{"map"}, Targets: []string{"reduce"}}
	rule := chain
	rule.Reruns = []RerunRule{{SourceFunction: "work", Scope: PerObject, Timeout: 100 * time.Millisecond, MaxAttempts: 1}}
	ms := time.Millisecond
	// outcome is one report of an invocation that sent objects keys of
	// bucket b (a return value is one such object) and ended.
	outcome := func(fn, inv string, keys ...string) []step {
		var steps []step
		for _, k := range keys {
			steps = append(steps, step{do: putFrom("s1", "b", k, fn, inv, "g", "x")})
		}
		return append(steps, step{do: endedWith("s1", fn, inv, len(keys))})
	}
	twice := func(want []string, fn, inv string, keys ...string) []step {
		first := outcome(fn, inv, keys...)
		for i := range first {
			if i < len(keys) {
				first[i].want = want[i : i+1 : i+1]
				if want[i] == "" {
					first[i].want = nil
				}
			}
		}
		return append(first, outcome(fn, inv, keys...)...)
	}
	cat := func(parts ...[]step) []step {
		var out []step
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	runTable(t, []tableCase{
		{"chain: the response, then the sidecar's report", []TriggerSpec{chain}, cat(
			[]step{{do: start("s1")}},
			twice([]string{"next[k]", "next[work.ret]"}, "work", "s1.0", "k", "work.ret"),
		)},
		{"fan-in: each outcome twice, the join fires once", []TriggerSpec{join}, cat(
			[]step{{do: start("s1")}},
			twice([]string{""}, "work", "s1.1", "k1"),
			twice([]string{"join[k1 k2]"}, "work", "s1.2", "k2"),
		)},
		{"dynamic group: the mappers' outcomes twice, the reducer fires once", []TriggerSpec{group}, cat(
			[]step{{do: start("s1")}, {do: ended("s1", "entry", "s1.0", false)}, {do: ended("s1", "entry", "s1.0", false)},
				{do: began("s1", "map", "s1.1")}, {do: began("s1", "map", "s1.2")}},
			twice([]string{""}, "map", "s1.1", "m1"),
			outcome("map", "s1.2", "m2")[:1],
			[]step{{do: endedWith("s1", "map", "s1.2", 1), want: []string{"reduce{x}[m1 m2]"}}},
			outcome("map", "s1.2", "m2"),
		)},
		{"a failure reported twice fails the session once", []TriggerSpec{chain}, []step{
			{do: start("s1")},
			{do: ended("s1", "work", "s1.0", true), want: []string{"failed", "drop"}},
			{do: ended("s1", "work", "s1.0", true)},
		}},
		{"a failure reported twice under a rule: one re-execution", []TriggerSpec{rule}, []step{
			{do: start("s1")},
			{do: began("s1", "work", "s1.3")},
			{at: 10 * ms, do: ended("s1", "work", "s1.3", true)},
			{at: 20 * ms, do: ended("s1", "work", "s1.3", true)},
			{at: 100 * ms, do: tick(), want: []string{"rerun:work#1"}},
			{at: 500 * ms, do: tick()},
		}},
		{"a timed-out call's late outcome from the sidecar counts, once", []TriggerSpec{rule}, []step{
			{do: start("s1")},
			{do: began("s1", "work", "s1.3")},
			{at: 10 * ms, do: ended("s1", "work", "s1.3", true)}, // the dispatcher's timeout
			{at: 20 * ms, do: putFrom("s1", "b", "k", "work", "s1.3"), want: []string{"next[k]"}},
			{at: 20 * ms, do: endedWith("s1", "work", "s1.3", 1)},
			{at: 30 * ms, do: putFrom("s1", "b", "k", "work", "s1.3")},
			{at: 30 * ms, do: endedWith("s1", "work", "s1.3", 1)},
			{at: 500 * ms, do: tick()}, // its output arrived: no re-execution
		}},
	})
}
