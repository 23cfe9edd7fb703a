package main

// Where a run's CPU went: every second while a sort runs, the CPU seconds
// of the cluster's processes by command (treeCPU: this process, which runs
// the control plane and the operator, and its descendants: API server,
// Knative, node agents, the functions' pods and sidecars, Redis, MinIO)
// and the machine's (/proc/stat: busy, steal, iowait). After the run, each
// function's window (as printPhases draws it) gets its share, interpolated
// between the samples, so a phase's measured time can be set against the
// CPU the model says it needs: a phase the model under-predicts shows
// which process used the CPU it did not count.

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// machineCPU is /proc/stat's first line in CPU seconds, all cores.
type machineCPU struct {
	Busy, IOWait, Steal, Idle float64
}

func readMachineCPU() machineCPU {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineCPU{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return machineCPU{}
	}
	v := func(i int) float64 { x, _ := strconv.ParseFloat(f[i], 64); return x / 100 }
	// user nice system idle iowait irq softirq steal
	return machineCPU{Busy: v(1) + v(2) + v(3) + v(6) + v(7), Idle: v(4), IOWait: v(5), Steal: v(8)}
}

type cpuSample struct {
	at      time.Time
	by      map[string]float64
	machine machineCPU
}

// cpuSampler samples every second until stop.
type cpuSampler struct {
	mu      sync.Mutex
	samples []cpuSample
	quit    chan struct{}
	done    chan struct{}
}

func sampleCPU(every time.Duration) *cpuSampler {
	s := &cpuSampler{quit: make(chan struct{}), done: make(chan struct{})}
	s.take()
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-s.quit:
				s.take()
				return
			case <-t.C:
				s.take()
			}
		}
	}()
	return s
}

func (s *cpuSampler) take() {
	by, _, err := treeCPU(os.Getpid())
	if err != nil {
		return
	}
	smp := cpuSample{at: time.Now(), by: by, machine: readMachineCPU()}
	s.mu.Lock()
	s.samples = append(s.samples, smp)
	s.mu.Unlock()
}

// stop ends the sampling (with a last sample) and returns the samples.
func (s *cpuSampler) stop() []cpuSample {
	close(s.quit)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples
}

// at interpolates the cumulative counters at t between the samples around
// it (clamped to the first and the last).
func at(samples []cpuSample, t time.Time) (map[string]float64, machineCPU) {
	i := sort.Search(len(samples), func(i int) bool { return !samples[i].at.Before(t) })
	switch {
	case i == 0:
		return samples[0].by, samples[0].machine
	case i == len(samples):
		return samples[i-1].by, samples[i-1].machine
	}
	a, b := samples[i-1], samples[i]
	w := float64(t.Sub(a.at)) / float64(b.at.Sub(a.at))
	lerp := func(x, y float64) float64 { return x + w*(y-x) }
	by := map[string]float64{}
	for k, y := range b.by {
		// a process that started between the samples counts from 0; one
		// that ended is missed (its CPU goes with it)
		by[k] = lerp(a.by[k], y)
	}
	m := machineCPU{Busy: lerp(a.machine.Busy, b.machine.Busy), IOWait: lerp(a.machine.IOWait, b.machine.IOWait),
		Steal: lerp(a.machine.Steal, b.machine.Steal), Idle: lerp(a.machine.Idle, b.machine.Idle)}
	return by, m
}

// WindowCPU is the CPU used while one function's window ran (from its
// first invocation to the next function's first; the last one to the end
// of the sort), or over the whole sort ("sort").
type WindowCPU struct {
	Name    string  `json:"name"`
	From    float64 `json:"from"` // seconds after the session started
	To      float64 `json:"to"`
	Seconds float64 `json:"seconds"`
	// Cluster: the cluster's processes' CPU seconds; ByCommand its split
	// (the commands above 1 % of it).
	Cluster   float64            `json:"clusterCPU"`
	ByCommand map[string]float64 `json:"byCommand"`
	// The machine's CPU seconds (every process, the kernel's threads too).
	MachineBusy float64 `json:"machineBusy"`
	Steal       float64 `json:"steal"`
	IOWait      float64 `json:"iowait"`
}

// cpuWindows splits the samples by the run's function windows; started is
// the session's start, sortSeconds the sort's end after it.
func cpuWindows(samples []cpuSample, started time.Time, fns []FunctionTimes, sortSeconds float64) []WindowCPU {
	if len(samples) < 2 || started.IsZero() {
		return nil
	}
	type win struct {
		name     string
		from, to float64
	}
	wins := []win{{"sort", 0, sortSeconds}}
	for i, f := range fns {
		end := sortSeconds
		if i+1 < len(fns) {
			end = fns[i+1].First
		}
		if end > f.First {
			wins = append(wins, win{f.Function, f.First, end})
		}
	}
	sec := func(s float64) time.Time { return started.Add(time.Duration(s * float64(time.Second))) }
	var out []WindowCPU
	for _, w := range wins {
		b0, m0 := at(samples, sec(w.from))
		b1, m1 := at(samples, sec(w.to))
		wc := WindowCPU{Name: w.name, From: w.from, To: w.to, Seconds: w.to - w.from, ByCommand: map[string]float64{},
			MachineBusy: m1.Busy - m0.Busy, Steal: m1.Steal - m0.Steal, IOWait: m1.IOWait - m0.IOWait}
		for k, v := range b1 {
			if d := v - b0[k]; d > 0 {
				wc.Cluster += d
				wc.ByCommand[k] = d
			}
		}
		for k, v := range wc.ByCommand {
			if v < 0.01*wc.Cluster {
				delete(wc.ByCommand, k)
			}
		}
		out = append(out, wc)
	}
	return out
}

// printWindows lists, for each run that recorded it, where the CPU went
// in each function window: the cluster's and the machine's cores, steal,
// and the five largest commands.
func printWindows(w io.Writer, rep *Report) {
	header := false
	for _, r := range rep.Runs {
		if len(r.CPU) == 0 {
			continue
		}
		if !header {
			fmt.Fprintln(w, "\n| size | method | window | seconds | cluster cores | machine busy cores | steal cores | largest (CPU s) |")
			fmt.Fprintln(w, "|---|---|---|---:|---:|---:|---:|---|")
			header = true
		}
		for _, c := range r.CPU {
			top := largest(c.ByCommand, 5, "%.1f")
			d := max(c.Seconds, 1e-9)
			fmt.Fprintf(w, "| %s | %s | %s %.0f–%.0f s | %.1f | %.2f | %.2f | %.2f | %s |\n", human(r.Bytes), r.Method, c.Name, c.From, c.To,
				c.Seconds, c.Cluster/d, c.MachineBusy/d, c.Steal/d, strings.Join(top, ", "))
		}
	}
}
