package plan

import (
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
)

func defaultModel(t testing.TB) *model.Model {
	t.Helper()
	m, err := model.New(model.DefaultParams(), model.DefaultPrices())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func mustPlan(t *testing.T, in Input) Result {
	t.Helper()
	res, err := Plan(defaultModel(t), in)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func option(t *testing.T, res Result, m model.Method) Option {
	t.Helper()
	for _, o := range res.Options {
		if o.Method == m {
			return o
		}
	}
	t.Fatalf("no option %s", m)
	return Option{}
}

// TestObjectivesChooseDifferently: 4 GiB with 8 GiB of fast tier. The
// fastest plan pulls from pod memory with many workers; within a budget of
// $0.05 it must be a cheaper one; the cheapest plan within a minute is
// another.
func TestObjectivesChooseDifferently(t *testing.T) {
	base := Input{DataBytes: 4 * model.GiB, FastCapacity: 8 * model.GiB, MaxWorkerMemory: 3 * model.GiB}
	fastest := base
	fastest.Objective = Fastest
	budget := base
	budget.Objective, budget.Budget = Fastest, 0.05
	deadline := base
	deadline.Objective, deadline.Deadline = Cheapest, 60
	rf, rb, rd := mustPlan(t, fastest), mustPlan(t, budget), mustPlan(t, deadline)
	for _, r := range []Result{rf, rb, rd} {
		if r.Chosen == nil {
			t.Fatalf("nothing chosen: %s", r.Reason)
		}
	}
	if rf.Chosen.Config.Method != model.PodMemory {
		t.Errorf("fastest: %s, want podmemory", rf.Chosen.Config.Method)
	}
	if rb.Chosen.Cost > 0.05 || rb.Chosen.Seconds < rf.Chosen.Seconds {
		t.Errorf("fastest within $0.05: %s at %v s, %v $ (unconstrained: %v s)", rb.Chosen.Config.Method, rb.Chosen.Seconds, rb.Chosen.Cost, rf.Chosen.Seconds)
	}
	if rd.Chosen.Seconds > 60 {
		t.Errorf("cheapest within 60 s takes %v s", rd.Chosen.Seconds)
	}
	if rd.Chosen.Cost > rb.Chosen.Cost {
		t.Errorf("cheapest within a minute ($%v) costs more than the fastest within $0.05 ($%v)", rd.Chosen.Cost, rb.Chosen.Cost)
	}
	if reflect.DeepEqual(rb.Chosen.Config, rd.Chosen.Config) {
		t.Errorf("budget and deadline objectives chose the same plan %+v", rb.Chosen.Config)
	}
	if !strings.Contains(rb.Reason, "within the budget of $0.05") || !strings.Contains(rd.Reason, "within the deadline of 1m0s") {
		t.Errorf("reasons: %q, %q", rb.Reason, rd.Reason)
	}
	// every option is the best of its method for the objective: the
	// chosen one is the best of them
	for _, o := range rf.Options {
		if o.Best != nil && o.Best.Seconds < rf.Chosen.Seconds {
			t.Errorf("%s is faster (%v s) than the chosen plan", o.Method, o.Best.Seconds)
		}
	}
	for _, o := range rd.Options {
		if o.MeetsConstraint && o.Best.Cost < rd.Chosen.Cost {
			t.Errorf("%s is cheaper within the deadline than the chosen plan", o.Method)
		}
	}
}

func TestInfeasibleMethodsExplained(t *testing.T) {
	res := mustPlan(t, Input{DataBytes: 4 * model.GiB, FastCapacity: model.GiB, PodMemory: model.GiB, MaxWorkerMemory: 3 * model.GiB, Objective: Fastest, Budget: 0.05})
	for m, want := range map[model.Method]string{
		model.Redis:     "redis: 4 GiB does not fit in 1 GiB of fast tier",
		model.PodMemory: "podmemory: 4 GiB does not fit in 1 GiB of pod memory",
	} {
		o := option(t, res, m)
		if o.Best != nil || o.Reason != want {
			t.Errorf("%s: best %v, reason %q; want %q", m, o.Best, o.Reason, want)
		}
	}
	if res.Chosen == nil || (res.Chosen.Config.Method != model.S3 && res.Chosen.Config.Method != model.Hybrid) {
		t.Errorf("chosen %+v", res.Chosen)
	}
	// no fast tier at all; pod memory only limited by the pods: 4 small
	// workers cannot hold 4 GiB
	res = mustPlan(t, Input{DataBytes: 4 * model.GiB, MaxWorkerMemory: 512 * model.MiB, MaxParallelism: 4})
	if o := option(t, res, model.Hybrid); o.Reason != "hybrid: no fast tier to run rounds through (fast capacity 0)" {
		t.Errorf("hybrid: %q", o.Reason)
	}
	if o := option(t, res, model.PodMemory); o.Reason != "podmemory: 4 GiB does not fit in the object stores of 4 pods of 512 MiB (1 GiB: 50 % each)" {
		t.Errorf("podmemory: %q", o.Reason)
	}
}

// TestHybridForDataFarBeyondFastTier: 10 TiB through 100 GiB of Redis,
// 1 TiB of pod memory, within $500 (Locus §3.6: hybrid pays off for very
// large shuffles, when the slow store's n² requests dominate).
func TestHybridForDataFarBeyondFastTier(t *testing.T) {
	res := mustPlan(t, Input{DataBytes: 10 * model.TiB, FastCapacity: 100 * model.GiB, PodMemory: model.TiB, MaxWorkerMemory: 3 * model.GiB, Objective: Fastest, Budget: 500})
	if res.Chosen == nil || res.Chosen.Config.Method != model.Hybrid {
		t.Fatalf("chose %+v (%s)", res.Chosen, res.Reason)
	}
	c := res.Chosen
	if c.Cost > 500 || c.Rounds < 103 || c.RoundBytes > 100*model.GiB {
		t.Errorf("hybrid plan: $%v, %d rounds of %s", c.Cost, c.Rounds, model.FormatBytes(c.RoundBytes))
	}
	s3 := option(t, res, model.S3)
	if s3.Best == nil || s3.Best.Seconds <= c.Seconds {
		t.Fatalf("s3: %+v", s3)
	}
	if b := s3.Best.Phases[0].BoundBy; b != "s3 requests" {
		t.Errorf("s3's map is bound by %q, want its requests", b)
	}
	if len(c.Phases) != 3 || c.Phases[0].Count != c.Rounds || c.Phases[2].Name != "merge" {
		t.Errorf("phases %+v", c.Phases)
	}
}

func TestNothingMeetsTheConstraint(t *testing.T) {
	res := mustPlan(t, Input{DataBytes: 4 * model.GiB, FastCapacity: 8 * model.GiB, MaxWorkerMemory: 3 * model.GiB, Objective: Fastest, Budget: 0.0001})
	if res.Chosen != nil {
		t.Fatalf("chose %+v", res.Chosen)
	}
	if !strings.HasPrefix(res.Reason, "no plan within the budget of $0.0001: the cheapest, s3, costs $") {
		t.Errorf("reason %q", res.Reason)
	}
	for _, o := range res.Options {
		if o.Best == nil || o.MeetsConstraint || !strings.Contains(o.Reason, "over budget") {
			t.Errorf("%s: %+v", o.Method, o)
		}
	}
	res = mustPlan(t, Input{DataBytes: 4 * model.GiB, MaxWorkerMemory: 3 * model.GiB, Objective: Cheapest, Deadline: 0.5})
	if res.Chosen != nil || !strings.Contains(res.Reason, "no plan within the deadline of 500ms: the fastest, podmemory, takes") {
		t.Errorf("deadline: %+v %q", res.Chosen, res.Reason)
	}
}

func TestDeterministic(t *testing.T) {
	in := Input{DataBytes: 100 * model.GiB, FastCapacity: 5 * model.GiB, MaxWorkerMemory: 3 * model.GiB, Objective: Cheapest, Deadline: 1800}
	a, b := mustPlan(t, in), mustPlan(t, in)
	if !reflect.DeepEqual(a, b) {
		t.Error("two plans of the same input differ")
	}
}

func TestInputErrors(t *testing.T) {
	for _, in := range []Input{
		{DataBytes: 0, MaxWorkerMemory: model.GiB},
		{DataBytes: model.GiB},
		{DataBytes: model.GiB, MaxWorkerMemory: model.GiB, Objective: Fastest, Deadline: 10},
		{DataBytes: model.GiB, MaxWorkerMemory: model.GiB, Objective: Cheapest, Budget: 10},
		{DataBytes: model.GiB, MaxWorkerMemory: model.GiB, Objective: "soonest"},
		{DataBytes: model.GiB, MaxWorkerMemory: model.GiB, FastCapacity: -1},
	} {
		if _, err := Plan(defaultModel(t), in); err == nil {
			t.Errorf("%+v: no error", in)
		}
	}
}

func TestGrids(t *testing.T) {
	if got, want := parallelisms(20), []int{1, 2, 3, 4, 6, 8, 12, 16, 20}; !reflect.DeepEqual(got, want) {
		t.Errorf("parallelisms(20) = %v", got)
	}
	if got, want := workerMemories(200*model.MiB, model.GiB), []float64{200 * model.MiB, 256 * model.MiB, 384 * model.MiB, 512 * model.MiB, 768 * model.MiB, model.GiB}; !reflect.DeepEqual(got, want) {
		t.Errorf("workerMemories = %v", got)
	}
	// k from ⌈10/4⌉ = 3 rounds, ×1.25 at a time, to at most 32·3 = 96
	d := 10.0 * model.GiB
	rs := roundSizes(d, 4*model.GiB)
	first, last := d/rs[0], d/rs[len(rs)-1]
	if math.Abs(first-3) > 1e-9 || last > 96+1e-9 || last < 96/1.25 {
		t.Errorf("roundSizes: %v to %v rounds", first, last)
	}
}

// BenchmarkPlan measures one whole plan with a fresh model (no cached
// straggler expectations); the target is < 50 ms.
func BenchmarkPlan(b *testing.B) {
	for _, c := range []struct {
		name string
		in   Input
	}{
		{"4GiB", Input{DataBytes: 4 * model.GiB, FastCapacity: model.GiB, MaxWorkerMemory: 3 * model.GiB, Objective: Fastest, Budget: 0.05}},
		{"10TiB", Input{DataBytes: 10 * model.TiB, FastCapacity: 100 * model.GiB, PodMemory: model.TiB, MaxWorkerMemory: 3 * model.GiB, Objective: Fastest, Budget: 500}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := Plan(defaultModel(b), c.in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
