package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/shuffle/calibrate"
	"github.com/ziptrail/ziptrail/internal/shuffle/model"
	"github.com/ziptrail/ziptrail/internal/testservers"
)

// runCalibrate implements `ziptrail calibrate`: it measures the
// installation's Redis, S3 and pod-memory pulls (or, with --local, servers
// it starts), fits the shuffle model's parameters and writes them as a
// calibration file and/or ConfigMap that `ziptrail explain --calibration`
// and the shuffle library read.
func runCalibrate(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	fs := flag.NewFlagSet("calibrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	local := fs.Bool("local", false, "measure a redis-server and a MinIO started here (hack/install-deps.sh installs them) instead of --redis and --s3-*")
	redisAddr := fs.String("redis", "", "the fast tier's Redis shard, host:port")
	redisPassFile := fs.String("redis-password-file", "", "file holding the Redis password (default: none)")
	shards := fs.Int("redis-shards", 1, "Redis shards of the fast tier (the measurements are per shard)")
	s3Endpoint := fs.String("s3-endpoint", "", "the slow tier's S3 endpoint, host:port")
	s3AccessFile := fs.String("s3-access-key-file", "", "file holding the S3 access key")
	s3SecretFile := fs.String("s3-secret-key-file", "", "file holding the S3 secret key")
	s3Bucket := fs.String("s3-bucket", "", "an existing bucket the measurements may write to (they remove what they write)")
	s3TLS := fs.Bool("s3-tls", false, "talk to the S3 endpoint over HTTPS")
	perPoint := fs.Duration("duration-per-point", 2*time.Second, "how long each measurement point runs: longer is more accurate, shorter is faster (a full run is about 120 points)")
	maxObject := fs.String("max-object", "100MB", "largest object size measured (sizes are 10KB, 100KB, 1MB, 10MB, 100MB up to it)")
	quick := fs.Bool("quick", false, "stop at 10MB objects (same as --max-object 10MB)")
	workersFlag := fs.String("workers", "1,2,4,8", "parallelisms of the bandwidth grid")
	defaults := model.DefaultParams()
	podFrac := fs.Float64("pod-store-fraction", defaults.PodStoreFraction, "fraction of a producer pod's memory its object store may hold (configuration, not measured)")
	ckpt := fs.Duration("checkpoint-interval", 0, "the control path's engine saves its state this often, as the installation's does (default: the local cluster's 250ms with --local, else the operator's 1s)")
	startup := fs.Duration("worker-startup", time.Duration(defaults.WorkerStartup*float64(time.Second)), "a stage's cold start (not measured here; bench/coldstart measures it on the local cluster)")
	qpBinary := fs.String("queue-proxy-zl", "", "--local: the sidecar binary of the sidecar-path CPU points (default: queue-proxy-zl on $PATH, next to this executable, or built from ./cmd/queue-proxy-zl in a ziptrail checkout); \"none\" leaves them out")
	pyFlag := fs.String("python", "", "--local: a python with the ziptrail SDK (pip install ./sdk/python) for the Python SDK's transfer points and the control path (a real engine in this process, real sidecars, Python functions); default python3 on $PATH if it imports ziptrail; \"none\" leaves them out")
	outFile := fs.String("o", "", "write the calibration to this file")
	rawFile := fs.String("raw", "", "also write every measurement (the tables the fit read) to this JSON file")
	cmFlag := fs.String("configmap", "", "write the calibration to this ConfigMap, NAMESPACE/NAME (NAME default "+model.ConfigMapName+"), on the cluster of the default kubeconfig (or --kubeconfig)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig for --configmap (default: $KUBECONFIG, then ~/.kube/config)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *outFile == "" && *cmFlag == "" {
		return errors.New("say where the calibration goes: -o FILE and/or --configmap NAMESPACE/NAME")
	}
	if *shards < 1 {
		return errors.New("--redis-shards must be at least 1")
	}
	if *perPoint <= 0 {
		return errors.New("--duration-per-point must be positive")
	}
	maxObj, err := model.ParseBytes(*maxObject)
	if err != nil {
		return fmt.Errorf("--max-object: %w", err)
	}
	if *quick {
		maxObj = min(maxObj, 10*model.MB)
	}
	var workers []int
	for _, s := range strings.Split(*workersFlag, ",") {
		w, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || w < 1 {
			return fmt.Errorf("--workers %q: want counts such as 1,2,4,8", *workersFlag)
		}
		workers = append(workers, w)
	}
	base := defaults
	base.FastShards, base.PodStoreFraction, base.WorkerStartup = *shards, *podFrac, startup.Seconds()

	// The ConfigMap's cluster is checked before the long measurement.
	var cm *configMapTarget
	if *cmFlag != "" {
		if cm, err = newConfigMapTarget(ctx, *kubeconfig, *cmFlag); err != nil {
			return err
		}
	}

	// the sidecar binary is found before anything starts
	var bin string
	switch {
	case !*local && *qpBinary != "":
		return errors.New("--queue-proxy-zl goes with --local (the sidecar path is measured against servers calibrate started)")
	case *local && *qpBinary != "none" && *redisAddr == "" && *s3Endpoint == "":
		var cleanup func()
		if bin, cleanup, err = findQueueProxy(ctx, *qpBinary, stderr); err != nil {
			return err
		}
		defer cleanup()
	}

	cfg := calibrate.Config{DurationPerPoint: *perPoint, MaxObject: maxObj, Workers: workers, Progress: stderr, CheckpointInterval: *ckpt}
	if *local && *ckpt == 0 {
		cfg.CheckpointInterval = localcluster.CheckpointInterval
	}
	host, _ := os.Hostname()
	details := map[string]string{
		"host": host, "cores": strconv.Itoa(runtime.NumCPU()), "memory": memTotal(), "os": runtime.GOOS + "/" + runtime.GOARCH,
		"durationPerPoint": perPoint.String(), "maxObject": calibrate.FormatSize(maxObj), "workers": *workersFlag,
		"podPulls": "in-process pull.Server/Client pairs over loopback TCP on " + host,
	}
	if cfg.CheckpointInterval > 0 {
		details["checkpointInterval"] = cfg.CheckpointInterval.String()
	}
	if *local {
		if *redisAddr != "" || *s3Endpoint != "" {
			return errors.New("--local starts its own Redis and MinIO: leave out --redis and --s3-endpoint")
		}
		tb := &testservers.ProcessTB{}
		defer tb.Close()
		fmt.Fprintln(stderr, "starting redis-server and MinIO on loopback ports")
		rs, mi, bucket, err := startLocalServers(tb)
		if err != nil {
			return err
		}
		cfg.Redis = &redis.Options{Addr: rs.Addr}
		cfg.S3 = calibrate.S3Endpoint{Endpoint: mi.Endpoint, AccessKey: mi.AccessKey, SecretKey: mi.SecretKey, Bucket: bucket}
		details["s3"] = "MinIO (testservers.StartMinIO) at " + mi.Endpoint + ", data in a temp dir"
		// The servers are this machine's processes: their CPU per byte
		// moved is measured, and they share its cores with the workers.
		cfg.ServerPIDs = map[string]int{}
		for store, addr := range map[string]string{calibrate.Redis: rs.Addr, calibrate.S3: mi.Endpoint} {
			pid, err := calibrate.ListenerPID(addr)
			if err != nil {
				return fmt.Errorf("%s server's process (for its CPU time): %w", store, err)
			}
			cfg.ServerPIDs[store] = pid
		}
		base.Cores = float64(runtime.NumCPU())
		details["serverCPU"] = "measured: /proc/<pid>/stat of redis-server and MinIO, and this process's own CPU (the client side, and both ends of the pod pulls)"
		if *qpBinary != "none" {
			cfg.Sidecar = &calibrate.SidecarPath{Binary: bin}
			details["sidecarCPU"] = "measured: objects through two queue-proxy-zl --standalone (" + bin + ") from SDK clients in this process; the platform's CPU per byte is fitted on these points (server + sidecars + SDK)"
			switch py := *pyFlag; {
			case py == "none":
				details["controlCPU"] = "not measured (--python none)"
			case py == "":
				if p, how := findPythonSDK(ctx); p != "" {
					cfg.Sidecar.Python = p
					details["pythonSDK"] = how
				} else {
					details["controlCPU"] = "not measured: no python3 on $PATH imports ziptrail (pip install ./sdk/python, or --python)"
					fmt.Fprintln(stderr, "warning: the control path and the Python SDK's costs are not measured: no python3 on $PATH imports ziptrail (pip install ./sdk/python, or --python); the model then leaves them out")
				}
			default:
				cfg.Sidecar.Python = py
			}
			if cfg.Sidecar.Python != "" {
				details["controlCPU"] = "measured: sessions of a real engine (an orchestrator in this process, checkpoints in the Redis) with two queue-proxy-zl connected to it in front of Python functions (" + cfg.Sidecar.Python + "); and the Python SDK's transfers through the sidecars"
			}
		} else {
			details["sidecarCPU"] = "not measured (--queue-proxy-zl none): the platform's CPU per byte is the bare clients' and the servers', without the sidecar's own work"
		}
	} else {
		if *redisAddr == "" || *s3Endpoint == "" || *s3Bucket == "" {
			return errors.New("give --redis, --s3-endpoint and --s3-bucket (with --s3-access-key-file and --s3-secret-key-file), or --local")
		}
		cfg.Redis = &redis.Options{Addr: *redisAddr}
		if *redisPassFile != "" {
			if cfg.Redis.Password, err = readSecret(*redisPassFile); err != nil {
				return fmt.Errorf("--redis-password-file: %w", err)
			}
		}
		cfg.S3 = calibrate.S3Endpoint{Endpoint: *s3Endpoint, Secure: *s3TLS, Bucket: *s3Bucket}
		for _, f := range []struct {
			flag, path string
			dst        *string
		}{{"s3-access-key-file", *s3AccessFile, &cfg.S3.AccessKey}, {"s3-secret-key-file", *s3SecretFile, &cfg.S3.SecretKey}} {
			if f.path == "" {
				return fmt.Errorf("--%s is required with --s3-endpoint", f.flag)
			}
			if *f.dst, err = readSecret(f.path); err != nil {
				return fmt.Errorf("--%s: %w", f.flag, err)
			}
		}
		scheme := "http://"
		if *s3TLS {
			scheme = "https://"
		}
		details["s3"] = scheme + *s3Endpoint + "/" + *s3Bucket
		// The servers' processes are not visible from here (pods, another
		// machine): their CPU per byte is not measured, and neither are
		// the cores the workers share with them.
		details["serverCPU"] = "not measured: the Redis and S3 servers are not processes of this machine that calibrate started; slowCPU and fastCPU unknown (0), podCPU from in-process pulls"
	}
	details["redis"] = cfg.Redis.Addr
	if v := redisVersion(ctx, cfg.Redis); v != "" {
		details["redis"] += " (redis " + v + ")"
	}

	loadBefore := loadAverage()
	m, err := calibrate.Measure(ctx, cfg)
	if err != nil {
		return err
	}
	// the machine's other work shows in the measurements: say how busy it was
	details["loadAverage"] = "before " + loadBefore + ", after " + loadAverage()
	params, notes, err := calibrate.Fit(m, base)
	if err != nil {
		return err
	}
	cal := model.Calibration{
		Version:    model.CalibrationVersion,
		Time:       time.Now().UTC().Truncate(time.Second),
		MeasuredOn: model.MeasuredOn{Kind: "machine", Name: host, Details: details},
		Params:     params,
		Notes: append([]string{
			fmt.Sprintf("ziptrail calibrate: %s per point, objects up to %s, workers %s", perPoint, calibrate.FormatSize(maxObj), *workersFlag),
			fmt.Sprintf("not measured: podStoreFraction %.2f, workerStartup %s (flags); taskMemoryFraction %.2f, speculateAfter %.2f (shuffle library defaults); fastShards %d (--redis-shards)",
				params.PodStoreFraction, model.FormatSeconds(params.WorkerStartup), params.TaskMemoryFraction, params.SpeculateAfter, params.FastShards),
			"worker memory not varied (workers are goroutines of one process): memoryExponent 0",
		}, notes...),
	}
	if cm != nil && !*local {
		cal.MeasuredOn.Kind, cal.MeasuredOn.Name = "cluster", cm.context
		details["measuredFrom"] = host
	}
	printCalibration(stdout, m, cal)

	if *rawFile != "" {
		b, err := json.MarshalIndent(m, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*rawFile, append(b, '\n'), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote the measurements to %s\n", *rawFile)
	}
	if *outFile != "" {
		if err := cal.Save(*outFile); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote the calibration to %s (use it: ziptrail explain --calibration %s --size …)\n", *outFile, *outFile)
	}
	if cm != nil {
		verb, err := cm.write(ctx, cal)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s ConfigMap %s/%s (key %s) on %q\n", verb, cm.namespace, cm.name, model.ConfigMapKey, cm.context)
	}
	return nil
}

// findPythonSDK finds a python3 on $PATH that imports the ziptrail SDK:
// installed, or — run from a ziptrail checkout (`go run ./cmd/ziptrail`,
// make bench-sort) — the checkout's sdk/python put first on PYTHONPATH
// for this process and every one it starts, as the tests do.
func findPythonSDK(ctx context.Context) (python, how string) {
	p, err := exec.LookPath("python3")
	if err != nil {
		return "", ""
	}
	if exec.CommandContext(ctx, p, "-c", "import ziptrail").Run() == nil {
		return p, p + " (the SDK installed)"
	}
	sdk, err := filepath.Abs(filepath.Join("sdk", "python"))
	if err != nil {
		return "", ""
	}
	if _, err := os.Stat(filepath.Join(sdk, "ziptrail", "__init__.py")); err != nil {
		return "", ""
	}
	cmd := exec.CommandContext(ctx, p, "-c", "import ziptrail")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+sdk)
	if cmd.Run() != nil {
		return "", ""
	}
	if err := os.Setenv("PYTHONPATH", sdk); err != nil {
		return "", ""
	}
	return p, p + " with PYTHONPATH=" + sdk + " (this checkout's SDK)"
}

// findQueueProxy resolves --queue-proxy-zl: the path given, else
// queue-proxy-zl on $PATH, else next to this executable, else — run from
// a ziptrail checkout (`go run ./cmd/ziptrail`, make bench-sort) — built
// from ./cmd/queue-proxy-zl into a temporary directory that cleanup
// removes.
func findQueueProxy(ctx context.Context, given string, progress io.Writer) (bin string, cleanup func(), err error) {
	cleanup = func() {}
	if given != "" {
		if st, err := os.Stat(given); err != nil || st.IsDir() {
			return "", cleanup, fmt.Errorf("--queue-proxy-zl %s: not a file", given)
		}
		return given, cleanup, nil
	}
	if p, err := exec.LookPath("queue-proxy-zl"); err == nil {
		return p, cleanup, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "queue-proxy-zl")
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, cleanup, nil
		}
	}
	if _, err := os.Stat(filepath.Join("cmd", "queue-proxy-zl", "main.go")); err == nil {
		dir, err := os.MkdirTemp("", "ziptrail-calibrate-")
		if err != nil {
			return "", cleanup, err
		}
		fmt.Fprintln(progress, "building ./cmd/queue-proxy-zl for the sidecar-path points")
		if out, err := exec.CommandContext(ctx, "go", "build", "-o", dir, "./cmd/queue-proxy-zl").CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return "", cleanup, fmt.Errorf("go build ./cmd/queue-proxy-zl: %v\n%s", err, out)
		}
		return filepath.Join(dir, "queue-proxy-zl"), func() { os.RemoveAll(dir) }, nil
	}
	return "", cleanup, errors.New("--local measures the sidecar path and needs queue-proxy-zl: not on $PATH, not next to this executable, and this is not a ziptrail checkout to build it in; build it (go build -o DIR ./cmd/queue-proxy-zl) and give --queue-proxy-zl DIR/queue-proxy-zl, or --queue-proxy-zl none to leave the sidecar path out")
}

// startLocalServers starts redis-server and MinIO with a bucket.
func startLocalServers(tb *testservers.ProcessTB) (rs *testservers.Redis, mi *testservers.MinIO, bucket string, err error) {
	err = tb.Do(func() {
		rs = testservers.StartRedis(tb)
		mi = testservers.StartMinIO(tb)
		bucket = mi.Bucket(tb, "calibrate")
	})
	return rs, mi, bucket, err
}

func readSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

func redisVersion(ctx context.Context, o *redis.Options) string {
	c := redis.NewClient(o)
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "redis_version:"); ok {
			return v
		}
	}
	return ""
}

// loadAverage is the 1-minute load average ("unknown" off Linux).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "unknown"
}

func memTotal() string {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err == nil {
				return model.FormatBytes(kb * 1024)
			}
		}
	}
	return "unknown"
}

// printCalibration prints the measurements as tables and the fitted
// parameters.
func printCalibration(w io.Writer, m *calibrate.Measurements, cal model.Calibration) {
	p := cal.Params
	fmt.Fprintf(w, "\ncalibration of %s %q at %s (load average %s)\n\n", cal.MeasuredOn.Kind, cal.MeasuredOn.Name, cal.Time.Format(time.RFC3339),
		cal.MeasuredOn.Details["loadAverage"])

	// bandwidth: a row per store, direction and size; a column per workers
	type row struct {
		store, op string
		size      float64
	}
	var rows []row
	cells := map[row]map[int]calibrate.BandwidthPoint{}
	var workers []int
	seenW := map[int]bool{}
	for _, pt := range m.Bandwidth {
		k := row{pt.Store, pt.Op, pt.Size}
		if cells[k] == nil {
			cells[k] = map[int]calibrate.BandwidthPoint{}
			rows = append(rows, k)
		}
		cells[k][pt.Workers] = pt
		if !seenW[pt.Workers] {
			seenW[pt.Workers] = true
			workers = append(workers, pt.Workers)
		}
	}
	sort.Ints(workers)
	fmt.Fprintln(w, "bandwidth per worker (all workers together), by workers at once:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprint(tw, "STORE\tOP\tOBJECT")
	for _, n := range workers {
		fmt.Fprintf(tw, "\t%d", n)
	}
	fmt.Fprintln(tw)
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s", r.store, r.op, calibrate.FormatSize(r.size))
		for _, n := range workers {
			if pt, ok := cells[r][n]; ok {
				fmt.Fprintf(tw, "\t%s (%s)", mbps(pt.Typical()), mbps(pt.Aggregate))
			} else {
				fmt.Fprint(tw, "\t-")
			}
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	fmt.Fprintln(w, "(MB/s)")

	fmt.Fprintln(w, "\nrequest rates (requests/s, the best of 1, 2, 4, … clients; Locus Table 1):")
	var sizes []float64
	seenS := map[float64]bool{}
	for _, r := range m.Rates {
		if !seenS[r.Size] {
			seenS[r.Size] = true
			sizes = append(sizes, r.Size)
		}
	}
	sort.Float64s(sizes)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprint(tw, "STORE\tOP")
	for _, s := range sizes {
		fmt.Fprintf(tw, "\t%s", calibrate.FormatSize(s))
	}
	fmt.Fprintln(tw)
	for _, store := range []string{calibrate.S3, calibrate.Redis} {
		for _, op := range []string{calibrate.Write, calibrate.Read} {
			fmt.Fprintf(tw, "%s\t%s", store, op)
			for _, s := range sizes {
				v := "-"
				for _, r := range m.Rates {
					if r.Store == store && r.Op == op && r.Size == s {
						v = fmt.Sprintf("%s (%d)", calibrate.FormatCount(r.PerSecond), r.Concurrency)
					}
				}
				fmt.Fprintf(tw, "\t%s", v)
			}
			fmt.Fprintln(tw)
		}
		fmt.Fprintf(tw, "%s\tmodel", store)
		curve := p.SlowRequests
		if store == calibrate.Redis {
			curve = p.FastRequests
		}
		for _, s := range sizes {
			fmt.Fprintf(tw, "\t%s", calibrate.FormatCount(curve.At(s)))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	fmt.Fprintln(w, "(clients of the best rate in parentheses; model: the fitted curve, reads and writes together)")
	for _, s := range m.Server {
		fmt.Fprintf(w, "\n%s server: %s with %d clients of %s objects, half writing, half reading\n", s.Store, calibrate.FormatRate(s.Aggregate), s.Clients, calibrate.FormatSize(s.Size))
	}

	fmt.Fprintln(w, "\nfitted parameters:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARAMETER\tVALUE")
	for _, b := range []struct {
		n string
		b model.Bandwidth
	}{{"slowRead", p.SlowRead}, {"slowWrite", p.SlowWrite}, {"fastRead", p.FastRead}, {"fastWrite", p.FastWrite}} {
		fmt.Fprintf(tw, "%s\tb(p) = %s; at 1/8/64 workers %s / %s / %s each\n", b.n, calibrate.DescribeBandwidth(b.b),
			mbps(b.b.At(1, model.GiB)), mbps(b.b.At(8, model.GiB)), mbps(b.b.At(64, model.GiB)))
	}
	capOrNone := func(v float64) string {
		if v == 0 {
			return "none (kept growing with workers)"
		}
		return calibrate.FormatRate(v)
	}
	fmt.Fprintf(tw, "slowServerBandwidth\t%s\n", capOrNone(p.SlowServerBandwidth))
	fmt.Fprintf(tw, "slowRequests\t%s\n", describeCurve(p.SlowRequests))
	fmt.Fprintf(tw, "fastServerBandwidth\t%s per shard × %d shard(s)\n", calibrate.FormatRate(p.FastServerBandwidth), p.FastShards)
	fmt.Fprintf(tw, "fastRequests\t%s per shard\n", describeCurve(p.FastRequests))
	fmt.Fprintf(tw, "podPullBandwidth\t%s\n", calibrate.FormatRate(p.PodPullBandwidth))
	fmt.Fprintf(tw, "podAggregateBandwidth\t%s\n", capOrNone(p.PodAggregateBandwidth))
	if n := len(p.Stragglers); n > 0 {
		fmt.Fprintf(tw, "stragglers\t%d samples, %.2f to %.2f, median %.2f\n", n, p.Stragglers[n-1], p.Stragglers[0], p.Stragglers[n/2])
	}
	for _, c := range []struct {
		n string
		c model.StoreCPU
	}{{"slowCPU", p.SlowCPU}, {"fastCPU", p.FastCPU}, {"podCPU", p.PodCPU}} {
		if c.c == (model.StoreCPU{}) {
			fmt.Fprintf(tw, "%s\tnot measured\n", c.n)
			continue
		}
		v := fmt.Sprintf("read %s + %s per request", calibrate.FormatCPUPerByte(c.c.Read.PerByte), calibrate.FormatCPUSeconds(c.c.Read.PerRequest))
		if c.c.Write != (model.CPUCost{}) {
			v = fmt.Sprintf("write %s + %s per request, %s", calibrate.FormatCPUPerByte(c.c.Write.PerByte), calibrate.FormatCPUSeconds(c.c.Write.PerRequest), v)
		}
		if c.c.Delete != (model.CPUCost{}) {
			v = fmt.Sprintf("%s, delete %s + %s per object", v, calibrate.FormatCPUPerByte(c.c.Delete.PerByte), calibrate.FormatCPUSeconds(c.c.Delete.PerRequest))
		}
		who := "server and bare client CPU"
		if _, ok := cal.MeasuredOn.Details["sidecarCPU"]; ok && strings.HasPrefix(cal.MeasuredOn.Details["sidecarCPU"], "measured") {
			who = "server, queue-proxy-zl and SDK CPU"
		}
		fmt.Fprintf(tw, "%s\t%s (%s)\n", c.n, v, who)
	}
	if c := p.ControlCPU; c != (model.ControlCPU{}) {
		fmt.Fprintf(tw, "controlCPU\t%s per object announced + %s per invocation (engine, sidecars, redis); %s per object kept per second, at most %.3g cores\n",
			calibrate.FormatCPUSeconds(c.PerObject), calibrate.FormatCPUSeconds(c.PerInvocation), calibrate.FormatCPUSeconds(c.PerObjectSecond), c.MaxCores)
	}
	for _, lang := range []string{"go", "python"} {
		c, ok := p.SDKCPU[lang]
		if !ok {
			continue
		}
		v := fmt.Sprintf("s3 write %s + %s, read %s + %s; redis write %s + %s, read %s + %s; pod put %s + %s, pull %s + %s",
			calibrate.FormatCPUPerByte(c.Slow.Write.PerByte), calibrate.FormatCPUSeconds(c.Slow.Write.PerRequest),
			calibrate.FormatCPUPerByte(c.Slow.Read.PerByte), calibrate.FormatCPUSeconds(c.Slow.Read.PerRequest),
			calibrate.FormatCPUPerByte(c.Fast.Write.PerByte), calibrate.FormatCPUSeconds(c.Fast.Write.PerRequest),
			calibrate.FormatCPUPerByte(c.Fast.Read.PerByte), calibrate.FormatCPUSeconds(c.Fast.Read.PerRequest),
			calibrate.FormatCPUPerByte(c.Pod.Write.PerByte), calibrate.FormatCPUSeconds(c.Pod.Write.PerRequest),
			calibrate.FormatCPUPerByte(c.Pod.Read.PerByte), calibrate.FormatCPUSeconds(c.Pod.Read.PerRequest))
		if c.Send != (model.CPUCost{}) || c.PerInvocation > 0 {
			v += fmt.Sprintf("; %s per object sent, %s per invocation", calibrate.FormatCPUSeconds(c.Send.PerRequest), calibrate.FormatCPUSeconds(c.PerInvocation))
		}
		fmt.Fprintf(tw, "sdkCPU[%s]\t%s (its own process)\n", lang, v)
	}
	if p.Cores > 0 {
		fmt.Fprintf(tw, "cores\t%g (this machine's: the workers and the stores share them)\n", p.Cores)
	}
	fmt.Fprintf(tw, "podStoreFraction\t%.2f (configuration)\n", p.PodStoreFraction)
	fmt.Fprintf(tw, "workerStartup\t%s (configuration)\n", model.FormatSeconds(p.WorkerStartup))
	fmt.Fprintf(tw, "taskMemoryFraction, speculateAfter\t%.2f, %.2f (shuffle library defaults)\n", p.TaskMemoryFraction, p.SpeculateAfter)
	tw.Flush()
	fmt.Fprintln(w)
}

func mbps(v float64) string {
	if v >= 100e6 {
		return strconv.FormatFloat(v/1e6, 'f', 0, 64)
	}
	return strconv.FormatFloat(v/1e6, 'f', 1, 64)
}

func describeCurve(c model.RateCurve) string {
	var parts []string
	for _, pt := range c.Points {
		parts = append(parts, fmt.Sprintf("%s %s/s", calibrate.FormatSize(pt.Size), calibrate.FormatCount(pt.PerSecond)))
	}
	return strings.Join(parts, ", ")
}

// configMapTarget is where --configmap writes: a namespace and name on the
// cluster of a kubeconfig.
type configMapTarget struct {
	namespace, name, context string
	client                   kubernetes.Interface
}

// newConfigMapTarget resolves NAMESPACE/NAME and the kubeconfig (explicit
// path, else $KUBECONFIG, else ~/.kube/config) and checks that the
// ConfigMap can be read (it may not exist yet).
func newConfigMapTarget(ctx context.Context, kubeconfig, spec string) (*configMapTarget, error) {
	ns, name, _ := strings.Cut(spec, "/")
	if name == "" {
		name = model.ConfigMapName
	}
	if ns == "" || strings.Contains(name, "/") {
		return nil, fmt.Errorf("--configmap %q: want NAMESPACE/NAME or NAMESPACE", spec)
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	raw, err := cc.RawConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig for --configmap: %w", err)
	}
	rc, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig for --configmap (pass --kubeconfig): %w", err)
	}
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	t := &configMapTarget{namespace: ns, name: name, context: raw.CurrentContext, client: kc}
	if t.context == "" {
		t.context = rc.Host
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := kc.CoreV1().ConfigMaps(ns).Get(cctx, name, metav1.GetOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("ConfigMap %s/%s on %q: %w", ns, name, t.context, err)
	}
	return t, nil
}

// write creates the ConfigMap or replaces its calibration; it returns
// "created" or "updated".
func (t *configMapTarget) write(ctx context.Context, cal model.Calibration) (string, error) {
	data, err := cal.ConfigMapData()
	if err != nil {
		return "", err
	}
	labels := map[string]string{"app.kubernetes.io/part-of": "ziptrail", "app.kubernetes.io/component": "shuffle-calibration"}
	cms := t.client.CoreV1().ConfigMaps(t.namespace)
	cur, err := cms.Get(ctx, t.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: t.namespace, Name: t.name, Labels: labels}, Data: data}, metav1.CreateOptions{})
		if err != nil {
			return "", fmt.Errorf("create ConfigMap %s/%s: %w", t.namespace, t.name, err)
		}
		return "created", nil
	}
	if err != nil {
		return "", err
	}
	if cur.Data == nil {
		cur.Data = map[string]string{}
	}
	for k, v := range data {
		cur.Data[k] = v
	}
	if cur.Labels == nil {
		cur.Labels = map[string]string{}
	}
	for k, v := range labels {
		cur.Labels[k] = v
	}
	if _, err := cms.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return "", fmt.Errorf("update ConfigMap %s/%s: %w", t.namespace, t.name, err)
	}
	return "updated", nil
}
