package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
)

func explain(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := runExplain(args, &out, &errOut)
	return out.String(), err
}

func TestExplainTable(t *testing.T) {
	out, err := explain(t, "--size", "4GiB", "--fast-capacity", "1GiB", "--pod-memory", "1GiB", "--worker-memory", "3GiB", "--budget", "0.05")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{
		"shuffle of 4 GiB; fast tier 1 GiB; pod memory 1 GiB; workers of 128 MiB to 3 GiB, at most 1024 at once",
		"parameters: UNCALIBRATED built-in defaults",
		"(the fastest plan within the budget of $0.05)",
		"redis: 4 GiB does not fit in 1 GiB of fast tier",
		"podmemory: 4 GiB does not fit in 1 GiB of pod memory",
		"phases of each method's best plan:",
		"costs of each method's best plan:",
		"merge",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// the chosen method is starred in the table, and is the one named
	var chosen string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "chosen: ") {
			chosen = strings.SplitN(strings.TrimPrefix(line, "chosen: "), ":", 2)[0]
		}
	}
	if chosen == "" || !strings.Contains(out, "\n"+chosen+" *") {
		t.Errorf("chosen %q not starred:\n%s", chosen, out)
	}
}

func TestExplainJSON(t *testing.T) {
	out, err := explain(t, "--size", "4GiB", "--fast-capacity", "8GiB", "--deadline", "1m", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Calibrated bool `json:"calibrated"`
		Result     struct {
			Chosen *struct {
				Config struct {
					Method string `json:"method"`
				} `json:"config"`
				Seconds float64 `json:"seconds"`
				Phases  []struct {
					Name    string `json:"name"`
					BoundBy string `json:"boundBy"`
				} `json:"phases"`
			} `json:"chosen"`
			Options []struct {
				Method string `json:"method"`
			} `json:"options"`
			Input struct {
				Objective string  `json:"objective"`
				Deadline  float64 `json:"deadline"`
			} `json:"input"`
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	r := doc.Result
	if doc.Calibrated || r.Chosen == nil || r.Chosen.Seconds > 60 || len(r.Chosen.Phases) < 2 || r.Chosen.Phases[0].BoundBy == "" ||
		len(r.Options) != 4 || r.Input.Objective != "cheapest" || r.Input.Deadline != 60 {
		t.Errorf("json: %+v", doc)
	}
}

func TestExplainCalibrationFile(t *testing.T) {
	c := model.DefaultCalibration()
	c.Time = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	c.MeasuredOn = model.MeasuredOn{Kind: "machine", Name: "devbox"}
	c.Params.SlowRequests = model.Flat(50) // a slow local S3
	path := filepath.Join(t.TempDir(), "calibration.json")
	if err := c.Save(path); err != nil {
		t.Fatal(err)
	}
	out, err := explain(t, "--size", "4GiB", "--fast-capacity", "1GiB", "--calibration", path, "--methods", "s3,hybrid")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `parameters: calibrated on machine "devbox" at 2026-03-01T12:00:00Z`) || strings.Contains(out, "UNCALIBRATED") {
		t.Errorf("calibration not reported:\n%s", out)
	}
	if strings.Contains(out, "\nredis") || strings.Contains(out, "\npodmemory") {
		t.Errorf("--methods s3,hybrid printed others:\n%s", out)
	}
	if err := os.WriteFile(path, []byte(`{"version": 1, "params": {}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := explain(t, "--size", "4GiB", "--calibration", path); err == nil || !strings.Contains(err.Error(), "calibration params") {
		t.Errorf("invalid calibration: %v", err)
	}
}

func TestExplainErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--size is required"},
		{[]string{"--size", "4 parsecs"}, "--size"},
		{[]string{"--size", "4GiB", "--budget", "1", "--deadline", "1m"}, "not both"},
		{[]string{"--size", "4GiB", "--budget", "free"}, "--budget"},
		{[]string{"--size", "4GiB", "--deadline", "soon"}, "--deadline"},
		{[]string{"--size", "4GiB", "--budget", "1", "--objective", "cheapest"}, "contradicts"},
		{[]string{"--size", "4GiB", "--methods", "s3,tape"}, "unknown method"},
		{[]string{"--size", "4GiB", "-o", "yaml"}, "want table or json"},
	} {
		if _, err := explain(t, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
	// nothing within the budget: the table is printed, then the error
	out, err := explain(t, "--size", "4GiB", "--budget", "0.0001")
	if err == nil || !strings.Contains(err.Error(), "no plan within the budget of $0.0001") || !strings.Contains(out, "chosen: none") {
		t.Errorf("%v\n%s", err, out)
	}
}
