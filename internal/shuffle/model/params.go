package model

import (
	"errors"
	"fmt"
	"math"
	"sort"
)

// Params are the measured characteristics of an installation's storage and
// workers: everything the model needs besides the job and the prices. Each
// field is filled by one calibration measurement (see the package doc);
// DefaultParams are documented, uncalibrated defaults.
//
// Units: bytes, seconds, bytes per second, requests per second.
type Params struct {
	// SlowRead and SlowWrite are the bandwidth one worker gets to the slow
	// store (S3) when p workers of w bytes of memory transfer at once.
	SlowRead  Bandwidth `json:"slowRead"`
	SlowWrite Bandwidth `json:"slowWrite"`
	// SlowServerBandwidth caps the slow store's aggregate bandwidth, reads
	// and writes together (0: unlimited, as Locus assumes for S3; a MinIO
	// server on one machine has one).
	SlowServerBandwidth float64 `json:"slowServerBandwidth,omitempty"`
	// SlowRequests is the request rate one bucket sustains, by object size.
	// The shuffle's intermediate bucket and the job's input/output bucket
	// each have this rate.
	SlowRequests RateCurve `json:"slowRequests"`

	// FastRead and FastWrite are the bandwidth one worker gets to the fast
	// store (Redis) with p workers of w bytes of memory.
	FastRead  Bandwidth `json:"fastRead"`
	FastWrite Bandwidth `json:"fastWrite"`
	// FastServerBandwidth is one Redis shard's bandwidth (its NIC or, on one
	// machine, its single-threaded copy rate), reads and writes together.
	FastServerBandwidth float64 `json:"fastServerBandwidth"`
	// FastShards is the number of Redis shards (servers) the fast tier has.
	FastShards int `json:"fastShards"`
	// FastRequests is the request rate one Redis shard sustains, by object
	// size.
	FastRequests RateCurve `json:"fastRequests"`

	// PodPullBandwidth is the bandwidth one consumer pod gets pulling
	// objects directly from producers' pod memory (ziptrail's data plane);
	// there is no request-rate limit other than this bandwidth.
	PodPullBandwidth float64 `json:"podPullBandwidth"`
	// PodAggregateBandwidth caps the pulls of all pods together (the
	// network, or on one machine loopback and its cores; 0: unlimited).
	PodAggregateBandwidth float64 `json:"podAggregateBandwidth,omitempty"`
	// PodStoreFraction is the fraction of a producer pod's memory its
	// object store may hold (the queue-proxy-zl memory cap over the pod's
	// memory).
	PodStoreFraction float64 `json:"podStoreFraction"`

	// Cores is the number of CPU cores the workers and the stores share,
	// on an installation where they run on the same machine(s) (a local
	// cluster: `ziptrail calibrate --local` records the machine's cores).
	// It caps the parallelism of a job's own work (Config.Compute), and
	// that work then adds to a phase's transfers instead of overlapping
	// them (see the package doc, "Compute"). 0: every worker has a core of
	// its own and its work overlaps its transfers (Locus's Lambda).
	Cores float64 `json:"cores,omitempty"`

	// SlowCPU, FastCPU and PodCPU are the installation's own CPU cost of
	// moving data through each store: the store's server (MinIO, Redis)
	// plus the client side that moves the bytes for a worker (ziptrail's
	// sidecar; for pod memory the producer's and the consumer's sidecars),
	// in seconds of one core per request and per byte, for writes and for
	// reads.
	// `ziptrail calibrate --local` measures them: objects through real
	// queue-proxy-zl processes, with the sidecars', the servers' and its
	// own (the SDK's) CPU time. PodCPU.Write is a producer's put into its
	// own sidecar (no transfer, but work). They count only with Cores set:
	// then that CPU competes with the job's for the same cores (see the
	// package doc, "Platform CPU"). All zero: not measured (a calibration
	// from before they existed, or of servers calibrate cannot see), and
	// the model predicts as it did without them.
	SlowCPU StoreCPU `json:"slowCPU,omitzero"`
	FastCPU StoreCPU `json:"fastCPU,omitzero"`
	PodCPU  StoreCPU `json:"podCPU,omitzero"`

	// ControlCPU is the installation's CPU per object a task announces to
	// a bucket and per task invoked, besides the bytes moved (StoreCPU):
	// the sidecar's SendObject and control stream, the trigger engine's
	// accounting, firing and checkpoints, the store holding them. A
	// shuffle piece in a tier is announced by a pointer object; a
	// pod-memory piece is its own object. `ziptrail calibrate --local`
	// measures it with a real engine (the orchestrator in its process) and
	// real sidecars (package calibrate, "The control path"). Zero: not
	// measured, no term (older calibrations predict as before).
	ControlCPU ControlCPU `json:"controlCPU,omitzero"`
	// SDKCPU is the CPU a function's SDK spends on its side of each
	// transfer, by SDK ("go", "python"). SlowCPU, FastCPU and PodCPU
	// include the SDK that calibrate's clients used, SDKCPU["go"]; a job
	// whose functions use another SDK (Config.SDK) pays that SDK's costs
	// instead: the model replaces the Go SDK's share with its own (see
	// the package doc, "Control path, SDK and background"). Empty: the
	// Go SDK's costs stand for every job, as before.
	SDKCPU map[string]SDKCost `json:"sdkCPU,omitempty"`
	// BackgroundCores are the cores the installation's own processes use
	// while no job runs (on a local cluster the API server, etcd,
	// Knative, the node agents and the operator: bench/sort -measure-idle
	// measures it). With Cores set, a job gets Cores − BackgroundCores
	// (never below a twentieth of Cores). 0: none.
	BackgroundCores float64 `json:"backgroundCores,omitempty"`

	// WorkerStartup is the time from invoking a stage's workers to their
	// first byte of work (a cold start), paid once per stage.
	WorkerStartup float64 `json:"workerStartup"`
	// TaskMemoryFraction is the fraction of a worker's memory one task's
	// data may take (the rest holds the output being built, buffers and the
	// runtime): a task handles at most TaskMemoryFraction·w bytes.
	TaskMemoryFraction float64 `json:"taskMemoryFraction"`

	// Stragglers are sampled per-worker bandwidths relative to the fitted
	// Bandwidth (1 = as fitted, 0.2 = a worker five times slower): Locus
	// §3.5's bandwidth distribution. Empty: no stragglers.
	Stragglers []float64 `json:"stragglers,omitempty"`
	// SpeculateAfter is x of §3.5 as a fraction: once this fraction of the
	// tasks of a stage's last wave finished, every task still running gets
	// a speculative copy on a freed worker and finishes with whichever copy
	// ends first. 0 disables speculation.
	SpeculateAfter float64 `json:"speculateAfter"`
}

// StoreCPU is the CPU, in seconds of one core, the installation's own
// processes spend moving data through a store, by direction: writing n
// objects of s bytes costs n·Write.PerRequest + n·s·Write.PerByte, reading
// them the same with Read (an S3 server's writes cost it several times
// its reads: it hashes and stores them).
//
// Delete is the cost of removing objects (n objects of s bytes: the same
// form): the shuffle library deletes every intermediate object its
// consumer read (a piece after its merge, a run after the final merge).
// Deletes count as CPU only, not against the store's request rate
// (Locus's model has no deletes).
type StoreCPU struct {
	Read   CPUCost `json:"read,omitzero"`
	Write  CPUCost `json:"write,omitzero"`
	Delete CPUCost `json:"delete,omitzero"`
}

// ControlCPU is seconds of one core per object announced to a bucket
// (PerObject) and per task invoked (PerInvocation: the firing, the
// dispatch through the sidecar, the function's start and end reported to
// the engine), on the control path: operator, sidecars and the store of
// the engine's checkpoints together.
//
// PerObjectSecond is seconds of one core per second per object the
// engine keeps of a running session (it keeps them to the session's end
// and checkpoints its whole state periodically: the upkeep grows with the
// objects, not with their events), up to MaxCores: the operator spaces
// its saves so that they take at most that share of the time
// (orchestrator.Options.CheckpointMaxShare; 0: no bound, calibrations
// from before it).
type ControlCPU struct {
	PerObject       float64 `json:"perObject,omitempty"`
	PerInvocation   float64 `json:"perInvocation,omitempty"`
	PerObjectSecond float64 `json:"perObjectSecond,omitempty"`
	MaxCores        float64 `json:"maxCores,omitempty"`
}

// Upkeep is the cores the engine's upkeep of held kept objects takes:
// PerObjectSecond·held, at most MaxCores when set.
func (c ControlCPU) Upkeep(held float64) float64 {
	u := c.PerObjectSecond * held
	if c.MaxCores > 0 {
		u = min(u, c.MaxCores)
	}
	return u
}

// SDKCost is one SDK's own CPU (the function's process only) per
// transfer: through each store (Slow, Fast: TierPut, TierGet,
// TierDelete; Pod: Put into its own pod's store as Write, Get of another
// pod's object as Read), per object sent to a bucket (Send) and per
// invocation served (PerInvocation: the function server's decoding and
// answering). Slow, Fast and Pod of "go" are the share of the store
// costs (Params.SlowCPU, …) that calibrate's Go clients took; Send and
// PerInvocation are in no other cost (ControlCPU is measured with the
// functions' processes apart).
//
// Path, where measured, is the whole transfer's CPU with this SDK as the
// client: the store's server, the sidecars and this SDK's process (what
// Params.SlowCPU, FastCPU and PodCPU are with calibrate's Go clients). A
// job in this SDK is priced with it, store by store, instead of the Go
// path with the SDKs' own shares swapped: the sidecar's work depends on
// its client too (how a put's bytes reach it, how many calls a transfer
// takes).
type SDKCost struct {
	Slow          StoreCPU `json:"slow,omitzero"`
	Fast          StoreCPU `json:"fast,omitzero"`
	Pod           StoreCPU `json:"pod,omitzero"`
	Send          CPUCost  `json:"send,omitzero"`
	PerInvocation float64  `json:"perInvocation,omitempty"`
	Path          PathCPU  `json:"path,omitzero"`
}

// PathCPU is a transfer's CPU through each store with one SDK as the
// client (SDKCost.Path); a zero StoreCPU is not measured.
type PathCPU struct {
	Slow StoreCPU `json:"slow,omitzero"`
	Fast StoreCPU `json:"fast,omitzero"`
	Pod  StoreCPU `json:"pod,omitzero"`
}

// store is the path's cost through the store of bucket b, and whether it
// was measured.
func (p PathCPU) store(b bucket) (StoreCPU, bool) {
	st := p.Slow
	switch b {
	case fast:
		st = p.Fast
	case pod:
		st = p.Pod
	}
	return st, st != StoreCPU{}
}

// store is the SDK's cost through the store of bucket b.
func (s SDKCost) store(b bucket) StoreCPU {
	switch b {
	case fast:
		return s.Fast
	case pod:
		return s.Pod
	}
	return s.Slow
}

// CPUCost is seconds of one core per byte and per request.
type CPUCost struct {
	PerByte    float64 `json:"perByte,omitempty"`
	PerRequest float64 `json:"perRequest,omitempty"`
}

// Of is the CPU seconds of moving bytes in requests objects.
func (c CPUCost) Of(bytes, requests float64) float64 {
	return bytes*c.PerByte + requests*c.PerRequest
}

// Of is the CPU seconds of writing (or reading) bytes in requests objects.
func (c StoreCPU) Of(bytes, requests float64, write bool) float64 {
	if write {
		return c.Write.Of(bytes, requests)
	}
	return c.Read.Of(bytes, requests)
}

// PlatformCPUMeasured says whether any of the installation's CPU costs
// is known (SlowCPU, FastCPU, PodCPU, ControlCPU).
func (p Params) PlatformCPUMeasured() bool {
	return p.SlowCPU != StoreCPU{} || p.FastCPU != StoreCPU{} || p.PodCPU != StoreCPU{} || p.ControlCPU != ControlCPU{}
}

// CoresLeft are the cores a job gets: Cores − BackgroundCores, at least a
// twentieth of Cores (0 without Cores).
func (p Params) CoresLeft() float64 {
	if p.Cores <= 0 {
		return 0
	}
	return max(p.Cores-p.BackgroundCores, p.Cores/20)
}

// Bandwidth is the fitted per-worker bandwidth b(p, w) to a store when p
// workers of w bytes of memory transfer at once:
//
//	b(p, w) = PerWorker · (w / 1 GiB)^MemoryExponent / (1 + p/ParallelismKnee)^ParallelismExponent
//
// capped at Max when Max > 0. The memory term is Locus Fig. 2's sub-linear
// growth with worker size (bigger functions get a bigger network share);
// the parallelism term its 2–3× decline as concurrency grows from 1 to
// thousands (ParallelismKnee 0: no decline). A calibration fits the four
// numbers by least squares on log b over a grid of (p, w).
type Bandwidth struct {
	PerWorker           float64 `json:"perWorker"`
	MemoryExponent      float64 `json:"memoryExponent,omitempty"`
	ParallelismKnee     float64 `json:"parallelismKnee,omitempty"`
	ParallelismExponent float64 `json:"parallelismExponent,omitempty"`
	Max                 float64 `json:"max,omitempty"`
}

// At is b(p, w) in bytes per second.
func (b Bandwidth) At(p int, w float64) float64 {
	v := b.PerWorker
	if b.MemoryExponent != 0 {
		v *= math.Pow(w/GiB, b.MemoryExponent)
	}
	if b.ParallelismKnee > 0 && b.ParallelismExponent != 0 {
		v /= math.Pow(1+float64(p)/b.ParallelismKnee, b.ParallelismExponent)
	}
	if b.Max > 0 && v > b.Max {
		v = b.Max
	}
	return v
}

// RatePoint is one measured request rate: PerSecond requests of Size bytes
// each.
type RatePoint struct {
	Size      float64 `json:"size"`
	PerSecond float64 `json:"perSecond"`
}

// RateCurve is a store's request-rate limit as a function of object size
// (Locus Table 1), from measured points: log-log interpolation between
// points; below the smallest size the smallest size's rate (a request
// limit); above the largest size the largest size's bandwidth (rate ∝
// 1/size).
type RateCurve struct {
	Points []RatePoint `json:"points"`
}

// Flat is a curve with the same rate at every size.
func Flat(perSecond float64) RateCurve {
	return RateCurve{Points: []RatePoint{{Size: 1, PerSecond: perSecond}, {Size: math.MaxFloat64, PerSecond: perSecond}}}
}

// At is the request rate (requests per second) for objects of size bytes.
func (c RateCurve) At(size float64) float64 {
	pts := c.Points
	if len(pts) == 0 {
		return math.Inf(1)
	}
	if size <= pts[0].Size {
		return pts[0].PerSecond
	}
	last := pts[len(pts)-1]
	if size >= last.Size {
		return last.PerSecond * (last.Size / size)
	}
	i := sort.Search(len(pts), func(i int) bool { return pts[i].Size >= size })
	a, b := pts[i-1], pts[i]
	f := (math.Log(size) - math.Log(a.Size)) / (math.Log(b.Size) - math.Log(a.Size))
	return math.Exp(math.Log(a.PerSecond) + f*(math.Log(b.PerSecond)-math.Log(a.PerSecond)))
}

func (c RateCurve) validate(name string) error {
	if len(c.Points) == 0 {
		return fmt.Errorf("%s: no points", name)
	}
	for i, p := range c.Points {
		if !(p.Size > 0) || !(p.PerSecond > 0) || math.IsInf(p.PerSecond, 0) {
			return fmt.Errorf("%s: point %d: size and rate must be positive and finite", name, i)
		}
		if i > 0 && p.Size <= c.Points[i-1].Size {
			return fmt.Errorf("%s: points must be in increasing size", name)
		}
	}
	return nil
}

func (b Bandwidth) validate(name string) error {
	if !(b.PerWorker > 0) || math.IsInf(b.PerWorker, 0) {
		return fmt.Errorf("%s: perWorker must be positive", name)
	}
	if b.ParallelismKnee < 0 || b.Max < 0 {
		return fmt.Errorf("%s: parallelismKnee and max must not be negative", name)
	}
	return nil
}

// Validate says what is wrong with p, if anything.
func (p Params) Validate() error {
	var errs []error
	for _, b := range []struct {
		n string
		b Bandwidth
	}{{"slowRead", p.SlowRead}, {"slowWrite", p.SlowWrite}, {"fastRead", p.FastRead}, {"fastWrite", p.FastWrite}} {
		errs = append(errs, b.b.validate(b.n))
	}
	errs = append(errs, p.SlowRequests.validate("slowRequests"), p.FastRequests.validate("fastRequests"))
	if p.FastShards < 1 {
		errs = append(errs, errors.New("fastShards must be at least 1"))
	}
	if !(p.FastServerBandwidth > 0) || !(p.PodPullBandwidth > 0) {
		errs = append(errs, errors.New("fastServerBandwidth and podPullBandwidth must be positive"))
	}
	if p.SlowServerBandwidth < 0 || p.PodAggregateBandwidth < 0 || p.WorkerStartup < 0 || p.Cores < 0 || math.IsInf(p.Cores, 0) {
		errs = append(errs, errors.New("slowServerBandwidth, podAggregateBandwidth, workerStartup and cores must not be negative"))
	}
	costs := []CPUCost{p.SlowCPU.Read, p.SlowCPU.Write, p.SlowCPU.Delete, p.FastCPU.Read, p.FastCPU.Write, p.FastCPU.Delete, p.PodCPU.Read, p.PodCPU.Write,
		{PerByte: p.ControlCPU.PerObject, PerRequest: p.ControlCPU.PerInvocation}, {PerByte: p.ControlCPU.PerObjectSecond, PerRequest: p.ControlCPU.MaxCores}}
	for _, s := range p.SDKCPU {
		for _, st := range []StoreCPU{s.Slow, s.Fast, s.Pod, s.Path.Slow, s.Path.Fast, s.Path.Pod} {
			costs = append(costs, st.Read, st.Write, st.Delete)
		}
		costs = append(costs, s.Send, CPUCost{PerRequest: s.PerInvocation})
	}
	for _, c := range costs {
		if !(c.PerByte >= 0) || !(c.PerRequest >= 0) || math.IsInf(c.PerByte, 0) || math.IsInf(c.PerRequest, 0) {
			errs = append(errs, errors.New("slowCPU, fastCPU, podCPU, controlCPU, sdkCPU: every cost must be non-negative and finite"))
			break
		}
	}
	if !(p.BackgroundCores >= 0) || math.IsInf(p.BackgroundCores, 0) {
		errs = append(errs, errors.New("backgroundCores must be non-negative and finite"))
	}
	if !(p.PodStoreFraction > 0 && p.PodStoreFraction <= 1) || !(p.TaskMemoryFraction > 0 && p.TaskMemoryFraction <= 1) {
		errs = append(errs, errors.New("podStoreFraction and taskMemoryFraction must be in (0, 1]"))
	}
	if p.SpeculateAfter < 0 || p.SpeculateAfter > 1 {
		errs = append(errs, errors.New("speculateAfter must be in [0, 1]"))
	}
	for _, s := range p.Stragglers {
		if !(s > 0) || math.IsInf(s, 0) {
			errs = append(errs, errors.New("stragglers: every sample must be positive and finite"))
			break
		}
	}
	return errors.Join(errs...)
}

// DefaultParams are uncalibrated defaults: the storage numbers Locus
// measured on AWS (Lambda workers, S3, ElastiCache Redis; NSDI '19, §2.4
// and §3.2, Table 1, Fig. 2, Fig. 4), plus assumptions for what Locus had
// no counterpart of (pod memory). They let `ziptrail explain` run before
// `ziptrail calibrate` has measured the installation; every output made with
// them says so.
func DefaultParams() Params {
	// Fig. 2 / §3.2: 60 workers of 0.5 GB write ~18 MB/s each, 10 of 3 GB
	// ~40 MB/s; bandwidth varies 2–3× as concurrency goes from 1 to 3000.
	// A knee of 100 with exponent 0.25 gives (1+3000/100)^0.25 = 2.36×;
	// the two data points then give MemoryExponent 0.39 and 26.6 MB/s at
	// 1 GiB. Locus uses the same b for reads and for Redis.
	lambda := Bandwidth{PerWorker: 26.6e6, MemoryExponent: 0.39, ParallelismKnee: 100, ParallelismExponent: 0.25}
	return Params{
		SlowRead:  lambda,
		SlowWrite: lambda,
		// Table 1, one S3 bucket.
		SlowRequests: RateCurve{Points: []RatePoint{
			{10 * KB, 5986}, {100 * KB, 4400}, {1 * MB, 3210}, {10 * MB, 1729}, {100 * MB, 1105},
		}},
		FastRead:  lambda,
		FastWrite: lambda,
		// §3.3: "one ElastiCache instance with 10Gbps NIC".
		FastServerBandwidth: 10e9 / 8,
		FastShards:          1,
		// Table 1, one Redis shard.
		FastRequests: RateCurve{Points: []RatePoint{
			{10 * KB, 116181}, {100 * KB, 11923}, {1 * MB, 1201}, {10 * MB, 120}, {100 * MB, 12},
		}},
		// Assumed: a 10 Gbit/s pod network, one pull stream per consumer
		// (DESIGN's target is ≥ 90 % of raw TCP at 10–100 MB).
		PodPullBandwidth: 10e9 / 8,
		PodStoreFraction: 0.5,
		// Assumed: a Knative cold start of about a second.
		WorkerStartup:      1,
		TaskMemoryFraction: 0.5,
		// Shaped after Fig. 4: most workers within ±25 % of the typical
		// bandwidth, 2 in 40 four to eight times slower.
		Stragglers: []float64{
			1.25, 1.2, 1.2, 1.15, 1.15, 1.1, 1.1, 1.1, 1.05, 1.05,
			1.05, 1.05, 1, 1, 1, 1, 1, 1, 1, 1,
			1, 1, 0.95, 0.95, 0.95, 0.95, 0.9, 0.9, 0.9, 0.9,
			0.85, 0.85, 0.8, 0.8, 0.75, 0.75, 0.7, 0.6, 0.25, 0.125,
		},
		// Locus does not give its x; 90 % of the last wave.
		SpeculateAfter: 0.9,
	}
}
