package engine

import "testing"

func TestDynamicGroup(t *testing.T) {
	trig := TriggerSpec{Name: "t", Bucket: "shuffle", Primitive: DynamicGroup, GroupMetadataKey: "group", Sources: []string{"map"}, Targets: []string{"reduce"}}
	runTable(t, []tableCase{
		{"each group fires once all mappers are done", []TriggerSpec{trig}, []step{
			{do: start("s1")},
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
			// The engine dispatched s1.1 and s1.2; only one has run.
			{do: began("s1", "map", "s1.1")},
			{do: putFrom("s1", "shuffle", "x", "map", "s1.1", "group", "g")},
			{do: ended("s1", "map", "s1.1", false)},
			{do: began("s1", "map", "s1.2")},
			{do: ended("s1", "map", "s1.2", false), want: []string{"reduce{g}[x]"}},
		}},
		{"groups are per session", []TriggerSpec{trig}, []step{
			{do: start("s1")}, {do: start("s2")},
			{do: began("s1", "map", "s1.m")}, {do: began("s2", "map", "s2.m")},
			{do: putFrom("s1", "shuffle", "k", "map", "s1.m", "group", "a")},
			{do: putFrom("s2", "shuffle", "k", "map", "s2.m", "group", "b")},
			{do: ended("s2", "map", "s2.m", false), want: []string{"reduce{b}[k]"}},
			{do: ended("s1", "map", "s1.m", false), want: []string{"reduce{a}[k]"}},
		}},
	})
}
