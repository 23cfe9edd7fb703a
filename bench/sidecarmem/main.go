// Command sidecarmem checks the design target "sidecar memory overhead
// ≤ 4 MiB over stock queue-proxy" and, with -latency, what queue-proxy-zl
// adds to an invocation's latency over stock queue-proxy (issue 33: ≤ 100
// µs at p50): it builds queue-proxy-zl and Knative's
// stock queue-proxy (knative.dev/serving/cmd/queue at the go.mod version,
// so both share every dependency version), runs each in its own network
// namespace next to a tiny user container, and reads the resident memory
// of the queue-proxy process when idle and after plain HTTP load. Both get
// the same environment and the same procedure, each start reading its
// binary from a cold page cache; GOGC and GOMEMLIMIT are left as they are
// (and reported). Needs root (network namespaces).
//
//	go run ./bench/sidecarmem [-reps 3] [-requests 2000] [-concurrency 8] [-latency 2000] [-json out.json] [-zl prebuilt-queue-proxy-zl]
package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/ziptrail/ziptrail/internal/localcluster/netns"
)

// The namespace prefix and subnet are this benchmark's own: other tests
// use zte/ztc/ztls/ztt and 10.213-10.218, and Setup removes leftovers of
// an earlier run with the same prefix.
const (
	netPrefix = "ztm"
	netSubnet = "10.219.0.0/24"
	target    = 4 << 20 // the design target, bytes
)

type config struct {
	ZLBinary    string `json:"zl_binary,omitempty"` // prebuilt queue-proxy-zl, instead of building it
	Reps        int    `json:"reps"`
	Requests    int    `json:"requests"`
	Concurrency int    `json:"concurrency"`
	Latency     int    `json:"latency_invocations,omitempty"`
	Settle      string `json:"settle"`
	GOGC        string `json:"gogc"`
	GOMEMLIMIT  string `json:"gomemlimit"`
	Knative     string `json:"knative_serving"`
	Go          string `json:"go"`
	settle      time.Duration
}

// binary is one queue-proxy build and its measurements.
type binary struct {
	Name string      `json:"name"`
	ID   string      `json:"-"` // pod id prefix
	Path string      `json:"-"`
	Size int64       `json:"size"`
	Runs []runResult `json:"runs"`
}

// runResult is one repetition: idle, after N requests, after 2N requests
// (the second batch shows whether memory keeps growing with traffic).
type runResult struct {
	Idle   memSample `json:"idle"`
	AfterN memSample `json:"after_n"`
	After2 memSample `json:"after_2n"`
	// Latency: with -latency, after the memory readings.
	Latency *latencyResult `json:"latency,omitempty"`
}

func main() {
	var cfg config
	flag.IntVar(&cfg.Reps, "reps", 3, "repetitions per binary (medians are reported)")
	flag.IntVar(&cfg.Requests, "requests", 2000, "plain HTTP requests per load batch (N)")
	flag.IntVar(&cfg.Concurrency, "concurrency", 8, "concurrent keep-alive clients")
	flag.IntVar(&cfg.Latency, "latency", 0, "also measure this many invocations, one after another, through each queue-proxy and straight to its user container, "+
		"as the operator's dispatcher sends them (after the memory readings; 0: no)")
	flag.DurationVar(&cfg.settle, "settle", 2*time.Second, "idle time before each reading")
	jsonPath := flag.String("json", "", "also write the results as JSON to this file")
	flag.StringVar(&cfg.ZLBinary, "zl", "", "measure this queue-proxy-zl binary instead of building ./cmd/queue-proxy-zl (e.g. a candidate fix)")
	upstream := flag.String("upstream", "", "internal: serve as the user container on this address")
	flag.Parse()
	if *upstream != "" {
		if err := serveUpstream(*upstream); err != nil {
			fmt.Fprintln(os.Stderr, "sidecarmem upstream:", err)
			os.Exit(1)
		}
		return
	}
	if cfg.Reps < 1 || cfg.Requests < 1 || cfg.Concurrency < 1 || cfg.Latency < 0 {
		fmt.Fprintln(os.Stderr, "sidecarmem: -reps, -requests and -concurrency must be positive")
		os.Exit(2)
	}
	if err := run(cfg, *jsonPath); err != nil {
		fmt.Fprintln(os.Stderr, "sidecarmem:", err)
		os.Exit(1)
	}
}

func run(cfg config, jsonPath string) error {
	// Interrupts cancel the context so the deferred cleanups still run.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "ziptrail-sidecarmem-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := describe(&cfg); err != nil {
		return err
	}
	bins, err := build(dir, cfg.ZLBinary)
	if err != nil {
		return err
	}
	if err := writeKeyFile(filepath.Join(dir, "keys.json")); err != nil {
		return err
	}
	network, err := netns.New(netPrefix, netip.MustParsePrefix(netSubnet))
	if err != nil {
		return err
	}
	if err := network.Setup(ctx); err != nil {
		return fmt.Errorf("network setup (needs root): %w", err)
	}
	defer network.Cleanup(context.Background())

	for rep := range cfg.Reps {
		// Alternate the order so neither binary always runs in the
		// state (kernel caches, background load) the other left behind.
		order := []*binary{bins[0], bins[1]}
		if rep%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, b := range order {
			fmt.Fprintf(os.Stderr, "sidecarmem: rep %d/%d %s\n", rep+1, cfg.Reps, b.Name)
			r, err := measure(ctx, network, b, fmt.Sprintf("%s%d", b.ID, rep), dir, cfg)
			if err != nil {
				return fmt.Errorf("%s, rep %d: %w", b.Name, rep+1, err)
			}
			b.Runs = append(b.Runs, r)
		}
	}
	printReport(cfg, bins)
	printLatency(cfg, bins)
	if jsonPath != "" {
		return writeJSON(jsonPath, cfg, bins)
	}
	return nil
}

// measure runs one pod and reads queue-proxy's memory idle and after load.
func measure(ctx context.Context, network *netns.Network, b *binary, id, dir string, cfg config) (runResult, error) {
	p, err := startPod(ctx, network, id, b.Path, dir)
	if err != nil {
		return runResult{}, err
	}
	defer p.stop()
	var r runResult
	for _, step := range []struct {
		requests int
		into     *memSample
	}{{0, &r.Idle}, {cfg.Requests, &r.AfterN}, {cfg.Requests, &r.After2}} {
		if step.requests > 0 {
			if err := load(ctx, p.url(), step.requests, cfg.Concurrency); err != nil {
				return r, err
			}
		}
		if err := sleep(ctx, cfg.settle); err != nil {
			return r, err
		}
		if !p.alive() {
			return r, p.withLog(fmt.Errorf("a process of pod %s exited", id))
		}
		if *step.into, err = readMem(p.pid()); err != nil {
			return r, err
		}
	}
	if cfg.Latency > 0 {
		l, err := measureLatency(ctx, id, p.url(), p.userURL(), cfg.Latency)
		if err != nil {
			return r, p.withLog(err)
		}
		r.Latency = &l
	}
	return r, nil
}

// build compiles both binaries from this module, so the stock queue-proxy
// uses exactly the dependency versions queue-proxy-zl is built with. A
// given zlBinary is used as it is.
func build(dir, zlBinary string) ([]*binary, error) {
	root, err := goOutput("env", "GOMOD")
	if err != nil {
		return nil, err
	}
	bins := []*binary{
		{Name: "queue-proxy (stock)", ID: "stock", Path: filepath.Join(dir, "queue")},
		{Name: "queue-proxy-zl", ID: "zl", Path: filepath.Join(dir, "queue-proxy-zl")},
	}
	pkgs := []string{"knative.dev/serving/cmd/queue", "./cmd/queue-proxy-zl"}
	if zlBinary != "" {
		if bins[1].Path, err = filepath.Abs(zlBinary); err != nil {
			return nil, err
		}
		pkgs = pkgs[:1]
	}
	for i, pkg := range pkgs {
		cmd := exec.Command("go", "build", "-o", bins[i].Path, pkg)
		cmd.Dir, cmd.Stdout, cmd.Stderr = filepath.Dir(root), os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("go build %s: %w", pkg, err)
		}
	}
	for _, b := range bins {
		st, err := os.Stat(b.Path)
		if err != nil {
			return nil, err
		}
		b.Size = st.Size()
	}
	return bins, nil
}

// describe records the conditions the numbers depend on.
func describe(cfg *config) error {
	v, err := goOutput("list", "-m", "-f", "{{.Version}}", "knative.dev/serving")
	if err != nil {
		return err
	}
	cfg.Knative, cfg.Go, cfg.Settle = v, runtime.Version(), cfg.settle.String()
	cfg.GOGC = envOr("GOGC", "unset (100)")
	cfg.GOMEMLIMIT = envOr("GOMEMLIMIT", "unset (no limit)")
	return nil
}

// writeKeyFile gives the data plane a namespace key, standing in for the
// operator's Keys message (format of the sidecar's ZIPTRAIL_KEY_FILE).
func writeKeyFile(path string) error {
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	return os.WriteFile(path, []byte(`{"active":"k1","keys":{"k1":"`+key+`"}}`), 0o600)
}

func goOutput(args ...string) (string, error) {
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func writeJSON(path string, cfg config, bins []*binary) error {
	data, err := json.MarshalIndent(struct {
		Config   config    `json:"config"`
		Binaries []*binary `json:"binaries"`
	}{cfg, bins}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}
