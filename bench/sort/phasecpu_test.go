package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
)

// TestPhasesCPU: the hybrid's rounds gather the map, merge and next-*
// windows against its two per-round phases (each round's startup but the
// first's left out), the final merge its final window; the idle use is
// taken out; a report read back from its JSON gives the same table.
func TestPhasesCPU(t *testing.T) {
	const gib = 1 << 30
	r := Run{System: "ziptrail", Method: string(model.Hybrid), Bytes: gib, Prediction: &model.Prediction{
		Config: model.Config{Method: model.Hybrid, DataBytes: gib, Compute: model.Compute{MapSecondsPerByte: 10e-9, ReduceSecondsPerByte: 2e-9}},
		Phases: []model.Phase{
			{Name: "round: partition", Count: 3, Seconds: 2, Startup: 0.5, PlatformCPU: 1},
			{Name: "round: combine", Count: 3, Seconds: 1, Startup: 0.5, PlatformCPU: 0.5},
			{Name: "merge", Count: 1, Seconds: 4, Startup: 0.5, PlatformCPU: 3},
		}},
		CPU: []WindowCPU{
			{Name: "sort", Seconds: 20, Cluster: 40},
			{Name: "map", Seconds: 2, Cluster: 4, ByCommand: map[string]float64{"python3": 3, "minio": 1}},
			{Name: "merge", Seconds: 1, Cluster: 2, ByCommand: map[string]float64{"python3": 1, "minio": 1}},
			{Name: "next-1", Seconds: 3, Cluster: 6, ByCommand: map[string]float64{"python3": 5}},
			{Name: "final", Seconds: 5, Cluster: 9, ByCommand: map[string]float64{"minio": 9}},
		}}
	ps := phasesCPU(r, 0.5)
	if len(ps) != 2 {
		t.Fatalf("%d phases, want 2", len(ps))
	}
	rounds, final := ps[0], ps[1]
	near := func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
	if rounds.name != "rounds" || !near(rounds.seconds, 6) || !near(rounds.cpu, 12-0.5*6) ||
		!near(rounds.predSeconds, (3*2-2*0.5)+(3*1-2*0.5)) || !near(rounds.platfm, 3*1+3*0.5) || !near(rounds.job, gib*12e-9) {
		t.Errorf("rounds: %+v", rounds)
	}
	if final.name != "final merge" || !near(final.seconds, 5) || !near(final.cpu, 9-2.5) || !near(final.predSeconds, 4) || !near(final.platfm, 3) || !near(final.job, gib*2e-9) {
		t.Errorf("final merge: %+v", final)
	}
	if got := strings.Join(rounds.top, ", "); got != "python3 9.0, minio 2.0" {
		t.Errorf("largest: %s", got)
	}

	rep := &Report{Setup: map[string]any{"idle": IdleMeasure{BackgroundCores: 0.5}}, Runs: []Run{r}}
	var direct, back bytes.Buffer
	printPhaseCPU(&direct, rep)
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var read Report
	if err := json.Unmarshal(b, &read); err != nil {
		t.Fatal(err)
	}
	printPhaseCPU(&back, &read)
	if direct.String() != back.String() || !strings.Contains(direct.String(), "| 1 GiB | hybrid | rounds | 6.0 s, 9.0 CPU-s |") {
		t.Errorf("table:\n%s\nread back:\n%s", direct.String(), back.String())
	}
}
