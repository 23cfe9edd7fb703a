// Command sessions measures sessions per second through the whole path
// with a sharded engine (issue 19): real operator processes (cmd/operator,
// --engine-buckets) on a real kube-apiserver and etcd (envtest) and a
// real redis-server, 1 and 2 replicas alternately in one run, replica i
// pinned to core i (taskset). Closed-loop clients start sessions through
// the gateway (HTTP) of a random replica and wait for their results; the
// engine dispatches each step of a chain to real queue-proxy-zl sidecars
// in front of Go SDK functions. It reports sessions/s, latency, the CPU
// seconds every process spent per session, the fraction of gateway calls
// proxied to the owner, the checkpoints' size, and a projection to more
// replicas (docs/sharding.md, "Capacity and projection").
//
//	go run ./bench/sessions [-cases 1,2,1,2] [-duration 60s] [-clients 48]
//
// Writes docs/bench/sessions.json and docs/bench/sessions.png and prints
// a markdown table.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

type options struct {
	cases           []int
	buckets         int
	perBucket       int
	steps           int
	clients         int
	idle            time.Duration
	warmup          time.Duration
	duration        time.Duration
	step            time.Duration
	leases          leases
	jsonOut, pngOut string
}

func main() {
	var o options
	var cases string
	serve := flag.Bool("serve-functions", false, "internal: run as the functions process")
	flag.StringVar(&cases, "cases", "1,2,1,2", "replica counts, run in this order (alternate them: the machine's load drifts)")
	flag.IntVar(&o.buckets, "buckets", 4, "engine buckets (--engine-buckets); a multiple of every replica count")
	flag.IntVar(&o.perBucket, "workflows-per-bucket", 2, "workflows hashed to each bucket")
	flag.IntVar(&o.steps, "steps", 3, "functions in each workflow's chain")
	flag.IntVar(&o.clients, "clients", 48, "closed-loop clients")
	flag.DurationVar(&o.idle, "idle", 5*time.Second, "idle window measured before the load (lease renewals, watches)")
	flag.DurationVar(&o.warmup, "warmup", 5*time.Second, "load before measuring")
	flag.DurationVar(&o.duration, "duration", 60*time.Second, "measured window per case")
	flag.DurationVar(&o.step, "step", 10*time.Second, "the measured window's time series: one point per step (the checkpoints grow as sessions end)")
	flag.DurationVar(&o.leases.duration, "lease-duration", 15*time.Second, "bucket Leases (chart default 15s)")
	flag.DurationVar(&o.leases.renew, "renew-deadline", 10*time.Second, "bucket Leases (chart default 10s)")
	flag.DurationVar(&o.leases.retry, "retry-period", 2*time.Second, "bucket Leases (chart default 2s)")
	flag.StringVar(&o.jsonOut, "json", "docs/bench/sessions.json", "results (relative to the module root)")
	flag.StringVar(&o.pngOut, "chart", "docs/bench/sessions.png", "chart (relative to the module root)")
	resummarize := flag.String("resummarize", "", "recompute the summary, projection, chart and table of a stored run (its JSON) without measuring")
	flag.Parse()
	if *resummarize != "" {
		if err := resummarizeRun(*resummarize, o); err != nil {
			fmt.Fprintln(os.Stderr, "sessions:", err)
			os.Exit(1)
		}
		return
	}
	if *serve {
		if err := serveFunctions(); err != nil {
			fmt.Fprintln(os.Stderr, "functions:", err)
			os.Exit(1)
		}
		return
	}
	for _, f := range strings.Split(cases, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || o.buckets%n != 0 {
			fmt.Fprintf(os.Stderr, "-cases: %q: want replica counts dividing -buckets %d\n", f, o.buckets)
			os.Exit(2)
		}
		o.cases = append(o.cases, n)
	}
	if _, err := exec.LookPath("taskset"); err != nil {
		fmt.Fprintln(os.Stderr, "taskset not found (util-linux): replicas are pinned with it")
		os.Exit(1)
	}
	ctrllog.SetLogger(logr.Discard())
	tb := &servers.ProcessTB{ExitOnFatal: true}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() { <-sig; tb.Close(); os.Exit(1) }()
	err := run(tb, o)
	tb.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sessions:", err)
		os.Exit(1)
	}
}

func run(tb *servers.ProcessTB, o options) error {
	root := paths.RepoRoot()
	if err := pickPorts(); err != nil {
		return err
	}
	rep := &Report{Host: hostInfo(), Options: map[string]any{"cases": o.cases, "buckets": o.buckets, "workflows": o.buckets * o.perBucket,
		"steps": o.steps, "clients": o.clients, "duration_s": o.duration.Seconds(), "warmup_s": o.warmup.Seconds(), "idle_s": o.idle.Seconds(),
		"lease": o.leases.duration.String() + "/" + o.leases.renew.String() + "/" + o.leases.retry.String()}}
	fmt.Fprintf(os.Stderr, "building and starting the API server, Redis, %d workflows x %d sidecars (load %s)\n", o.buckets*o.perBucket, o.steps, loadavg())
	c := startCluster(tb, root, o.buckets, o.perBucket, o.steps)
	rep.Placement = placement(c)
	for k, n := range o.cases {
		fmt.Fprintf(os.Stderr, "case %d: %d replica(s) (load %s)\n", k+1, n, loadavg())
		cr := c.runCase(k+1, n, o)
		fmt.Fprintf(os.Stderr, "  %.1f sessions/s, p50 %.1f ms, p99 %.1f ms, operator CPU %.3f ms/session, proxied %.0f %%, errors %d (load %s)\n",
			cr.SessionsPerSec, cr.P50ms, cr.P99ms, cr.OperatorCPUPerSessionMs, 100*cr.ProxiedFraction, cr.Errors, cr.LoadAfter)
		rep.Cases = append(rep.Cases, cr)
	}
	rep.summarize()
	if err := rep.write(under(root, o.jsonOut), under(root, o.pngOut)); err != nil {
		return err
	}
	fmt.Print(rep.markdown())
	return nil
}

// runCase runs n replicas (fresh processes, a fresh checkpoint key) and
// measures an idle window, then the load.
func (c *cluster) runCase(k, n int, o options) Case {
	ctx := context.Background()
	key := fmt.Sprintf("ziptrail:bench:case%d", k)
	cr := Case{Run: k, Replicas: n, LoadBefore: loadavg()}
	rs := c.startReplicas(n, o.buckets, key, o.leases)
	defer stopAll(rs)
	var ids []string
	for _, r := range rs {
		ids = append(ids, r.id)
	}
	began := time.Now()
	c.settle(rs, o.buckets, began.Add(4*time.Minute))
	// Read once the operator runs (right after the start, the process may
	// still be taskset before its exec).
	for _, r := range rs {
		if got := r.affinity(); got != strconv.Itoa(r.core) {
			c.tb.Fatalf("replica %s runs on cpus %q, not on core %d alone", r.id, got, r.core)
		}
		cr.Pinning = append(cr.Pinning, fmt.Sprintf("%s: cpus %s", r.id, r.affinity()))
	}
	c.makeReady(ctx, time.Now().Add(2*time.Minute))
	owners := c.owners(ctx, ids, time.Now().Add(2*time.Minute))
	cr.SettleSeconds = time.Since(began).Seconds()
	cr.WorkflowsOwned = map[string]int{}
	for _, id := range owners {
		cr.WorkflowsOwned[id]++
	}

	// Idle: the replicas' and the API server's own upkeep.
	a0, s0 := c.apiRequests(ctx), c.snapshot(rs)
	time.Sleep(o.idle)
	s1, a1 := c.snapshot(rs), c.apiRequests(ctx)
	cr.IdleCores = perSecond(s1.sub(s0), s1.at.Sub(s0.at))
	cr.IdleAPIRequestsPerSec = rates(a0, a1, s1.at.Sub(s0.at).Seconds())

	l := newLoad(owners, ids, c.token, o.clients, o.steps)
	lctx, stop := context.WithCancel(ctx)
	wg := l.run(lctx, o.clients)
	time.Sleep(o.warmup)
	if lat, _, _, errs, last := l.take(); len(lat) == 0 && errs > 0 {
		stop()
		c.tb.Fatalf("no session completed in the warm-up: %d errors, the last: %s", errs, last)
	}
	m0 := replicaMetrics(rs)
	cp := c.sampleCheckpoints(lctx, key)
	a0, s0 = c.apiRequests(ctx), c.snapshot(rs)
	in0 := c.redisInputBytes(ctx)
	l.recording.Store(true)
	cr.Series = c.series(rs, l, cp, o.duration, o.step)
	l.recording.Store(false)
	s1, a1 = c.snapshot(rs), c.apiRequests(ctx)
	in1 := c.redisInputBytes(ctx)
	m1 := replicaMetrics(rs)
	cr.CheckpointBytesPerSec = cp.bytesPerSecond()
	stop()
	wg.Wait()
	cr.LoadAfter = loadavg()

	lat, requests, proxied, errs, last := l.take()
	slices.Sort(lat)
	window := s1.at.Sub(s0.at)
	cr.Seconds = window.Seconds()
	cr.Sessions = len(lat)
	cr.SessionsPerSec = float64(len(lat)) / window.Seconds()
	if len(lat) > 0 && in1 > in0 {
		cr.RedisInBytesPerSession = (in1 - in0) / float64(len(lat))
	}
	cr.P50ms, cr.P99ms = percentile(lat, 0.50), percentile(lat, 0.99)
	cr.Errors, cr.LastError = errs, last
	cr.Requests, cr.Proxied = requests, proxied
	if requests > 0 {
		cr.ProxiedFraction = float64(proxied) / float64(requests)
	}
	cr.APIRequestsPerSession = rates(a0, a1, float64(cr.Sessions))
	cr.CPU = s1.sub(s0)
	cr.Cores = perSecond(cr.CPU, window)
	cr.CoreBusy = s1.coreBusy(s0)
	cr.CPUPerSessionMs = map[string]float64{}
	for g, v := range cr.CPU {
		if cr.Sessions > 0 {
			cr.CPUPerSessionMs[g] = 1000 * v / float64(cr.Sessions)
		}
	}
	cr.EndedByReplica = map[string]float64{}
	for i, r := range rs {
		cr.EndedByReplica[r.id] = m1[i]["ziptrail_sessions_ended_total"] - m0[i]["ziptrail_sessions_ended_total"]
		cr.OperatorCPUPerSessionMs += cr.CPUPerSessionMs["replica "+r.id]
	}
	// The owners must not have moved during the window.
	if after := c.owners(ctx, ids, time.Now().Add(time.Minute)); !mapsEqual(after, owners) {
		cr.Notes = append(cr.Notes, fmt.Sprintf("owners moved during the window: %v -> %v", owners, after))
	}
	cr.Checkpoint = c.measureCheckpoint(ctx, key)
	return cr
}

// resummarizeRun reads a stored report, recomputes what derives from
// its cases and writes it back (with the chart).
func resummarizeRun(path string, o options) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return err
	}
	rep.Summary, rep.Ratio, rep.Projection = nil, 0, nil
	rep.summarize()
	root := paths.RepoRoot()
	if err := rep.write(under(root, o.jsonOut), under(root, o.pngOut)); err != nil {
		return err
	}
	fmt.Print(rep.markdown())
	return nil
}

// under is path relative to the module root unless absolute.
func under(root, path string) string {
	if filepath.IsAbs(path) {
		return path
	}
	return filepath.Join(root, path)
}

func stopAll(rs []*replica) {
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Add(1)
		go func() { defer wg.Done(); r.stop() }()
	}
	wg.Wait()
}

func replicaMetrics(rs []*replica) []map[string]float64 {
	out := make([]map[string]float64, len(rs))
	for i, r := range rs {
		out[i] = r.metrics()
	}
	return out
}

func perSecond(cpu map[string]float64, d time.Duration) map[string]float64 {
	out := map[string]float64{}
	for g, v := range cpu {
		out[g] = v / d.Seconds()
	}
	return out
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// placement says what ran where.
func placement(c *cluster) map[string]string {
	return map[string]string{
		"replica i":                   "core i (taskset -c i; GOMAXPROCS follows the affinity: 1)",
		"kube-apiserver, etcd, redis": "unpinned (any core)",
		"sidecars":                    fmt.Sprintf("%d queue-proxy-zl --standalone processes, unpinned", len(c.sidecars)),
		"functions":                   "one process (this command, -serve-functions; Go SDK FunctionHandler), unpinned",
		"load generator":              "this process, unpinned",
	}
}
