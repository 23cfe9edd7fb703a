// Command messaging measures direct messages between function instances
// (issue 16, after Pikachu §6) side by side in one run, on this machine:
// ziptrail's Send/Recv between real queue-proxy-zl processes ("pods")
// connected to the operator's directory (a real control server on a real
// API server), against Redis LPUSH/BRPOP through a real redis-server. The
// functions are goroutines of this process using the Go SDK on each pod's
// socket and shared-memory directory.
//
//   - Fig. 7: one message of 64 B … 64 MB between two pods, ping-pong:
//     round trip and one-way (half of it), p50/p99.
//   - Fig. 8: 1 … 10,000 messages of 64 B back to back, time until the
//     last is received (Redis also with pipelined LPUSHes, its best case).
//   - allreduce of 1 MB of float64 (sum) over 4 and 8 members, the Go
//     SDK's Allreduce against a gather-to-rank-0-and-push-back through Redis.
//   - membership change (a member joins: until every other member's Watch
//     sees it) and death detection (SIGKILL a member's sidecar: until the
//     others' blocked Recv from it returns PeerGone).
//
// ziptrail runs as three arms in the same run: "same node (direct)", eight
// pods sharing a node directory (as bench/dataplane -samenode), whose
// functions talk over direct channels (docs/messaging.md, "Same-node
// direct channels"); "across nodes (direct TCP)", eight pods without one,
// whose functions talk over TCP channels the sidecars open ("Direct
// channels across nodes"); and "across nodes (sidecars)", eight pods with
// those off (ZIPTRAIL_DIRECT_TCP=off), whose messages cross both
// sidecars. The membership, death, floor and CPU cells use the sidecar
// arm.
//
// It prints one table and writes JSON and an SVG chart.
//
//	go run ./bench/messaging [-scale 1] [-out docs/bench] [-only fig7,fig8,allreduce,membership,death]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ziptrail/ziptrail/internal/nodedir"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// Result is one measured cell.
type Result struct {
	Section string `json:"section"` // fig7, fig8, allreduce, membership, death
	Case    string `json:"case"`    // e.g. "64 KB", "1,000 msgs", "8 members"
	System  string `json:"system"`  // ziptrail, Redis, Redis (pipelined LPUSH)
	Size    int    `json:"size,omitempty"`
	Count   int    `json:"count,omitempty"` // messages or members
	Reps    int    `json:"reps"`
	// P50 and P99 (nearest rank) of the measured time in seconds: for
	// fig7 the one-way time (half a round trip), else the whole operation.
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	// RTTP50/RTTP99: fig7's round trips.
	RTTP50 float64 `json:"rtt_p50,omitempty"`
	RTTP99 float64 `json:"rtt_p99,omitempty"`
}

var (
	fig7Sizes = []int{64, 1_000, 64_000, 1_000_000, 16_000_000, 64_000_000}
	fig7Reps  = []int{2000, 2000, 500, 100, 20, 10}
	fig8Count = []int{1, 100, 1_000, 10_000}
	fig8Reps  = []int{200, 50, 10, 5}
)

var sidecarEnv []string

// The two ziptrail arms: pods on one node (direct channels between the
// functions), and pods whose pairs cross the sidecars (as across nodes).
const (
	sysDirect = "ziptrail same node (direct)"
	// sysDirectProcs: Fig. 7 only, its two ends in two processes.
	sysDirectProcs = "ziptrail same node (direct, 2 processes)"
	// sysDirectRecycled: the same, both ends joined WithRecycledBuffers.
	sysDirectRecycled = "ziptrail same node (direct, 2 processes, recycled buffers)"
	sysSidecars       = "ziptrail across nodes (sidecars)"
	// sysTCP: pods on different nodes whose functions talk over direct
	// TCP channels (docs/messaging.md, "Direct channels across nodes");
	// sysTCPProcs: Fig. 7 with its two ends in two processes.
	sysTCP         = "ziptrail across nodes (direct TCP)"
	sysTCPProcs    = "ziptrail across nodes (direct TCP, 2 processes)"
	sysTCPRecycled = "ziptrail across nodes (direct TCP, 2 processes, recycled buffers)"
)

const (
	allreduceBytes = 1_000_000 // 125,000 float64
	allreduceReps  = 10
	membershipReps = 30
	deathReps      = 12
)

func main() {
	if spec := os.Getenv(echoEnv); spec != "" {
		runEchoChild(spec)
	}
	scale := flag.Float64("scale", 1, "multiply every repetition count (at least 3 per cell)")
	out := flag.String("out", "docs/bench", "directory for messaging.json and messaging.svg")
	only := flag.String("only", "", "comma-separated sections to run (fig7,fig8,allreduce,membership,death); default all")
	sizesFlag := flag.String("sizes", "", "comma-separated Fig. 7 sizes in bytes (default 64,1000,64000,1000000,16000000,64000000)")
	sidecarProcs := flag.Int("sidecar-gomaxprocs", 0, "GOMAXPROCS of the sidecars (0: Go's default, the number of CPUs)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of this process (the functions' side: SDK and Redis clients)")
	flag.Parse()
	sections := map[string]bool{}
	for _, s := range strings.Split(*only, ",") {
		if s != "" {
			sections[s] = true
		}
	}
	want := func(s string) bool { return len(sections) == 0 || sections[s] }
	all := len(sections) == 0
	if *sizesFlag != "" {
		var sizes, rs []int
		for _, f := range strings.Split(*sizesFlag, ",") {
			n, err := strconv.Atoi(f)
			i := slices.Index(fig7Sizes, n)
			if err != nil || i < 0 {
				fmt.Fprintf(os.Stderr, "bench: -sizes: %q is not one of %v\n", f, fig7Sizes)
				os.Exit(2)
			}
			sizes, rs = append(sizes, n), append(rs, fig7Reps[i])
		}
		fig7Sizes, fig7Reps = sizes, rs
		all = false
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		_ = pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if *sidecarProcs > 0 {
		sidecarEnv = append(sidecarEnv, fmt.Sprintf("GOMAXPROCS=%d", *sidecarProcs))
		all = false // not the default configuration: docs/bench is not written
	}
	if err := run(*scale, *out, want, all); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// retried lists the cells that failed with a messaging error and ran again.
type retried struct {
	Cell  string `json:"cell"`
	Error string `json:"error"`
}

var retries = []retried{}

// attempt runs one cell with a time bound; a ziptrail messaging error
// (a member taken for gone or closed: the operator ended a healthy pod's
// control stream) is recorded, reset rejoins, and the cell runs again, at
// most twice more.
func attempt[T any](ctx context.Context, cell string, reset func(context.Context) error, f func(context.Context) (T, error)) (T, error) {
	for try := 0; ; try++ {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		v, err := f(cctx)
		cancel()
		retry := errors.Is(err, ziptrail.ErrPeerGone) || errors.Is(err, ziptrail.ErrClosed) || errors.Is(err, ziptrail.ErrTimeout)
		if err == nil || !retry || try == 2 {
			return v, err
		}
		fmt.Fprintf(os.Stderr, "  %s: %v (control-stream drops so far: %d); again\n", cell, err, streamDrops.Load())
		retries = append(retries, retried{cell, err.Error()})
		if reset != nil {
			if err := reset(ctx); err != nil {
				return v, err
			}
		}
	}
}

func reps(n int, scale float64) int { return max(3, int(float64(n)*scale)) }

func run(scale float64, outDir string, want func(string) bool, all bool) error {
	tb := &servers.ProcessTB{ExitOnFatal: true}
	defer tb.Close()
	start := time.Now()
	host := hostInfo()
	fmt.Fprintln(os.Stderr, "building queue-proxy-zl, starting the API server, the operator's control server and redis-server ...")
	bin, err := buildSidecar(tb)
	if err != nil {
		return err
	}
	op := servers.StartOperator(tb)
	rd := servers.StartRedis(tb)
	// The sidecar arm keeps its pairs on the sidecars' message streams;
	// the TCP arm's functions talk over direct TCP channels.
	ps := &pods{tb: tb, op: op, bin: bin, env: append(slices.Clone(sidecarEnv), "ZIPTRAIL_DIRECT_TCP=off")}
	tps := &pods{tb: tb, op: op, bin: bin, env: sidecarEnv, prefix: "tcp-"}
	nodeDir, err := os.MkdirTemp("", "zn") // socket paths are short
	if err != nil {
		return err
	}
	tb.Cleanup(func() { os.RemoveAll(nodeDir) })
	if err := nodedir.Prepare(nodeDir); err != nil {
		return err
	}
	dps := &pods{tb: tb, op: op, bin: bin, env: sidecarEnv, nodeDir: nodeDir, prefix: "same-node-"}
	// Eight pods per arm: one per member of the largest group; the
	// ping-pongs use the first two. The direct arm's pods share a node
	// directory (one node); the other arm's do not (every pair crosses
	// the sidecars, as between nodes).
	var pp, dp, tp []*pod
	for range 8 {
		p, err := ps.start()
		if err != nil {
			return err
		}
		pp = append(pp, p)
		if p, err = dps.start(); err != nil {
			return err
		}
		dp = append(dp, p)
		if p, err = tps.start(); err != nil {
			return err
		}
		tp = append(tp, p)
	}
	fmt.Fprintf(os.Stderr, "pods up (sidecar pids %d and %d carry the sidecar ping-pongs)\n", pp[0].pid(), pp[1].pid())
	zt := &ztBench{pods: pp, ps: ps}
	zd := &ztBench{pods: dp, ps: dps, tag: "direct-"}
	ztc := &ztBench{pods: tp, ps: tps, tag: "tcp-"}
	rb := newRedisBench(rd.Addr)
	defer rb.close()
	ctx := context.Background()
	var results []Result
	add := func(r Result) {
		results = append(results, r)
		fmt.Fprintf(os.Stderr, "  %-10s %-12s %-26s p50 %-9s p99 %s\n", r.Section, r.Case, r.System, dur(r.P50), dur(r.P99))
	}

	if want("fig7") {
		fmt.Fprintln(os.Stderr, "Fig. 7: one message between two pods (ping-pong)")
		if err := zt.setupPair(ctx); err != nil {
			return err
		}
		if err := zd.setupPair(ctx); err != nil {
			return err
		}
		if err := ztc.setupPair(ctx); err != nil {
			return err
		}
		for i, size := range fig7Sizes {
			n := reps(fig7Reps[i], scale)
			data := payload(size)
			for _, sys := range []struct {
				name  string
				f     func(context.Context, []byte, int) ([]float64, error)
				reset func(context.Context) error
			}{{sysDirect, zd.pingPong, zd.setupPair}, {sysDirectProcs, zd.pingPongProcs, nil}, {sysDirectRecycled, zd.pingPongProcsRecycled, nil},
				{sysTCP, ztc.pingPong, ztc.setupPair}, {sysTCPProcs, ztc.pingPongProcs, nil}, {sysTCPRecycled, ztc.pingPongProcsRecycled, nil},
				{sysSidecars, zt.pingPong, zt.setupPair}, {"Redis", rb.pingPong, nil}} {
				rtts, err := attempt(ctx, "fig7 "+sys.name+" "+human(size), sys.reset, func(ctx context.Context) ([]float64, error) { return sys.f(ctx, data, n) })
				if err != nil {
					return fmt.Errorf("fig7 %s %s: %w", sys.name, human(size), err)
				}
				r := Result{Section: "fig7", Case: human(size), System: sys.name, Size: size, Count: 1, Reps: n,
					RTTP50: pct(rtts, 50), RTTP99: pct(rtts, 99)}
				r.P50, r.P99 = r.RTTP50/2, r.RTTP99/2
				add(r)
			}
		}
	}
	if want("fig7") {
		fmt.Fprintln(os.Stderr, "the floors under a 64 B message")
		n := reps(2000, scale)
		for _, c := range []struct {
			name, system string
			f            func(context.Context, int) ([]float64, error)
		}{
			{"local API call (Members)", "ziptrail", zt.apiRoundTrip},
			{"Send 64 B (until queued at the receiver's sidecar)", "ziptrail", zt.sendOnly},
			{"PING", "Redis", rb.pingRoundTrip},
			{"LPUSH 64 B", "Redis", rb.lpushOnly},
		} {
			ts, err := attempt(ctx, "floor "+c.name, zt.setupPair, func(ctx context.Context) ([]float64, error) { return c.f(ctx, n) })
			if err != nil {
				return fmt.Errorf("floor %s: %w", c.name, err)
			}
			add(Result{Section: "floor", Case: c.name, System: c.system, Size: 64, Reps: n, P50: pct(ts, 50), P99: pct(ts, 99)})
		}
	}
	if want("fig8") {
		fmt.Fprintln(os.Stderr, "Fig. 8: 64 B messages back to back")
		if err := zt.setupPair(ctx); err != nil {
			return err
		}
		if err := zd.setupPair(ctx); err != nil {
			return err
		}
		if err := ztc.setupPair(ctx); err != nil {
			return err
		}
		for i, count := range fig8Count {
			n := reps(fig8Reps[i], scale)
			for _, sys := range []struct {
				name  string
				f     func(context.Context, int, int) ([]float64, error)
				reset func(context.Context) error
			}{{sysDirect, zd.stream, zd.setupPair}, {sysTCP, ztc.stream, ztc.setupPair}, {sysSidecars, zt.stream, zt.setupPair}, {sysSidecars + " (8 sending goroutines)", zt.streamConcurrent, zt.setupPair},
				{"Redis", rb.stream(false), nil}, {"Redis (pipelined LPUSH)", rb.stream(true), nil}} {
				if count == 1 && strings.HasSuffix(sys.name, "goroutines)") {
					continue // one message: one sender
				}
				ts, err := attempt(ctx, "fig8 "+sys.name+" "+msgs(count), sys.reset, func(ctx context.Context) ([]float64, error) { return sys.f(ctx, count, n) })
				if err != nil {
					return fmt.Errorf("fig8 %s %d: %w", sys.name, count, err)
				}
				add(Result{Section: "fig8", Case: msgs(count), System: sys.name, Size: 64, Count: count, Reps: n, P50: pct(ts, 50), P99: pct(ts, 99)})
			}
		}
	}
	var costs []costRow
	if want("fig8") {
		fmt.Fprintln(os.Stderr, "CPU per message: 10,000 × 64 B back to back, once per system")
		var err error
		if costs, err = attempt(ctx, "cost", zt.setupPair, func(ctx context.Context) ([]costRow, error) { return cost(ctx, zt, rb, rd.Addr, 10_000) }); err != nil {
			return fmt.Errorf("cost: %w", err)
		}
	}
	if want("allreduce") {
		fmt.Fprintln(os.Stderr, "allreduce of 1 MB of float64 (sum)")
		for _, members := range []int{4, 8} {
			n := reps(allreduceReps, scale)
			for _, sys := range []struct {
				name string
				f    func(context.Context, int, int) ([]float64, error)
			}{{sysDirect, zd.allreduce}, {sysTCP, ztc.allreduce}, {sysSidecars, zt.allreduce}, {"Redis", rb.allreduce}} {
				ts, err := attempt(ctx, fmt.Sprintf("allreduce %s %d", sys.name, members), nil, func(ctx context.Context) ([]float64, error) { return sys.f(ctx, members, n) })
				if err != nil {
					return fmt.Errorf("allreduce %s %d: %w", sys.name, members, err)
				}
				add(Result{Section: "allreduce", Case: fmt.Sprintf("%d members", members), System: sys.name, Size: allreduceBytes, Count: members,
					Reps: n, P50: pct(ts, 50), P99: pct(ts, 99)})
			}
		}
	}
	if want("membership") {
		fmt.Fprintln(os.Stderr, "membership change: a 4th member joins, 3 watch")
		n := reps(membershipReps, scale)
		type pair struct{ seen, joins []float64 }
		p, err := attempt(ctx, "membership", nil, func(ctx context.Context) (pair, error) {
			s, j, err := zt.membership(ctx, n)
			return pair{s, j}, err
		})
		ts, joins := p.seen, p.joins
		if err != nil {
			return fmt.Errorf("membership: %w", err)
		}
		add(Result{Section: "membership", Case: "join seen by all", System: "ziptrail", Count: 4, Reps: n, P50: pct(ts, 50), P99: pct(ts, 99)})
		add(Result{Section: "membership", Case: "Join call", System: "ziptrail", Count: 4, Reps: n, P50: pct(joins, 50), P99: pct(joins, 99)})
	}
	if want("death") {
		fmt.Fprintln(os.Stderr, "death detection: SIGKILL a member's sidecar, 3 blocked in Recv from it")
		n := reps(deathReps, scale)
		ts, err := attempt(ctx, "death", nil, func(ctx context.Context) ([]float64, error) { return zt.death(ctx, n) })
		if err != nil {
			return fmt.Errorf("death: %w", err)
		}
		add(Result{Section: "death", Case: "PeerGone at all", System: "ziptrail", Count: 4, Reps: n, P50: pct(ts, 50), P99: pct(ts, 99)})
	}
	zt.close()
	zd.close()

	fmt.Fprintln(os.Stderr)
	printTable(os.Stdout, results)
	printCost(os.Stdout, costs)
	fmt.Printf("\ncontrol streams of sidecars that ended and reconnected during the run: %d; cells run again after a messaging error: %d\n", streamDrops.Load(), len(retries))
	for _, r := range retries {
		fmt.Printf("  %s: %s\n", r.Cell, r.Error)
	}
	if !all {
		fmt.Println("\n(a subset of sections: docs/bench not written)")
		return nil
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	host["elapsed_seconds"] = time.Since(start).Seconds()
	js, _ := json.MarshalIndent(map[string]any{"host": host, "scale": scale, "results": results, "cpu_per_message": costs,
		"control_stream_drops": streamDrops.Load(), "retried_cells": retries}, "", "  ")
	if err := os.WriteFile(filepath.Join(outDir, "messaging.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(outDir, "messaging.svg"), chart(results), 0o644); err != nil {
		return err
	}
	fmt.Printf("\nwrote %s and %s (%.0f s)\n", filepath.Join(outDir, "messaging.json"), filepath.Join(outDir, "messaging.svg"), time.Since(start).Seconds())
	return nil
}

func payload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31 + i>>8)
	}
	return b
}

// touch reads one byte per page, as a function reading its message would
// fault it in (a mapped ziptrail message is not read by Recv itself).
func touch(b []byte) (s byte) {
	for i := 0; i < len(b); i += 4096 {
		s += b[i]
	}
	if len(b) > 0 {
		s += b[len(b)-1]
	}
	return s
}

// pct is the nearest-rank percentile.
func pct(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func human(n int) string {
	switch {
	case n >= 1_000_000:
		return fmt.Sprintf("%d MB", n/1_000_000)
	case n >= 1_000:
		return fmt.Sprintf("%d KB", n/1_000)
	}
	return fmt.Sprintf("%d B", n)
}

func msgs(n int) string {
	s := fmt.Sprint(n)
	if n >= 1000 {
		s = fmt.Sprintf("%d,%03d", n/1000, n%1000)
	}
	if n == 1 {
		return "1 msg"
	}
	return s + " msgs"
}

func dur(s float64) string {
	switch {
	case s < 1e-3:
		return fmt.Sprintf("%.0f µs", s*1e6)
	case s < 1:
		return fmt.Sprintf("%.2f ms", s*1e3)
	}
	return fmt.Sprintf("%.2f s", s)
}
