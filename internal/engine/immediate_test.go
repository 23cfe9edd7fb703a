package engine

import "testing"

func TestImmediate(t *testing.T) {
	trig := TriggerSpec{Name: "t", Bucket: "b", Primitive: Immediate, Targets: []string{"f", "g"}}
	runTable(t, []tableCase{
		{"every object fires every target", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{do: put("s1", "b", "k1"), want: []string{"f[k1]", "g[k1]"}},
			{do: put("s1", "b", "k2"), want: []string{"f[k2]", "g[k2]"}},
		}},
		{"other buckets, duplicates and unknown sessions fire nothing", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{do: put("s1", "other", "k1")},
			{do: put("s1", "b", "k1"), want: []string{"f[k1]", "g[k1]"}},
			{do: put("s1", "b", "k1")},
			{do: put("nope", "b", "k1")},
		}},
		{"interleaved sessions are independent", []TriggerSpec{trig}, []step{
			{do: start("s1")}, {do: start("s2")},
			{do: put("s2", "b", "k"), want: []string{"f[k]", "g[k]"}},
			{do: put("s1", "b", "k"), want: []string{"f[k]", "g[k]"}},
		}},
		{"the output bucket completes the session and later objects fire nothing", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{do: put("s1", "out", "result"), want: []string{"complete"}},
			{do: put("s1", "b", "late")},
		}},
	})
}
