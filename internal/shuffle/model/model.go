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

// Term is one limit on a phase's time: the seconds the phase would take if
// that limit alone bound it.
type Term struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
}

// Total is the phase's predicted time over its Count runs: the first
// cold, the others warm (Startup once).
func (ph Phase) Total() float64 {
	if ph.Count <= 0 {
		return 0
	}
	return float64(ph.Count)*ph.Seconds - float64(ph.Count-1)*ph.Startup
}

// Phase is one stage of the shuffle, with what bounds it.
type Phase struct {
	Name string `json:"name"`
	// Count is how many times the phase runs (the rounds, for the hybrid's
	// per-round phases).
	Count int `json:"count"`
	// Tasks is the number of tasks of one run of the phase.
	Tasks int `json:"tasks"`
	// Seconds is the first run's predicted time: Startup + the largest
	// term. Later runs of the phase (the hybrid's rounds) start warm and
	// take Seconds − Startup: see Total.
	Seconds float64 `json:"seconds"`
	// Startup is WorkerStartup, paid by the phase's first run only: its
	// function's pods are up for the next round, seconds later (Knative
	// keeps an idle pod for its scale-down window, 60 s and more).
	Startup float64 `json:"startup"`
	// BoundBy is the name of the largest term.
	BoundBy string `json:"boundBy"`
	Terms   []Term `json:"terms"`
	// StragglerSeconds is how much of the worker-bandwidth term stragglers
	// add (after speculation), whether or not that term is the largest.
	StragglerSeconds float64 `json:"stragglerSeconds"`
	// ComputeSeconds is the compute term when it adds to the transfers
	// (Params.Cores set: workers and stores share the cores); 0 otherwise.
	ComputeSeconds float64 `json:"computeSeconds,omitempty"`
	// PlatformCPU is the CPU seconds (of one core) the installation's own
	// processes spend moving the phase's bytes (Params.SlowCPU, FastCPU,
	// PodCPU); counted, with Params.Cores set, in the compute term.
	PlatformCPU float64 `json:"platformCPU,omitempty"`
	// ControlCPU is the part of PlatformCPU on the control path
	// (Params.ControlCPU: objects announced, tasks invoked).
	ControlCPU float64 `json:"controlCPU,omitempty"`
	// Workers is the number of workers billed while the phase runs.
	Workers int `json:"workers"`
	// Requests of one run of the phase: to the slow store (both buckets),
	// to the fast store.
	SlowGets float64 `json:"slowGets"`
	SlowPuts float64 `json:"slowPuts"`
	FastOps  float64 `json:"fastOps"`
}

// Costs is a prediction's cost in dollars, by resource.
type Costs struct {
	Workers      float64 `json:"workers"`
	SlowRequests float64 `json:"slowRequests"`
	SlowStorage  float64 `json:"slowStorage"`
	Fast         float64 `json:"fast"`
}

// Total is the sum.
func (c Costs) Total() float64 { return c.Workers + c.SlowRequests + c.SlowStorage + c.Fast }

// Prediction is the model's prediction for one Config.
type Prediction struct {
	Config Config `json:"config"`
	// Tasks is the number of map tasks (and of reduce tasks, or of final
	// ranges for the hybrid): P·⌈D/(P·c)⌉ with c = TaskMemoryFraction·w.
	Tasks int `json:"tasks"`
	// Rounds and RoundBytes are the hybrid's k = ⌈D/r⌉ rounds of D/k bytes.
	Rounds     int     `json:"rounds,omitempty"`
	RoundBytes float64 `json:"roundBytes,omitempty"`
	Seconds    float64 `json:"seconds"`
	Cost       float64 `json:"cost"`
	Costs      Costs   `json:"costs"`
	Phases     []Phase `json:"phases"`
	// Requests made: to the slow store (both buckets), to the fast store.
	SlowGets float64 `json:"slowGets"`
	SlowPuts float64 `json:"slowPuts"`
	FastOps  float64 `json:"fastOps"`
}

// InfeasibleError says why a Config cannot run at all (as opposed to
// running slowly or expensively).
type InfeasibleError struct {
	Method Method
	Reason string
}

func (e *InfeasibleError) Error() string { return string(e.Method) + ": " + e.Reason }

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

// bucket is a request-rate budget (and, through its store, a bandwidth).
type bucket int

const (
	slowShuffle bucket = iota // the slow store's intermediate bucket
	slowIO                    // the slow store's input/output bucket
	fast                      // the fast store (all shards)
	pod                       // producers' pod memory
)

// op is what the tasks of a stage do to one bucket, in total.
type op struct {
	bucket   bucket
	write    bool
	bytes    float64
	requests float64 // objects moved; each is bytes/requests big
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

// tasks is the number of tasks for d bytes on p workers when one task may
// take at most chunk bytes: at least ⌈d/chunk⌉, rounded up to whole waves
// of p so that every worker gets a task and every wave is full.
func tasks(d float64, p int, chunk float64) int {
	waves := math.Ceil(d / (chunk * float64(p)))
	if waves < 1 {
		waves = 1
	}
	if waves*float64(p) > math.MaxInt32 {
		return math.MaxInt32
	}
	return int(waves) * p
}

// phase predicts one stage: tasks tasks on p workers of w bytes, doing ops
// (totals over the stage) and cpu seconds of one core of the job's own work
// (Config.Compute), with workers workers billed.
//
// The stage's reads and writes are pipelined (a task streams its input
// while it writes its output, as Locus §3.3 assumes), so the stage takes
// its startup plus the largest of these limits:
//
//   - per bucket, requests: Σ objects / rate(object size), the bucket's
//     request-rate limit (the fast store's rate is per shard × shards; pod
//     memory has none);
//   - per store and direction, worker bandwidth: each task moves its share
//     at b(p, w), in waves of p tasks; with stragglers, the expected time
//     of the waves under the sampled distribution and speculation;
//   - per store, server bandwidth: all bytes over the store's aggregate
//     bandwidth (fast: per shard × shards; slow and pod: when capped);
//   - compute: cpu / min(p, tasks, Params.Cores), the job's work spread
//     over its workers, one core each at most.
//
// When Params.Cores is set, the workers and the stores share those cores
// (one machine). If the platform's CPU per byte is known
// (Params.PlatformCPUMeasured), the stores' and sidecars' CPU for the
// phase's transfers (and for deleting the intermediate objects it read),
// platform, joins the job's on those cores: the compute
// term is max(cpu / min(p, tasks, Cores), (cpu + platform) / Cores), one
// more limit competing with the transfer limits (the transfers' CPU is in
// it, so adding it to them would count it twice). If it is not known (a
// calibration from before), the compute term is added to the largest
// transfer limit instead: the transfers' limits were measured with the
// cores busy moving bytes, so the job's own work cannot hide under them.
// Without Params.Cores (each worker its own core, as on Lambda) the compute
// term is one more limit and the platform's CPU, on the stores' own
// machines, does not count.
//
// The platform CPU of a phase is, summed over the processes on its path
// (store server, sidecars, SDK; package doc, "Control path, SDK and
// background"):
//
//	platform = Σ_ops (requests·PerRequest + bytes·PerByte)        store, sidecar and Go SDK, by direction
//	         + Σ_intermediate reads (the same with Delete)           the consumer deletes what it read
//	         + Σ_ops (SDK_job − SDK_go)(op)                           the job's SDK in place of Go's
//	         + objects·(ControlCPU.PerObject + Send_job)             every object written is announced
//	         + tasks·(ControlCPU.PerInvocation + PerInvocation_job)  every task is a firing
//
// and the cores are Params.CoresLeft(): Cores − BackgroundCores. The
// engine keeps every object of a session to its end and checkpoints its
// state periodically: ControlCPU.Upkeep(H) = min(PerObjectSecond·H,
// MaxCores) cores all along, H the objects it keeps while the phase runs
// (m.held: the earlier phases' and half of this one's). So the phase's
// CPU-bound time t solves t·cores = job + platform + t·Upkeep(H):
//
//	t = (job + platform) / (cores − Upkeep(H))
func (m *Model) phase(name string, count, tasks, p int, w float64, workers int, cpu float64, ops []op) Phase {
	pp := m.Params
	ph := Phase{Name: name, Count: count, Tasks: tasks, Startup: pp.WorkerStartup, Workers: workers}
	var reqSec [4]float64
	var used [4]bool
	type dirKey struct {
		store string
		write bool
	}
	dirBytes := map[dirKey]float64{}
	serverBytes := map[string]float64{}
	var platform float64 // the installation's CPU for these transfers
	var objects float64  // objects the tasks announce to buckets
	// the job's SDK in place of the Go SDK's share, if both are measured
	jobSDK, swapSDK := pp.SDKCPU[m.sdk]
	goSDK := pp.SDKCPU["go"]
	swapSDK = swapSDK && m.sdk != "go" && m.sdk != ""
	for _, o := range ops {
		if o.bytes <= 0 {
			continue
		}
		size := o.bytes / o.requests
		// a producer's put into its own pod's store is no transfer, but it
		// is work: the function hands the bytes to its sidecar (PodCPU.Write,
		// measured on the sidecar path; 0 before); the consumer deletes the
		// intermediate objects it read (fast, slowShuffle)
		if path, ok := jobSDK.Path.store(o.bucket); ok && swapSDK {
			platform += o.cpu(path) // measured with the job's SDK as the client
		} else {
			platform += o.cpu(storeCPU(pp, o.bucket))
			if swapSDK {
				platform += o.cpu(jobSDK.store(o.bucket)) - o.cpu(goSDK.store(o.bucket))
			}
		}
		if o.write { // every object a task writes is announced to a bucket
			objects += o.requests
		}
		switch {
		case o.bucket == fast:
			ph.FastOps += o.requests
		case o.bucket == pod:
		case o.write:
			ph.SlowPuts += o.requests
		default:
			ph.SlowGets += o.requests
		}
		switch o.bucket {
		case slowShuffle, slowIO:
			reqSec[o.bucket] += o.requests / pp.SlowRequests.At(size)
			used[o.bucket] = true
			dirBytes[dirKey{"s3", o.write}] += o.bytes
			serverBytes["s3"] += o.bytes
		case fast:
			reqSec[fast] += o.requests / (pp.FastRequests.At(size) * float64(pp.FastShards))
			used[fast] = true
			dirBytes[dirKey{"redis", o.write}] += o.bytes
			serverBytes["redis"] += o.bytes
		case pod:
			if !o.write { // a producer's writes stay in its own memory
				dirBytes[dirKey{"pod", false}] += o.bytes
				serverBytes["pod"] += o.bytes
			}
		}
	}
	for b, name := range []string{"s3 requests", "s3 input/output requests", "redis requests"} {
		if used[b] {
			ph.Terms = append(ph.Terms, Term{name, reqSec[b]})
		}
	}
	peff := min(p, tasks)
	waves := float64((tasks + p - 1) / p)
	straggled := m.strag.waves(tasks, p)
	var worst, worstIdeal float64
	for _, k := range []dirKey{{"s3", false}, {"s3", true}, {"redis", false}, {"redis", true}, {"pod", false}} {
		bytes, ok := dirBytes[k]
		if !ok {
			continue
		}
		var b float64
		switch {
		case k.store == "s3" && k.write:
			b = pp.SlowWrite.At(peff, w)
		case k.store == "s3":
			b = pp.SlowRead.At(peff, w)
		case k.store == "redis" && k.write:
			b = pp.FastWrite.At(peff, w)
		case k.store == "redis":
			b = pp.FastRead.At(peff, w)
		default:
			b = pp.PodPullBandwidth
		}
		t := bytes / float64(tasks) / b // one task's time at the fitted bandwidth
		dir := " read"
		if k.write {
			dir = " write"
		}
		store := k.store
		if store == "pod" {
			store = "pod pull"
			dir = ""
		}
		ph.Terms = append(ph.Terms, Term{store + dir + " bandwidth", t * straggled})
		worst = max(worst, t*straggled)
		worstIdeal = max(worstIdeal, t*waves)
	}
	ph.StragglerSeconds = worst - worstIdeal
	if bytes, ok := serverBytes["s3"]; ok && pp.SlowServerBandwidth > 0 {
		ph.Terms = append(ph.Terms, Term{"s3 server bandwidth", bytes / pp.SlowServerBandwidth})
	}
	if bytes, ok := serverBytes["redis"]; ok {
		ph.Terms = append(ph.Terms, Term{"redis server bandwidth", bytes / (pp.FastServerBandwidth * float64(pp.FastShards))})
	}
	if bytes, ok := serverBytes["pod"]; ok && pp.PodAggregateBandwidth > 0 {
		ph.Terms = append(ph.Terms, Term{"pod network bandwidth", bytes / pp.PodAggregateBandwidth})
	}
	var bound float64
	for _, t := range ph.Terms {
		if t.Seconds > bound {
			bound, ph.BoundBy = t.Seconds, t.Name
		}
	}
	// the control path: each announced object, each task invoked (and the
	// job's SDK's send in place of the Go SDK's)
	control := objects*pp.ControlCPU.PerObject + float64(tasks)*pp.ControlCPU.PerInvocation
	// the function's SDK sending them and serving the invocations (in no
	// other cost): the job's SDK's, else Go's
	lang := m.sdk
	if lang == "" {
		lang = "go"
	}
	if s, ok := pp.SDKCPU[lang]; ok {
		control += s.Send.Of(objects*pointerBytes, objects) + float64(tasks)*s.PerInvocation
	}
	platform += control
	platform = max(platform, 0)
	shared := pp.Cores > 0 && pp.PlatformCPUMeasured()
	if shared {
		ph.PlatformCPU = platform
		ph.ControlCPU = control
	}
	cores := pp.CoresLeft()
	if cpu > 0 || (shared && platform > 0) {
		par := float64(min(p, tasks))
		if pp.Cores > 0 {
			par = min(par, cores)
		}
		ct := Term{ComputeTerm, cpu / par}
		if shared {
			// the engine's upkeep of the objects it keeps (checkpoints)
			// takes hold cores all along: the phase's CPU t·hold + cpu +
			// platform over the cores is t, so t = (cpu + platform) /
			// (cores − hold), at least a twentieth of the cores left
			hold := pp.ControlCPU.Upkeep(m.held)
			ct.Seconds = max(ct.Seconds, (cpu+platform)/max(cores-hold, cores/20))
			ph.ControlCPU += hold * ct.Seconds
			ph.PlatformCPU += hold * ct.Seconds
		}
		ph.Terms = append(ph.Terms, ct)
		if pp.Cores > 0 && !shared {
			ph.ComputeSeconds = ct.Seconds
			if ct.Seconds > bound {
				ph.BoundBy = ComputeTerm
			}
			bound += ct.Seconds
		} else if ct.Seconds > bound {
			bound, ph.BoundBy = ct.Seconds, ComputeTerm
		}
	}
	ph.Seconds = ph.Startup + bound
	return ph
}

// pointerBytes is the size of the object announcing a tier piece (the
// shuffle library's pointer: JSON of its tier, key and size), at which
// SDKCost.Send is priced.
const pointerBytes = 256

// cpu is o's CPU at the costs sc: moving its bytes in its direction, and
// deleting them once read from the intermediate stores (the shuffle
// library deletes every piece its consumer read: fast, slowShuffle).
func (o op) cpu(sc StoreCPU) float64 {
	v := sc.Of(o.bytes, o.requests, o.write)
	if !o.write && (o.bucket == fast || o.bucket == slowShuffle) {
		v += sc.Delete.Of(o.bytes, o.requests)
	}
	return v
}

// storeCPU is the installation's CPU cost through bucket b's store.
func storeCPU(pp Params, b bucket) StoreCPU {
	switch b {
	case fast:
		return pp.FastCPU
	case pod:
		return pp.PodCPU
	}
	return pp.SlowCPU
}

// ComputeTerm is the name of a phase's compute term (Config.Compute).
const ComputeTerm = "compute"

// Term returns the named term's seconds, or -1 if the phase has none.
func (ph Phase) Term(name string) float64 {
	for _, t := range ph.Terms {
		if t.Name == name {
			return t.Seconds
		}
	}
	return -1
}
