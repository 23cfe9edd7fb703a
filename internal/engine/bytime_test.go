package engine

import (
	"testing"
	"time"
)

func TestByTime(t *testing.T) {
	trig := TriggerSpec{Name: "t", Bucket: "b", Primitive: ByTime, Window: time.Second, Targets: []string{"agg"}}
	ms := time.Millisecond
	runTable(t, []tableCase{
		{"the window fires on the clock, without a further object", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{at: 100 * ms, do: put("s1", "b", "1")},
			{at: 600 * ms, do: put("s1", "b", "2")},
			{at: 1099 * ms, do: tick()},
			{at: 1100 * ms, do: tick(), want: []string{"agg[1 2]"}},
			{at: 5 * time.Second, do: tick()},
		}},
		{"an object after the window closes both fires the old and opens a new one", []TriggerSpec{trig}, []step{
			{do: start("s1")},
			{at: 0, do: put("s1", "b", "1")},
			{at: 1500 * ms, do: put("s1", "b", "2"), want: []string{"agg[1]"}},
			{at: 2499 * ms, do: tick()},
			{at: 2500 * ms, do: tick(), want: []string{"agg[2]"}},
		}},
		{"windows are per session", []TriggerSpec{trig}, []step{
			{do: start("s1")}, {do: start("s2")},
			{at: 0, do: put("s1", "b", "a")},
			{at: 500 * ms, do: put("s2", "b", "b")},
			{at: 1000 * ms, do: tick(), want: []string{"agg[a]"}},
			{at: 1500 * ms, do: tick(), want: []string{"agg[b]"}},
		}},
	})
}
