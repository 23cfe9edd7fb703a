package engine

import "testing"

func TestBySet(t *testing.T) {
	trig := TriggerSpec{Name: "t", Bucket: "b", Primitive: BySet, Keys: []string{"a", "b", "c"}, Targets: []string{"join"}}
	runTable(t, []tableCase{
		{"fires once when the set is complete", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{do: put("s1", "b", "c")},
			{do: put("s1", "b", "x")},
			{do: put("s1", "b", "a")},
			{do: put("s1", "b", "a")},
			{do: put("s1", "b", "b"), want: []string{"join[a b c]"}},
		}},
		{"interleaved sessions never share a set", []TriggerSpec{trig}, []step{
			{do: start("s1")}, {do: start("s2")},
			{do: put("s1", "b", "a")}, {do: put("s2", "b", "b")},
			{do: put("s1", "b", "b")}, {do: put("s2", "b", "c")},
			{do: put("s2", "b", "a"), want: []string{"join[a b c]"}},
			{do: put("s1", "b", "c"), want: []string{"join[a b c]"}},
		}},
	})
}
