package engine

import "testing"

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
