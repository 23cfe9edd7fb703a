package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
)

// phaseCPU is one predicted phase (or the hybrid's rounds together) set
// against the function windows that ran it: their time and CPU (the
// cluster's, less its idle use) against the model's time and CPU (the
// job's compute and the platform's transfers).
type phaseCPU struct {
	name                     string
	seconds, cpu             float64 // measured
	predSeconds, job, platfm float64 // predicted
	top                      []string
}

// phaseWindows maps a method's predicted phases to the function windows
// of examples/sort's workflow (cpuWindows): which windows ran them, and
// whether their compute is the map's or the reduce's.
func phaseWindows(method model.Method) []struct {
	name    string
	phases  []string // model phase names
	windows []string // function windows
} {
	type pw = struct {
		name    string
		phases  []string
		windows []string
	}
	if method == model.Hybrid {
		rounds := []string{"map", "merge"}
		for i := 1; i <= 6; i++ { // gen_workflow.py's next-<round> functions (at most MAX_ROUNDS)
			rounds = append(rounds, fmt.Sprintf("next-%d", i))
		}
		return []pw{{"rounds", []string{"round: partition", "round: combine"}, rounds}, {"final merge", []string{"merge"}, []string{"final"}}}
	}
	return []pw{{"map", []string{"map"}, []string{"map"}}, {"merge", []string{"reduce"}, []string{"merge"}}}
}

// phasesCPU compares a run's phases, measured and predicted; background
// is the cluster's idle use in cores.
func phasesCPU(r Run, background float64) []phaseCPU {
	if r.Prediction == nil || len(r.CPU) == 0 {
		return nil
	}
	c := r.Prediction.Config
	wins := map[string]WindowCPU{}
	for _, w := range r.CPU {
		wins[w.Name] = w
	}
	var out []phaseCPU
	for _, pw := range phaseWindows(c.Method) {
		p := phaseCPU{name: pw.name}
		by := map[string]float64{}
		for _, n := range pw.windows {
			if w, ok := wins[n]; ok {
				p.seconds += w.Seconds
				p.cpu += w.Cluster - background*w.Seconds
				for k, v := range w.ByCommand {
					by[k] += v
				}
			}
		}
		for _, ph := range r.Prediction.Phases {
			for _, n := range pw.phases {
				if ph.Name != n {
					continue
				}
				p.predSeconds += ph.Total()
				p.platfm += float64(ph.Count) * ph.PlatformCPU
				perByte := c.Compute.ReduceSecondsPerByte
				if strings.Contains(n, "map") || strings.Contains(n, "partition") {
					perByte = c.Compute.MapSecondsPerByte
				}
				// a per-round phase computes its round's share: all of it
				// over the rounds
				p.job += c.DataBytes * perByte
			}
		}
		p.top = largest(by, 5, "%.1f")
		out = append(out, p)
	}
	return out
}

// backgroundCores is the cluster's idle use the run measured (setup.idle),
// in a report just made or read back from its JSON; 0 if not measured.
func backgroundCores(rep *Report) float64 {
	switch v := rep.Setup["idle"].(type) {
	case IdleMeasure:
		return v.BackgroundCores
	case map[string]any:
		b, _ := json.Marshal(v)
		var m IdleMeasure
		if json.Unmarshal(b, &m) == nil {
			return m.BackgroundCores
		}
	}
	return 0
}

// printPhaseCPU sets each phase's measured CPU against the model's.
func printPhaseCPU(w io.Writer, rep *Report) {
	bg := backgroundCores(rep)
	header := false
	for _, r := range rep.Runs {
		for _, p := range phasesCPU(r, bg) {
			if !header {
				fmt.Fprintf(w, "\n| size | method | phase | measured | predicted | CPU measured / predicted | largest (CPU s) |\n|---|---|---|---:|---:|---:|---|\n")
				header = true
			}
			ratio := "–"
			if pred := p.job + p.platfm; pred > 0 {
				ratio = fmt.Sprintf("×%.2f", p.cpu/pred)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %.1f s, %.1f CPU-s | %.1f s, %.1f CPU-s (job %.1f + platform %.1f) | %s | %s |\n", human(r.Bytes), r.Method, p.name,
				p.seconds, p.cpu, p.predSeconds, p.job+p.platfm, p.job, p.platfm, ratio, strings.Join(p.top, ", "))
		}
	}
	if header {
		fmt.Fprintf(w, "\n(measured: the function windows' cluster CPU less its idle use, %.2f cores; predicted: the job's compute and the platform's CPU of the phase)\n", bg)
	}
}
