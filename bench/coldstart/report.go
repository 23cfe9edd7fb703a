package main

import (
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"time"
)

// Percentiles, host information and the markdown report.

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

// stats are nearest-rank percentiles of v.
func stats(v []float64) Stats {
	if len(v) == 0 {
		return Stats{}
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	at := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return Stats{N: len(s), P50: at(0.50), P95: at(0.95), Min: s[0], Max: s[len(s)-1]}
}

func hostInfo() map[string]any {
	h, _ := os.Hostname()
	load, _ := os.ReadFile("/proc/loadavg")
	return map[string]any{"hostname": h, "time": time.Now().UTC().Format(time.RFC3339), "loadavg": strings.TrimSpace(string(load))}
}

// markdown is the report's tables (stdout and coldstart.md).
func markdown(r report) string {
	var sb strings.Builder
	st := func(k string) Stats { return r.Summary[k].(Stats) }
	row := func(label, k string, unit func(float64) string) {
		s := st(k)
		fmt.Fprintf(&sb, "| %s | %d | %s | %s | %s | %s |\n", label, s.N, unit(s.P50), unit(s.P95), unit(s.Min), unit(s.Max))
	}
	msu := func(v float64) string {
		if v >= 1000 {
			return fmt.Sprintf("%.2f s", v/1e3)
		}
		return fmt.Sprintf("%.1f ms", v)
	}
	bytesu := func(v float64) string { return fmt.Sprintf("%.0f B", v) }
	fmt.Fprintf(&sb, "Run %s on %s (load average before it: %s). `hold` sends a %d-byte object by reference; `read` is invoked by the bucket's Immediate trigger and pulls it.\n\n",
		r.Host["time"], r.Host["hostname"], r.Host["loadavg"], blobSize)
	sb.WriteString("| measurement | rounds | p50 | p95 | min | max |\n|---|---|---|---|---|---|\n")
	row("cold: invocation → function start", "coldInvokeToStart", msu)
	row("cold: whole session", "coldSession", msu)
	row("cold: bytes read by reference", "coldBytes", bytesu)
	row("cold: invocation → read pod listed", "coldPodSeen", msu)
	row("cold: invocation → read pod Ready", "coldPodReady", msu)
	row("cold: session end → Knative scaled read to zero", "coldScaledToZero", msu)
	row("cold: session end → read's pod gone", "coldPodGone", msu)
	row("warm: invocation → function start", "warmInvokeToStart", msu)
	row("warm: whole session", "warmSession", msu)
	row("hold's send_object of the object, cold pairs", "coldSend", msu)
	row("hold's send_object of the object, warm pair", "warmSend", msu)
	mapped := 0
	for _, c := range r.Cold {
		if c.Mapped {
			mapped++
		}
	}
	fmt.Fprintf(&sb, "\nCold rounds where `read` got the object through shared memory (pulled into its sidecar): %d of %d; a read pod started in every cold round.\n\n", mapped, len(r.Cold))
	sb.WriteString("Autoscaler under load (min-scale 1, max-scale 4, container concurrency 1, 1 s per invocation, a session every ")
	fmt.Fprintf(&sb, "%v ms):\n\n", r.Config["loadIntervalMs"])
	sb.WriteString("| repetition | load start → 2nd Ready pod | → 3rd Ready pod | max Ready | sessions | load | last result → one pod |\n|---|---|---|---|---|---|---|\n")
	for i, s := range r.Scale {
		fmt.Fprintf(&sb, "| %d | %s | %s | %d | %d | %.1f s | %s |\n", i+1, msu(s.SecondReadyMs), msu(s.ThirdReadyMs), s.MaxReady, s.Sessions, s.LoadSeconds, msu(s.BackToOneMs))
	}
	return sb.String()
}
