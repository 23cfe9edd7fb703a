package main

// The peer (Ray) and the sort's own CPU measurement.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

func measureCompute(python, root string, taskBytes int64, copies int) (ComputeMeasure, error) {
	// copies processes at once, as the sort's workers run (one task per
	// pod, every pod's process on the same cores): each one's CPU time
	// per byte includes what sharing the cores with the others costs it
	// (caches and TLBs refilled after every switch). The median over
	// the copies is the cost.
	type result struct {
		cm  ComputeMeasure
		err error
	}
	results := make(chan result, copies)
	for i := range copies {
		go func() {
			cmd := exec.Command(python, filepath.Join(root, "bench", "sort", "cpu.py"), filepath.Join(root, "examples", "sort"),
				"--task-bytes", strconv.FormatInt(min(taskBytes, 64*MiB), 10), "--repeat", "3", "--seed", strconv.Itoa(99+i))
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			if err != nil {
				results <- result{err: fmt.Errorf("bench/sort/cpu.py: %w", err)}
				return
			}
			var cm ComputeMeasure
			if err := json.Unmarshal(out, &cm); err != nil {
				results <- result{err: fmt.Errorf("bench/sort/cpu.py: %w", err)}
				return
			}
			_ = json.Unmarshal(out, &cm.Raw)
			results <- result{cm: cm}
		}()
	}
	var all []ComputeMeasure
	var firstErr error
	for range copies {
		r := <-results
		if r.err != nil && firstErr == nil {
			firstErr = r.err
		}
		all = append(all, r.cm)
	}
	if firstErr != nil {
		return ComputeMeasure{}, firstErr
	}
	median := func(f func(ComputeMeasure) float64) float64 {
		v := make([]float64, len(all))
		for i, c := range all {
			v[i] = f(c)
		}
		sort.Float64s(v)
		if n := len(v); n%2 == 0 {
			return (v[n/2-1] + v[n/2]) / 2
		}
		return v[len(v)/2]
	}
	cm := ComputeMeasure{
		MapSecondsPerByte:      median(func(c ComputeMeasure) float64 { return c.MapSecondsPerByte }),
		ReduceSecondsPerByte:   median(func(c ComputeMeasure) float64 { return c.ReduceSecondsPerByte }),
		ValidateSecondsPerByte: median(func(c ComputeMeasure) float64 { return c.ValidateSecondsPerByte }),
		Raw:                    map[string]any{"copies": copies},
	}
	var raws []map[string]any
	for _, c := range all {
		raws = append(raws, c.Raw)
	}
	cm.Raw["python"] = all[0].Raw["python"]
	cm.Raw["perCopy"] = raws
	return cm, nil
}

// rayPgid is the running Ray peer's process group (0: none), rayOut its
// stdout.
var (
	rayPgid atomic.Int64
	rayOut  strings.Builder
)

func rayRun(python, examples string, seed, records int64, parts int, taskRecords, store int64, timeout time.Duration) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	script := filepath.Join(filepath.Dir(filepath.Dir(examples)), "bench", "sort", "ray_sort.py")
	cmd := exec.CommandContext(ctx, python, script, examples, "--seed", strconv.FormatInt(seed, 10),
		"--records", strconv.FormatInt(records, 10), "--partitions", strconv.Itoa(parts),
		"--task-records", strconv.FormatInt(taskRecords, 10), "--object-store-memory", strconv.FormatInt(store, 10), "--num-cpus", "2")
	cmd.Env = append(os.Environ(), "RAY_AUTH_MODE=disabled")
	// Its own process group: an interrupt takes Ray's processes down too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stderr strings.Builder
	cmd.Stderr = &stderr
	rayOut.Reset()
	cmd.Stdout = &rayOut
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	rayPgid.Store(int64(cmd.Process.Pid))
	err := cmd.Wait()
	rayPgid.Store(0)
	out := []byte(rayOut.String())
	rayOut.Reset()
	if err != nil {
		tail := stderr.String()
		if len(tail) > 2000 {
			tail = tail[len(tail)-2000:]
		}
		return nil, fmt.Errorf("%w: %s", err, tail)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return json.RawMessage(lines[len(lines)-1]), nil
}
