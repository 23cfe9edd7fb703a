// Command dataplane measures object transfer side by side in one run, on
// this machine: raw loopback TCP (the ceiling), ziptrail's pull between a
// producer and a consumer sidecar (the producer's put an in-process store
// insert), ziptrail through the SDK's local API (put in one pod, get in
// another, as functions see it; 1-1 only), Redis SET+GET and S3 PUT+GET
// (a real redis-server and a real MinIO), for 1-1 transfers and for the
// scatter, gather and broadcast patterns. It prints one table and writes
// JSON and a PNG chart. The Redis column is cross-checked in the same run
// with redis-benchmark -c 1 (SET p50 + GET p50 per size, redisbench.go).
//
//	go run ./bench/dataplane [-reps 5] [-out docs/bench]
//
// While iterating on one cell, -sizes, -systems and -patterns narrow the
// run (e.g. the SDK path at 10 MB against the bare pull:
// -sizes 10000000 -systems 'ziptrail,ziptrail SDK' -patterns 1-1 -no-s3);
// a narrowed run prints its table but writes no JSON or chart.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Result is one measured cell.
type Result struct {
	Pattern string  `json:"pattern"` // 1-1, scatter, gather, broadcast
	Fan     int     `json:"fan"`
	Size    int     `json:"size"` // bytes per object
	System  string  `json:"system"`
	Seconds float64 `json:"seconds"` // median time of the whole pattern
	MBps    float64 `json:"mbps"`    // bytes moved / time
}

func main() {
	reps := flag.Int("reps", 5, "repetitions per cell (the median is reported)")
	out := flag.String("out", "docs/bench", "directory for dataplane.json and dataplane.png")
	skipS3 := flag.Bool("no-s3", false, "skip the S3 column (e.g. MinIO not installed)")
	sameNode := flag.Bool("samenode", false, "measure the same-node path (memfd over a unix socket) against the TCP pull, Redis and S3 instead (samenode.go)")
	sizesFlag := flag.String("sizes", "", "comma-separated object sizes in bytes to measure (default: every size)")
	systemsFlag := flag.String("systems", "", "comma-separated systems to measure, e.g. 'ziptrail,ziptrail SDK' (default: all)")
	patternsFlag := flag.String("patterns", "", "comma-separated patterns: 1-1, scatter, gather, broadcast (default: all)")
	flag.Parse()
	var err error
	if only.sizes, err = parseSizes(*sizesFlag); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	only.systems, only.patterns = set(*systemsFlag), set(*patternsFlag)
	runFn := run
	if *sameNode {
		runFn = runSameNode
	}
	if err := runFn(*reps, *out, !*skipS3); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(reps int, outDir string, withS3 bool) error {
	env, err := setup(withS3)
	if err != nil {
		return err
	}
	defer env.close()
	ctx := context.Background()
	var results []Result
	// measure times f, reps times; prepared measures what next returns,
	// made before each rep's timer starts (an SDK buffer already written).
	var prepared func(pattern string, fan, size int, system string, next func() (func() error, error)) error
	measure := func(pattern string, fan, size int, system string, f func() error) error {
		return prepared(pattern, fan, size, system, func() (func() error, error) { return f, nil })
	}
	prepared = func(pattern string, fan, size int, system string, next func() (func() error, error)) error {
		times := make([]float64, 0, reps)
		for i := 0; i < reps; i++ {
			f, err := next()
			if err != nil {
				return fmt.Errorf("%s %s fan %d size %d: %w", system, pattern, fan, size, err)
			}
			t := time.Now()
			if err := f(); err != nil {
				return fmt.Errorf("%s %s fan %d size %d: %w", system, pattern, fan, size, err)
			}
			times = append(times, time.Since(t).Seconds())
		}
		sort.Float64s(times)
		med := times[len(times)/2]
		moved := float64(size * max(fan, 1))
		results = append(results, Result{Pattern: pattern, Fan: fan, Size: size, System: system, Seconds: med, MBps: moved / med / 1e6})
		fmt.Fprintf(os.Stderr, ".")
		return nil
	}

	// 1-1: the systems take turns, one transfer each per round, so that
	// what drifts on a shared machine (load, frequency, another process)
	// falls on all of them alike, not on whichever ran last.
	sizes := []int{10_000, 1_000_000, 10_000_000, 100_000_000}
	for _, size := range sizes {
		if !only.size(size) || !only.pattern("1-1") {
			continue
		}
		data := payload(size)
		var systems []system
		for _, sys := range env.systems() {
			if only.system(sys.name) {
				systems = append(systems, sys)
			}
		}
		times := make([][]float64, len(systems))
		for i := 0; i < reps; i++ {
			for j, sys := range systems {
				f := func() error { return sys.oneToOne(ctx, data) }
				if sys.prepared != nil {
					var err error
					if f, err = sys.prepared(ctx, data); err != nil {
						return fmt.Errorf("%s 1-1 size %d: %w", sys.name, size, err)
					}
				}
				t := time.Now()
				if err := f(); err != nil {
					return fmt.Errorf("%s 1-1 size %d: %w", sys.name, size, err)
				}
				times[j] = append(times[j], time.Since(t).Seconds())
			}
		}
		for j, sys := range systems {
			sort.Float64s(times[j])
			med := times[j][len(times[j])/2]
			results = append(results, Result{Pattern: "1-1", Fan: 1, Size: size, System: sys.name, Seconds: med, MBps: float64(size) / med / 1e6})
		}
		fmt.Fprintf(os.Stderr, ".")
	}
	for _, pattern := range []string{"scatter", "gather", "broadcast"} {
		if !only.pattern(pattern) {
			continue
		}
		for _, fan := range []int{4, 16} {
			for _, size := range []int{10_000, 10_000_000} {
				if !only.size(size) {
					continue
				}
				data := payload(size)
				for _, sys := range env.systems() {
					if sys.pattern == nil || !only.system(sys.name) {
						continue // raw TCP and the SDK path: 1-1 only
					}
					f := sys.pattern(ctx, pattern, fan, data)
					if err := measure(pattern, fan, size, sys.name, f); err != nil {
						return err
					}
				}
			}
		}
	}
	fmt.Fprintln(os.Stderr)
	printTable(results, env.names())
	checks, err := redisCrossCheck(env.redis.Addr, results)
	if err != nil {
		return err
	}
	printCrossCheck(checks)
	if only.narrowed() {
		fmt.Println("\n(narrowed run: no JSON or chart written)")
		return nil
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	js, _ := json.MarshalIndent(map[string]any{"host": hostInfo(), "reps": reps, "results": results, "redis_benchmark": checks}, "", "  ")
	if err := os.WriteFile(filepath.Join(outDir, "dataplane.json"), js, 0o644); err != nil {
		return err
	}
	charted := slices.DeleteFunc(env.names(), func(n string) bool { return n == sdkFloor }) // a floor, not a system
	if err := writeChart(filepath.Join(outDir, "dataplane.png"), results, charted); err != nil {
		return err
	}
	fmt.Printf("\nwrote %s and %s\n", filepath.Join(outDir, "dataplane.json"), filepath.Join(outDir, "dataplane.png"))
	return nil
}

// only narrows a run to some sizes, systems and patterns (empty: all).
var only filter

type filter struct {
	sizes             map[int]bool
	systems, patterns map[string]bool
}

func (f filter) size(n int) bool       { return len(f.sizes) == 0 || f.sizes[n] }
func (f filter) system(s string) bool  { return len(f.systems) == 0 || f.systems[s] }
func (f filter) pattern(p string) bool { return len(f.patterns) == 0 || f.patterns[p] }
func (f filter) narrowed() bool        { return len(f.sizes)+len(f.systems)+len(f.patterns) > 0 }

func set(list string) map[string]bool {
	m := map[string]bool{}
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s != "" {
			m[s] = true
		}
	}
	return m
}

func parseSizes(list string) (map[int]bool, error) {
	m := map[int]bool{}
	for s := range set(list) {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-sizes: %q is not a size in bytes", s)
		}
		m[n] = true
	}
	return m, nil
}

func payload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31 + i>>8)
	}
	return b
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

func printTable(results []Result, systems []string) {
	type row struct {
		pattern string
		fan     int
		size    int
	}
	var rows []row
	cells := map[row]map[string]Result{}
	for _, r := range results {
		k := row{r.Pattern, r.Fan, r.Size}
		if cells[k] == nil {
			cells[k] = map[string]Result{}
			rows = append(rows, k)
		}
		cells[k][r.System] = r
	}
	fmt.Printf("| pattern | size |")
	for _, s := range systems {
		fmt.Printf(" %s |", s)
	}
	fmt.Printf(" ziptrail vs raw | vs Redis | vs S3 | SDK / SDK in place vs ziptrail | SDK vs its floor |\n|---|---|")
	fmt.Print(strings.Repeat("---|", len(systems)+5) + "\n")
	for _, k := range rows {
		name := k.pattern
		if k.fan > 1 {
			name = fmt.Sprintf("%s ×%d", k.pattern, k.fan)
		}
		fmt.Printf("| %s | %s |", name, human(k.size))
		for _, s := range systems {
			if r, ok := cells[k][s]; ok {
				fmt.Printf(" %s (%.0f MB/s) |", dur(r.Seconds), r.MBps)
			} else {
				fmt.Printf(" – |")
			}
		}
		zt := cells[k]["ziptrail"]
		ratio := func(other string, inverse bool) string {
			o, ok := cells[k][other]
			if !ok || zt.Seconds == 0 {
				return "–"
			}
			if inverse {
				return fmt.Sprintf("%.0f %%", 100*o.Seconds/zt.Seconds)
			}
			return fmt.Sprintf("%.1f×", o.Seconds/zt.Seconds)
		}
		var sdks []string
		for _, name := range []string{"ziptrail SDK", sdkInPlace} {
			if r, ok := cells[k][name]; ok && zt.Seconds > 0 {
				sdks = append(sdks, fmt.Sprintf("%.2f×", r.Seconds/zt.Seconds))
			} else {
				sdks = append(sdks, "–")
			}
		}
		sdk := strings.Join(sdks, " / ")
		floor := "–"
		if r, ok := cells[k]["ziptrail SDK"]; ok {
			if f, ok := cells[k][sdkFloor]; ok && f.Seconds > 0 {
				floor = fmt.Sprintf("%.2f×", r.Seconds/f.Seconds)
			}
		}
		fmt.Printf(" %s | %s | %s | %s | %s |\n", ratio("raw TCP", true), ratio("Redis", false), ratio("S3", false), sdk, floor)
	}
}

func dur(s float64) string {
	switch {
	case s < 1e-3:
		return fmt.Sprintf("%.0f µs", s*1e6)
	case s < 1:
		return fmt.Sprintf("%.1f ms", s*1e3)
	}
	return fmt.Sprintf("%.2f s", s)
}

func hostInfo() map[string]any {
	h, _ := os.Hostname()
	return map[string]any{"hostname": h, "time": time.Now().UTC().Format(time.RFC3339)}
}
