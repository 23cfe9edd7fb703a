package model

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"strings"
	"testing"
)

// handParams are round numbers for hand-worked cases: 50 MB/s per worker to
// both stores in both directions (no dependence on p or w), flat request
// rates, a task may use all of a worker's memory, no startup, no
// stragglers.
func handParams() Params {
	bw := Bandwidth{PerWorker: 50e6}
	return Params{
		SlowRead: bw, SlowWrite: bw, SlowRequests: Flat(100),
		FastRead: bw, FastWrite: bw, FastRequests: Flat(1e5), FastServerBandwidth: 1e9, FastShards: 1,
		PodPullBandwidth: 200e6, PodStoreFraction: 0.5,
		TaskMemoryFraction: 1,
	}
}

// handPrices: $1e-5 per GiB-second of worker, $1e-6 per GET, $1e-5 per
// PUT, no storage or fast-tier prices.
func handPrices() Prices {
	return Prices{WorkerPerGiBSecond: 1e-5, SlowPerGet: 1e-6, SlowPerPut: 1e-5}
}

func mustModel(t testing.TB, p Params, pr Prices) *Model {
	t.Helper()
	m, err := New(p, pr)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b)) }

func TestHandWorkedCases(t *testing.T) {
	requestBound := handParams()
	requestBound.SlowRequests = Flat(1)
	serverBound := handParams()
	serverBound.FastServerBandwidth = 1e9
	cases := []struct {
		name   string
		params Params
		cfg    Config
		// wanted: total seconds, each phase's seconds and binding term,
		// worker GiB-seconds, GETs, PUTs, fast ops
		seconds     float64
		phases      []float64
		bound       []string
		workerGiBs  float64
		gets, puts  float64
		fastOps     float64
		cost        float64
		tasks       int
		extraChecks func(t *testing.T, p Prediction)
	}{
		{
			// D = 10 GB, P = 10 workers of 1 GiB (a task holds ≤ 1 GiB):
			// n = 10·⌈10e9/(1 GiB·10)⌉ = 10 tasks. Map: n² = 100 PUTs at
			// 100/s = 1 s; 10 GETs of input at 100/s = 0.1 s; each task
			// writes 1 GB at 50 MB/s = 20 s. Reduce the same. Locus's
			// 2·max(S²/(w²q_s), S/(b·p)) = 2·max(1, 20) = 40 s.
			// Workers: 10 × 1 GiB × 40 s = 400 GiB-s = $0.004; GETs 10 + 100,
			// PUTs 100 + 10: $0.00011 + $0.0011.
			name: "s3 bandwidth-bound", params: handParams(),
			cfg:     Config{Method: S3, DataBytes: 10e9, Parallelism: 10, WorkerMemory: GiB},
			seconds: 40, phases: []float64{20, 20}, bound: []string{"s3 read bandwidth", "s3 read bandwidth"},
			workerGiBs: 400, gets: 110, puts: 110, cost: 400*1e-5 + 110*1e-6 + 110*1e-5, tasks: 10,
			extraChecks: func(t *testing.T, p Prediction) {
				if v := p.Phases[0].Term("s3 requests"); !near(v, 1) {
					t.Errorf("map's s3 requests term = %v, want 1 s (100 PUTs at 100/s)", v)
				}
				if v := p.Phases[0].Term("s3 write bandwidth"); !near(v, 20) {
					t.Errorf("map's s3 write bandwidth term = %v, want 20 s", v)
				}
			},
		},
		{
			// The same at 1 request/s: n² = 100 PUTs take 100 s per stage
			// (the input's 10 GETs, in their own bucket, 10 s).
			// 2·max(100, 20) = 200 s.
			name: "s3 request-bound", params: requestBound,
			cfg:     Config{Method: S3, DataBytes: 10e9, Parallelism: 10, WorkerMemory: GiB},
			seconds: 200, phases: []float64{100, 100}, bound: []string{"s3 requests", "s3 requests"},
			workerGiBs: 2000, gets: 110, puts: 110, cost: 2000*1e-5 + 110*1e-6 + 110*1e-5, tasks: 10,
		},
		{
			// Redis: D = 10 GB, 100 workers of 100 MB → n = 100 tasks of
			// 100 MB, 10⁴ objects of 1 MB. Worker side: 100 MB at 50 MB/s
			// = 2 s; server side: 10 GB at 1 GB/s = 10 s; requests: 10⁴ at
			// 10⁵/s = 0.1 s. Locus: 2·max(S²/(w²q_f), S/min(b_f, b·p)) =
			// 2·max(0.1, 10e9/min(1e9, 5e9)) = 20 s. No S3 intermediate
			// requests: GETs are the input's 100, PUTs the output's 100.
			name: "redis server-bound", params: serverBound,
			cfg:     Config{Method: Redis, DataBytes: 10e9, Parallelism: 100, WorkerMemory: 100e6, FastCapacity: 10e9},
			seconds: 20, phases: []float64{10, 10}, bound: []string{"redis server bandwidth", "redis server bandwidth"},
			workerGiBs: 100 * 100e6 / GiB * 20, gets: 100, puts: 100, fastOps: 2e4,
			cost: 100*100e6/GiB*20*1e-5 + 100*1e-6 + 100*1e-5, tasks: 100,
		},
		{
			// Pod memory: D = 10 GB, 10 workers of 2 GB (half of which
			// the object store may hold: 10 GB in all, it just fits) → n =
			// 10 tasks of 1 GB. Map: read 1 GB of input at 50 MB/s = 20 s,
			// the partitions stay in the pod. Reduce: pull 1 GB at 200
			// MB/s = 5 s, write 1 GB of output at 50 MB/s = 20 s → 20 s.
			// Billed: 10 workers in the map, 20 (producers hold their
			// partitions) in the reduce: (10 + 20) × 20 s × 2 GB.
			name: "podmemory", params: handParams(),
			cfg:     Config{Method: PodMemory, DataBytes: 10e9, Parallelism: 10, WorkerMemory: 2e9},
			seconds: 40, phases: []float64{20, 20}, bound: []string{"s3 read bandwidth", "s3 write bandwidth"},
			workerGiBs: 30 * 20 * 2e9 / GiB, gets: 10, puts: 10,
			cost: 30*20*2e9/GiB*1e-5 + 10*1e-6 + 10*1e-5, tasks: 10,
			extraChecks: func(t *testing.T, p Prediction) {
				if v := p.Phases[1].Term("pod pull bandwidth"); !near(v, 5) {
					t.Errorf("reduce's pull term = %v, want 5 s", v)
				}
				if v := p.Phases[0].Term("s3 read bandwidth"); !near(v, 20) {
					t.Errorf("map's input read = %v, want 20 s", v)
				}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := mustModel(t, c.params, handPrices())
			p, err := m.Predict(c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if !near(p.Seconds, c.seconds) {
				t.Errorf("seconds = %v, want %v", p.Seconds, c.seconds)
			}
			if p.Tasks != c.tasks {
				t.Errorf("tasks = %d, want %d", p.Tasks, c.tasks)
			}
			for i, ph := range p.Phases {
				if !near(ph.Seconds, c.phases[i]) {
					t.Errorf("phase %s = %v s, want %v", ph.Name, ph.Seconds, c.phases[i])
				}
				// equal terms (a stage's read and write at the same
				// bandwidth) may tie: the wanted one must be a largest
				if got := ph.Term(c.bound[i]); !near(got, ph.Seconds-ph.Startup) {
					t.Errorf("phase %s: %q = %v s, want it to bound the phase (%v s; terms %v)", ph.Name, c.bound[i], got, ph.Seconds, ph.Terms)
				}
			}
			if !near(p.SlowGets, c.gets) || !near(p.SlowPuts, c.puts) || (c.fastOps != 0 || p.FastOps != 0) && !near(p.FastOps, c.fastOps) {
				t.Errorf("requests: %v GETs, %v PUTs, %v fast; want %v, %v, %v", p.SlowGets, p.SlowPuts, p.FastOps, c.gets, c.puts, c.fastOps)
			}
			if !near(p.Costs.Workers, c.workerGiBs*1e-5) {
				t.Errorf("worker cost %v, want %v", p.Costs.Workers, c.workerGiBs*1e-5)
			}
			if !near(p.Cost, c.cost) {
				t.Errorf("cost %v, want %v", p.Cost, c.cost)
			}
			if c.extraChecks != nil {
				c.extraChecks(t, p)
			}
		})
	}
}

// hybridCase: D = 100 GB, 10 workers of 1 GB (task ≤ 1 GB) → R = n = 100
// ranges; slow store 1000 requests/s.
func hybridCase(r float64) (Params, Config) {
	p := handParams()
	p.SlowRequests = Flat(1000)
	return p, Config{Method: Hybrid, DataBytes: 100e9, Parallelism: 10, WorkerMemory: 1e9, FastCapacity: 10e9, RoundBytes: r}
}

// TestMergeTerm checks the re-derived merge phase: R reducers each read one
// run per round, R·k GETs, so its request term is R·k/q_s seconds; its
// bandwidth term D/(b·p) does not depend on the rounds.
func TestMergeTerm(t *testing.T) {
	var prev Phase
	for i, c := range []struct {
		r      float64
		rounds int
		tmq    float64
	}{
		// r = 10 GB: k = 10 rounds; R·k = 100·10 = 1000 GETs at 1000/s = 1 s
		{10e9, 10, 1},
		// r = 5 GB: k = 20; 2000 GETs: 2 s
		{5e9, 20, 2},
		// r = 2.5 GB: k = 40; 4 s
		{2.5e9, 40, 4},
	} {
		params, cfg := hybridCase(c.r)
		m := mustModel(t, params, handPrices())
		p, err := m.Predict(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if p.Rounds != c.rounds {
			t.Fatalf("r=%v: %d rounds, want %d", c.r, p.Rounds, c.rounds)
		}
		merge := p.Phases[2]
		if merge.Name != "merge" || merge.Tasks != 100 {
			t.Fatalf("merge phase %+v", merge)
		}
		if got := merge.Term("s3 requests"); !near(got, c.tmq) {
			t.Errorf("r=%v: merge request term %v s, want %v", c.r, got, c.tmq)
		}
		if !near(merge.SlowGets, float64(100*c.rounds)) {
			t.Errorf("r=%v: merge GETs %v, want R·k = %d", c.r, merge.SlowGets, 100*c.rounds)
		}
		// 100 GB read by 10 workers at 50 MB/s: 200 s, whatever k
		if got := merge.Term("s3 read bandwidth"); !near(got, 200) {
			t.Errorf("r=%v: merge bandwidth term %v, want 200 s", c.r, got)
		}
		if i > 0 {
			if got, want := merge.Term("s3 requests"), 2*prev.Term("s3 requests"); !near(got, want) {
				t.Errorf("doubling the rounds: request term %v, want twice %v", got, prev.Term("s3 requests"))
			}
		}
		// Per round: m = 10 tasks of r/10; the combine writes one run per
		// range, R = 100 PUTs at 1000/s = 0.1 s
		if got := p.Phases[1].Term("s3 requests"); !near(got, 0.1) {
			t.Errorf("r=%v: combine's run PUTs take %v s, want 0.1", c.r, got)
		}
		prev = merge
	}
}

// TestUnits is the dimensional check of every term: expressing all bytes in
// a unit λ times smaller (every size, capacity and bandwidth × λ) leaves
// every time unchanged, since each term is bytes/(bytes/s) or
// requests/(requests/s); making every rate λ× faster divides every term by
// λ. The paper's printed merge term T_mq = (S·w/r)²·T_sq = S²/q_s fails the
// first: it grows λ².
func TestUnits(t *testing.T) {
	const lambda = 8.0
	scale := func(p Params, c Config, bytes, rate float64) (Params, Config) {
		sb := func(b Bandwidth) Bandwidth { b.PerWorker *= bytes * rate; return b }
		p.SlowRead, p.SlowWrite, p.FastRead, p.FastWrite = sb(p.SlowRead), sb(p.SlowWrite), sb(p.FastRead), sb(p.FastWrite)
		p.FastServerBandwidth *= bytes * rate
		p.PodPullBandwidth *= bytes * rate
		sc := func(rc RateCurve) RateCurve {
			out := RateCurve{}
			for _, pt := range rc.Points {
				out.Points = append(out.Points, RatePoint{Size: math.Min(pt.Size*bytes, math.MaxFloat64), PerSecond: pt.PerSecond * rate})
			}
			return out
		}
		p.SlowRequests, p.FastRequests = sc(p.SlowRequests), sc(p.FastRequests)
		c.DataBytes *= bytes
		c.WorkerMemory *= bytes
		c.RoundBytes *= bytes
		c.FastCapacity *= bytes
		c.PodMemory *= bytes
		return p, c
	}
	base := handParams()
	base.SlowRequests = RateCurve{Points: []RatePoint{{10e3, 5000}, {1e6, 3000}, {100e6, 1000}}}
	base.FastRequests = RateCurve{Points: []RatePoint{{10e3, 1e5}, {100e6, 12}}}
	for _, cfg := range []Config{
		{Method: S3, DataBytes: 7e9, Parallelism: 8, WorkerMemory: 0.3e9},
		{Method: Redis, DataBytes: 7e9, Parallelism: 8, WorkerMemory: 0.3e9, FastCapacity: 8e9},
		{Method: PodMemory, DataBytes: 7e9, Parallelism: 64, WorkerMemory: 0.3e9},
		{Method: Hybrid, DataBytes: 7e9, Parallelism: 8, WorkerMemory: 0.3e9, FastCapacity: 2e9},
	} {
		m0 := mustModel(t, base, handPrices())
		p0, err := m0.Predict(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []struct{ bytes, rate, timeFactor float64 }{{lambda, 1, 1}, {1, lambda, 1 / lambda}} {
			params, c := scale(base, cfg, s.bytes, s.rate)
			p1, err := mustModel(t, params, handPrices()).Predict(c)
			if err != nil {
				t.Fatal(err)
			}
			for i, ph := range p1.Phases {
				for j, term := range ph.Terms {
					if want := p0.Phases[i].Terms[j].Seconds * s.timeFactor; math.Abs(term.Seconds-want) > 1e-9*want {
						t.Errorf("%s %s %s: bytes×%v rates×%v: %v s, want %v", cfg.Method, ph.Name, term.Name, s.bytes, s.rate, term.Seconds, want)
					}
				}
			}
		}
	}
	// The paper's T_mq = (S·w/r)²·T_sq with T_sq = r²/(w²·q_s):
	paperTmq := func(s, w, r, q float64) float64 { return (s * w / r) * (s * w / r) * (r * r / (w * w * q)) }
	// ours: R·k/q_s = (S/w)·(S/r)/q_s
	oursTmq := func(s, w, r, q float64) float64 { return (s / w) * (s / r) / q }
	s, w, r, q := 100e9, 1e9, 10e9, 1000.0
	if a, b := oursTmq(s, w, r, q), oursTmq(s*lambda, w*lambda, r*lambda, q); !near(a, b) {
		t.Errorf("derived T_mq changes with the byte unit: %v vs %v", a, b)
	}
	if a, b := paperTmq(s, w, r, q), paperTmq(s*lambda, w*lambda, r*lambda, q); near(a, b) || !near(b/a, lambda*lambda) {
		t.Errorf("the paper's printed T_mq was expected to scale with bytes² (it is not a time): %v vs %v", a, b)
	}
}

func TestInfeasible(t *testing.T) {
	m := mustModel(t, handParams(), handPrices())
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Method: PodMemory, DataBytes: 4 * GiB, Parallelism: 64, WorkerMemory: GiB, PodMemory: GiB}, "podmemory: 4 GiB does not fit in 1 GiB of pod memory"},
		{Config{Method: PodMemory, DataBytes: 4 * GiB, Parallelism: 4, WorkerMemory: GiB}, "podmemory: 4 GiB does not fit in the object stores of 4 pods of 1 GiB (2 GiB: 50 % each)"},
		{Config{Method: Redis, DataBytes: 4 * GiB, Parallelism: 4, WorkerMemory: GiB, FastCapacity: GiB}, "redis: 4 GiB does not fit in 1 GiB of fast tier"},
		{Config{Method: Hybrid, DataBytes: 4 * GiB, Parallelism: 4, WorkerMemory: GiB}, "hybrid: no fast tier to run rounds through (fast capacity 0)"},
		{Config{Method: Hybrid, DataBytes: 4 * GiB, Parallelism: 4, WorkerMemory: GiB, FastCapacity: GiB, RoundBytes: 2 * GiB}, "hybrid: a round of 2 GiB does not fit in 1 GiB of fast tier"},
	} {
		_, err := m.Predict(c.cfg)
		var ie *InfeasibleError
		if !errors.As(err, &ie) || err.Error() != c.want {
			t.Errorf("%+v: err %v, want %q", c.cfg, err, c.want)
		}
	}
	if _, err := m.Predict(Config{Method: "tape", DataBytes: 1, Parallelism: 1, WorkerMemory: 1}); err == nil || !strings.Contains(err.Error(), "unknown method") {
		t.Errorf("unknown method: %v", err)
	}
}

func TestRateCurve(t *testing.T) {
	c := DefaultParams().SlowRequests
	for _, pt := range c.Points {
		if got := c.At(pt.Size); !near(got, pt.PerSecond) {
			t.Errorf("At(%v) = %v, want the measured %v", pt.Size, got, pt.PerSecond)
		}
	}
	// geometric mean halfway in log size between 10 KB (5986) and 100 KB (4400)
	if got, want := c.At(math.Sqrt(10e3*100e3)), math.Sqrt(5986*4400.0); !near(got, want) {
		t.Errorf("At(31.6 KB) = %v, want %v", got, want)
	}
	if got := c.At(1); got != 5986 {
		t.Errorf("below the smallest size: %v, want 5986", got)
	}
	// above 100 MB: the 100 MB point's bandwidth, 1105 × 100 MB/s
	if got := c.At(1e9); !near(got, 110.5) {
		t.Errorf("At(1 GB) = %v, want 110.5", got)
	}
}

func TestBandwidthFit(t *testing.T) {
	b := DefaultParams().SlowWrite
	// the two points of Locus §3.2 the defaults were fitted to: 60 workers
	// of 0.5 GB ≈ 18 MB/s, 10 of 3 GB ≈ 40 MB/s (within 5 %)
	for _, c := range []struct {
		p    int
		w    float64
		want float64
	}{{60, 0.5 * GiB, 18e6}, {10, 3 * GiB, 40e6}} {
		if got := b.At(c.p, c.w); math.Abs(got-c.want) > 0.05*c.want {
			t.Errorf("b(%d, %s) = %.1f MB/s, want ≈ %.0f", c.p, FormatBytes(c.w), got/1e6, c.want/1e6)
		}
	}
	if r := b.At(1, GiB) / b.At(3000, GiB); r < 2 || r > 3 {
		t.Errorf("bandwidth from 1 to 3000 workers drops %.2f×, want 2–3× (Fig. 2)", r)
	}
	if got := (Bandwidth{PerWorker: 1e9, Max: 5e8}).At(1, GiB); got != 5e8 {
		t.Errorf("cap: %v", got)
	}
}

func TestDefaultsValid(t *testing.T) {
	if err := DefaultParams().Validate(); err != nil {
		t.Fatal(err)
	}
	if err := DefaultPrices().Validate(); err != nil {
		t.Fatal(err)
	}
	bad := DefaultParams()
	bad.FastShards = 0
	bad.Stragglers = []float64{1, 0}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "fastShards") || !strings.Contains(err.Error(), "stragglers") {
		t.Errorf("Validate: %v", err)
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]float64{"4GiB": 4 * GiB, "1.5 GB": 1.5e9, "512Mi": 512 * MiB, "100": 100, "2tib": 2 * TiB, "10KB": 1e4} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "4 parsecs", "-1GiB"} {
		if _, err := ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q): no error", in)
		}
	}
	if got := FormatBytes(4 * GiB); got != "4 GiB" {
		t.Errorf("FormatBytes = %q", got)
	}
}

// TestStragglersSlowTheStage: with the default distribution a stage is
// slower than without stragglers, and speculation makes it less so.
func TestStragglersSlowTheStage(t *testing.T) {
	p := handParams()
	cfg := Config{Method: S3, DataBytes: 10e9, Parallelism: 10, WorkerMemory: GiB}
	ideal, _ := mustModel(t, p, handPrices()).Predict(cfg)
	p.Stragglers = DefaultParams().Stragglers
	noSpec, _ := mustModel(t, p, handPrices()).Predict(cfg)
	p.SpeculateAfter = 0.5
	spec, _ := mustModel(t, p, handPrices()).Predict(cfg)
	if !(ideal.Seconds < spec.Seconds && spec.Seconds < noSpec.Seconds) {
		t.Errorf("ideal %v < speculation %v < none %v does not hold", ideal.Seconds, spec.Seconds, noSpec.Seconds)
	}
	if ph := noSpec.Phases[0]; !near(ph.StragglerSeconds, ph.Seconds-20) {
		t.Errorf("straggler seconds %v, want %v", ph.StragglerSeconds, ph.Seconds-20)
	}
}

// TestComputeTerm: the job's own CPU work is a phase term, spread over
// min(P, tasks, Cores) cores; with Cores set (workers and stores on the
// same cores) it adds to the largest transfer limit.
func TestComputeTerm(t *testing.T) {
	// s3, D = 1 GB on 4 workers of 1 GB (4 tasks of 250 MB): every phase's
	// transfer bound is 250 MB / 50 MB/s = 5 s (requests: 16/100 s).
	cfg := Config{Method: S3, DataBytes: 1e9, Parallelism: 4, WorkerMemory: 1e9,
		Compute: Compute{MapSecondsPerByte: 24e-9, ReduceSecondsPerByte: 8e-9}}
	for _, c := range []struct {
		name          string
		cores         float64
		map_, reduce_ float64
		mapBound      string
	}{
		// own cores: map 24 s of CPU / 4 workers = 6 s > 5 s; reduce 2 s < 5 s
		{"own cores", 0, 6, 5, ComputeTerm},
		// 2 shared cores: map 24/2 = 12 s + 5 s; reduce 8/2 = 4 s + 5 s
		{"2 shared cores", 2, 17, 9, ComputeTerm},
		// 16 shared cores: still one core per worker (4): 6 + 5, 2 + 5
		{"16 shared cores", 16, 11, 7, ComputeTerm},
	} {
		p := handParams()
		p.Cores = c.cores
		pr, err := mustModel(t, p, handPrices()).Predict(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := pr.Phases[0].Seconds; !near(got, c.map_) {
			t.Errorf("%s: map %v s, want %v", c.name, got, c.map_)
		}
		if got := pr.Phases[1].Seconds; !near(got, c.reduce_) {
			t.Errorf("%s: reduce %v s, want %v", c.name, got, c.reduce_)
		}
		if pr.Phases[0].BoundBy != c.mapBound {
			t.Errorf("%s: map bound by %q, want %q", c.name, pr.Phases[0].BoundBy, c.mapBound)
		}
		if !near(pr.Seconds, c.map_+c.reduce_) {
			t.Errorf("%s: total %v, want %v", c.name, pr.Seconds, c.map_+c.reduce_)
		}
	}
	// Without Compute nothing changes (Locus's I/O-bound model).
	cfg.Compute = Compute{}
	pr, err := mustModel(t, handParams(), handPrices()).Predict(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !near(pr.Seconds, 10) || pr.Phases[0].Term(ComputeTerm) != -1 {
		t.Errorf("no compute: %v s (want 10), compute term %v", pr.Seconds, pr.Phases[0].Term(ComputeTerm))
	}
}

// TestJobTaskCounts: a job's own mappers and partitions replace the
// model's n: MapTasks × Partitions objects, Partitions reducers; the hybrid
// gets ⌈MapTasks/k⌉ mappers and Partitions combine tasks per round.
func TestJobTaskCounts(t *testing.T) {
	m := mustModel(t, handParams(), handPrices())
	pr, err := m.Predict(Config{Method: S3, DataBytes: 1e9, Parallelism: 4, WorkerMemory: 1e9, MapTasks: 10, Partitions: 6})
	if err != nil {
		t.Fatal(err)
	}
	if pr.Phases[0].Tasks != 10 || pr.Phases[1].Tasks != 6 {
		t.Errorf("tasks %d, %d; want 10 mappers, 6 reducers", pr.Phases[0].Tasks, pr.Phases[1].Tasks)
	}
	// map: 10 input GETs, 60 partition PUTs; reduce: 60 GETs, 6 output PUTs
	if pr.SlowPuts != 66 || pr.SlowGets != 70 {
		t.Errorf("puts %v gets %v, want 66, 70", pr.SlowPuts, pr.SlowGets)
	}
	h, err := m.Predict(Config{Method: Hybrid, DataBytes: 1e9, Parallelism: 4, WorkerMemory: 1e9, FastCapacity: 2.5e8,
		MapTasks: 10, Partitions: 6})
	if err != nil {
		t.Fatal(err)
	}
	if h.Rounds != 4 || h.Phases[0].Tasks != 3 || h.Phases[1].Tasks != 6 || h.Phases[2].Tasks != 6 {
		t.Errorf("rounds %d, tasks %d/%d/%d; want 4 rounds of 3 mappers and 6 combines, 6 merges", h.Rounds,
			h.Phases[0].Tasks, h.Phases[1].Tasks, h.Phases[2].Tasks)
	}
	// per round 3×6 fast objects written and read; merge reads 6×4 runs
	if h.Phases[0].FastOps != 18 || h.Phases[1].FastOps != 18 || h.Phases[2].SlowGets != 24 {
		t.Errorf("fast ops %v/%v, merge gets %v; want 18/18, 24", h.Phases[0].FastOps, h.Phases[1].FastOps, h.Phases[2].SlowGets)
	}
	if _, err := m.Predict(Config{Method: S3, DataBytes: 1e9, Parallelism: 4, WorkerMemory: 1e9, MapTasks: -1}); err == nil {
		t.Error("negative MapTasks accepted")
	}
}

// platformParams are handParams with the platform's CPU per store, the
// same for writes and reads: 5 ns/B and 10 ms per request through the slow
// store, 3 ns/B through the fast store, 1 ns/B and 1 ms per request for
// pod pulls, and 0.5 ns/B and 1 ms per request for a producer's put into
// its own pod's store.
func platformParams(cores float64) Params {
	p := handParams()
	p.Cores = cores
	slow, fast, pod := CPUCost{PerByte: 5e-9, PerRequest: 0.01}, CPUCost{PerByte: 3e-9}, CPUCost{PerByte: 1e-9, PerRequest: 0.001}
	p.SlowCPU = StoreCPU{Read: slow, Write: slow}
	p.FastCPU = StoreCPU{Read: fast, Write: fast}
	p.PodCPU = StoreCPU{Read: pod, Write: CPUCost{PerByte: 0.5e-9, PerRequest: 0.001}}
	return p
}

// TestPlatformCPU: with Cores set and the platform's CPU measured, a
// phase's compute term is max(job / min(P, tasks, Cores), (job +
// platform) / Cores), where platform = Σ over its transfers of requests ×
// PerRequest + bytes × PerByte of the store; it competes with the transfer
// limits (max), not added to them. D = 1 GB on 4 workers of 1 GB: 4 tasks
// of 250 MB, every transfer limit 250 MB / 50 MB/s = 5 s (the pod pull
// 1.25 s); job CPU 24 s (map) and 8 s (reduce).
func TestPlatformCPU(t *testing.T) {
	job := Compute{MapSecondsPerByte: 24e-9, ReduceSecondsPerByte: 8e-9}
	for _, c := range []struct {
		name               string
		method             Method
		cores              float64
		compute            Compute
		mapPlat, redPlat   float64 // platform CPU-seconds
		map_, reduce_      float64
		mapBound, redBound string
	}{
		// s3: map reads 1 GB in 4 GETs, writes 1 GB in 16 PUTs: 2e9 B ×
		// 5 ns + 20 × 10 ms = 10.2 s; the reduce the same.
		// 2 cores: (24 + 10.2)/2 = 17.1; (8 + 10.2)/2 = 9.1.
		{"s3, 2 cores", S3, 2, job, 10.2, 10.2, 17.1, 9.1, ComputeTerm, ComputeTerm},
		// 16 cores: max(24/4, 34.2/16) = 6 > 5; max(8/4, 18.2/16) = 2 < 5
		// (the read and the write limit tie at 5 s: the first listed).
		{"s3, 16 cores", S3, 16, job, 10.2, 10.2, 6, 5, ComputeTerm, "s3 read bandwidth"},
		// no job CPU: the platform's alone, 10.2/2 = 5.1 > 5.
		{"s3, 2 cores, no job CPU", S3, 2, Compute{}, 10.2, 10.2, 5.1, 5.1, ComputeTerm, ComputeTerm},
		// own cores (Cores 0): the platform's CPU is on the stores'
		// machines and does not count: 24/4 = 6; 8/4 = 2 < 5.
		{"s3, own cores", S3, 0, job, 0, 0, 6, 5, ComputeTerm, "s3 read bandwidth"},
		// redis: map 1 GB from s3 in 4 GETs (5.04 s) + 1 GB to Redis
		// (3 s) = 8.04: (24 + 8.04)/2 = 16.02; reduce the same 8.04:
		// (8 + 8.04)/2 = 8.02.
		{"redis, 2 cores", Redis, 2, job, 8.04, 8.04, 16.02, 8.02, ComputeTerm, ComputeTerm},
		// podmemory: map reads 1 GB from s3 (5.04 s), its partitions stay
		// in the pod, but each producer hands its 4 pieces to its own
		// sidecar: 1 GB in 16 puts, 0.5 + 0.016 s; (24 + 5.556)/2 =
		// 14.778; reduce pulls 1 GB in 16 objects (1 + 0.016 s) and
		// writes 1 GB in 4 PUTs (5.04 s): (8 + 6.056)/2 = 7.028.
		{"podmemory, 2 cores", PodMemory, 2, job, 5.556, 6.056, 14.778, 7.028, ComputeTerm, ComputeTerm},
	} {
		cfg := Config{Method: c.method, DataBytes: 1e9, Parallelism: 4, WorkerMemory: 1e9, FastCapacity: 2e9, Compute: c.compute}
		pr, err := mustModel(t, platformParams(c.cores), handPrices()).Predict(cfg)
		if err != nil {
			t.Fatal(c.name, err)
		}
		m, r := pr.Phases[0], pr.Phases[1]
		if !near(m.PlatformCPU, c.mapPlat) || !near(r.PlatformCPU, c.redPlat) {
			t.Errorf("%s: platform CPU %v, %v; want %v, %v", c.name, m.PlatformCPU, r.PlatformCPU, c.mapPlat, c.redPlat)
		}
		if !near(m.Seconds, c.map_) || !near(r.Seconds, c.reduce_) {
			t.Errorf("%s: map %v s, reduce %v s; want %v, %v", c.name, m.Seconds, r.Seconds, c.map_, c.reduce_)
		}
		if m.BoundBy != c.mapBound || r.BoundBy != c.redBound {
			t.Errorf("%s: bound by %q, %q; want %q, %q", c.name, m.BoundBy, r.BoundBy, c.mapBound, c.redBound)
		}
		if m.ComputeSeconds != 0 || r.ComputeSeconds != 0 {
			t.Errorf("%s: the compute term was added to the transfers (%v, %v)", c.name, m.ComputeSeconds, r.ComputeSeconds)
		}
	}

	// hybrid, 2 cores, rounds of 250 MB (k = 4, 4 tasks each: whole waves
	// of P): a round's partition reads 250 MB from s3 in 4 GETs (1.25 +
	// 0.04) and writes 250 MB to Redis (0.75): 2.04 s of platform CPU,
	// (6 + 2.04)/2 = 4.02 > 0.3125 s of transfers; the combine reads them back (0.75) and writes 1 run of
	// 250 MB per range (4 PUTs: 1.25 + 0.04): 2.04, (2 + 2.04)/2 = 2.02;
	// the merge reads 16 runs (5 + 0.16) and writes 1 GB in 4 PUTs
	// (5.04): 10.2, (8 + 10.2)/2 = 9.1.
	cfg := Config{Method: Hybrid, DataBytes: 1e9, Parallelism: 4, WorkerMemory: 1e9, FastCapacity: 2.5e8, Compute: job}
	pr, err := mustModel(t, platformParams(2), handPrices()).Predict(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if pr.Rounds != 4 {
		t.Fatalf("rounds %d, want 4", pr.Rounds)
	}
	for i, want := range []struct{ plat, secs float64 }{{2.04, 4.02}, {2.04, 2.02}, {10.2, 9.1}} {
		ph := pr.Phases[i]
		if !near(ph.PlatformCPU, want.plat) || !near(ph.Seconds, want.secs) || ph.BoundBy != ComputeTerm {
			t.Errorf("hybrid %s: platform %v s, %v s bound by %q; want %v, %v, compute", ph.Name, ph.PlatformCPU, ph.Seconds, ph.BoundBy, want.plat, want.secs)
		}
	}
	if want := 4*(4.02+2.02) + 9.1; !near(pr.Seconds, want) {
		t.Errorf("hybrid total %v, want %v", pr.Seconds, want)
	}

	// Writes and reads priced apart: S3 writes at 7 ns/B: the s3 map reads
	// 1 GB in 4 GETs (5.04 s) and writes 1 GB in 16 PUTs (7.16 s): 12.2 s,
	// (24 + 12.2)/2 = 18.1; the reduce reads 16 (5.16) and writes 4
	// (7.04): 12.2, (8 + 12.2)/2 = 10.1.
	p := platformParams(2)
	p.SlowCPU.Write.PerByte = 7e-9
	pr, err = mustModel(t, p, handPrices()).Predict(Config{Method: S3, DataBytes: 1e9, Parallelism: 4, WorkerMemory: 1e9, Compute: job})
	if err != nil {
		t.Fatal(err)
	}
	if m, r := pr.Phases[0], pr.Phases[1]; !near(m.PlatformCPU, 12.2) || !near(r.PlatformCPU, 12.2) || !near(m.Seconds, 18.1) || !near(r.Seconds, 10.1) {
		t.Errorf("s3 with dearer writes: platform %v, %v s; phases %v, %v s; want 12.2, 12.2; 18.1, 10.1", m.PlatformCPU, r.PlatformCPU, m.Seconds, r.Seconds)
	}

	// Deletes: the consumer deletes every intermediate object it read, at
	// 2 ms per S3 object and 1 ms per Redis object; the input and output
	// bucket's objects are not deleted. s3: the map deletes nothing
	// (10.2); the reduce deletes its 16 pieces: 10.2 + 0.032 = 10.232,
	// (8 + 10.232)/2 = 9.116. redis: the reduce deletes its 16 Redis
	// objects: 8.04 + 0.016 = 8.056, (8 + 8.056)/2 = 8.028.
	p = platformParams(2)
	p.SlowCPU.Delete.PerRequest, p.FastCPU.Delete.PerRequest = 0.002, 0.001
	for _, c := range []struct {
		method           Method
		mapPlat, redPlat float64
		reduce_          float64
	}{{S3, 10.2, 10.232, 9.116}, {Redis, 8.04, 8.056, 8.028}} {
		pr, err = mustModel(t, p, handPrices()).Predict(Config{Method: c.method, DataBytes: 1e9, Parallelism: 4, WorkerMemory: 1e9, FastCapacity: 2e9, Compute: job})
		if err != nil {
			t.Fatal(err)
		}
		if m, r := pr.Phases[0], pr.Phases[1]; !near(m.PlatformCPU, c.mapPlat) || !near(r.PlatformCPU, c.redPlat) || !near(r.Seconds, c.reduce_) {
			t.Errorf("%s with deletes: platform %v, %v s; reduce %v s; want %v, %v; %v", c.method, m.PlatformCPU, r.PlatformCPU, r.Seconds, c.mapPlat, c.redPlat, c.reduce_)
		}
	}

	// Negative or infinite costs are rejected.
	p = handParams()
	p.FastCPU.Read.PerByte = -1
	if err := p.Validate(); err == nil {
		t.Error("negative fastCPU accepted")
	}
	p = handParams()
	p.SlowCPU.Delete.PerRequest = math.Inf(1)
	if err := p.Validate(); err == nil {
		t.Error("infinite slowCPU delete cost accepted")
	}
}

// TestNoPlatformCPUPredictsAsBefore: a calibration without the platform's
// CPU (all older ones) predicts exactly what it did: the predictions that
// bench/sort's run recorded in docs/bench/sort.json with
// docs/bench/sort-calibration-used.json are reproduced (less the warm
// rounds' startups, which it counted), and the platform CPU is nowhere.
func TestNoPlatformCPUPredictsAsBefore(t *testing.T) {
	cal, err := Load("../../../docs/bench/sort-calibration-used.json")
	if err != nil {
		t.Fatal(err)
	}
	if cal.Params.PlatformCPUMeasured() || cal.Params.Cores != 2 {
		t.Fatalf("that calibration has platform CPU %v or cores %v ≠ 2", cal.Params.PlatformCPUMeasured(), cal.Params.Cores)
	}
	b, err := os.ReadFile("../../../docs/bench/sort.json")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Runs []struct {
			Predicted  float64 `json:"predicted"`
			Prediction *struct {
				Config Config `json:"config"`
			} `json:"prediction"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	m := mustModel(t, cal.Params, DefaultPrices())
	n := 0
	for _, r := range rep.Runs {
		if r.Prediction == nil {
			continue
		}
		pr, err := m.Predict(r.Prediction.Config)
		if err != nil {
			t.Fatal(err)
		}
		// but for the rounds after a phase's first, which start warm now
		// (Phase.Total) and paid WorkerStartup each then
		want := r.Predicted
		for _, ph := range pr.Phases {
			want -= float64(max(ph.Count-1, 0)) * ph.Startup
		}
		if !near(pr.Seconds, want) {
			t.Errorf("%s of %v: %v s, recorded %v s less the warm rounds' startups: %v s", r.Prediction.Config.Method, r.Prediction.Config.DataBytes, pr.Seconds, r.Predicted, want)
		}
		for _, ph := range pr.Phases {
			if ph.PlatformCPU != 0 {
				t.Errorf("platform CPU %v without its calibration", ph.PlatformCPU)
			}
		}
		n++
	}
	if n != 9 {
		t.Errorf("%d predictions checked, want 9", n)
	}
}

// TestControlSDKBackground: the control path's CPU (per object announced,
// per task invoked, per object kept per second), the job's SDK in place of
// the Go SDK's share, and the
// cores the installation's idle processes take. Each case is
// TestPlatformCPU's s3 shuffle (D = 1 GB, 4 workers, 2 cores: platform
// 10.2 s of CPU per phase, job 24 s and 8 s) with one term added; without
// the term every phase is 17.1 s and 9.1 s.
func TestControlSDKBackground(t *testing.T) {
	job := Compute{MapSecondsPerByte: 24e-9, ReduceSecondsPerByte: 8e-9}
	sdks := map[string]SDKCost{
		"go": {Slow: StoreCPU{Read: CPUCost{PerRequest: 0.001}, Write: CPUCost{PerRequest: 0.001}}},
		"python": {Slow: StoreCPU{Read: CPUCost{PerByte: 1e-9, PerRequest: 0.002}, Write: CPUCost{PerByte: 1e-9, PerRequest: 0.002}},
			Send: CPUCost{PerRequest: 0.003}, PerInvocation: 0.01},
	}
	withPath := func(path PathCPU) map[string]SDKCost {
		py := sdks["python"]
		py.Path = path
		return map[string]SDKCost{"go": sdks["go"], "python": py}
	}
	for _, c := range []struct {
		name             string
		params           func(*Params)
		sdk              string
		mapPlat, redPlat float64
		mapCtl, redCtl   float64
		mapSecs, redSecs float64
	}{
		{"no new term", func(*Params) {}, "", 10.2, 10.2, 0, 0, 17.1, 9.1},
		// the map announces its 16 pieces and runs 4 tasks: 16 × 5 ms +
		// 4 × 20 ms = 0.16 s, (24 + 10.36)/2 = 17.18; the reduce
		// announces its 4 outputs, 4 tasks: 0.02 + 0.08 = 0.1 s,
		// (8 + 10.3)/2 = 9.15.
		{"control path", func(p *Params) { p.ControlCPU = ControlCPU{PerObject: 0.005, PerInvocation: 0.02} }, "", 10.36, 10.3, 0.16, 0.1, 17.18, 9.15},
		// python instead of go: each phase moves 2 GB in 20 requests:
		// python 2 + 0.04 s, go 0.02 s: +2.02 s; the sends: 16 × 3 ms
		// (map), 4 × 3 ms (reduce), and 4 invocations × 10 ms each: map
		// 12.308, (24 + 12.308)/2 = 18.154; reduce 12.272, (8 +
		// 12.272)/2 = 10.136.
		{"python SDK", func(p *Params) { p.SDKCPU = sdks }, "python", 12.308, 12.272, 0.088, 0.052, 18.154, 10.136},
		// the whole s3 path measured with the python SDK as the client
		// (server, sidecars, SDK) replaces SlowCPU and the swap: map reads
		// 1 GB (2 s) and writes 1 GB (3 s), + 0.088 s of sends and
		// invocations: (24 + 5.088)/2 = 14.544; reduce the same 5 s +
		// 0.052: (8 + 5.052)/2 = 6.526
		{"python SDK's own path", func(p *Params) {
			p.SDKCPU = withPath(PathCPU{Slow: StoreCPU{Read: CPUCost{PerByte: 2e-9}, Write: CPUCost{PerByte: 3e-9}}})
		}, "python", 5.088, 5.052, 0.088, 0.052, 14.544, 6.526},
		// a path measured through another store only: s3 as before
		{"python SDK's path through Redis only", func(p *Params) {
			p.SDKCPU = withPath(PathCPU{Fast: StoreCPU{Read: CPUCost{PerByte: 2e-9}}})
		}, "python", 12.308, 12.272, 0.088, 0.052, 18.154, 10.136},
		// the job in Go, or an SDK not measured: as before
		{"go SDK", func(p *Params) { p.SDKCPU = sdks }, "go", 10.2, 10.2, 0, 0, 17.1, 9.1},
		{"unmeasured SDK", func(p *Params) { p.SDKCPU = sdks }, "rust", 10.2, 10.2, 0, 0, 17.1, 9.1},
		// the engine keeps the session's objects: 0.0625 core per object
		// kept; the map keeps 16/2 = 8 on average (0.5 core): t = 34.2 /
		// 1.5 = 22.8 s, its upkeep 0.5 × 22.8 = 11.4 CPU-s; the reduce
		// 16 + 4/2 = 18 (1.125 cores): 18.2 / 0.875 = 20.8 s, 23.4 CPU-s.
		{"objects kept", func(p *Params) { p.ControlCPU = ControlCPU{PerObjectSecond: 0.0625} }, "", 21.6, 33.6, 11.4, 23.4, 22.8, 20.8},
		// 0.5 of the 2 cores busy when idle: (24 + 10.2)/1.5 = 22.8,
		// (8 + 10.2)/1.5 = 12.1333
		{"background", func(p *Params) { p.BackgroundCores = 0.5 }, "", 10.2, 10.2, 0, 0, 22.8, 18.2 / 1.5},
		// all of them: map (24 + 10.2 + 0.16 + 2.02 + 0.088)/1.5;
		// reduce (8 + 10.2 + 0.1 + 2.02 + 0.052)/1.5
		{"all", func(p *Params) {
			p.ControlCPU = ControlCPU{PerObject: 0.005, PerInvocation: 0.02}
			p.SDKCPU, p.BackgroundCores = sdks, 0.5
		}, "python", 12.468, 12.372, 0.248, 0.152, 36.468 / 1.5, 20.372 / 1.5},
	} {
		p := platformParams(2)
		c.params(&p)
		pr, err := mustModel(t, p, handPrices()).Predict(Config{Method: S3, DataBytes: 1e9, Parallelism: 4, WorkerMemory: 1e9, Compute: job, SDK: c.sdk})
		if err != nil {
			t.Fatal(c.name, err)
		}
		m, r := pr.Phases[0], pr.Phases[1]
		if !near(m.PlatformCPU, c.mapPlat) || !near(r.PlatformCPU, c.redPlat) || !near(m.ControlCPU, c.mapCtl) || !near(r.ControlCPU, c.redCtl) {
			t.Errorf("%s: platform CPU %v, %v (control %v, %v); want %v, %v (%v, %v)", c.name, m.PlatformCPU, r.PlatformCPU, m.ControlCPU, r.ControlCPU,
				c.mapPlat, c.redPlat, c.mapCtl, c.redCtl)
		}
		if !near(m.Seconds, c.mapSecs) || !near(r.Seconds, c.redSecs) || m.BoundBy != ComputeTerm || r.BoundBy != ComputeTerm {
			t.Errorf("%s: map %v s, reduce %v s (%s, %s); want %v, %v, compute", c.name, m.Seconds, r.Seconds, m.BoundBy, r.BoundBy, c.mapSecs, c.redSecs)
		}
	}

	// podmemory: a piece is its own object: the map announces its 16
	// pieces (put into its own sidecar, PodCPU.Write), the reduce its 4
	// outputs; 4 tasks each. 5.556 + 0.16 = 5.716, (24 + 5.716)/2 =
	// 14.858; 6.056 + 0.1 = 6.156, (8 + 6.156)/2 = 7.078.
	p := platformParams(2)
	p.ControlCPU = ControlCPU{PerObject: 0.005, PerInvocation: 0.02}
	pr, err := mustModel(t, p, handPrices()).Predict(Config{Method: PodMemory, DataBytes: 1e9, Parallelism: 4, WorkerMemory: 1e9, Compute: job})
	if err != nil {
		t.Fatal(err)
	}
	if m, r := pr.Phases[0], pr.Phases[1]; !near(m.PlatformCPU, 5.716) || !near(r.PlatformCPU, 6.156) || !near(m.Seconds, 14.858) || !near(r.Seconds, 7.078) {
		t.Errorf("podmemory with the control path: platform %v, %v s; phases %v, %v s; want 5.716, 6.156; 14.858, 7.078", m.PlatformCPU, r.PlatformCPU, m.Seconds, r.Seconds)
	}

	// The control path alone counts as measured platform CPU.
	p = handParams()
	p.ControlCPU.PerObject = 0.001
	if !p.PlatformCPUMeasured() {
		t.Error("controlCPU alone: platform CPU not measured")
	}
	// The cores left never fall below a twentieth; none without Cores.
	for _, c := range []struct{ cores, bg, want float64 }{{2, 0.5, 1.5}, {2, 5, 0.1}, {0, 0.5, 0}} {
		if got := (Params{Cores: c.cores, BackgroundCores: c.bg}).CoresLeft(); !near(got, c.want) {
			t.Errorf("cores %v, background %v: %v left, want %v", c.cores, c.bg, got, c.want)
		}
	}
	// Negative or infinite costs are rejected.
	for name, f := range map[string]func(*Params){
		"negative controlCPU": func(p *Params) { p.ControlCPU.PerInvocation = -1 },
		"negative sdkCPU":     func(p *Params) { p.SDKCPU = map[string]SDKCost{"python": {Send: CPUCost{PerRequest: -1}}} },
		"negative sdkCPU path": func(p *Params) {
			p.SDKCPU = map[string]SDKCost{"python": {Path: PathCPU{Pod: StoreCPU{Write: CPUCost{PerByte: -1}}}}}
		},
		"infinite sdkCPU": func(p *Params) {
			p.SDKCPU = map[string]SDKCost{"python": {Pod: StoreCPU{Read: CPUCost{PerByte: math.Inf(1)}}}}
		},
		"negative backgroundCores": func(p *Params) { p.BackgroundCores = -0.1 },
	} {
		p := handParams()
		f(&p)
		if err := p.Validate(); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

// TestUpkeepIsBoundedByTheCheckpointShare: the engine's upkeep grows with
// the objects it keeps up to MaxCores (the operator spaces its saves);
// without MaxCores (calibrations from before it) it is not bounded.
func TestUpkeepIsBoundedByTheCheckpointShare(t *testing.T) {
	for _, c := range []struct {
		cpu        ControlCPU
		held, want float64
	}{
		{ControlCPU{PerObjectSecond: 4e-6}, 1000, 0.004},
		{ControlCPU{PerObjectSecond: 4e-6}, 100000, 0.4},
		{ControlCPU{PerObjectSecond: 4e-6, MaxCores: 0.05}, 1000, 0.004},
		{ControlCPU{PerObjectSecond: 4e-6, MaxCores: 0.05}, 100000, 0.05},
		{ControlCPU{MaxCores: 0.05}, 100000, 0},
	} {
		if got := c.cpu.Upkeep(c.held); !near(got, c.want) {
			t.Errorf("%+v with %v objects: %v cores, want %v", c.cpu, c.held, got, c.want)
		}
	}
}
