package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// usage is a process's CPU time and context switches (all its threads).
type usage struct {
	cpu   time.Duration
	ctxsw int64
}

func (u usage) sub(v usage) usage { return usage{u.cpu - v.cpu, u.ctxsw - v.ctxsw} }

// procUsage reads /proc for another process (CPU in clock ticks of 10 ms).
func procUsage(pid int) (usage, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return usage{}, err
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	u := usage{cpu: time.Duration(ut+st) * 10 * time.Millisecond}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, t := range tasks {
		s, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(s), "\n") {
			if strings.HasPrefix(l, "voluntary_ctxt_switches:") || strings.HasPrefix(l, "nonvoluntary_ctxt_switches:") {
				n, _ := strconv.ParseInt(strings.TrimSpace(l[strings.IndexByte(l, ':')+1:]), 10, 64)
				u.ctxsw += n
			}
		}
	}
	return u, nil
}

// selfUsage is this process's (the functions') CPU and context switches.
func selfUsage() usage {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return usage{cpu: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ctxsw: ru.Nvcsw + ru.Nivcsw}
}

// redisPid finds the redis-server listening on addr (it shows its address
// in its command line).
func redisPid(addr string) int {
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, c := range cmdlines {
		b, err := os.ReadFile(c)
		if err == nil && strings.Contains(string(b), "redis-server") && strings.Contains(string(b), addr) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(c)))
			return pid
		}
	}
	return 0
}

// costRow is the CPU spent per message by each process of a system.
type costRow struct {
	System   string             `json:"system"`
	Messages int                `json:"messages"`
	Seconds  float64            `json:"seconds"`
	CPU      map[string]float64 `json:"cpu_us_per_msg"` // process -> µs of CPU per message
	Switches map[string]float64 `json:"ctxsw_per_msg"`  // process -> context switches per message
}

// cost sends count 64 B messages back to back once per system and reads
// the CPU time and context switches every process involved spent.
func cost(ctx context.Context, zt *ztBench, rb *redisBench, redisAddr string, count int) ([]costRow, error) {
	measure := func(system string, procs map[string]int, f func() error) (costRow, error) {
		before := map[string]usage{"functions (bench process)": selfUsage()}
		for name, pid := range procs {
			u, err := procUsage(pid)
			if err != nil {
				return costRow{}, err
			}
			before[name] = u
		}
		t := time.Now()
		if err := f(); err != nil {
			return costRow{}, err
		}
		row := costRow{System: system, Messages: count, Seconds: time.Since(t).Seconds(), CPU: map[string]float64{}, Switches: map[string]float64{}}
		after := map[string]usage{"functions (bench process)": selfUsage()}
		for name, pid := range procs {
			u, err := procUsage(pid)
			if err != nil {
				return costRow{}, err
			}
			after[name] = u
		}
		for name, b := range before {
			d := after[name].sub(b)
			row.CPU[name] = float64(d.cpu.Microseconds()) / float64(count)
			row.Switches[name] = float64(d.ctxsw) / float64(count)
		}
		return row, nil
	}
	z, err := measure("ziptrail", map[string]int{"sender's queue-proxy-zl": zt.pods[0].pid(), "receiver's queue-proxy-zl": zt.pods[1].pid()}, func() error {
		_, err := zt.streamOnce(ctx, 1, count)
		return err
	})
	if err != nil {
		return nil, err
	}
	pid := redisPid(redisAddr)
	if pid == 0 {
		return nil, fmt.Errorf("no redis-server process for %s", redisAddr)
	}
	r, err := measure("Redis", map[string]int{"redis-server": pid}, func() error {
		_, err := rb.stream(false)(ctx, count, 0)
		return err
	})
	if err != nil {
		return nil, err
	}
	return []costRow{z, r}, nil
}
