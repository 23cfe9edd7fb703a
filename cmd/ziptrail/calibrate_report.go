package main

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
	"github.com/ziptrail/ziptrail/internal/tools/calibrate"
)

// What calibrate prints: every measurement, the parameters fitted to them
// and how far the fits are from the points.

// printCalibration prints the measurements as tables and the fitted
// parameters.
func printCalibration(w io.Writer, m *calibrate.Measurements, cal model.Calibration) {
	p := cal.Params
	fmt.Fprintf(w, "\ncalibration of %s %q at %s (load average %s)\n\n", cal.MeasuredOn.Kind, cal.MeasuredOn.Name, cal.Time.Format(time.RFC3339),
		cal.MeasuredOn.Details["loadAverage"])

	// bandwidth: a row per store, direction and size; a column per workers
	type row struct {
		store, op string
		size      float64
	}
	var rows []row
	cells := map[row]map[int]calibrate.BandwidthPoint{}
	var workers []int
	seenW := map[int]bool{}
	for _, pt := range m.Bandwidth {
		k := row{pt.Store, pt.Op, pt.Size}
		if cells[k] == nil {
			cells[k] = map[int]calibrate.BandwidthPoint{}
			rows = append(rows, k)
		}
		cells[k][pt.Workers] = pt
		if !seenW[pt.Workers] {
			seenW[pt.Workers] = true
			workers = append(workers, pt.Workers)
		}
	}
	sort.Ints(workers)
	fmt.Fprintln(w, "bandwidth per worker (all workers together), by workers at once:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprint(tw, "STORE\tOP\tOBJECT")
	for _, n := range workers {
		fmt.Fprintf(tw, "\t%d", n)
	}
	fmt.Fprintln(tw)
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s", r.store, r.op, calibrate.FormatSize(r.size))
		for _, n := range workers {
			if pt, ok := cells[r][n]; ok {
				fmt.Fprintf(tw, "\t%s (%s)", mbps(pt.Typical()), mbps(pt.Aggregate))
			} else {
				fmt.Fprint(tw, "\t-")
			}
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	fmt.Fprintln(w, "(MB/s)")

	fmt.Fprintln(w, "\nrequest rates (requests/s, the best of 1, 2, 4, … clients; Locus Table 1):")
	var sizes []float64
	seenS := map[float64]bool{}
	for _, r := range m.Rates {
		if !seenS[r.Size] {
			seenS[r.Size] = true
			sizes = append(sizes, r.Size)
		}
	}
	sort.Float64s(sizes)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprint(tw, "STORE\tOP")
	for _, s := range sizes {
		fmt.Fprintf(tw, "\t%s", calibrate.FormatSize(s))
	}
	fmt.Fprintln(tw)
	for _, store := range []string{calibrate.S3, calibrate.Redis} {
		for _, op := range []string{calibrate.Write, calibrate.Read} {
			fmt.Fprintf(tw, "%s\t%s", store, op)
			for _, s := range sizes {
				v := "-"
				for _, r := range m.Rates {
					if r.Store == store && r.Op == op && r.Size == s {
						v = fmt.Sprintf("%s (%d)", calibrate.FormatCount(r.PerSecond), r.Concurrency)
					}
				}
				fmt.Fprintf(tw, "\t%s", v)
			}
			fmt.Fprintln(tw)
		}
		fmt.Fprintf(tw, "%s\tmodel", store)
		curve := p.SlowRequests
		if store == calibrate.Redis {
			curve = p.FastRequests
		}
		for _, s := range sizes {
			fmt.Fprintf(tw, "\t%s", calibrate.FormatCount(curve.At(s)))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	fmt.Fprintln(w, "(clients of the best rate in parentheses; model: the fitted curve, reads and writes together)")
	for _, s := range m.Server {
		fmt.Fprintf(w, "\n%s server: %s with %d clients of %s objects, half writing, half reading\n", s.Store, calibrate.FormatRate(s.Aggregate), s.Clients, calibrate.FormatSize(s.Size))
	}

	fmt.Fprintln(w, "\nfitted parameters:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARAMETER\tVALUE")
	for _, b := range []struct {
		n string
		b model.Bandwidth
	}{{"slowRead", p.SlowRead}, {"slowWrite", p.SlowWrite}, {"fastRead", p.FastRead}, {"fastWrite", p.FastWrite}} {
		fmt.Fprintf(tw, "%s\tb(p) = %s; at 1/8/64 workers %s / %s / %s each\n", b.n, calibrate.DescribeBandwidth(b.b),
			mbps(b.b.At(1, model.GiB)), mbps(b.b.At(8, model.GiB)), mbps(b.b.At(64, model.GiB)))
	}
	capOrNone := func(v float64) string {
		if v == 0 {
			return "none (kept growing with workers)"
		}
		return calibrate.FormatRate(v)
	}
	fmt.Fprintf(tw, "slowServerBandwidth\t%s\n", capOrNone(p.SlowServerBandwidth))
	fmt.Fprintf(tw, "slowRequests\t%s\n", describeCurve(p.SlowRequests))
	fmt.Fprintf(tw, "fastServerBandwidth\t%s per shard × %d shard(s)\n", calibrate.FormatRate(p.FastServerBandwidth), p.FastShards)
	fmt.Fprintf(tw, "fastRequests\t%s per shard\n", describeCurve(p.FastRequests))
	fmt.Fprintf(tw, "podPullBandwidth\t%s\n", calibrate.FormatRate(p.PodPullBandwidth))
	fmt.Fprintf(tw, "podAggregateBandwidth\t%s\n", capOrNone(p.PodAggregateBandwidth))
	if n := len(p.Stragglers); n > 0 {
		fmt.Fprintf(tw, "stragglers\t%d samples, %.2f to %.2f, median %.2f\n", n, p.Stragglers[n-1], p.Stragglers[0], p.Stragglers[n/2])
	}
	for _, c := range []struct {
		n string
		c model.StoreCPU
	}{{"slowCPU", p.SlowCPU}, {"fastCPU", p.FastCPU}, {"podCPU", p.PodCPU}} {
		if c.c == (model.StoreCPU{}) {
			fmt.Fprintf(tw, "%s\tnot measured\n", c.n)
			continue
		}
		v := fmt.Sprintf("read %s + %s per request", calibrate.FormatCPUPerByte(c.c.Read.PerByte), calibrate.FormatCPUSeconds(c.c.Read.PerRequest))
		if c.c.Write != (model.CPUCost{}) {
			v = fmt.Sprintf("write %s + %s per request, %s", calibrate.FormatCPUPerByte(c.c.Write.PerByte), calibrate.FormatCPUSeconds(c.c.Write.PerRequest), v)
		}
		if c.c.Delete != (model.CPUCost{}) {
			v = fmt.Sprintf("%s, delete %s + %s per object", v, calibrate.FormatCPUPerByte(c.c.Delete.PerByte), calibrate.FormatCPUSeconds(c.c.Delete.PerRequest))
		}
		who := "server and bare client CPU"
		if _, ok := cal.MeasuredOn.Details["sidecarCPU"]; ok && strings.HasPrefix(cal.MeasuredOn.Details["sidecarCPU"], "measured") {
			who = "server, queue-proxy-zl and SDK CPU"
		}
		fmt.Fprintf(tw, "%s\t%s (%s)\n", c.n, v, who)
	}
	if c := p.ControlCPU; c != (model.ControlCPU{}) {
		fmt.Fprintf(tw, "controlCPU\t%s per object announced + %s per invocation (engine, sidecars, redis); %s per object kept per second, at most %.3g cores\n",
			calibrate.FormatCPUSeconds(c.PerObject), calibrate.FormatCPUSeconds(c.PerInvocation), calibrate.FormatCPUSeconds(c.PerObjectSecond), c.MaxCores)
	}
	for _, lang := range []string{"go", "python"} {
		c, ok := p.SDKCPU[lang]
		if !ok {
			continue
		}
		v := fmt.Sprintf("s3 write %s + %s, read %s + %s; redis write %s + %s, read %s + %s; pod put %s + %s, pull %s + %s",
			calibrate.FormatCPUPerByte(c.Slow.Write.PerByte), calibrate.FormatCPUSeconds(c.Slow.Write.PerRequest),
			calibrate.FormatCPUPerByte(c.Slow.Read.PerByte), calibrate.FormatCPUSeconds(c.Slow.Read.PerRequest),
			calibrate.FormatCPUPerByte(c.Fast.Write.PerByte), calibrate.FormatCPUSeconds(c.Fast.Write.PerRequest),
			calibrate.FormatCPUPerByte(c.Fast.Read.PerByte), calibrate.FormatCPUSeconds(c.Fast.Read.PerRequest),
			calibrate.FormatCPUPerByte(c.Pod.Write.PerByte), calibrate.FormatCPUSeconds(c.Pod.Write.PerRequest),
			calibrate.FormatCPUPerByte(c.Pod.Read.PerByte), calibrate.FormatCPUSeconds(c.Pod.Read.PerRequest))
		if c.Send != (model.CPUCost{}) || c.PerInvocation > 0 {
			v += fmt.Sprintf("; %s per object sent, %s per invocation", calibrate.FormatCPUSeconds(c.Send.PerRequest), calibrate.FormatCPUSeconds(c.PerInvocation))
		}
		fmt.Fprintf(tw, "sdkCPU[%s]\t%s (its own process)\n", lang, v)
	}
	if p.Cores > 0 {
		fmt.Fprintf(tw, "cores\t%g (this machine's: the workers and the stores share them)\n", p.Cores)
	}
	fmt.Fprintf(tw, "podStoreFraction\t%.2f (configuration)\n", p.PodStoreFraction)
	fmt.Fprintf(tw, "workerStartup\t%s (configuration)\n", model.FormatSeconds(p.WorkerStartup))
	fmt.Fprintf(tw, "taskMemoryFraction, speculateAfter\t%.2f, %.2f (shuffle library defaults)\n", p.TaskMemoryFraction, p.SpeculateAfter)
	tw.Flush()
	fmt.Fprintln(w)
}

func mbps(v float64) string {
	if v >= 100e6 {
		return strconv.FormatFloat(v/1e6, 'f', 0, 64)
	}
	return strconv.FormatFloat(v/1e6, 'f', 1, 64)
}

func describeCurve(c model.RateCurve) string {
	var parts []string
	for _, pt := range c.Points {
		parts = append(parts, fmt.Sprintf("%s %s/s", calibrate.FormatSize(pt.Size), calibrate.FormatCount(pt.PerSecond)))
	}
	return strings.Join(parts, ", ")
}
