package engine

import "testing"

func TestByBatchSize(t *testing.T) {
	trig := TriggerSpec{Name: "t", Bucket: "b", Primitive: ByBatchSize, BatchSize: 2, Targets: []string{"agg"}}
	runTable(t, []tableCase{
		{"every n objects form a batch", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{do: put("s1", "b", "1")},
			{do: put("s1", "b", "2"), want: []string{"agg[1 2]"}},
			{do: put("s1", "b", "3")},
			{do: put("s1", "b", "3")},
			{do: put("s1", "b", "4"), want: []string{"agg[3 4]"}},
		}},
		{"sessions never share a batch", []TriggerSpec{trig}, []step{
			{do: start("s1")}, {do: start("s2")},
			{do: put("s1", "b", "1")},
			{do: put("s2", "b", "1")},
			{do: put("s2", "b", "2"), want: []string{"agg[1 2]"}},
			{do: put("s1", "b", "2"), want: []string{"agg[1 2]"}},
		}},
	})
}
