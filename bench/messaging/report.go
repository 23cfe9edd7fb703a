package main

import (
	"fmt"
	"io"
	"slices"
)

var sectionTitles = map[string]string{
	"fig7":       "Fig. 7: one message between two pods (one-way = half a ping-pong round trip)",
	"fig8":       "Fig. 8: 64 B messages back to back, until the last is received",
	"allreduce":  "allreduce of 1 MB of float64 (sum), until every member has the result",
	"membership": "membership change (a 4th member joins; 3 members Watch)",
	"floor":      "floors under a 64 B message (single calls, no receive on the timed path)",
	"death":      "death detection (SIGKILL of a member's queue-proxy-zl; 3 members blocked in Recv from it)",
}

var sectionOrder = []string{"fig7", "floor", "fig8", "allreduce", "membership", "death"}

// printTable writes one markdown table per section, ziptrail against
// every Redis variant measured for the same case.
func printTable(w io.Writer, results []Result) {
	for _, sec := range sectionOrder {
		var rows []Result
		var cases []string
		seen := map[string]bool{}
		for _, r := range results {
			if r.Section == sec {
				rows = append(rows, r)
				if !seen[r.Case] {
					seen[r.Case] = true
					cases = append(cases, r.Case)
				}
			}
		}
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s\n\n", sectionTitles[sec])
		switch sec {
		case "fig7":
			fmt.Fprintln(w, "| size | system | reps | one-way p50 | p99 | Redis p50 / this p50 |")
			fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|")
			for _, c := range cases {
				rd := find(rows, c, "Redis")
				for _, r := range rows {
					if r.Case == c {
						fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s |\n", c, r.System, r.Reps, dur(r.P50), dur(r.P99), ratio(rd.P50, r.P50))
					}
				}
			}
		case "fig8", "allreduce":
			fmt.Fprintf(w, "| case | system | reps | p50 | p99 | vs %s (p50) |\n", sysDirect)
			fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|")
			for _, c := range cases {
				z := find(rows, c, sysDirect)
				for _, r := range rows {
					if r.Case != c {
						continue
					}
					rel := "–"
					if r.System != sysDirect {
						rel = ratio(r.P50, z.P50) + " slower"
						if r.P50 < z.P50 {
							rel = ratio(z.P50, r.P50) + " faster"
						}
					}
					fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s |\n", c, r.System, r.Reps, dur(r.P50), dur(r.P99), rel)
				}
			}
		case "floor":
			fmt.Fprintln(w, "| system | call | reps | p50 | p99 |")
			fmt.Fprintln(w, "|---|---|---:|---:|---:|")
			for _, r := range rows {
				fmt.Fprintf(w, "| %s | %s | %d | %s | %s |\n", r.System, r.Case, r.Reps, dur(r.P50), dur(r.P99))
			}
		default:
			fmt.Fprintln(w, "| measurement | reps | p50 | p99 |")
			fmt.Fprintln(w, "|---|---:|---:|---:|")
			for _, r := range rows {
				fmt.Fprintf(w, "| %s | %d | %s | %s |\n", r.Case, r.Reps, dur(r.P50), dur(r.P99))
			}
		}
	}
}

func find(rows []Result, c, system string) Result {
	for _, r := range rows {
		if r.Case == c && r.System == system {
			return r
		}
	}
	return Result{}
}

func ratio(a, b float64) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// printCost writes the CPU each process spent per message.
func printCost(w io.Writer, rows []costRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\nCPU per message (%d × 64 B back to back, one run; /proc of each process, 10 ms ticks, and getrusage of the bench process)\n\n", rows[0].Messages)
	fmt.Fprintln(w, "| system | process | CPU per message | context switches per message | run |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|")
	for _, r := range rows {
		names := make([]string, 0, len(r.CPU))
		for n := range r.CPU {
			names = append(names, n)
		}
		slices.Sort(names)
		total := 0.0
		for _, n := range names {
			total += r.CPU[n]
			fmt.Fprintf(w, "| %s | %s | %.0f µs | %.1f | %s |\n", r.System, n, r.CPU[n], r.Switches[n], dur(r.Seconds))
		}
		fmt.Fprintf(w, "| %s | all | %.0f µs | | |\n", r.System, total)
	}
}
