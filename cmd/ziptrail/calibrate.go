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
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/shuffle/model"
	"github.com/ziptrail/ziptrail/internal/tools/calibrate"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
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
		tb := &servers.ProcessTB{}
		defer tb.Close()
		fmt.Fprintln(stderr, "starting redis-server and MinIO on loopback ports")
		rs, mi, bucket, err := startLocalServers(tb)
		if err != nil {
			return err
		}
		cfg.Redis = &redis.Options{Addr: rs.Addr}
		cfg.S3 = calibrate.S3Endpoint{Endpoint: mi.Endpoint, AccessKey: mi.AccessKey, SecretKey: mi.SecretKey, Bucket: bucket}
		details["s3"] = "MinIO (servers.StartMinIO) at " + mi.Endpoint + ", data in a temp dir"
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
func startLocalServers(tb *servers.ProcessTB) (rs *servers.Redis, mi *servers.MinIO, bucket string, err error) {
	err = tb.Do(func() {
		rs = servers.StartRedis(tb)
		mi = servers.StartMinIO(tb)
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
