package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/localcluster"
)

// The two arms: the engine fires every trigger (the dispatcher sends each
// invocation from the operator), or the producers' sidecars fire the
// Immediate and ByName ones themselves (delegated firing,
// --delegate-triggers). They alternate in blocks on one cluster and one
// set of pods: a switch restarts the in-process operator with the other
// setting, as changing the chart's engine.delegateTriggers rolls the
// operator's Deployment (localcluster.SetDelegateTriggers), and waits for
// the sidecars to reconnect; each block starts with a warm-up session.

type report struct {
	Host     host  `json:"host"`
	Sessions int   `json:"sessionsPerArm"`
	Rounds   int   `json:"rounds"`
	Results  []row `json:"results"`
}

type host struct {
	Hostname   string `json:"hostname"`
	Time       string `json:"time"`
	Commit     string `json:"commit"`
	LoadBefore string `json:"loadavgBefore"`
	LoadAfter  string `json:"loadavgAfter"`
}

type row struct {
	Chain    string  `json:"chain"`
	Steps    int     `json:"steps"`
	Firing   string  `json:"firing"` // "engine" or "delegated"
	Sessions int     `json:"sessions"`
	P50Ms    float64 `json:"p50Ms"`
	P95Ms    float64 `json:"p95Ms"`
	StepP50  float64 `json:"perStepP50Ms"`
	// Delegated firings recorded per session (the engine's
	// ziptrail_engine_delegated_firings_total), lowest and highest.
	DelegatedMin int `json:"delegatedFiringsMin"`
	DelegatedMax int `json:"delegatedFiringsMax"`
	// Every measured session's latency, in the order run.
	LatenciesMs []float64 `json:"latenciesMs"`
}

func hostInfo() host {
	h, _ := os.Hostname()
	commit, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	return host{Hostname: h, Time: time.Now().UTC().Format(time.RFC3339), Commit: strings.TrimSpace(string(commit)), LoadBefore: loadavg()}
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}

// arm is one way of running a chain: who fires (the engine, or the
// producers' sidecars for what they can) and how the operator's
// invocations travel (straight to a ready pod, or through the ingress and
// the activator: localcluster.SetDirectDispatch, switched at once).
type arm struct{ delegate, direct bool }

func armName(a arm) string {
	name := "engine"
	if a.delegate {
		name = "delegated"
	}
	if a.direct {
		return name + ", direct"
	}
	return name + ", route"
}

// delegatedFirings reads the engine's count of delegated firings (in this
// process's registry: the local cluster's operator runs here).
func delegatedFirings() int {
	mfs, err := crmetrics.Registry.Gather()
	if err != nil {
		return -1
	}
	for _, mf := range mfs {
		if mf.GetName() == "ziptrail_engine_delegated_firings_total" && len(mf.GetMetric()) > 0 {
			return int(mf.GetMetric()[0].GetCounter().GetValue())
		}
	}
	return 0
}

// schedule is the arm of each block: off, on, on, off, off, on, ... so
// that neither arm always runs first after a deploy or last.
func schedule(arms []arm, rounds int) []arm {
	var out []arm
	for r := 0; r < rounds; r++ {
		a := slices.Clone(arms)
		if r%2 == 1 {
			slices.Reverse(a)
		}
		out = append(out, a...)
	}
	return out
}

// measure deploys wf, runs sessions of it with input in each arm, checks
// each result against want and prints one table row an arm; steps is the
// invocations per session, delegable how many of its firings a producer's
// sidecar can make (Immediate and ByName triggers on objects a function
// returns in its response; a function's plain return value goes to its
// dependency buckets through the engine).
func measure(ctx context.Context, c *localcluster.Cluster, cfg config, wf *v1alpha1.Workflow, label string, steps, delegable int, input, want string) ([]row, error) {
	remove, err := deploy(ctx, c, wf)
	if err != nil {
		return nil, err
	}
	defer remove()
	one := func() (time.Duration, int, error) {
		d0 := delegatedFirings()
		t := time.Now()
		out, err := session(c.GatewayURL, c.GatewayToken, wf.Name, input)
		lat := time.Since(t)
		if err != nil {
			return 0, 0, err
		}
		if out != want {
			return 0, 0, fmt.Errorf("%s returned %q, want %q", wf.Name, out, want)
		}
		return lat, delegatedFirings() - d0, nil
	}
	lat := map[arm][]time.Duration{}
	deleg := map[arm][]int{}
	var cycled []time.Duration // cycleFloor's, after the blocks
	blocks := schedule(cfg.arms, cfg.rounds)
	perArm := len(blocks) / len(cfg.arms)
	for b, on := range blocks {
		if err := c.SetDelegateTriggers(ctx, on.delegate, wf.Namespace); err != nil {
			return nil, err
		}
		c.SetDirectDispatch(on.direct)
		// Warm-up: for cfg.warmup (a restarted operator's first sessions
		// are slow: new connections, its controllers' first reconciles)
		// and until the pods' sidecars have their delegations (the
		// operator sends them once it has resolved the routes).
		warm := time.Now().Add(cfg.warmup)
		want := 0
		if on.delegate {
			want = delegable
		}
		for misses := 0; ; {
			_, d, err := one()
			if err != nil {
				return nil, err
			}
			if d == want {
				if time.Now().After(warm) {
					break
				}
				continue
			}
			if misses++; misses == 50 {
				return nil, fmt.Errorf("%s, %s firing: %d delegated firings in a warm-up session, want %d", wf.Name, armName(on), d, want)
			}
			time.Sleep(200 * time.Millisecond)
		}
		// This arm's share of the sessions: the blocks split them evenly.
		n := cfg.sessions / perArm
		if len(lat[on])+n > cfg.sessions || b >= len(blocks)-len(cfg.arms) {
			n = cfg.sessions - len(lat[on])
		}
		stop, err := startProfiles(cfg, fmt.Sprintf("%s-%s-%d", wf.Name, armName(on), b))
		if err != nil {
			return nil, err
		}
		before, first := snapshot(), len(lat[on])
		for s := 0; s < n; s++ {
			l, d, err := one()
			if err != nil {
				stop()
				return nil, err
			}
			lat[on], deleg[on] = append(lat[on], l), append(deleg[on], d)
		}
		stop()
		block := slices.Sorted(slices.Values(lat[on][first:]))
		if len(block) > 0 {
			printBreakdown(fmt.Sprintf("%s, %s, block %d", label, armName(on), b), len(block), steps, percentile(block, 0.5)/time.Duration(steps), before, snapshot())
		}
		if cfg.floor > 0 && len(wf.Spec.Functions) > 1 && len(wf.Spec.Triggers) == 0 && b == len(blocks)-1 {
			// The floor of this chain's own requests, after its last
			// block (its reports, kept for a release no session sends,
			// reach the operator 5 s later: not inside a block). Only
			// for chains of the echo function: a ring's functions take a
			// count and send objects on (its floors are the one-pod ones).
			ls, err := cycleFloor(ctx, c, wf, label, min(cfg.floor, 10*len(wf.Spec.Functions)))
			if err != nil {
				return nil, err
			}
			cycled = append(cycled, ls...)
		}
	}
	var rows []row
	if len(cycled) > 0 {
		r := latencyRow(fmt.Sprintf("straight to the pods of %s in turn: queue-proxy-zl, function", label), "none", 1, cycled)
		r.print("–")
		rows = append(rows, r)
	}
	for _, on := range cfg.arms {
		r := latencyRow(label, armName(on), steps, lat[on])
		r.DelegatedMin, r.DelegatedMax = slices.Min(deleg[on]), slices.Max(deleg[on])
		dl := fmt.Sprint(r.DelegatedMin)
		if r.DelegatedMax != r.DelegatedMin {
			dl += fmt.Sprintf("–%d", r.DelegatedMax)
		}
		r.print(dl)
		rows = append(rows, r)
	}
	return rows, nil
}

// latencyRow is the row of measurements ls (in the order run) of steps
// invocations each.
func latencyRow(label, firing string, steps int, ls []time.Duration) row {
	r := row{Chain: label, Steps: steps, Firing: firing, Sessions: len(ls)}
	for _, l := range ls {
		r.LatenciesMs = append(r.LatenciesMs, ms(l))
	}
	sorted := slices.Clone(ls)
	slices.Sort(sorted)
	p50, p95 := percentile(sorted, 0.50), percentile(sorted, 0.95)
	r.P50Ms, r.P95Ms, r.StepP50 = ms(p50), ms(p95), ms(p50/time.Duration(steps))
	return r
}

// print writes r as a line of the table, last its delegated-firings cell.
func (r row) print(delegated string) {
	d := func(v float64) time.Duration {
		return (time.Duration(math.Round(v*1000)) * time.Microsecond).Round(10 * time.Microsecond)
	}
	fmt.Printf("| %s | %s | %d | %s | %s | %s | %s |\n", r.Chain, r.Firing, r.Sessions, d(r.P50Ms), d(r.P95Ms), d(r.StepP50), delegated)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// startProfiles profiles one block's measured sessions into
// <profileDir>/<name>.pprof (this process: operator, engine, gateway) and,
// with -perf, <name>.perf.data (`perf record -a -g`: every process, the
// pods' queue-proxy-zl and Python servers, the ingress and activator). The
// returned function stops them.
func startProfiles(cfg config, name string) (func(), error) {
	if cfg.profileDir == "" {
		return func() {}, nil
	}
	f, err := os.Create(filepath.Join(cfg.profileDir, name+".pprof"))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	var perf *exec.Cmd
	if cfg.perf {
		perf = exec.Command("perf", "record", "-a", "-g", "-F", "499", "-q", "-o", filepath.Join(cfg.profileDir, name+".perf.data"))
		perf.Stderr = os.Stderr
		if err := perf.Start(); err != nil {
			pprof.StopCPUProfile()
			f.Close()
			return nil, err
		}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		if perf != nil {
			_ = perf.Process.Signal(syscall.SIGINT)
			_ = perf.Wait()
		}
	}, nil
}

// deploy creates wf and waits until it is Ready; the returned function
// deletes it.
func deploy(ctx context.Context, c *localcluster.Cluster, wf *v1alpha1.Workflow) (func(), error) {
	t := time.Now()
	if err := c.Client.Create(ctx, wf); err != nil {
		return nil, err
	}
	remove := func() { _ = c.Client.Delete(context.Background(), wf) }
	if err := waitReady(ctx, c.Client, wf, 10*time.Minute); err != nil {
		remove()
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "%s: %d functions ready in %s\n", wf.Name, len(wf.Spec.Functions), time.Since(t).Round(time.Millisecond))
	return remove, nil
}
