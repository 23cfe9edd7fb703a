package main

import (
	"math"
	"testing"
	"time"
)

func TestCPUWindows(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	// python3 uses 1 core from 0 to 10 s, then 2; minio starts at 5 s
	// with half a core; the machine is busy with both plus 0.1 core.
	var samples []cpuSample
	for s := 0; s <= 20; s++ {
		py := float64(min(s, 10)) + 2*float64(max(0, s-10))
		by := map[string]float64{"python3": py}
		if s >= 5 {
			by["minio"] = 0.5 * float64(s-5)
		}
		busy := py + by["minio"] + 0.1*float64(s)
		samples = append(samples, cpuSample{at: t0.Add(time.Duration(s) * time.Second), by: by, machine: machineCPU{Busy: busy, Steal: 0.2 * float64(s)}})
	}
	fns := []FunctionTimes{{Function: "map", First: 0.5}, {Function: "merge", First: 12.5}}
	got := cpuWindows(samples, t0.Add(-500*time.Millisecond), fns, 18)
	if len(got) != 3 {
		t.Fatalf("windows: %+v", got)
	}
	near := func(what string, x, want float64) {
		t.Helper()
		if math.Abs(x-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", what, x, want)
		}
	}
	// session time s is sample time s-0.5: map [0.5, 12.5) = [0, 12) s
	whole, mapw, merge := got[0], got[1], got[2]
	near("sort seconds", whole.Seconds, 18)
	near("map python3", mapw.ByCommand["python3"], 10+2*2)
	near("map minio", mapw.ByCommand["minio"], 0.5*7)
	near("map cluster", mapw.Cluster, 14+3.5)
	near("map steal", mapw.Steal, 0.2*12)
	near("merge python3", merge.ByCommand["python3"], 2*5.5)
	near("merge busy", merge.MachineBusy, 2*5.5+0.5*5.5+0.1*5.5)
	if whole.Name != "sort" || mapw.Name != "map" || merge.Name != "merge" {
		t.Errorf("names %q %q %q", whole.Name, mapw.Name, merge.Name)
	}
	// past the last sample: clamped, not extrapolated
	late := cpuWindows(samples, t0, []FunctionTimes{{Function: "collect", First: 19}}, 30)
	near("clamped", late[1].ByCommand["python3"], 30-28)
}
