package main

import (
	"fmt"
	"slices"
	"strings"
)

// column is one reading per run, reported as the median over the runs.
type column struct {
	name   string
	get    func(runResult) int64
	target bool // part of the ≤ 4 MiB verdict
}

func columns(n int) []column {
	return []column{
		{"idle RSS", func(r runResult) int64 { return r.Idle.RSS }, true},
		{"idle PSS", func(r runResult) int64 { return r.Idle.PSS }, false},
		{"idle RSS anon", func(r runResult) int64 { return r.Idle.RSSAnon }, false},
		{"idle RSS file", func(r runResult) int64 { return r.Idle.RSSFile }, false},
		{fmt.Sprintf("RSS after %d req", n), func(r runResult) int64 { return r.AfterN.RSS }, true},
		{fmt.Sprintf("PSS after %d req", n), func(r runResult) int64 { return r.AfterN.PSS }, false},
		{fmt.Sprintf("RSS after %d req", 2*n), func(r runResult) int64 { return r.After2.RSS }, false},
		{"peak RSS", func(r runResult) int64 { return r.After2.HWM }, false},
	}
}

// printReport prints the conditions, a markdown table of medians and the
// overhead of queue-proxy-zl (bins[1]) over stock (bins[0]).
func printReport(cfg config, bins []*binary) {
	fmt.Printf("Sidecar memory: queue-proxy-zl vs stock queue-proxy (knative.dev/serving %s), %s, median of %d reps\n",
		cfg.Knative, cfg.Go, cfg.Reps)
	if cfg.ZLBinary != "" {
		fmt.Printf("queue-proxy-zl: prebuilt %s\n", cfg.ZLBinary)
	}
	fmt.Printf("GOGC=%s GOMEMLIMIT=%s; load: %d plain GETs per batch, %d keep-alive clients; %s idle before each reading\n\n",
		cfg.GOGC, cfg.GOMEMLIMIT, cfg.Requests, cfg.Concurrency, cfg.Settle)
	cols := columns(cfg.Requests)
	fmt.Print("| binary | file size |")
	for _, c := range cols {
		fmt.Printf(" %s |", c.name)
	}
	fmt.Print("\n|---|---:|")
	for range cols {
		fmt.Print("---:|")
	}
	fmt.Println()
	for _, b := range bins {
		fmt.Printf("| %s | %s |", b.Name, mib(b.Size))
		for _, c := range cols {
			fmt.Printf(" %s |", mib(median(b.Runs, c.get)))
		}
		fmt.Println()
	}
	fmt.Println()
	printOverhead(cols, bins[0], bins[1])
}

// printOverhead prints zl − stock per column (medians); the target holds
// if the RSS overhead is within it both idle and after load.
func printOverhead(cols []column, stock, zl *binary) {
	fmt.Print("Overhead (zl − stock):")
	within := true
	var targets []string
	for i, c := range cols {
		z, s := median(zl.Runs, c.get), median(stock.Runs, c.get)
		if z < 0 || s < 0 {
			continue // not available on this kernel
		}
		d := z - s
		if i > 0 {
			fmt.Print(",")
		}
		fmt.Printf(" %s %+.2f MiB", c.name, float64(d)/(1<<20))
		if c.target {
			within = within && d <= target
			targets = append(targets, c.name)
		}
	}
	fmt.Printf("; file size %+.2f MiB\n", float64(zl.Size-stock.Size)/(1<<20))
	verdict := "NO"
	if within {
		verdict = "yes"
	}
	fmt.Printf("Target overhead ≤ 4 MiB (%s): %s\n", strings.Join(targets, " and "), verdict)
}

// median of one reading over the runs; -1 (unavailable) stays -1.
func median(runs []runResult, get func(runResult) int64) int64 {
	if len(runs) == 0 {
		return -1
	}
	vs := make([]int64, 0, len(runs))
	for _, r := range runs {
		vs = append(vs, get(r))
	}
	slices.Sort(vs)
	if len(vs)%2 == 1 {
		return vs[len(vs)/2]
	}
	return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
}

func mib(b int64) string {
	if b < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20))
}
