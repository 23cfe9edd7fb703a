package model

import (
	"errors"
	"fmt"
	"math"
)

// Method is where a shuffle keeps its intermediate data.
type Method string

const (
	// S3 keeps every mapper→reducer partition in the slow store.
	S3 Method = "s3"
	// Redis keeps every partition in the fast store; all of them must fit.
	Redis Method = "redis"
	// PodMemory keeps every partition in its producer's pod memory; the
	// reducers pull them directly. All of them must fit in the producers'
	// object stores, and the producers stay up until they are pulled.
	PodMemory Method = "podmemory"
	// Hybrid is Locus's multi-round shuffle (§3.4, Fig. 3): rounds of r
	// bytes through the fast store, a sorted run per range and round to the
	// slow store, then a merge of every range's runs.
	Hybrid Method = "hybrid"
)

// Methods are all methods, in the order outputs list them.
var Methods = []Method{S3, Redis, PodMemory, Hybrid}

// Config is one way to run a shuffle: the job (DataBytes), the knobs the
// planner turns (Method, Parallelism, WorkerMemory, RoundBytes), and the
// capacities it must fit in.
type Config struct {
	Method Method `json:"method"`
	// DataBytes is D, the bytes shuffled (= the job's input = its output).
	DataBytes float64 `json:"dataBytes"`
	// Parallelism is P, the number of workers running at once.
	Parallelism int `json:"parallelism"`
	// WorkerMemory is w, each worker's memory in bytes.
	WorkerMemory float64 `json:"workerMemory"`
	// RoundBytes is r, the bytes one hybrid round moves through the fast
	// store (0: FastCapacity). Hybrid only.
	RoundBytes float64 `json:"roundBytes,omitempty"`
	// FastCapacity is the fast store's memory available to the shuffle.
	FastCapacity float64 `json:"fastCapacity,omitempty"`
	// PodMemory caps the memory all producer pods' object stores may hold
	// together (0: only P·w·PodStoreFraction).
	PodMemory float64 `json:"podMemory,omitempty"`

	// MapTasks and Partitions, when set, are the job's own task counts
	// instead of the model's n = P·⌈D/(P·c)⌉: MapTasks mappers over the
	// whole input (a hybrid round gets ⌈MapTasks/k⌉ of them), Partitions
	// reducers (ranges; a hybrid round's combine has one task per range).
	// The objects shuffled are then MapTasks × Partitions, not n². A job
	// that fixed its tasks (examples/sort: taskRecords, partitions) is
	// predicted with its own counts.
	MapTasks   int `json:"mapTasks,omitempty"`
	Partitions int `json:"partitions,omitempty"`
	// Compute is the job's own CPU work besides the transfers (0: none,
	// Locus's assumption: its sort is I/O-bound).
	Compute Compute `json:"compute,omitzero"`
	// SDK is the SDK the job's functions use ("go", "python"; empty: the
	// one calibrate measured, Go). With Params.SDKCPU of that SDK, its own
	// CPU per transfer replaces the Go SDK's in the platform CPU.
	SDK string `json:"sdk,omitempty"`
}

// Compute is a job's CPU work, in seconds of one core per byte of data:
// MapSecondsPerByte for the map side (a mapper producing its partitions:
// generating or parsing its input, sorting, partitioning), ReduceSecondsPerByte
// for the reduce side (a reducer merging its pieces; also a hybrid round's
// combine and the final merge). A phase's compute term is
// bytes · perByte / min(P, tasks, Params.Cores): the work spread over the
// workers, at most one core each, and at most the cores there are.
type Compute struct {
	MapSecondsPerByte    float64 `json:"mapSecondsPerByte,omitempty"`
	ReduceSecondsPerByte float64 `json:"reduceSecondsPerByte,omitempty"`
}

// Model predicts shuffle times and costs. It caches straggler
// expectations, so it is not safe for concurrent use.
type Model struct {
	Params Params
	Prices Prices
	strag  *stragglers
	sdk    string // the Config.SDK of the prediction being made
	// held is the objects the engine keeps of the session while the next
	// phase runs, on average (set by at before each phase)
	held float64
}

// at sets the objects the engine keeps of the session, on average, while
// the next phase runs: those announced by the phases before it (a session
// keeps them to its end) and half of its own.
func (m *Model) at(held float64) *Model {
	m.held = held
	return m
}

// New checks params and prices and returns a Model.
func New(params Params, prices Prices) (*Model, error) {
	if err := params.Validate(); err != nil {
		return nil, fmt.Errorf("params: %w", err)
	}
	if err := prices.Validate(); err != nil {
		return nil, fmt.Errorf("prices: %w", err)
	}
	return &Model{Params: params, Prices: prices, strag: newStragglers(params.Stragglers, params.SpeculateAfter)}, nil
}

// Predict predicts c's time and cost, or returns an *InfeasibleError.
func (m *Model) Predict(c Config) (Prediction, error) {
	if !(c.DataBytes > 0) || c.Parallelism < 1 || !(c.WorkerMemory > 0) || math.IsInf(c.DataBytes, 0) {
		return Prediction{}, errors.New("model: need dataBytes > 0, parallelism ≥ 1, workerMemory > 0")
	}
	pp := m.Params
	d, p, w := c.DataBytes, c.Parallelism, c.WorkerMemory
	if c.MapTasks < 0 || c.Partitions < 0 || c.Compute.MapSecondsPerByte < 0 || c.Compute.ReduceSecondsPerByte < 0 {
		return Prediction{}, errors.New("model: mapTasks, partitions and compute must not be negative")
	}
	n := tasks(d, p, pp.TaskMemoryFraction*w)
	// nm mappers, nr reducers (both n unless the job fixed its own)
	nm, nr := n, n
	if c.MapTasks > 0 {
		nm = c.MapTasks
	}
	if c.Partitions > 0 {
		nr = c.Partitions
	}
	nf, mapf := float64(nr), float64(nm)
	cpuMap, cpuReduce := d*c.Compute.MapSecondsPerByte, d*c.Compute.ReduceSecondsPerByte
	pr := Prediction{Config: c, Tasks: n}
	m.sdk = c.SDK
	infeasible := func(format string, a ...any) (Prediction, error) {
		return Prediction{}, &InfeasibleError{Method: c.Method, Reason: fmt.Sprintf(format, a...)}
	}
	var fastHeld float64 // bytes kept in the fast store while the job runs
	switch c.Method {
	case S3:
		// map: read the input (n objects), write n² partitions; reduce:
		// read them, write the output (n objects).
		pr.Phases = []Phase{
			m.at(mapf*nf/2).phase("map", 1, nm, p, w, p, cpuMap, []op{{slowIO, false, d, mapf}, {slowShuffle, true, d, mapf * nf}}),
			m.at(mapf*nf+nf/2).phase("reduce", 1, nr, p, w, p, cpuReduce, []op{{slowShuffle, false, d, mapf * nf}, {slowIO, true, d, nf}}),
		}
	case Redis:
		if d > c.FastCapacity {
			return infeasible("%s does not fit in %s of fast tier", FormatBytes(d), FormatBytes(c.FastCapacity))
		}
		fastHeld = d
		pr.Phases = []Phase{
			m.at(mapf*nf/2).phase("map", 1, nm, p, w, p, cpuMap, []op{{slowIO, false, d, mapf}, {fast, true, d, mapf * nf}}),
			m.at(mapf*nf+nf/2).phase("reduce", 1, nr, p, w, p, cpuReduce, []op{{fast, false, d, mapf * nf}, {slowIO, true, d, nf}}),
		}
	case PodMemory:
		capacity := float64(p) * w * pp.PodStoreFraction
		if c.PodMemory > 0 && c.PodMemory < capacity {
			if d > c.PodMemory {
				return infeasible("%s does not fit in %s of pod memory", FormatBytes(d), FormatBytes(c.PodMemory))
			}
			capacity = c.PodMemory
		}
		if d > capacity {
			return infeasible("%s does not fit in the object stores of %d pods of %s (%s: %.0f %% each)",
				FormatBytes(d), p, FormatBytes(w), FormatBytes(capacity), 100*pp.PodStoreFraction)
		}
		// map: read the input, keep the n² partitions in the pod's own
		// memory (no transfer); reduce: pull them, write the output. The
		// producers stay up, holding their partitions, while the reducers
		// run: 2P workers billed.
		pr.Phases = []Phase{
			m.at(mapf*nf/2).phase("map", 1, nm, p, w, p, cpuMap, []op{{slowIO, false, d, mapf}, {pod, true, d, mapf * nf}}),
			m.at(mapf*nf+nf/2).phase("reduce", 1, nr, p, w, 2*p, cpuReduce, []op{{pod, false, d, mapf * nf}, {slowIO, true, d, nf}}),
		}
	case Hybrid:
		r := c.RoundBytes
		if r <= 0 {
			r = c.FastCapacity
		}
		if !(r > 0) {
			return infeasible("no fast tier to run rounds through (fast capacity 0)")
		}
		if r > c.FastCapacity {
			return infeasible("a round of %s does not fit in %s of fast tier", FormatBytes(r), FormatBytes(c.FastCapacity))
		}
		k := int(math.Ceil(d / r * (1 - 1e-12))) // r = D/k exactly gives k, not k+1
		re := d / float64(k)
		kf := float64(k)
		// Ranges: the final merge has one task per range, R = n, each
		// range at most one task's data. Per round, m tasks partition re
		// bytes into the fast store (m² objects) and m combine tasks write
		// one sorted run per range (R objects of re/R bytes) to the slow
		// store. The merge reads every range's k runs (R·k objects) and
		// writes the output.
		// With the job's own counts: ⌈MapTasks/k⌉ mappers per round, one
		// combine task per range.
		mt := tasks(re, p, pp.TaskMemoryFraction*w)
		ct, objs := mt, float64(mt)*float64(mt)
		if c.MapTasks > 0 {
			mt = int(math.Ceil(mapf / kf))
		}
		if c.MapTasks > 0 || c.Partitions > 0 {
			ct, objs = nr, float64(mt)*nf
		}
		mf := float64(mt)
		fastHeld = re
		pr.Rounds, pr.RoundBytes = k, re
		pr.Phases = []Phase{
			m.at((kf-1)/2*(objs+nf)+objs/2).phase("round: partition", k, mt, p, w, p, cpuMap/kf, []op{{slowIO, false, re, mf}, {fast, true, re, objs}}),
			m.at((kf-1)/2*(objs+nf)+objs+nf/2).phase("round: combine", k, ct, p, w, p, cpuReduce/kf, []op{{fast, false, re, objs}, {slowShuffle, true, re, nf}}),
			m.at(kf*(objs+nf)+nf/2).phase("merge", 1, nr, p, w, p, cpuReduce, []op{{slowShuffle, false, d, nf * kf}, {slowIO, true, d, nf}}),
		}
	default:
		return Prediction{}, fmt.Errorf("model: unknown method %q (want s3, redis, podmemory or hybrid)", c.Method)
	}

	var workerSeconds float64
	for _, ph := range pr.Phases {
		pr.Seconds += ph.Total()
		workerSeconds += ph.Total() * float64(ph.Workers)
	}
	for _, ph := range pr.Phases {
		pr.SlowGets += float64(ph.Count) * ph.SlowGets
		pr.SlowPuts += float64(ph.Count) * ph.SlowPuts
		pr.FastOps += float64(ph.Count) * ph.FastOps
	}
	hours := pr.Seconds / 3600
	pz := m.Prices
	pr.Costs.Workers = workerSeconds * w / GiB * pz.WorkerPerGiBSecond
	pr.Costs.SlowRequests = pr.SlowGets*pz.SlowPerGet + pr.SlowPuts*pz.SlowPerPut
	if c.Method == S3 || c.Method == Hybrid {
		// the intermediate data (partitions or runs) sits in S3 at most
		// the whole job
		pr.Costs.SlowStorage = d / GiB * hours / 730 * pz.SlowPerGiBMonth
	}
	if fastHeld > 0 {
		moved := 2 * d // written once, read once
		pr.Costs.Fast = fastHeld/GiB*hours*pz.FastPerGiBHour + float64(pp.FastShards)*hours*pz.FastPerNodeHour + moved/GiB*pz.FastPerGiBTransferred
	}
	pr.Cost = pr.Costs.Total()
	return pr, nil
}
