// Command chaos is ziptrail's Jepsen-style chaos checker (issue 32, `make
// chaos`, docs/guarantees.md "How we test it"). On the local cluster (real
// Kubernetes, real Knative Serving, redis-server and MinIO on the host) it
// installs ziptrail with its Helm chart — unsharded (2 replicas, leader
// election) and/or sharded (3 replicas, 6 buckets) — and runs sessions of
// four shapes (a chain, a DynamicGroup/DynamicJoin fan-out and fan-in, a
// 2-of-3 Redundant vote, a ByTime window) through the session gateway
// while nemeses act on a schedule with jitter: SIGKILL and SIGSTOP of the
// operator's leader (or a bucket owner), `kubectl rollout restart` and
// `helm upgrade` of the operator, SIGKILL of function processes and of
// their queue-proxy-zl, a Redis restart and a Redis SIGSTOP. The run is cut
// into phases, one nemesis each (the first without one); a session counts
// for the phase it started in.
//
// The checker: every session's result is exactly its expected set, no
// idempotency key's effect (each invocation writes one line to an effects
// file outside ziptrail) happens twice, no session is past its deadline.
// It prints a table per nemesis and exits 1 on any violation (2 when the
// run itself could not be set up).
//
//	go run ./bench/chaos -duration 10m -sharded=both
//	go run ./bench/chaos -duration 90s -sharded=false -nemeses kill-leader,redis-stop
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/localcluster/k8s"
)

type config struct {
	duration        time.Duration // per mode
	modes           []string      // unsharded, sharded
	nemeses         []string
	rate            float64 // sessions started a second
	maxInFlight     int
	work            time.Duration
	sessionDeadline time.Duration
	progress        time.Duration
	seed            uint64
	stateDir        string
	nodes           int
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	violations, err := run(ctx, cfg, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	if violations > 0 {
		fmt.Printf("FAIL: %d violations\n", violations)
		os.Exit(1)
	}
	fmt.Println("PASS: no violation")
}

func parseFlags(args []string, out io.Writer) (config, error) {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(out)
	var cfg config
	fs.DurationVar(&cfg.duration, "duration", 10*time.Minute, "how long sessions run under nemeses, per mode (cut into one phase per nemesis, plus one without)")
	sharded := fs.String("sharded", "false", "false: the unsharded engine (2 replicas, leader election); true: sharded (3 replicas, 6 buckets); both: one after the other on the same cluster")
	nemeses := fs.String("nemeses", strings.Join(nemesisNames(), ","), "comma-separated nemeses, one phase each, in this order")
	fs.Float64Var(&cfg.rate, "rate", 4, "sessions started a second (open loop: a stuck session does not slow the arrivals)")
	fs.IntVar(&cfg.maxInFlight, "max-in-flight", 200, "sessions at once at most; a start beyond is skipped (and counted)")
	fs.DurationVar(&cfg.work, "work", time.Second, "each function invocation works (sleeps) a uniform random time up to this, so that faults find invocations in flight")
	fs.DurationVar(&cfg.sessionDeadline, "session-deadline", time.Minute, "a session without its final answer this long after its start is stuck (and a start not acknowledged by then failed)")
	fs.DurationVar(&cfg.progress, "progress", 10*time.Second, "how often a progress line is printed")
	fs.Uint64Var(&cfg.seed, "seed", 0, "seed of the nemeses' jitter and choices (0: from the clock; printed)")
	fs.StringVar(&cfg.stateDir, "state-dir", "", "the local cluster's state directory (default: a new temporary directory)")
	fs.IntVar(&cfg.nodes, "nodes", 1, "nodes of the local cluster")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch *sharded {
	case "false":
		cfg.modes = []string{"unsharded"}
	case "true":
		cfg.modes = []string{"sharded"}
	case "both":
		cfg.modes = []string{"unsharded", "sharded"}
	default:
		return cfg, fmt.Errorf("-sharded must be false, true or both, not %q", *sharded)
	}
	known := map[string]bool{}
	for _, n := range nemesisNames() {
		known[n] = true
	}
	for _, n := range strings.Split(*nemeses, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if !known[n] {
			return cfg, fmt.Errorf("unknown nemesis %q (known: %s)", n, strings.Join(nemesisNames(), ", "))
		}
		cfg.nemeses = append(cfg.nemeses, n)
	}
	if cfg.work < 0 {
		return cfg, errors.New("-work must not be negative")
	}
	if cfg.duration <= 0 || cfg.rate <= 0 || cfg.maxInFlight <= 0 || cfg.sessionDeadline <= 0 || cfg.progress <= 0 || cfg.nodes <= 0 {
		return cfg, errors.New("-duration, -rate, -max-in-flight, -session-deadline, -progress and -nodes must be positive")
	}
	if cfg.seed == 0 {
		cfg.seed = uint64(time.Now().UnixNano())
	}
	return cfg, nil
}

// run sets up the local cluster and runs each mode; it returns the number
// of violations the checker found.
func run(ctx context.Context, cfg config, out io.Writer) (int, error) {
	t0 := time.Now()
	dir := cfg.stateDir
	if dir == "" {
		d, err := os.MkdirTemp("", "ziptrail-chaos-")
		if err != nil {
			return 0, err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	// The functions write their effects here: a directory every pod's
	// process (host processes of the node agent) can write.
	effectsDir := filepath.Join(os.TempDir(), fmt.Sprintf("ziptrail-chaos-effects-%d", os.Getpid()))
	if err := os.MkdirAll(effectsDir, 0o777); err != nil {
		return 0, err
	}
	if err := os.Chmod(effectsDir, 0o777); err != nil {
		return 0, err
	}
	defer os.RemoveAll(effectsDir)
	logFile, err := os.Create(filepath.Join(os.TempDir(), fmt.Sprintf("ziptrail-chaos-%d.log", os.Getpid())))
	if err != nil {
		return 0, err
	}
	defer logFile.Close()
	// go-redis logs its pool's dial errors (the Redis nemeses) to stderr.
	redis.SetLogger(logTo{logFile})
	fmt.Fprintf(out, "chaos: seed %d, modes %v, %s each, nemeses %v, %.1f sessions/s (at most %d at once), work up to %s an invocation, session deadline %s; commands and cluster log: %s\n",
		cfg.seed, cfg.modes, cfg.duration, cfg.nemeses, cfg.rate, cfg.maxInFlight, cfg.work, cfg.sessionDeadline, logFile.Name())

	fmt.Fprintf(out, "==> the local cluster (Kubernetes, Knative Serving, redis-server, MinIO; %d node(s))\n", cfg.nodes)
	c, err := localcluster.Up(ctx, localcluster.Options{StateDir: dir, Nodes: cfg.nodes, NoOperator: true, Log: logFile,
		Kubernetes: k8s.Options{WaitForHost: 30 * time.Minute}})
	if err != nil {
		return 0, fmt.Errorf("local cluster: %w", err)
	}
	defer func() {
		fmt.Fprintln(out, "==> tearing down the local cluster")
		if err := c.Down(context.Background()); err != nil {
			fmt.Fprintf(out, "warning: %v\n", err)
		}
	}()
	if c.RedisAddr == "" {
		return 0, errors.New("no redis-server on this host (hack/install-deps.sh): the engine has no checkpoints")
	}
	fmt.Fprintf(out, "==> local cluster up in %s\n", time.Since(t0).Round(time.Second))

	rng := rand.New(rand.NewPCG(cfg.seed, cfg.seed^0x9e3779b97f4a7c15))
	violations := 0
	var tables []string
	for i, mode := range cfg.modes {
		m := &modeRun{cfg: cfg, mode: mode, cluster: c, out: out, log: logFile, rng: rng,
			effects: filepath.Join(effectsDir, mode+".log"), last: i == len(cfg.modes)-1}
		v, table, err := m.run(ctx)
		violations += v
		if table != "" {
			tables = append(tables, table)
		}
		if err != nil {
			fmt.Fprintf(out, "\n%s", strings.Join(tables, "\n"))
			return violations, fmt.Errorf("%s: %w", mode, err)
		}
	}
	fmt.Fprintf(out, "\n%s", strings.Join(tables, "\n"))
	fmt.Fprintf(out, "chaos: %s in all (setup included)\n", time.Since(t0).Round(time.Second))
	return violations, nil
}

// logTo is go-redis's logger, into the run's log.
type logTo struct{ w io.Writer }

func (l logTo) Printf(_ context.Context, format string, v ...any) {
	fmt.Fprintf(l.w, "redis: "+format+"\n", v...)
}
