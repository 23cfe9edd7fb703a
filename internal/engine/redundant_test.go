package engine

import "testing"

func TestRedundant(t *testing.T) {
	trig := TriggerSpec{Name: "t", Bucket: "b", Primitive: Redundant, K: 2, N: 3, Targets: []string{"vote"}}
	runTable(t, []tableCase{
		{"fires exactly once, on the k-th of n", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{do: put("s1", "b", "r1")},
			{do: put("s1", "b", "r1")},
			{do: put("s1", "b", "r3"), want: []string{"vote[r1 r3]"}},
			{do: put("s1", "b", "r2")},
		}},
		{"k of n per session", []TriggerSpec{trig}, []step{
			{do: start("s1")}, {do: start("s2")},
			{do: put("s1", "b", "r1")},
			{do: put("s2", "b", "r1")},
			{do: put("s2", "b", "r2"), want: []string{"vote[r1 r2]"}},
			{do: put("s1", "b", "r2"), want: []string{"vote[r1 r2]"}},
		}},
	})
}
