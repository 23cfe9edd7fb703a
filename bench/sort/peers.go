package main

// The peer (Ray) and the sort's own CPU measurement.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

func measureCompute(python, root string, taskBytes int64) (ComputeMeasure, error) {
	cmd := exec.Command(python, filepath.Join(root, "bench", "sort", "cpu.py"), filepath.Join(root, "examples", "sort"),
		"--task-bytes", strconv.FormatInt(min(taskBytes, 64*MiB), 10), "--repeat", "3")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return ComputeMeasure{}, fmt.Errorf("bench/sort/cpu.py: %w", err)
	}
	var cm ComputeMeasure
	if err := json.Unmarshal(out, &cm); err != nil {
		return cm, err
	}
	_ = json.Unmarshal(out, &cm.Raw)
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
