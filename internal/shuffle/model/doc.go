// Package model is the performance and cost model of a shuffle (or sort)
// of D bytes by P parallel workers of w bytes of memory each, after Locus
// (Pu, Venkataraman, Stoica, NSDI '19, §3), over four ways to keep the
// intermediate data: "s3" (the slow store only), "redis" (the fast store
// only), "podmemory" (ziptrail's producers keep their partitions in pod
// memory and the consumers pull them directly) and "hybrid" (Locus's
// multi-round shuffle, §3.4 and Fig. 3). It has no Kubernetes or HTTP
// imports; package plan searches it, `ziptrail explain` prints it.
//
// # Tasks and stages
//
// A task holds at most c = TaskMemoryFraction·w bytes. A stage of D bytes
// on P workers has n = P·⌈D/(P·c)⌉ tasks: at least D/c (Locus's S/w) and
// whole waves of P. Every method has a map stage (read the input from the
// slow store, partition it) and a reduce stage (gather a partition, write
// the output to the slow store); the input and the output live in a slow
// store bucket of their own, as in Locus ("both the inputs and the outputs
// of the shuffle are stored on the slow storage"), with its own request
// budget. Reads and writes within a stage are pipelined, so a stage takes
//
//	T_stage = WorkerStartup + max(limits)
//
// (WorkerStartup once per stage: the hybrid's stages that run once per
// round pay it in their first round only, their pods being warm for the
// next ones: Phase.Total)
//
// with one limit per bucket for requests (objects / rate(object size)),
// one per store and direction for the workers' bandwidth (in waves of P
// tasks, with stragglers, below) and one per store for its server-side
// bandwidth. With the input/output terms dominated and no startup this is
// exactly Locus Table 3: the s3 shuffle takes 2·max(n²/q_s, D/(b·P)), the
// redis shuffle 2·max(n²/q_f, D/min(b_f, b·P)).
//
//   - s3: map writes n² partitions of D/n² bytes to the intermediate
//     bucket, reduce reads them.
//   - redis: the same n² objects in Redis (rate per shard × shards, server
//     bandwidth per shard × shards); all D bytes must fit in the fast
//     capacity.
//   - podmemory: map keeps its partitions in its own pod (no transfer, so
//     the map is bound by reading its input); reduce pulls D bytes at
//     PodPullBandwidth per worker (no request limit; PodAggregateBandwidth
//     caps all pulls). D must fit in the producers' object stores,
//     P·w·PodStoreFraction, and in the PodMemory cap if one is given. The
//     producers stay up, holding their partitions, while the reducers run,
//     so the reduce bills 2P workers.
//   - hybrid: k = ⌈D/r⌉ rounds of D/k bytes. A round is a shuffle of r
//     bytes through the fast store by m = P·⌈r/(P·c)⌉ tasks (partition:
//     read r of input from the slow store, write m² objects to the fast
//     store; combine: read them, write one sorted run per range, R runs, to
//     the slow store). The ranges are the final reducers, R = n (each at
//     most one task's data), the same range partitioner in every round.
//     Then the merge: R tasks, each reads its range's k runs and writes its
//     part of the output. Time: k·(T_partition + T_combine) + T_merge.
//
// # The merge term, re-derived
//
// Locus prints the merge phase's request-limited time as T_mq = (S·w/r)²·
// T_sq with T_sq = r²/(w²·q_s). That product is S²/q_s: bytes² per
// (request/s), not a time (expressing the bytes in another unit changes
// it), so it cannot be right as printed. Counting the merge's requests
// instead: there are R = S/w reducers (ranges; here R = n, the tasks of
// the final stage, S/c rounded up to whole waves) and k = S/r rounds; every
// round left one sorted run per range in the slow store; each reducer
// reads its run of every round, one request each. So the merge makes
//
//	N_merge = R·k = (S/w)·(S/r) requests of S/(R·k) bytes (one run each),
//
// and its request-limited time is that count over the slow store's request
// rate at that object size:
//
//	T_mq = R·k / q_s(S/(R·k))           [requests / (requests/s) = s]
//
// The bandwidth-limited time is the bytes over the aggregate bandwidth,
// T_mb = S/(b·P) [bytes / (bytes/s) = s] (Locus's (S/r)·T_sb, which is
// consistent). Doubling the rounds doubles N_merge and, at a flat rate,
// T_mq; T_mb does not change. The output's R writes go to the output
// bucket, a separate budget, and the merge stage takes the largest of these
// limits (plus startup) like every stage. TestMergeTerm checks the count
// and the doubling, TestUnits checks that every term of every method is
// unchanged when all byte quantities are scaled (and that the printed T_mq
// is not).
//
// The same count replaces Locus's per-round slow-store term T_sq =
// r²/(w²·q_s): a round's slow-store requests are its m input reads (input
// bucket) and its R run writes (intermediate bucket), not (r/w)²; the
// round's (r/w)² = m² objects go to the fast store and are limited by its
// rate, which Locus ignored (footnote 3) and this model does not.
//
// # Compute (the job's own work)
//
// Locus's sort is I/O-bound (C++ on Lambda), so its model has no CPU term.
// A job whose tasks compute more than they move (examples/sort in pure
// Python: ~13–20 ns of one core per byte to generate, sort and partition,
// ~4–7 ns to merge, by machine) is not. Config.Compute gives the job's CPU
// seconds of one core per byte on the map side and on the reduce side, as
// the tasks pay it while sharing the cores (bench/sort measures it with
// one process per worker running at once: alone, a process missed ~10 %
// of what the others' cache and TLB refills cost it); a phase's
// compute term is its bytes × that cost over min(P, tasks, Params.Cores).
// With Params.Cores set (workers and stores on the same cores: a local
// cluster) the term adds to the largest transfer limit, because the
// calibrated transfer bandwidths were measured with those cores busy
// moving bytes; without it (each worker its own core) the term is one more
// limit. Config.MapTasks and Config.Partitions let a job that fixed its
// own task counts be predicted with them (objects = mappers × partitions).
//
// # Platform CPU (the installation's own work per byte moved)
//
// On a local cluster the stores and ziptrail's sidecars run on the same
// cores as the job: bench/sort measured, per 2 GiB sorted through s3, the
// sidecars at 45 CPU-seconds, MinIO 43 and Redis 5 against the functions'
// 96. Params.SlowCPU, FastCPU and PodCPU are that cost per store and
// direction (model.StoreCPU: Read and Write, each PerByte and PerRequest
// seconds of one core): the store's server plus the client side that
// moves the bytes for a worker (the sidecar's part, and the SDK's in the
// function), for pod memory the producer's and the consumer's ends of a
// pull (Read) and a producer's put into its own sidecar (Write: no
// transfer, but the bytes still go from the function to its sidecar's
// store). A phase's platform
// CPU is the sum over its transfers, every bucket, of objects × PerRequest
// + bytes × PerByte (Phase.PlatformCPU), plus StoreCPU.Delete for every
// intermediate object the phase read (the shuffle library deletes a piece
// once merged, a run once the final merge read it; CPU only, not counted
// against the request rate). With Params.Cores set and the
// costs measured (Params.PlatformCPUMeasured), the compute term is
//
//	max(job / min(P, tasks, Cores), (job + platform) / Cores)
//
// and competes with the transfer limits like any other (the phase takes
// the largest): the transfers' CPU is now in the term, and where the
// transfers are CPU-bound (this machine) adding the two would count it
// twice. Without the costs (all zero: older calibrations, or servers
// calibrate could not see) the compute term is added to the transfers as
// before, the stand-in for the platform's unmeasured CPU, and every
// prediction is what it was (TestNoPlatformCPUPredictsAsBefore). Without
// Cores the platform's CPU runs on the stores' own machines and does not
// count.
//
// The costs are measured on the path a function uses: `ziptrail
// calibrate --local` moves objects of 256 KB to 16 MB from Go SDK clients
// through two real queue-proxy-zl processes (local API, the sidecar's
// tier clients, pod puts and pulls) and reads the CPU of the sidecars,
// the servers and its own (the SDK). Earlier calibrations measured bare
// Go clients (minio-go, go-redis, pull.Client) and missed the sidecar's
// own work, and deletes.
//
// # Control path, SDK and background
//
// Three more costs run on the same cores (Params.ControlCPU, SDKCPU,
// BackgroundCores; all zero in older calibrations, which predict as
// before). Per phase, the CPU demand is the sum over every process on the
// path:
//
//	platform = Σ_ops StoreCPU(op) (+ Delete for intermediate reads)   server, sidecars, Go SDK
//	         + Σ_ops (SDKCPU[job] − SDKCPU["go"])(op)                 the job's SDK in place of Go's
//	         + objects · (ControlCPU.PerObject + SDKCPU[job].Send)     announcing every object written
//	         + tasks · (ControlCPU.PerInvocation + SDKCPU[job].PerInvocation)
//
// and where SDKCPU[job].Path measured a store (calibrate's Python points:
// the server's, the sidecars' and the Python SDK's CPU together), its cost
// replaces both of the first two terms for that store: the sidecar's own
// work depends on its client too (Python hands a put's bytes over in a
// file it writes, Go lends a file it keeps), which the SDK's share alone
// does not see;
// where objects are the objects the phase's tasks write (a shuffle piece
// is announced to its bucket by a pointer object when it sits in a tier,
// by itself in pod memory; an output or a run by its pointer) and tasks
// its invocations. The engine keeps every object of a session until the
// session ends and checkpoints its state at every interval while the
// session changes (every 250 ms on the local cluster, spaced so that the
// saves take at most ControlCPU.MaxCores of the time, the operator's
// CheckpointMaxShare): Upkeep(H) = min(PerObjectSecond·H, MaxCores) cores
// all along, H the objects kept while the phase runs (those of the
// phases before it, half of its own). The cores a job gets are
// CoresLeft() = Cores − BackgroundCores (the installation's processes when
// nothing runs). So, CPU-bound, the phase's time t solves
// t·cores = job + platform + t·Upkeep(H):
//
//	t = (job + platform) / (CoresLeft − Upkeep(H))
//
// and the phase takes max(I/O limits, max(job / min(P, tasks, cores), t)).
// `ziptrail calibrate --local` measures ControlCPU with a real engine (an
// orchestrator in its process, checkpointing to the Redis it started at
// the installation's interval, with sessions held open and busy so that
// every checkpoint saves them)
// and two real queue-proxy-zl connected to its control server, in front
// of Python functions that announce a shuffle's pointer objects; SDKCPU
// from the SDK's own process on the sidecar-path points (Go: its
// clients; Python: sdkdriver.py) and, for Send and PerInvocation, from the
// Python function servers of those sessions. bench/sort -measure-idle
// (and every bench/sort run, before its sorts) measures BackgroundCores
// on the local cluster. Config.SDK names the job's SDK (bench/sort:
// "python").
//
// The model is thus a CPU-bound shared machine: with Cores set, a phase
// takes the larger of its I/O limits and (job + platform CPU) / Cores.
// Where the machine is shared with other work, Cores is the cores left to
// the job, not the machine's: `bench/sort -replot -cores-left` predicts
// each recorded run with the cores the machine's other work left it, as
// measured while it ran.
//
// # Stragglers (§3.5)
//
// Params.Stragglers are sampled per-worker bandwidths relative to the fit
// (Fig. 4's CDF as samples). A task that moves its share in t at the fitted
// bandwidth takes t/s on a worker with relative bandwidth s. A stage of n
// tasks on P workers takes W = ⌈n/P⌉ waves: the W−1 waves before the last
// cost their mean, E[1/s] each, since workers pick up tasks as they free
// up; the last wave ends with its slowest task. Speculation: once
// SpeculateAfter (x) of the last wave finished, every task still running
// gets a copy on a freed worker and ends with the earlier of the two. The
// expectations are computed exactly over the samples by order statistics
// (see stragglers.go), not simulated, so predictions are deterministic;
// a seeded Monte Carlo simulation in the tests checks them. Stragglers
// lengthen the worker-bandwidth terms only; Phase.StragglerSeconds says by
// how much.
//
// # Cost
//
// Workers: GiB-seconds of every phase's billed workers (P, or 2P for the
// podmemory reduce) at Prices.WorkerPerGiBSecond (Locus's p·c_l·T). Slow
// store: every GET and PUT, both buckets, and the intermediate bytes stored
// for the job's duration. Fast store: the bytes it holds (D for redis, r
// for hybrid) for the job's duration, its nodes, and the bytes moved
// through it (Locus's r·c_f·T, plus per-request pricing where the service
// has it). Speculative copies are not billed.
//
// # What a calibration measures
//
// `ziptrail calibrate` (package internal/tools/calibrate, which
// documents the method) fills the Params fields:
//
//   - SlowRead, SlowWrite, FastRead, FastWrite: the per-worker throughput
//     of GETs and PUTs of 1, 10 and 100 MB objects to S3 and Redis, for 1,
//     2, 4 and 8 concurrent workers; PerWorker, ParallelismKnee and
//     ParallelismExponent fitted by least squares on log b (Max: the
//     largest single-worker value seen). Worker memory is not varied (the
//     workers are goroutines), so MemoryExponent stays 0 unless a
//     calibration with several memories is fitted.
//   - SlowServerBandwidth, FastServerBandwidth: the aggregate throughput
//     with many clients; FastShards: the --redis-shards flag.
//   - SlowRequests, FastRequests: the request rate at 10 KB, 100 KB, 1 MB,
//     10 MB and 100 MB (Table 1's sizes), doubling the clients until two
//     doublings gain less than 10 %.
//   - PodPullBandwidth, PodAggregateBandwidth: data-plane pulls between
//     in-process producers and consumers over loopback TCP.
//   - PodStoreFraction, WorkerStartup: flags (the installation's
//     configuration and a measured cold start, given by the operator).
//   - TaskMemoryFraction, SpeculateAfter: configuration of the shuffle
//     library, not measured.
//   - Stragglers: the per-worker throughputs of the bandwidth runs, each
//     divided by the fit's prediction for its parallelism.
//   - SlowCPU, FastCPU, PodCPU (--local only): the CPU time of the
//     redis-server and MinIO processes (/proc/<pid>/stat) and of the
//     calibrating process (the clients, and both ends of the pod pulls)
//     around every timed measurement, fitted per store and direction as
//     PerRequest·objects + PerByte·bytes; Cores: the machine's cores.
//   - ControlCPU, SDKCPU (--local, with a python that imports the SDK):
//     control-path sessions and the Python SDK's points (above).
//   - BackgroundCores: not calibrate's; bench/sort measures it on the
//     local cluster.
package model
