package main

// The model's errors and the table.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
)

// modelErrors is the model's mean absolute relative error over the ziptrail
// runs that completed, per size group and overall.
func modelErrors(runs []Run) map[string]Error {
	out := map[string]Error{}
	var all, allIO []float64
	for _, r := range runs {
		if r.System != "ziptrail" || r.SortSeconds <= 0 || r.Predicted <= 0 {
			continue
		}
		all = append(all, math.Abs(r.Predicted-r.SortSeconds)/r.SortSeconds)
		allIO = append(allIO, math.Abs(r.PredictedNoCPU-r.SortSeconds)/r.SortSeconds)
	}
	mean := func(v []float64) float64 {
		s := 0.0
		for _, x := range v {
			s += x
		}
		return 100 * s / float64(max(1, len(v)))
	}
	out["all"] = Error{Runs: len(all), WithCompute: mean(all), TransfersOnly: mean(allIO),
		Description: "mean of |predicted − measured| / measured over the ziptrail runs, in %; measured = session time − the collector's validation"}
	return out
}

func human(b int64) string {
	// a size of records (100 bytes each) just under whole GiB is that size
	if g := math.Round(float64(b) / GiB); g >= 1 && math.Abs(float64(b)-g*GiB) < 100 {
		return strconv.FormatFloat(g, 'f', -1, 64) + " GiB"
	}
	switch {
	case b >= GiB && b%(GiB/10) == 0 || b >= 10*GiB:
		return strconv.FormatFloat(float64(b)/GiB, 'f', -1, 64) + " GiB"
	case b >= GiB:
		return fmt.Sprintf("%.2f GiB", float64(b)/GiB)
	case b >= MiB:
		return fmt.Sprintf("%.0f MiB", float64(b)/MiB)
	default:
		return fmt.Sprintf("%d B", b)
	}
}

func fmtSec(s float64) string {
	if s <= 0 || math.IsNaN(s) {
		return "-"
	}
	return fmt.Sprintf("%.1fs", s)
}

func printTable(w io.Writer, rep *Report) {
	fmt.Fprintln(w, "| size | method | rounds | measured (sort + validation) | sort | predicted | error | transfers-only prediction | valid, same sha256 | load before → after |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rep.Runs {
		name := r.Method
		if r.System == "ray" {
			name = "**Ray** (peer)"
		}
		size := human(r.Bytes)
		switch {
		case r.Skipped != "":
			fmt.Fprintf(w, "| %s | %s | | skipped: %s | | %s | | %s | | |\n", size, name, r.Skipped, fmtSec(r.Predicted), fmtSec(r.PredictedNoCPU))
			continue
		case r.Failed != "":
			fmt.Fprintf(w, "| %s | %s | | FAILED: %.120s | | %s | | %s | | %s → %s |\n", size, name, r.Failed, fmtSec(r.Predicted), fmtSec(r.PredictedNoCPU), r.LoadBefore, r.LoadAfter)
			continue
		}
		rounds, pred, errs, io := "", "", "", ""
		if r.Rounds > 1 {
			rounds = strconv.Itoa(r.Rounds)
		}
		if r.System == "ziptrail" {
			pred, io = fmtSec(r.Predicted), fmtSec(r.PredictedNoCPU)
			if r.ErrorPct != nil {
				errs = fmt.Sprintf("%+.0f %%", *r.ErrorPct)
			}
		}
		same := "first"
		if r.SameOutput != nil {
			same = strconv.FormatBool(*r.SameOutput)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s (%s + %s) | %s | %s | %s | %s | %v, %s | %s → %s |\n", size, name, rounds, fmtSec(r.Seconds),
			fmtSec(r.SortSeconds), fmtSec(r.ValidateSeconds), fmtSec(r.SortSeconds), pred, errs, io, r.Valid, same, r.LoadBefore, r.LoadAfter)
	}
	if e, ok := rep.Error["all"]; ok {
		fmt.Fprintf(w, "\nmodel mean absolute error over %d runs: %.1f %% (transfer terms only: %.1f %%)\n", e.Runs, e.WithCompute, e.TransfersOnly)
	}
}

// repredict recomputes every run's prediction with cal's parameters (the
// runs' own configurations, as recorded in sort.json: sizes, task counts,
// fast-tier cap, round size, the sort's CPU cost), and with the platform's
// CPU per store from platform when it is not nil: the measured times stay
// what they were. A calibration without cores gets the run's machine's
// (as the bench did). The transfers-only prediction leaves out the job's
// and the platform's CPU (Locus's model).
//
// coresLeft, when not nil, gives a run's cores: those the machine had left
// for the sort while it ran (its cores minus what other work on the
// machine used then, measured; see coresLeftFrom). 0 or nil: the
// calibration's cores (else the machine's).
//
// With platform, the runs are predicted as what they are, Python jobs
// (Config.SDK "python": the Python SDK's costs where the calibration has
// them), with the control path's costs (per object announced, per task
// invoked) when it has them. background, when not nil, is the cluster's
// idle CPU (-measure-idle): Params.BackgroundCores.
func repredict(rep *Report, cal model.Calibration, platform *model.Calibration, coresLeft func(Run) float64, background *IdleMeasure) error {
	p := cal.Params
	if p.Cores == 0 {
		if c, ok := rep.Machine["cores"].(float64); ok {
			p.Cores = c
		}
	}
	if platform != nil {
		p = withPlatform(p, platform.Params)
	}
	if background != nil {
		p.BackgroundCores = background.BackgroundCores
	}
	io := withPlatform(p, model.Params{})
	mio, err := model.New(io, model.DefaultPrices())
	if err != nil {
		return err
	}
	for i := range rep.Runs {
		r := &rep.Runs[i]
		if r.System != "ziptrail" || r.Prediction == nil {
			continue
		}
		pr := p
		if coresLeft != nil {
			if c := coresLeft(*r); c > 0 {
				pr.Cores = c
			}
		}
		m, err := model.New(pr, model.DefaultPrices())
		if err != nil {
			return err
		}
		cfg := r.Prediction.Config
		if platform != nil {
			cfg.SDK = sortSDK
		}
		pred, err := m.Predict(cfg)
		if err != nil {
			return fmt.Errorf("%s via %s: %w", human(r.Bytes), r.Method, err)
		}
		cfg.Compute = model.Compute{}
		predIO, err := mio.Predict(cfg)
		if err != nil {
			return err
		}
		r.Predicted, r.PredictedNoCPU, r.Prediction = pred.Seconds, predIO.Seconds, &pred
		r.ErrorPct = nil
		if r.SortSeconds > 0 {
			e := 100 * (r.Predicted - r.SortSeconds) / r.SortSeconds
			r.ErrorPct = &e
		}
	}
	rep.Error = modelErrors(rep.Runs)
	return nil
}

// printCPU lists, per run, the CPU the prediction counts: the job's (the
// sort's, Config.Compute) and the platform's (stores and sidecars), in
// CPU-seconds over all phases.
func printCPU(w io.Writer, rep *Report) {
	fmt.Fprintln(w, "\n| size | method | job CPU (predicted) | platform CPU (predicted) | of it, control path | phases bound by compute |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, r := range rep.Runs {
		if r.System != "ziptrail" || r.Prediction == nil {
			continue
		}
		c := r.Prediction.Config
		var plat, ctl float64
		bound := 0
		for _, ph := range r.Prediction.Phases {
			plat += float64(ph.Count) * ph.PlatformCPU
			ctl += float64(ph.Count) * ph.ControlCPU
			if ph.BoundBy == model.ComputeTerm {
				bound++
			}
		}
		job := c.DataBytes * (c.Compute.MapSecondsPerByte + c.Compute.ReduceSecondsPerByte)
		if c.Method == model.Hybrid {
			job += c.DataBytes * c.Compute.ReduceSecondsPerByte // combine and merge
		}
		fmt.Fprintf(w, "| %s | %s | %.0f s | %.0f s | %.0f s | %d of %d |\n", human(r.Bytes), r.Method, job, plat, ctl, bound, len(r.Prediction.Phases))
	}
}

// coresLeftFrom reads bench/sort/cpushare.py's JSON (--json: per run the
// cores the sort's process tree got and the cores the rest of the machine
// used, both measured from /proc while it ran) and returns, per run, the
// machine's cores minus the others' use: the cores that were left for the
// sort. Runs are matched by size and method; a run not in the file gets
// 0 (the calibration's cores).
func coresLeftFrom(path string, machineCores float64) (func(Run) float64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f struct {
		Tree []struct {
			Size        string  `json:"size"`
			Method      string  `json:"method"`
			CoresOthers float64 `json:"coresOthers"`
		} `json:"tree"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(f.Tree) == 0 {
		return nil, fmt.Errorf("%s: no runs (\"tree\")", path)
	}
	if !(machineCores > 0) {
		return nil, errors.New("the run's machine has no cores recorded")
	}
	return func(r Run) float64 {
		for _, t := range f.Tree {
			size, err := model.ParseBytes(t.Size)
			if err != nil || t.Method != r.Method || math.Abs(size-float64(r.Bytes)) > 0.01*float64(r.Bytes) {
				continue
			}
			return max(machineCores-t.CoresOthers, 0.1)
		}
		return 0
	}, nil
}
