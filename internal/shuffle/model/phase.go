package model

import "math"

// One phase of a shuffle: what its tasks do to each store (ops), and the
// time and CPU that takes with P workers.

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
