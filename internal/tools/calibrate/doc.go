// Package calibrate measures an installation's storage and fits the shuffle
// model's parameters (model.Params) to the measurements: the benchmarks of
// Locus (NSDI '19) §3.2 and Table 1, run by `ziptrail calibrate`.
//
// # What is measured
//
// Measure drives three stores with real clients: a Redis shard
// (go-redis), an S3 bucket (minio-go, one PUT per object, no multipart
// upload) and ziptrail's pod-memory data plane, run in this process the way
// bench/dataplane runs it (pull.Servers with their object stores on
// loopback TCP as the producers, one pull.Client per consumer). A worker is
// a goroutine with its own connection, issuing requests back to back.
//
//   - Bandwidth grid (BandwidthPoint): for each store, direction (S3 and
//     Redis: write and read; pod memory: pulls only, a producer's put stays
//     in its own memory) and object size (1 MB, 10 MB, 100 MB, up to
//     Config.MaxObject), 1, 2, 4 and 8 workers at once for
//     DurationPerPoint. Each worker's bytes over its own time is its
//     bandwidth; all bytes over the wall time is the aggregate.
//
//   - Request rates (RatePoint): for S3 and Redis, writes and reads of
//     10 KB, 100 KB, 1 MB, 10 MB and 100 MB objects (Locus Table 1) by 1,
//     2, 4, … clients, doubled until two doublings in a row did not raise
//     the best rate by 10 % (or 32 clients, or 1 GiB in flight), each probe
//     half of DurationPerPoint: the best rate is the store's limit
//     as this machine's clients see it (a stepwise form of Locus's AIMD
//     probing).
//
//   - Redis server bandwidth (ServerPoint): 16 clients on one shard, half
//     writing and half reading 10 MB values.
//
//   - The sidecar path (Config.Sidecar): objects of 256 KB to 16 MB
//     through two real queue-proxy-zl processes, from Go SDK clients in
//     this process (sidecar.go) and, with SidecarPath.Python, from the
//     Python SDK in a Python process (sdkdriver.py, sdkpython.go), with
//     the CPU of the server, the sidecars and the SDK's process around
//     every timed batch.
//
//   - The control path (SidecarPath.Python, control.go): a real engine (an
//     orchestrator in this process, its control server on loopback,
//     checkpoints to the Redis), two queue-proxy-zl connected to it, each
//     in front of a Python function server (sdkfunc.py): sessions of M
//     maps announcing K pointer-sized objects each (the shuffle library's
//     metadata) into G DynamicGroup groups, one reducer per group, some
//     held open for seconds after the reducers; the CPU of the engine,
//     the sidecars, redis-server and the functions around each session,
//     minus their idle CPU over the same time.
//
// Worker memory is not varied: the workers are goroutines of one process,
// with no memory limit that could change their network share the way a
// Lambda's size changes it (Locus Fig. 2). BandwidthPoint.WorkerMemory is 0
// and the fit's MemoryExponent stays 0; FitBandwidth fits it when samples
// of two or more worker memories are given (from a cluster run, say).
//
// # The fit
//
// Fit turns Measurements into model.Params:
//
//   - SlowRead, SlowWrite, FastRead, FastWrite: FitBandwidth over the grid's
//     points of the largest object size (bandwidth, not per-request
//     latency), one sample per point (the geometric mean of its workers).
//     For a fixed knee K, log b = log PerWorker + MemoryExponent·log(w/GiB)
//     − ParallelismExponent·log(1 + p/K) is linear in the three
//     coefficients and solved exactly by least squares; K is searched on a
//     log grid from 0.01 to 10⁴, refined by golden-section search. A
//     decline with parallelism is kept only with a positive exponent that
//     fits better than a constant. Max is the largest per-worker value
//     seen. The exponent is kept in (0, 1], so the fitted aggregate p·b(p)
//     never falls as workers are added (a store that saturates is
//     capped by its server bandwidth instead of an extrapolated collapse).
//     On one machine the per-worker bandwidth falls roughly as 1/p once
//     the cores are busy, which the form captures with a small K and an
//     exponent near 1; a K far below 1 makes it a power law,
//     b ≈ PerWorker·(K/p)^β, and PerWorker alone is then no worker's
//     bandwidth (Max caps b at the largest seen).
//
//   - Stragglers: every worker's bandwidth in the S3 read points of that
//     size divided by the fit's prediction for its p (Locus §3.5's
//     distribution, as relative samples).
//
//   - SlowRequests, FastRequests: FitRates. At each size the rate is the
//     harmonic mean of the read and the write rate (a stream of half reads
//     and half writes, since the model charges one rate for both); the
//     curve is then made non-increasing in size by pool-adjacent-violators
//     on log rate (a larger object never sustains more requests than a
//     smaller one; where two latency-bound sizes measure the other way
//     round, they are pooled and a note says so).
//
//   - SlowServerBandwidth: the largest aggregate seen against S3 with
//     objects of BulkSize (10 MB) or more, if the aggregate stopped growing
//     at the largest size: doubling the workers to the most measured raised
//     it by less than Saturation (25 %), or the most workers together got
//     less than Efficiency (half) of the fewest workers' aggregate scaled
//     linearly. Else 0 (unlimited, Locus's assumption for S3).
//
//   - FastServerBandwidth: the largest aggregate seen against the Redis
//     shard with objects of BulkSize or more, in any measurement (the
//     server point is there to reach it; smaller objects are the rate
//     curve's business).
//
//   - PodPullBandwidth: the fewest pullers' (one) per-worker bandwidth at
//     the largest size; PodAggregateBandwidth: as SlowServerBandwidth, for
//     the pulls.
//
//   - PodStoreFraction, WorkerStartup, TaskMemoryFraction, SpeculateAfter,
//     FastShards: not measured here; Fit keeps the base Params' values
//     (`ziptrail calibrate` takes them from flags, documented there).
//
//   - SDKCPU (fitcontrol.go): per SDK, store and direction, the SDK's
//     process's CPU alone, fitted like the platform's ("go": the share of
//     SlowCPU, FastCPU and PodCPU its clients took; "python": the Python
//     points); the Python SDK's Send and PerInvocation from the function
//     servers' CPU of the control sessions (per object sent through the
//     client, per invocation).
//
//   - ControlCPU: engine + sidecars + redis-server of the control
//     sessions = PerObject·objects + PerInvocation·invocations +
//     PerObjectSecond·object-seconds kept, least squares on the relative
//     residual, each coefficient non-negative. The engine checkpoints at
//     Config.CheckpointInterval (the installation's: 250 ms on the local
//     cluster), and the held sessions stay busy (a tick object every
//     0.1 s), as a running shuffle does: an unchanged session is not
//     saved again, and holds that were idle let PerObjectSecond fit to 0.
//
// Fit returns notes (each fitted formula and its RMS residual on log b)
// that the calibration stores with the parameters.
package calibrate
