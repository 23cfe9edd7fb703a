package model

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

func TestWavesWithoutStragglers(t *testing.T) {
	s := newStragglers(nil, 0.9)
	for _, c := range []struct{ n, p, want int }{{10, 10, 1}, {11, 10, 2}, {100, 10, 10}, {1, 64, 1}} {
		if got := s.waves(c.n, c.p); got != float64(c.want) {
			t.Errorf("waves(%d, %d) = %v, want %d", c.n, c.p, got, c.want)
		}
	}
}

func TestLastWaveByHand(t *testing.T) {
	// Two samples, relative bandwidths 1 and 0.5: v ∈ {1, 2}. Two tasks,
	// no speculation: max is 1 only if both draw 1 (¼): E = ¼·1 + ¾·2.
	s := newStragglers([]float64{1, 0.5}, 0)
	if got := s.lastWave(2); !near(got, 1.75) {
		t.Errorf("E[max of 2] = %v, want 1.75", got)
	}
	// Waves before the last cost the mean, (1+2)/2 = 1.5: 3 waves of 2
	// tasks → 2·1.5 + 1.75.
	if got := s.waves(6, 2); !near(got, 4.75) {
		t.Errorf("waves(6, 2) = %v, want 4.75", got)
	}
	// Every worker half as fast: every term doubles, speculation or not
	// (a copy started at τ = 2 ends at 4, after the original).
	for _, x := range []float64{0, 0.5, 0.9} {
		s := newStragglers([]float64{0.5, 0.5, 0.5}, x)
		if got := s.waves(30, 10); !near(got, 6) {
			t.Errorf("x=%v: all at half speed, 3 waves: %v, want 6", x, got)
		}
	}
	// Speculation by hand: samples v ∈ {1, 1, 1, 10} (one in four ten
	// times slower), l = 2 tasks, x = ½: q = 1, the first finisher.
	// τ = E[min of 2] = 1 unless both are 10 (1/16): τ = 1 + 9/16, taken
	// as fixed.
	// A task still running at τ (v = 10) gets a copy ending τ + v', so
	// Y = min(10, τ + v'): τ + 1 w.p. ¾, 10 otherwise.
	// P(Y ≤ y): F(y) + (1 − F(y))·F(y − τ); for 1 ≤ y < τ+1: ¾;
	// τ+1 ≤ y < 10: ¾ + ¼·¾ = 15/16; from 10: 1.
	// E[max of 2] = 1 + (τ+1 − 1)·(1 − (¾)²) + (10 − (τ+1))·(1 − (15/16)²).
	tau := 1 + 9.0/16
	want := 1 + tau*(1-0.5625) + (10-tau-1)*(1-225.0/256) // 2.584; the true value is 43/16 = 2.6875 (τ is not fixed)
	s = newStragglers([]float64{1, 1, 1, 0.1}, 0.5)
	if got := s.lastWave(2); !near(got, want) {
		t.Errorf("speculative last wave = %v, want %v", got, want)
	}
}

// simulateLastWave runs the §3.5 scheduling trials times with a fixed seed:
// l tasks draw their relative bandwidths; once ⌈x·l⌉ have finished, every
// task still running gets a copy on a freed worker with a fresh draw; the
// wave ends when every task has a finished copy.
func simulateLastWave(samples []float64, x float64, l, trials int) float64 {
	rng := rand.New(rand.NewPCG(17, uint64(l)))
	v := make([]float64, l)
	sorted := make([]float64, l)
	var sum float64
	for range trials {
		for i := range v {
			v[i] = 1 / samples[rng.IntN(len(samples))]
		}
		copy(sorted, v)
		sort.Float64s(sorted)
		q := int(math.Ceil(x * float64(l)))
		end := sorted[l-1]
		if x > 0 && q < l {
			tau := sorted[q-1]
			end = 0
			for _, vi := range v {
				y := vi
				if vi > tau {
					y = math.Min(vi, tau+1/samples[rng.IntN(len(samples))])
				}
				end = math.Max(end, y)
			}
		}
		sum += end
	}
	return sum / float64(trials)
}

// TestLastWaveAgreesWithSimulation: the exact-over-the-distribution
// expectation (which takes τ at its expectation) against a seeded Monte
// Carlo simulation of the same scheduling, with the default distribution.
func TestLastWaveAgreesWithSimulation(t *testing.T) {
	samples := DefaultParams().Stragglers
	for _, x := range []float64{0, 0.5, 0.9} {
		s := newStragglers(samples, x)
		for _, l := range []int{4, 16, 64, 256, 1024} {
			sim := simulateLastWave(samples, x, l, max(2000, 2_000_000/l))
			got := s.lastWave(l)
			t.Logf("x=%v l=%d: model %.3f, simulation %.3f (%+.1f %%)", x, l, got, sim, 100*(got/sim-1))
			tol := 0.02
			if l < 64 {
				tol = 0.10 // τ's spread matters when a few tasks decide
			}
			if math.Abs(got-sim) > tol*sim {
				t.Errorf("x=%v l=%d: model %.3f, simulation %.3f (> %.0f %% apart)", x, l, got, sim, 100*tol)
			}
		}
	}
}

func TestRegIncBeta(t *testing.T) {
	// I_x(1, 1) = x; I_½(a, a) = ½; I_x(a, b) = P(Binomial(a+b−1, x) ≥ a)
	for _, x := range []float64{0.1, 0.5, 0.77} {
		if got := regIncBeta(1, 1, x); !near(got, x) {
			t.Errorf("I_%v(1,1) = %v", x, got)
		}
	}
	if got := regIncBeta(37, 37, 0.5); math.Abs(got-0.5) > 1e-12 {
		t.Errorf("I_½(37,37) = %v", got)
	}
	binomTail := func(n, q int, p float64) float64 {
		var s float64
		for k := q; k <= n; k++ {
			lc, _ := math.Lgamma(float64(n + 1))
			lk, _ := math.Lgamma(float64(k + 1))
			lnk, _ := math.Lgamma(float64(n - k + 1))
			s += math.Exp(lc - lk - lnk + float64(k)*math.Log(p) + float64(n-k)*math.Log1p(-p))
		}
		return s
	}
	for _, c := range []struct {
		n, q int
		p    float64
	}{{10, 3, 0.2}, {64, 58, 0.9}, {1024, 922, 0.95}, {1024, 922, 0.85}} {
		want := binomTail(c.n, c.q, c.p)
		if got := regIncBeta(float64(c.q), float64(c.n-c.q+1), c.p); math.Abs(got-want) > 1e-9 {
			t.Errorf("P(Bin(%d, %v) ≥ %d) = %v, want %v", c.n, c.p, c.q, got, want)
		}
	}
}
