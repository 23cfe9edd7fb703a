package engine

import "testing"

func TestByName(t *testing.T) {
	trig := TriggerSpec{Name: "t", Bucket: "b", Primitive: ByName, Key: "approved", Targets: []string{"notify"}}
	runTable(t, []tableCase{
		{"only the named key fires", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{do: put("s1", "b", "rejected")},
			{do: put("s1", "b", "approved"), want: []string{"notify[approved]"}},
		}},
		{"per session", []TriggerSpec{trig}, []step{
			{do: start("s1")}, {do: start("s2")},
			{do: put("s1", "b", "approved"), want: []string{"notify[approved]"}},
			{do: put("s1", "b", "approved")},
			{do: put("s2", "b", "approved"), want: []string{"notify[approved]"}},
		}},
	})
}
