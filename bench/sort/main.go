// Command sort is the sort benchmark of issue 17 (Locus §5 on this
// machine): examples/sort on the local real-Knative cluster, 1, 2 and 4 GiB
// of the sort benchmark's 100-byte records through each shuffle method, with
// the fast tier (Redis) capped at a quarter of the data; for every run the
// Locus model's predicted time (internal/shuffle/model, with this
// installation's calibration) against the measured one; and, in the same
// run, a peer — Ray from PyPI (hack/ray-venv.sh) sorting the same records
// with its own shuffle under the same memory cap and cores — validated the
// same way (the sha256 of the whole output must be ziptrail's).
//
//	go run ./bench/sort [-sizes 1GiB,2GiB,4GiB] [-methods s3,redis,podmemory,hybrid]
//	                    [-calibration docs/bench/sort-calibration.json] [-out docs/bench] [-no-ray]
//	go run ./bench/sort -replot docs/bench/sort.json [-out DIR]        # redraw the chart, print the table
//	go run ./bench/sort -replot docs/bench/sort.json [-calibration F] [-platform-cpu F] [-cores-left F] [-background F]
//	                                                   # re-predict the recorded runs, print the table
//	go run ./bench/sort -measure-idle 60s [-out DIR]   # the local cluster's idle CPU only (sort-idle.json)
//
// docs/benchmarks.md ("Sort") explains the setup and the results. Needs root
// (the local cluster) and the host's cluster claim (it waits for it).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/localcluster/k8s"
	"github.com/ziptrail/ziptrail/internal/shuffle/model"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

const (
	MiB = 1 << 20
	GiB = 1 << 30
	// workers is the sort's parallelism: maxScale of map, merge and final
	// in examples/sort/workflow.yaml.
	workers = 8
	// partitionBytes: each output partition passes through its pod's
	// /dev/shm (64 MiB) when written; 16 MiB keeps a final merge's runs and
	// output well inside it (examples/sort/README.md, "Memory").
	partitionBytes = 16 * MiB
)

type options struct {
	sizes        []int64
	methods      []string
	fastFraction float64 // Redis maxmemory over the data
	roundFrac    float64 // hybrid round (fastCapacity passed to the sort) over the data
	taskBytes    int64
	seed         int64
	calibration  string
	out          string
	ray          bool
	rayPython    string
	timeout      time.Duration
	warmup       int64
	idle         time.Duration
	cpuprofile   string
}

// sortSDK is the SDK of examples/sort's functions (Config.SDK).
const sortSDK = "python"

func main() {
	var o options
	sizes := flag.String("sizes", "1GiB,2GiB,4GiB", "data sizes to sort")
	methods := flag.String("methods", "s3,redis,podmemory,hybrid", "ziptrail shuffle methods")
	flag.Float64Var(&o.fastFraction, "fast-fraction", 0.25, "the fast tier's cap (Redis maxmemory beyond what the cluster already uses) as a fraction of the data")
	flag.Float64Var(&o.roundFrac, "round-fraction", 0.17, "hybrid: the bytes per round (the sort's fastCapacity) as a fraction of the data; below -fast-fraction, for Redis's own overhead (client query buffers of the pieces in flight, allocator size classes): 0.17 is 6 rounds, the most the workflow declares")
	taskBytes := flag.String("task-bytes", "64MiB", "records per map task (the sort's taskRecords), in bytes")
	flag.Int64Var(&o.seed, "seed", 17, "the data set (examples/sort/records.py)")
	flag.StringVar(&o.calibration, "calibration", "docs/bench/sort-calibration.json", "the installation's calibration: `ziptrail calibrate --local` output")
	flag.StringVar(&o.out, "out", "docs/bench", "directory for sort.json and sort.png (and the calibration used, sort-calibration-used.json)")
	noRay := flag.Bool("no-ray", false, "leave out the Ray peer")
	flag.StringVar(&o.rayPython, "ray-python", "", "python of a venv with Ray (default: hack/ray-venv.sh's)")
	flag.DurationVar(&o.timeout, "run-timeout", 40*time.Minute, "give up on one sort after this long")
	replot := flag.String("replot", "", "only redraw the chart (into -out) and print the table of this sort.json; with -calibration or -platform-cpu given, re-predict its runs instead (no chart)")
	platformCPU := flag.String("platform-cpu", "", "-replot: re-predict with the platform's CPU per store (slowCPU, fastCPU, podCPU) of this calibration (`ziptrail calibrate --local` output)")
	coresFrom := flag.String("cores-left", "", "-replot: re-predict each run with the cores the machine had left for it (its cores minus the other work's, from bench/sort/cpushare.py --json output, e.g. docs/bench/sort-cpu.json) instead of all of them")
	warmup := flag.String("warmup", "256MiB", "first sort this much through s3 and hybrid, not counted, so that the functions' pods are up (0: no warm-up)")
	backgroundFrom := flag.String("background", "", "-replot: re-predict with the local cluster's idle CPU of this file (-measure-idle's sort-idle.json) as the cores it takes (Params.BackgroundCores)")
	measureIdle := flag.Duration("measure-idle", 0, "only bring the local cluster up with the sort's workflow and its warm pods, measure its CPU while nothing runs for this long, write sort-idle.json into -out, take it down")
	flag.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of this process over the sorts (the local cluster's control plane, operator and engine run in it) to this file")
	flag.DurationVar(&o.idle, "idle", time.Minute, "before the runs (after the warm-up), measure the cluster's idle CPU for this long (the model's backgroundCores; 0: not measured)")
	flag.Parse()
	if *measureIdle > 0 {
		if err := idleOnly(o, *measureIdle); err != nil {
			fail(err)
		}
		return
	}
	if *replot != "" {
		b, err := os.ReadFile(*replot)
		if err != nil {
			fail(err)
		}
		rep := &Report{}
		if err := json.Unmarshal(b, rep); err != nil {
			fail(err)
		}
		calGiven := false
		flag.Visit(func(f *flag.Flag) { calGiven = calGiven || f.Name == "calibration" })
		if calGiven || *platformCPU != "" || *coresFrom != "" || *backgroundFrom != "" {
			// Re-predict the recorded runs: the storage parameters of
			// -calibration (default: the one the run used), the platform's
			// CPU of -platform-cpu. The measured times are not touched, and
			// the chart (the run's) is not redrawn.
			calFile := o.calibration
			if !calGiven {
				calFile = filepath.Join(filepath.Dir(*replot), "sort-calibration-used.json")
			}
			cal, err := model.Load(calFile)
			if err != nil {
				fail(err)
			}
			var plat *model.Calibration
			if *platformCPU != "" {
				pc, err := model.Load(*platformCPU)
				if err != nil {
					fail(err)
				}
				if !pc.Params.PlatformCPUMeasured() {
					fail(fmt.Errorf("%s has no platform CPU (slowCPU, fastCPU, podCPU): calibrate it with ziptrail calibrate --local", *platformCPU))
				}
				plat = &pc
			}
			var coresLeft func(Run) float64
			if *coresFrom != "" {
				mc, _ := rep.Machine["cores"].(float64)
				if coresLeft, err = coresLeftFrom(*coresFrom, mc); err != nil {
					fail(err)
				}
			}
			var background *IdleMeasure
			if *backgroundFrom != "" {
				im, err := loadIdle(*backgroundFrom)
				if err != nil {
					fail(err)
				}
				background = &im
			}
			if err := repredict(rep, cal, plat, coresLeft, background); err != nil {
				fail(err)
			}
			fmt.Printf("re-predicted with the storage parameters of %s", calFile)
			if plat != nil {
				fmt.Printf(" and the platform CPU of %s (slow %+v, fast %+v, pod %+v; s per byte and per request; control path %+v; SDKs %+v; the runs as %s jobs)", *platformCPU,
					plat.Params.SlowCPU, plat.Params.FastCPU, plat.Params.PodCPU, plat.Params.ControlCPU, plat.Params.SDKCPU, sortSDK)
			}
			if background != nil {
				fmt.Printf(", the cluster's idle CPU of %s (%s)", *backgroundFrom, background)
			}
			if coresLeft != nil {
				fmt.Printf(", each run with the cores left to it by the machine's other work (%s)", *coresFrom)
			}
			fmt.Printf("\n\n")
			printReport(os.Stdout, rep, true)
			return
		}
		if err := writeChart(filepath.Join(o.out, "sort.png"), rep.Runs); err != nil {
			fail(err)
		}
		printReport(os.Stdout, rep, false)
		return
	}
	o.ray = !*noRay
	if wb, err := model.ParseBytes(*warmup); err == nil {
		o.warmup = int64(wb)
	} else if *warmup != "0" {
		fail(fmt.Errorf("-warmup: %w", err))
	}
	for _, s := range strings.Split(*sizes, ",") {
		b, err := model.ParseBytes(strings.TrimSpace(s))
		if err != nil {
			fail(fmt.Errorf("-sizes: %w", err))
		}
		o.sizes = append(o.sizes, int64(b))
	}
	tb, err := model.ParseBytes(*taskBytes)
	if err != nil {
		fail(fmt.Errorf("-task-bytes: %w", err))
	}
	o.taskBytes = int64(tb)
	for _, m := range strings.Split(*methods, ",") {
		o.methods = append(o.methods, strings.TrimSpace(m))
	}
	if err := run(o); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "sort:", err)
	os.Exit(1)
}

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, a...)...)
}

// Report is sort.json.
type Report struct {
	Started      time.Time        `json:"started"`
	Commit       string           `json:"commit"`
	Machine      map[string]any   `json:"machine"`
	Calibration  string           `json:"calibration"`
	Compute      ComputeMeasure   `json:"compute"`
	Setup        map[string]any   `json:"setup"`
	Runs         []Run            `json:"runs"`
	Error        map[string]Error `json:"meanAbsoluteError"`
	LoadAverages []string         `json:"loadAverages"`
	Finished     time.Time        `json:"finished"`
}

// Error is the model's mean absolute (relative) error over the runs that ran.
type Error struct {
	Runs          int     `json:"runs"`
	WithCompute   float64 `json:"withCompute"`
	TransfersOnly float64 `json:"transfersOnly"`
	Description   string  `json:"description"`
}

// Run is one sort: a ziptrail method or the Ray peer.
type Run struct {
	System     string `json:"system"` // "ziptrail" or "ray"
	Method     string `json:"method"` // s3, redis, podmemory, hybrid; "ray"
	Bytes      int64  `json:"bytes"`
	Records    int64  `json:"records"`
	Partitions int    `json:"partitions"`
	MapTasks   int    `json:"mapTasks"`
	Rounds     int    `json:"rounds,omitempty"`
	FastCap    int64  `json:"fastCapacity"` // Redis maxmemory for the shuffle / Ray object store
	Skipped    string `json:"skipped,omitempty"`
	Failed     string `json:"failed,omitempty"`
	// Measured: the session (or Ray job) from start to validated result;
	// the validator's share; the sort without it (what the model predicts).
	Seconds         float64 `json:"seconds,omitempty"`
	ValidateSeconds float64 `json:"validateSeconds,omitempty"`
	SortSeconds     float64 `json:"sortSeconds,omitempty"`
	Valid           bool    `json:"valid"`
	SHA256          string  `json:"sha256,omitempty"`
	SameOutput      *bool   `json:"sameOutputAsFirst,omitempty"`
	// Predicted: with the compute term, and with Locus's transfer terms only.
	Predicted       float64           `json:"predicted,omitempty"`
	PredictedNoCPU  float64           `json:"predictedTransfersOnly,omitempty"`
	Prediction      *model.Prediction `json:"prediction,omitempty"`
	ErrorPct        *float64          `json:"errorPct,omitempty"`
	LoadBefore      string            `json:"loadBefore"`
	LoadAfter       string            `json:"loadAfter,omitempty"`
	Result          json.RawMessage   `json:"result,omitempty"`
	PeakRedisMemory int64             `json:"peakRedisUsedMemory,omitempty"`
	// Functions: when the session invoked each function (the phases'
	// starts; see FunctionTimes), and how many of its events the polls
	// missed (0: the times are complete).
	Functions    []FunctionTimes `json:"functions,omitempty"`
	MissedEvents int             `json:"missedEvents,omitempty"`
	// CPU: where the CPU went, over the whole sort and per function
	// window (cpusample.go).
	CPU []WindowCPU `json:"cpu,omitempty"`
}

// ComputeMeasure is bench/sort/cpu.py's output: the sort's own CPU seconds
// per byte of one core, the median of one process per worker run at once
// (measureCompute).
type ComputeMeasure struct {
	MapSecondsPerByte      float64        `json:"mapSecondsPerByte"`
	ReduceSecondsPerByte   float64        `json:"reduceSecondsPerByte"`
	ValidateSecondsPerByte float64        `json:"validateSecondsPerByte"`
	Raw                    map[string]any `json:"raw"`
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func run(o options) error {
	ctx := context.Background()
	root := paths.RepoRoot()
	examples := filepath.Join(root, "examples", "sort")
	rep := &Report{Started: time.Now().UTC(), Error: map[string]Error{}}
	if out, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output(); err == nil {
		rep.Commit = strings.TrimSpace(string(out))
	}
	rep.Machine = map[string]any{"cores": runtime.NumCPU(), "loadAverageAtStart": loadavg()}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		rep.Machine["memTotal"] = strings.TrimSpace(strings.TrimPrefix(strings.Split(string(b), "\n")[0], "MemTotal:"))
	}

	// The installation's calibration (storage: ziptrail calibrate --local)
	// plus what this bench measures: the cores the cluster shares and the
	// sort's own CPU cost.
	cal, err := model.Load(o.calibration)
	if err != nil {
		return fmt.Errorf("calibration (make it with: ziptrail calibrate --local --worker-startup 585ms -o %s): %w", o.calibration, err)
	}
	rep.Calibration = o.calibration
	if cal.Params.Cores == 0 {
		cal.Params.Cores = float64(runtime.NumCPU())
		cal.Notes = append(cal.Notes, fmt.Sprintf("bench/sort: cores %d (runtime.NumCPU): the local cluster's workers, Redis and MinIO share this machine's cores", runtime.NumCPU()))
	}
	python := "python3"
	logf("measuring the sort's own CPU cost per byte (bench/sort/cpu.py, %d copies at once as the %d workers run, %s map tasks)", workers, workers, human(o.taskBytes))
	cm, err := measureCompute(python, root, o.taskBytes, workers)
	if err != nil {
		return err
	}
	rep.Compute = cm
	logf("compute: map %.1f ns/B, reduce %.1f ns/B, validate %.1f ns/B", cm.MapSecondsPerByte*1e9, cm.ReduceSecondsPerByte*1e9, cm.ValidateSecondsPerByte*1e9)
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	cal.Notes = append(cal.Notes, fmt.Sprintf("bench/sort: examples/sort's compute (bench/sort/cpu.py, python3 %v): map %.3g s/B, reduce %.3g s/B of one core",
		cm.Raw["python"], cm.MapSecondsPerByte, cm.ReduceSecondsPerByte))
	if err := cal.Save(filepath.Join(o.out, "sort-calibration-used.json")); err != nil {
		return err
	}
	m, err := model.New(cal.Params, model.DefaultPrices())
	if err != nil {
		return err
	}
	compute := model.Compute{MapSecondsPerByte: cm.MapSecondsPerByte, ReduceSecondsPerByte: cm.ReduceSecondsPerByte}

	rayPython := o.rayPython
	if o.ray && rayPython == "" {
		logf("Ray venv: hack/ray-venv.sh")
		cmd := exec.Command(filepath.Join(root, "hack", "ray-venv.sh"))
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("hack/ray-venv.sh: %w", err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		rayPython = lines[len(lines)-1]
	}

	// The workflow, as examples/sort ships it.
	wf, maxRounds, podMemPerPod, err := loadWorkflow(examples)
	if err != nil {
		return err
	}
	rep.Setup = map[string]any{
		"workers": workers, "taskBytes": o.taskBytes, "partitionBytes": partitionBytes, "seed": o.seed,
		"fastFraction": o.fastFraction, "roundFraction": o.roundFrac, "memoryLimitPerPod": podMemPerPod,
		"maxRounds": maxRounds, "knative": "min-scale 1, scale-down-delay 15m (one warm pod per function; more start on demand, up to maxScale 8, and stay); a warm-up sort (-warmup) scales them up first",
		"nodes": 2,
	}

	c, rdb, down, err := upCluster(wf)
	if err != nil {
		return err
	}
	defer down()
	if o.warmup > 0 {
		for _, method := range []string{"s3", "hybrid"} {
			params := map[string]any{"method": method, "bytes": o.warmup, "seed": o.seed + 1, "partitions": int(max(4, o.warmup/partitionBytes)),
				"taskRecords": min(o.taskBytes/100, o.warmup/400), "fastCapacity": o.warmup / 4, "job": "warmup" + method}
			t := time.Now()
			_, _, err := session(c.GatewayURL, c.GatewayToken, params, o.timeout, func(el time.Duration, what string) {
				logf("warm-up %s via %s: running, %s (%s)", human(o.warmup), method, el.Round(time.Second), what)
			}, nil)
			if err != nil {
				return fmt.Errorf("warm-up: %w", err)
			}
			logf("warm-up %s via %s (not counted): %s", human(o.warmup), method, time.Since(t).Round(time.Millisecond))
		}
		rep.Setup["warmup"] = o.warmup
	}
	if o.idle > 0 {
		// the cluster's idle CPU, its pods warm: cores the sorts do not get
		im, err := measureIdle(o.idle, "bench/sort: the local cluster after the warm-up, no session")
		if err != nil {
			return err
		}
		logf("the cluster's idle CPU: %s", im)
		rep.Setup["idle"] = im
		cal.Params.BackgroundCores = im.BackgroundCores
		cal.Notes = append(cal.Notes, fmt.Sprintf("bench/sort: backgroundCores %.3f, the cluster's idle CPU measured before the runs (%s)", im.BackgroundCores, im))
		if err := cal.Save(filepath.Join(o.out, "sort-calibration-used.json")); err != nil {
			return err
		}
		if m, err = model.New(cal.Params, model.DefaultPrices()); err != nil {
			return err
		}
	}

	write := func() {
		rep.Finished = time.Now().UTC()
		rep.Error = modelErrors(rep.Runs)
		b, _ := json.MarshalIndent(rep, "", "  ")
		_ = os.WriteFile(filepath.Join(o.out, "sort.json"), append(b, '\n'), 0o644)
		_ = writeChart(filepath.Join(o.out, "sort.png"), rep.Runs)
	}
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	rn := &runner{o: o, ctx: ctx, c: c, rdb: rdb, m: m, cal: &cal, compute: compute, podMemPerPod: podMemPerPod,
		maxRounds: maxRounds, rayPython: rayPython, examples: examples, rep: rep, write: write,
		total: len(o.sizes) * (len(o.methods) + map[bool]int{true: 1}[o.ray])}
	for _, size := range o.sizes {
		sz := newSizeRun(o, size)
		var first *Run
		for _, method := range o.methods {
			r, err := rn.ziptrail(sz, method, first)
			if err != nil {
				return err
			}
			if first == nil {
				first = r
			}
		}
		if o.ray {
			rn.ray(sz, first)
		}
	}
	rep.LoadAverages = append(rep.LoadAverages, "end: "+loadavg())
	write()
	printReport(os.Stdout, rep, false)
	fmt.Printf("\nwrote %s and %s\n", filepath.Join(o.out, "sort.json"), filepath.Join(o.out, "sort.png"))
	return nil
}

func deref(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

// mapTasks is examples/sort's map task count (sort.py map_tasks).
func mapTasks(records, per int64, rounds int) int {
	n := 0
	for r := int64(0); r < int64(rounds); r++ {
		a, b := r*records/int64(rounds), (r+1)*records/int64(rounds)
		n += int(max(1, (b-a+per-1)/per))
	}
	return n
}

// upCluster brings the local cluster up (waiting for the host's cluster
// claim) with wf deployed and ready; down takes it down (also on an
// interrupt).
func upCluster(wf *v1alpha1.Workflow) (c *localcluster.Cluster, rdb *redis.Client, down func(), err error) {
	ctx := context.Background()
	var cleanups []func()
	down = func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	defer func() {
		if err != nil {
			down()
		}
	}()
	dir, err := os.MkdirTemp("", "ziptrail-sortbench-")
	if err != nil {
		return nil, nil, nil, err
	}
	cleanups = append(cleanups, func() { os.RemoveAll(dir) })
	logf("bringing up the local cluster (waits for the host's cluster claim)")
	t := time.Now()
	c, err = localcluster.Up(ctx, localcluster.Options{StateDir: dir, Nodes: 2, Log: io.Discard,
		// Pods scaled up stay 15 minutes: Knative scaling a function down
		// in the middle of a sort sent a map invocation to a pod whose
		// queue-proxy-zl was draining ("cannot reach the sidecar"; the
		// workflow re-runs such a task after 5 minutes, a benchmark cannot).
		Knative: map[string]map[string]string{"config-autoscaler": {"min-scale": "1", "scale-down-delay": "15m"}},
		Kubernetes: k8s.Options{NetPrefix: "zts", ClusterCIDR: netip.MustParsePrefix("10.219.0.0/16"),
			ServiceCIDR: netip.MustParsePrefix("10.105.0.0/16"), WaitForHost: 60 * time.Minute}})
	if err != nil {
		return nil, nil, nil, err
	}
	cleanups = append(cleanups, func() { c.Down(context.Background()) })
	// An interrupt takes the cluster down (the host has one cluster slot).
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		logf("%s: taking the cluster down", s)
		if pg := rayPgid.Load(); pg > 0 {
			_ = syscall.Kill(-int(pg), syscall.SIGKILL)
		}
		c.Down(context.Background())
		os.Exit(1)
	}()
	logf("cluster up in %s", time.Since(t).Round(time.Second))
	if c.RedisAddr == "" {
		return nil, nil, nil, errors.New("the local cluster has no Redis (redis-server not installed)")
	}
	rdb = redis.NewClient(&redis.Options{Addr: c.RedisAddr})
	cleanups = append(cleanups, func() { rdb.Close() }, func() { rdb.ConfigSet(context.Background(), "maxmemory", "0") })
	if err := c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}); err != nil {
		return nil, nil, nil, err
	}
	if err := c.Client.Create(ctx, wf); err != nil {
		return nil, nil, nil, err
	}
	if err := waitReady(ctx, c.Client, wf, 15*time.Minute); err != nil {
		return nil, nil, nil, err
	}
	logf("workflow sort ready (%d functions)", len(wf.Spec.Functions))
	return c, rdb, down, nil
}

// idleOnly is -measure-idle: the cluster up with the sort's workflow and
// its warm pods (min-scale 1), its idle CPU measured for d after a
// minute's settling, written to -out/sort-idle.json.
func idleOnly(o options, d time.Duration) error {
	wf, _, _, err := loadWorkflow(filepath.Join(paths.RepoRoot(), "examples", "sort"))
	if err != nil {
		return err
	}
	_, _, down, err := upCluster(wf)
	if err != nil {
		return err
	}
	defer down()
	logf("settling for a minute (the pods' start-up), then measuring the cluster's idle CPU for %s", d)
	time.Sleep(time.Minute)
	m, err := measureIdle(d, "bench/sort -measure-idle: the local cluster (2 nodes) with examples/sort's workflow and one warm pod per function, no session")
	if err != nil {
		return err
	}
	logf("idle: %s", m)
	b, _ := json.MarshalIndent(m, "", "  ")
	path := filepath.Join(o.out, "sort-idle.json")
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return err
	}
	logf("wrote %s", path)
	return nil
}

// loadWorkflow reads examples/sort's workflow (namespace bench) and what
// the bench needs from it: the rounds it declares and its shuffle
// buckets' memoryLimitPerPod.
func loadWorkflow(examples string) (wf *v1alpha1.Workflow, maxRounds int, podMemPerPod int64, err error) {
	data, err := os.ReadFile(filepath.Join(examples, "workflow.yaml"))
	if err != nil {
		return nil, 0, 0, err
	}
	wf = &v1alpha1.Workflow{}
	if err := yaml.UnmarshalStrict(data, wf); err != nil {
		return nil, 0, 0, err
	}
	wf.Namespace = "bench"
	for _, b := range wf.Spec.Buckets {
		if strings.HasPrefix(b.Name, "shuffle-r") {
			maxRounds++
			if b.Spec.MemoryLimitPerPod != nil {
				podMemPerPod = b.Spec.MemoryLimitPerPod.Value()
			}
		}
	}
	return wf, maxRounds, podMemPerPod, nil
}
