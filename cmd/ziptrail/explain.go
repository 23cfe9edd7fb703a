package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
	"github.com/ziptrail/ziptrail/internal/shuffle/plan"
)

// runExplain implements `ziptrail explain`: it plans a shuffle with the
// Locus model and prints the chosen plan and every method's best.
func runExplain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	size := fs.String("size", "", "bytes to shuffle, e.g. 4GiB (required)")
	fastCap := fs.String("fast-capacity", "0", "fast tier (Redis) memory available to the shuffle, e.g. 1GiB (0: none)")
	podMem := fs.String("pod-memory", "0", "memory the producer pods' object stores may hold together (0: only each pod's own memory limits it)")
	workerMem := fs.String("worker-memory", "3GiB", "largest worker memory to consider")
	minWorkerMem := fs.String("min-worker-memory", "128MiB", "smallest worker memory to consider")
	maxP := fs.Int("max-parallelism", plan.DefaultMaxParallelism, "most workers running at once")
	budget := fs.String("budget", "", "objective: the fastest plan costing at most this many dollars, e.g. 0.05")
	deadline := fs.String("deadline", "", "objective: the cheapest plan taking at most this long, e.g. 90s or 2m")
	objective := fs.String("objective", "", "fastest or cheapest, without a budget or deadline (default fastest)")
	methods := fs.String("methods", "", "comma-separated methods to consider (default all: s3,redis,podmemory,hybrid)")
	calib := fs.String("calibration", "", "calibration file written by `ziptrail calibrate` (default: built-in, uncalibrated defaults)")
	pricesFile := fs.String("prices", "", "JSON file of prices overriding the defaults (fields of model.Prices)")
	out := fs.String("o", "table", "output: table or json")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *size == "" {
		return errors.New("--size is required (e.g. --size 4GiB)")
	}
	if *out != "table" && *out != "json" {
		return fmt.Errorf("-o %q: want table or json", *out)
	}
	in := plan.Input{MaxParallelism: *maxP}
	for _, f := range []struct {
		name, val string
		dst       *float64
	}{{"size", *size, &in.DataBytes}, {"fast-capacity", *fastCap, &in.FastCapacity}, {"pod-memory", *podMem, &in.PodMemory},
		{"worker-memory", *workerMem, &in.MaxWorkerMemory}, {"min-worker-memory", *minWorkerMem, &in.MinWorkerMemory}} {
		v, err := model.ParseBytes(f.val)
		if err != nil {
			return fmt.Errorf("--%s: %w", f.name, err)
		}
		*f.dst = v
	}
	switch {
	case *budget != "" && *deadline != "":
		return errors.New("give --budget (fastest within it) or --deadline (cheapest within it), not both")
	case *budget != "":
		v, err := strconv.ParseFloat(strings.TrimPrefix(strings.TrimSpace(*budget), "$"), 64)
		if err != nil || !(v > 0) {
			return fmt.Errorf("--budget %q: want a positive number of dollars", *budget)
		}
		in.Objective, in.Budget = plan.Fastest, v
	case *deadline != "":
		d, err := time.ParseDuration(*deadline)
		if err != nil {
			s, ferr := strconv.ParseFloat(*deadline, 64)
			if ferr != nil {
				return fmt.Errorf("--deadline %q: want a duration such as 90s or 2m", *deadline)
			}
			d = time.Duration(s * float64(time.Second))
		}
		if d <= 0 {
			return fmt.Errorf("--deadline %q: must be positive", *deadline)
		}
		in.Objective, in.Deadline = plan.Cheapest, d.Seconds()
	}
	if *objective != "" {
		o := plan.Objective(*objective)
		if o != plan.Fastest && o != plan.Cheapest {
			return fmt.Errorf("--objective %q: want fastest or cheapest", *objective)
		}
		if in.Objective != "" && in.Objective != o {
			return fmt.Errorf("--objective %s contradicts --budget/--deadline (a budget goes with fastest, a deadline with cheapest)", o)
		}
		in.Objective = o
	}
	if *methods != "" {
		ms, err := plan.ParseMethods(*methods)
		if err != nil {
			return fmt.Errorf("--methods: %w", err)
		}
		in.Methods = ms
	}

	cal := model.DefaultCalibration()
	if *calib != "" {
		var err error
		if cal, err = model.Load(*calib); err != nil {
			return err
		}
	}
	prices := model.DefaultPrices()
	if *pricesFile != "" {
		data, err := os.ReadFile(*pricesFile)
		if err != nil {
			return err
		}
		if prices, err = plan.PricesWith(prices, data); err != nil {
			return fmt.Errorf("%s: %w", *pricesFile, err)
		}
	}
	ex, err := plan.Explain(cal, prices, in)
	if err != nil {
		return err
	}
	res := ex.Result
	if *out == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(ex); err != nil {
			return err
		}
	} else {
		printExplain(stdout, cal, res)
	}
	if res.Chosen == nil {
		return errors.New(res.Reason)
	}
	return nil
}

// printExplain prints a plan as text: the inputs, the parameters' origin,
// the chosen plan, a table of every method's best and each one's phases.
func printExplain(w io.Writer, cal model.Calibration, res plan.Result) {
	in := res.Input
	fast := "none"
	if in.FastCapacity > 0 {
		fast = model.FormatBytes(in.FastCapacity)
	}
	pods := "each pod's own"
	if in.PodMemory > 0 {
		pods = model.FormatBytes(in.PodMemory)
	}
	fmt.Fprintf(w, "shuffle of %s; fast tier %s; pod memory %s; workers of %s to %s, at most %d at once\n",
		model.FormatBytes(in.DataBytes), fast, pods, model.FormatBytes(in.MinWorkerMemory), model.FormatBytes(in.MaxWorkerMemory), in.MaxParallelism)
	if cal.Calibrated() {
		fmt.Fprintf(w, "parameters: calibrated on %s %q at %s\n", cal.MeasuredOn.Kind, cal.MeasuredOn.Name, cal.Time.Format(time.RFC3339))
	} else {
		fmt.Fprintf(w, "parameters: UNCALIBRATED built-in defaults (Locus's AWS measurements; pod-memory numbers assumed), not this installation's: predictions are illustrative only\n")
	}
	fmt.Fprintln(w)
	if c := res.Chosen; c != nil {
		fmt.Fprintf(w, "chosen: %s: %s, %s (%s)\n\n", c.Config.Method, describe(*c), predicted(*c), res.Reason)
	} else {
		fmt.Fprintf(w, "chosen: none (%s)\n\n", res.Reason)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "METHOD\tWORKERS\tMEMORY\tROUNDS\tTIME\tCOST\tBOUND BY\tNOTE")
	for _, o := range res.Options {
		name := string(o.Method)
		if res.Chosen != nil && o.Best == res.Chosen {
			name += " *"
		}
		if o.Best == nil {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t%s\n", name, o.Reason)
			continue
		}
		b := o.Best
		rounds := "-"
		if b.Rounds > 0 {
			rounds = fmt.Sprintf("%d × %s", b.Rounds, model.FormatBytes(b.RoundBytes))
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", name, b.Config.Parallelism, model.FormatBytes(b.Config.WorkerMemory),
			rounds, model.FormatSeconds(b.Seconds), model.FormatDollars(b.Cost), slowest(*b), o.Reason)
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "phases of each method's best plan:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "METHOD\tPHASE\tRUNS\tTASKS\tTIME\tBOUND BY\tSTRAGGLERS\tNEXT LIMIT")
	for _, o := range res.Options {
		if o.Best == nil {
			continue
		}
		for _, ph := range o.Best.Phases {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t+%s\t%s\n", o.Method, ph.Name, ph.Count, ph.Tasks, model.FormatSeconds(ph.Seconds),
				ph.BoundBy, model.FormatSeconds(ph.StragglerSeconds), nextLimit(ph))
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "costs of each method's best plan:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "METHOD\tWORKERS\tS3 REQUESTS\tS3 STORAGE\tFAST TIER\tTOTAL\tS3 GETS\tS3 PUTS\tFAST OPS")
	for _, o := range res.Options {
		if o.Best == nil {
			continue
		}
		b := o.Best
		c := b.Costs
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.0f\t%.0f\t%.0f\n", o.Method, model.FormatDollars(c.Workers), model.FormatDollars(c.SlowRequests),
			model.FormatDollars(c.SlowStorage), model.FormatDollars(c.Fast), model.FormatDollars(b.Cost), b.SlowGets, b.SlowPuts, b.FastOps)
	}
	tw.Flush()
}

func describe(p model.Prediction) string {
	s := fmt.Sprintf("%d workers of %s, %d tasks per stage", p.Config.Parallelism, model.FormatBytes(p.Config.WorkerMemory), p.Tasks)
	if p.Rounds > 0 {
		s += fmt.Sprintf(", %d rounds of %s", p.Rounds, model.FormatBytes(p.RoundBytes))
	}
	return s
}

func predicted(p model.Prediction) string {
	return fmt.Sprintf("predicted %s, %s", model.FormatSeconds(p.Seconds), model.FormatDollars(p.Cost))
}

// slowest is what bounds the phase that takes the longest in all.
func slowest(p model.Prediction) string {
	var best model.Phase
	var t float64
	for _, ph := range p.Phases {
		if v := ph.Total(); v > t {
			t, best = v, ph
		}
	}
	return best.Name + ": " + best.BoundBy
}

// nextLimit is the second largest term of a phase: how much headroom the
// bound has.
func nextLimit(ph model.Phase) string {
	var name string
	var t float64
	for _, term := range ph.Terms {
		if term.Name != ph.BoundBy && term.Seconds > t {
			name, t = term.Name, term.Seconds
		}
	}
	if name == "" {
		return "-"
	}
	return name + " " + model.FormatSeconds(t)
}
