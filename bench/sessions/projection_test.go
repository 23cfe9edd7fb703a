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

// project separates the proxy hop from the engine's cost and the growth
// with the ended sessions kept from both, and solves the steady state.
func TestProject(t *testing.T) {
	const b, e, h = 1e-4, 1.0, 0.5 // ms per session per kept session, ms, ms per proxied call
	series := func(base float64, replicas int) []Point {
		var pts []Point
		for i := 1; i <= 4; i++ {
			kept := int64(i * 2000 * replicas) // 2,000..8,000 a replica
			pts = append(pts, Point{SessionsPerSec: 100, EndedRecords: kept, OperatorMs: base + b*float64(kept)/float64(replicas)})
		}
		return pts
	}
	one := Case{Replicas: 1, Sessions: 1000, Requests: 2000, Seconds: 10, SessionsPerSec: 100, Series: series(e, 1),
		RedisInBytesPerSession: 1500, Checkpoint: Checkpoint{BytesPerEndedRecord: 1100}, CPU: map[string]float64{"redis-server": 0.05}}
	two := one
	two.Replicas, two.ProxiedFraction, two.Series = 2, 0.5, series(e+2*h*0.5, 2)
	p := project(Summary{Replicas: 1}, Summary{Replicas: 2, Proxied: 0.5}, []Case{one, two})
	for name, got := range map[string][2]float64{"b": {p.KeptMsPerSession, b}, "e": {p.EngineMs, e}, "h": {p.ProxyHopMs, h},
		"g": {p.CallsPerSession, 2}, "r": {p.RedisMsPerSess, 0.05}, "Redis ceiling": {p.RedisCeiling, 20000}} {
		if math.Abs(got[0]-got[1]) > 1e-6 {
			t.Errorf("%s = %v, want %v", name, got[0], got[1])
		}
	}
	// One replica in steady state: x·(e + b·x·3600) = 1000 ms.
	r := p.Rows[0]
	x := r.SteadyCeiling
	if r.Replicas != 1 || math.Abs(x*(e+b*x*3600)-1000) > 1e-6 || math.Abs(r.SteadyMs-1000/x) > 1e-9 || r.ShortCeiling != 1000/e {
		t.Errorf("1 replica: %+v", r)
	}
	if want := r.Effective * 3600 * 1100 / 1e9; math.Abs(r.RedisGB-want) > 1e-9 {
		t.Errorf("Redis records %v GB, want %v", r.RedisGB, want)
	}
	// Nothing grows with what is kept: steady is the short run.
	if x := saturated(2, 0); x != 500 {
		t.Errorf("saturated(2, 0) = %v, want 500", x)
	}
}
