// Package plan chooses how to run a shuffle: it searches method ×
// parallelism × worker memory × hybrid round size with the Locus model
// (package model) and returns the best plan for the user's objective —
// the fastest within a budget, or the cheapest within a deadline — with
// the best plan of every method for comparison and the reason a method
// cannot run at all.
//
// The search is exhaustive over a fixed grid, so it is deterministic:
// worker memory from MinWorkerMemory to MaxWorkerMemory in steps of ×1.5
// and ×4/3 (128, 192, 256, 384, 512 MiB, …, plus the maximum); parallelism
// 1, 2, 3, 4, 6, 8, 12, … up to MaxParallelism (plus it); for the hybrid,
// k = ⌈D/F⌉ rounds (F the fast capacity) and then ×1.25 more at a time up
// to 32× as many, the round size being D/k. Ties keep the earlier
// candidate in that order (smaller workers, fewer of them, fewer rounds).
package plan

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
)

// Objective is what the planner optimizes.
type Objective string

const (
	// Fastest is the shortest predicted time whose cost is within Budget
	// (any cost when Budget is 0).
	Fastest Objective = "fastest"
	// Cheapest is the lowest predicted cost whose time is within Deadline
	// (any time when Deadline is 0).
	Cheapest Objective = "cheapest"
)

// Defaults of Input's zero values.
const (
	DefaultMinWorkerMemory = 128 * model.MiB
	DefaultMaxParallelism  = 1024
)

// Input is the shuffle to plan and the limits to plan within.
type Input struct {
	// DataBytes is D, the bytes to shuffle.
	DataBytes float64 `json:"dataBytes"`
	// FastCapacity is the fast tier's (Redis's) memory available to the
	// shuffle; 0: no fast tier.
	FastCapacity float64 `json:"fastCapacity"`
	// PodMemory caps the producer pods' object-store memory, all pods
	// together; 0: only each pod's own memory limits it.
	PodMemory float64 `json:"podMemory,omitempty"`
	// MinWorkerMemory and MaxWorkerMemory bound w (min 0: 128 MiB).
	MinWorkerMemory float64 `json:"minWorkerMemory,omitempty"`
	MaxWorkerMemory float64 `json:"maxWorkerMemory"`
	// MaxParallelism bounds P (0: 1024).
	MaxParallelism int `json:"maxParallelism,omitempty"`
	// Objective, and its constraint: Budget in dollars for Fastest,
	// Deadline in seconds for Cheapest (0: none). An empty Objective is
	// Cheapest with a Deadline, else Fastest.
	Objective Objective `json:"objective"`
	Budget    float64   `json:"budget,omitempty"`
	Deadline  float64   `json:"deadline,omitempty"`
	// Methods to consider (empty: all).
	Methods []model.Method `json:"methods,omitempty"`
}

// Option is one method's outcome.
type Option struct {
	Method model.Method `json:"method"`
	// Best is the method's best plan: the best within the constraint if
	// any meets it, else the one closest to meeting it (the cheapest when
	// over budget, the fastest when past the deadline); nil when the method
	// cannot run at all.
	Best *model.Prediction `json:"best,omitempty"`
	// MeetsConstraint says whether Best is within the budget or deadline.
	MeetsConstraint bool `json:"meetsConstraint"`
	// Reason says why the method cannot run, or misses the constraint.
	Reason string `json:"reason,omitempty"`
	// Evaluated is the number of configurations the model predicted.
	Evaluated int `json:"evaluated"`
}

// Result is the planner's answer.
type Result struct {
	Input Input `json:"input"`
	// Chosen is the best plan over all methods that meets the constraint;
	// nil when none does (Reason says why).
	Chosen *model.Prediction `json:"chosen,omitempty"`
	Reason string            `json:"reason"`
	// Options are every considered method's best, in model.Methods order.
	Options []Option `json:"options"`
}

// Plan searches the configurations of in with m and returns the best.
func Plan(m *model.Model, in Input) (Result, error) {
	if err := in.Check(); err != nil {
		return Result{}, fmt.Errorf("plan: %w", err)
	}
	if in.MinWorkerMemory == 0 {
		in.MinWorkerMemory = DefaultMinWorkerMemory
	}
	if in.MaxParallelism == 0 {
		in.MaxParallelism = DefaultMaxParallelism
	}
	if in.Objective == "" {
		// A deadline alone asks for the cheapest plan within it.
		in.Objective = Fastest
		if in.Deadline > 0 {
			in.Objective = Cheapest
		}
	}
	switch {
	case in.MaxWorkerMemory < in.MinWorkerMemory || !(in.MaxWorkerMemory > 0):
		return Result{}, fmt.Errorf("plan: the worker memory limit (%s) must be at least %s", model.FormatBytes(in.MaxWorkerMemory), model.FormatBytes(in.MinWorkerMemory))
	case in.MaxParallelism < 1:
		return Result{}, errors.New("plan: the maximum parallelism must be at least 1")
	case in.FastCapacity < 0 || in.PodMemory < 0 || in.Budget < 0 || in.Deadline < 0:
		return Result{}, errors.New("plan: capacities, budget and deadline must not be negative")
	case in.Objective != Fastest && in.Objective != Cheapest:
		return Result{}, fmt.Errorf("plan: unknown objective %q (want fastest or cheapest)", in.Objective)
	case in.Objective == Fastest && in.Deadline > 0:
		return Result{}, errors.New("plan: a deadline goes with the cheapest objective, a budget with the fastest")
	case in.Objective == Cheapest && in.Budget > 0:
		return Result{}, errors.New("plan: a budget goes with the fastest objective, a deadline with the cheapest")
	}
	methods := in.Methods
	if len(methods) == 0 {
		methods = model.Methods
	}
	ws := workerMemories(in.MinWorkerMemory, in.MaxWorkerMemory)
	ps := parallelisms(in.MaxParallelism)
	res := Result{Input: in}
	for _, meth := range model.Methods {
		if !slices.Contains(methods, meth) {
			continue
		}
		opt := Option{Method: meth}
		var best, closest *model.Prediction
		var lastReason string
		rounds := []float64{0}
		if meth == model.Hybrid && in.FastCapacity > 0 {
			rounds = roundSizes(in.DataBytes, in.FastCapacity)
		}
		for _, w := range ws {
			for _, p := range ps {
				for _, r := range rounds {
					c := model.Config{Method: meth, DataBytes: in.DataBytes, Parallelism: p, WorkerMemory: w,
						RoundBytes: r, FastCapacity: in.FastCapacity, PodMemory: in.PodMemory}
					pr, err := m.Predict(c)
					opt.Evaluated++
					if err != nil {
						var ie *model.InfeasibleError
						if !errors.As(err, &ie) {
							return Result{}, err
						}
						lastReason = err.Error()
						continue
					}
					if in.meets(pr) {
						if best == nil || in.better(pr, *best) {
							best = &pr
						}
					} else if closest == nil || in.closer(pr, *closest) {
						closest = &pr
					}
				}
			}
		}
		switch {
		case best != nil:
			opt.Best, opt.MeetsConstraint = best, true
		case closest != nil:
			opt.Best = closest
			if in.Objective == Fastest {
				opt.Reason = fmt.Sprintf("%s: over budget: its cheapest plan costs %s > %s", meth, model.FormatDollars(closest.Cost), model.FormatDollars(in.Budget))
			} else {
				opt.Reason = fmt.Sprintf("%s: past the deadline: its fastest plan takes %s > %s", meth, model.FormatSeconds(closest.Seconds), model.FormatSeconds(in.Deadline))
			}
		default:
			opt.Reason = lastReason
		}
		if opt.MeetsConstraint && (res.Chosen == nil || in.better(*opt.Best, *res.Chosen)) {
			res.Chosen = opt.Best
		}
		res.Options = append(res.Options, opt)
	}
	res.Reason = in.reason(res)
	return res, nil
}

func (in Input) meets(p model.Prediction) bool {
	if in.Objective == Fastest {
		return in.Budget == 0 || p.Cost <= in.Budget
	}
	return in.Deadline == 0 || p.Seconds <= in.Deadline
}

// better says whether a beats b for the objective (strictly: ties keep b).
func (in Input) better(a, b model.Prediction) bool {
	if in.Objective == Fastest {
		return a.Seconds < b.Seconds || (a.Seconds == b.Seconds && a.Cost < b.Cost)
	}
	return a.Cost < b.Cost || (a.Cost == b.Cost && a.Seconds < b.Seconds)
}

// closer says whether a is closer than b to meeting the constraint.
func (in Input) closer(a, b model.Prediction) bool {
	if in.Objective == Fastest {
		return a.Cost < b.Cost || (a.Cost == b.Cost && a.Seconds < b.Seconds)
	}
	return a.Seconds < b.Seconds || (a.Seconds == b.Seconds && a.Cost < b.Cost)
}

func (in Input) reason(res Result) string {
	var within string
	switch {
	case in.Objective == Fastest && in.Budget > 0:
		within = " within the budget of " + model.FormatDollars(in.Budget)
	case in.Objective == Cheapest && in.Deadline > 0:
		within = " within the deadline of " + model.FormatSeconds(in.Deadline)
	}
	if res.Chosen != nil {
		return fmt.Sprintf("the %s plan%s", in.Objective, within)
	}
	var closest *model.Prediction
	for _, o := range res.Options {
		if o.Best != nil && (closest == nil || in.closer(*o.Best, *closest)) {
			closest = o.Best
		}
	}
	switch {
	case closest == nil:
		return "no method can run this shuffle"
	case in.Objective == Fastest:
		return fmt.Sprintf("no plan%s: the cheapest, %s, costs %s", within, closest.Config.Method, model.FormatDollars(closest.Cost))
	default:
		return fmt.Sprintf("no plan%s: the fastest, %s, takes %s", within, closest.Config.Method, model.FormatSeconds(closest.Seconds))
	}
}

// workerMemories is the worker-memory grid: 128 MiB·2^i and 192 MiB·2^i
// within [lo, hi], plus lo and hi.
func workerMemories(lo, hi float64) []float64 {
	out := []float64{lo}
	for v := 128.0 * model.MiB; v <= hi; v *= 2 {
		for _, x := range []float64{v, v * 1.5} {
			if x > lo && x < hi {
				out = append(out, x)
			}
		}
	}
	if hi > lo {
		out = append(out, hi)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// parallelisms is the parallelism grid: 1, 2, 3, 4, 6, 8, 12, … ≤ max,
// plus max.
func parallelisms(maxP int) []int {
	out := []int{1}
	for v := 2; v <= maxP; v *= 2 {
		out = append(out, v)
		if v*3/2 <= maxP && v >= 2 {
			out = append(out, v*3/2)
		}
	}
	out = append(out, maxP)
	slices.Sort(out)
	return slices.Compact(out)
}

// roundSizes is the hybrid's round-size grid: D/k for k = ⌈D/F⌉ rounds and
// then ×1.25 more at a time, up to 32× as many.
func roundSizes(d, fastCap float64) []float64 {
	kmin := int(math.Ceil(d / fastCap))
	var out []float64
	for k := kmin; k <= 32*kmin; k = max(k+1, int(math.Ceil(float64(k)*1.25))) {
		out = append(out, d/float64(k))
	}
	return out
}
