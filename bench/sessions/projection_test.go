package main

import (
	"math"
	"testing"
)

// The slope is the one common to the groups, whatever their intercepts.
func TestFixedEffectsSlope(t *testing.T) {
	groups := map[int][][2]float64{
		1: {{0, 1}, {10, 21}, {20, 41}}, // y = 1 + 2x
		2: {{5, 20}, {15, 40}, {0, 10}}, // y = 10 + 2x
		3: {{7, 3}},                     // one point: no slope of its own
	}
	if got := fixedEffectsSlope(groups); math.Abs(got-2) > 1e-9 {
		t.Fatalf("slope %v, want 2", got)
	}
	if got := fixedEffectsSlope(map[int][][2]float64{1: {{3, 1}, {3, 5}}}); got != 0 {
		t.Fatalf("no spread in x: slope %v, want 0", got)
	}
}

// project separates the proxy hop from the engine's cost and the
// checkpoint's growth from both.
func TestProject(t *testing.T) {
	const k, e, h = 10.0, 1.0, 0.5 // ns/B, ms, ms per proxied call
	series := func(base float64) []Point {
		var pts []Point
		for i := 1; i <= 4; i++ {
			mb := float64(i) * 2 // 2..8 MB at 100 sessions/s: 20-80 KB a session
			pts = append(pts, Point{SessionsPerSec: 100, CheckpointMB: mb, OperatorMs: base + mb*1e6/100*k/1e6})
		}
		return pts
	}
	one := Case{Replicas: 1, Sessions: 1000, Requests: 2000, Seconds: 10, SessionsPerSec: 100, Series: series(e),
		Checkpoint: Checkpoint{BytesPerSession: 1000, EncodeNsPerByte: 5}, CheckpointBytesPerSec: 5e6, CPU: map[string]float64{"redis-server": 0.1}}
	two := one
	two.Replicas, two.ProxiedFraction, two.Series = 2, 0.5, series(e+2*h*0.5)
	p := project(Summary{Replicas: 1}, Summary{Replicas: 2, Proxied: 0.5}, []Case{one, two})
	for name, got := range map[string][2]float64{"k": {p.EncodeNsPerByte, k}, "e": {p.EngineMs, e}, "h": {p.ProxyHopMs, h},
		"g": {p.CallsPerSession, 2}, "r": {p.RedisNsPerByte, 2}} {
		if math.Abs(got[0]-got[1]) > 1e-6 {
			t.Errorf("%s = %v, want %v", name, got[0], got[1])
		}
	}
	// Redis: 3600 s × 1000 B × 2 ns/B per session a second -> 1e9/7.2e6.
	if want := 1e9 / (3600 * 1000 * 2.0); math.Abs(p.RedisCeiling-want) > 1e-6 {
		t.Errorf("Redis ceiling %v, want %v", p.RedisCeiling, want)
	}
	if r := p.Rows[0]; r.Replicas != 1 || math.Abs(r.SteadyMs-(e+3600*1000*k/1e6)) > 1e-6 {
		t.Errorf("1 replica steady: %+v", r)
	}
}
