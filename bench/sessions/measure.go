package main

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ziptrail/ziptrail/internal/tools/calibrate"
)

func numCPU() int { return runtime.NumCPU() }

// cpuSnapshot is the CPU seconds (user + system, every thread; from
// /proc/<pid>/stat) of each process group, and of each core (/proc/stat).
type cpuSnapshot struct {
	at     time.Time
	groups map[string]float64
	cores  []coreTimes // /proc/stat cpuN lines
}

type coreTimes struct{ busy, total float64 } // seconds

// groups names the processes of a case: each replica, then the shared ones.
func (c *cluster) snapshot(rs []*replica) cpuSnapshot {
	s := cpuSnapshot{at: time.Now(), groups: map[string]float64{}}
	add := func(group string, pid int) {
		if v, err := calibrate.ProcessCPU(pid); err == nil {
			s.groups[group] += v
		}
	}
	for _, r := range rs {
		add("replica "+r.id, r.pid())
	}
	for pid, comm := range children(os.Getpid()) {
		switch comm {
		case "kube-apiserver", "etcd", "redis-server":
			add(comm, pid)
		}
	}
	for _, q := range c.sidecars {
		add("sidecars", q.Cmd.Process.Pid)
	}
	add("functions", c.fnPid)
	add("load generator", os.Getpid())
	s.cores = coreStat()
	return s
}

// sub is the CPU seconds each group spent between o and s.
func (s cpuSnapshot) sub(o cpuSnapshot) map[string]float64 {
	out := map[string]float64{}
	for g, v := range s.groups {
		out[g] = v - o.groups[g]
	}
	return out
}

// coreBusy is each core's busy fraction between o and s (every process
// on the machine, other engineers' too).
func (s cpuSnapshot) coreBusy(o cpuSnapshot) []float64 {
	var out []float64
	for i := range min(len(s.cores), len(o.cores)) {
		if dt := s.cores[i].total - o.cores[i].total; dt > 0 {
			out = append(out, (s.cores[i].busy-o.cores[i].busy)/dt)
		}
	}
	return out
}

// children maps the pids of the processes whose parent is ppid to their
// command names (envtest's kube-apiserver and etcd, redis-server).
func children(ppid int) map[int]string {
	out := map[int]string{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		f := strings.Fields(s[end+1:])
		if len(f) < 2 {
			continue
		}
		if parent, _ := strconv.Atoi(f[1]); parent == ppid {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			out[pid] = s[open+1 : end]
		}
	}
	return out
}

// coreStat reads each core's busy and total time from /proc/stat.
func coreStat() []coreTimes {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil
	}
	var out []coreTimes
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 8 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		var t coreTimes
		for i, v := range f[1:] {
			n, _ := strconv.ParseFloat(v, 64)
			t.total += n / 100
			if i != 3 && i != 4 { // idle, iowait
				t.busy += n / 100
			}
		}
		out = append(out, t)
	}
	return out
}

// loadavg is /proc/loadavg's three averages (uptime's).
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// checkpointSampler reads, once a second, the size of every bucket's
// snapshot (its running sessions, rewritten when something changed) and
// the ended sessions' records kept in Redis (each written once, kept for
// the retention: internal/operator/checkpoint, endedsessions.go).
type checkpointSampler struct {
	mu      sync.Mutex
	samples int
	sum     float64 // total snapshot bytes of all buckets, summed over samples
	last    map[string]int64
	ended   int64 // ended sessions' records kept, at the last sample
}

func (c *cluster) sampleCheckpoints(ctx context.Context, prefix string) *checkpointSampler {
	cs := &checkpointSampler{}
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			sizes := c.checkpointSizes(ctx, prefix)
			ended, _ := c.endedRecords(ctx, prefix)
			var total int64
			for _, n := range sizes {
				total += n
			}
			cs.mu.Lock()
			cs.samples++
			cs.sum += float64(total)
			cs.last, cs.ended = sizes, ended
			cs.mu.Unlock()
		}
	}()
	return cs
}

// bytesPerSecond is the mean total size of the snapshots (at most one
// save per bucket per second).
func (cs *checkpointSampler) bytesPerSecond() float64 {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.samples == 0 {
		return 0
	}
	return cs.sum / float64(cs.samples)
}

func (c *cluster) checkpointSizes(ctx context.Context, prefix string) map[string]int64 {
	out := map[string]int64{}
	keys, err := c.redis.Client.Keys(ctx, prefix+":*").Result()
	if err != nil {
		return out
	}
	for _, k := range keys {
		if strings.HasSuffix(k, ":ended") || strings.HasSuffix(k, ":ended:exp") {
			continue
		}
		if n, err := c.redis.Client.HStrLen(ctx, k, "data").Result(); err == nil {
			out[k] = n
		}
	}
	return out
}

// endedRecords is the number of ended sessions' records every bucket
// keeps, and the memory Redis holds for them (the records and their
// expiry index: MEMORY USAGE, every element counted).
func (c *cluster) endedRecords(ctx context.Context, prefix string) (records, bytes int64) {
	keys, err := c.redis.Client.Keys(ctx, prefix+":*").Result()
	if err != nil {
		return 0, 0
	}
	for _, k := range keys {
		switch {
		case strings.HasSuffix(k, ":ended"):
			if n, err := c.redis.Client.HLen(ctx, k).Result(); err == nil {
				records += n
			}
		case !strings.HasSuffix(k, ":ended:exp"):
			continue
		}
		if n, err := c.redis.Client.MemoryUsage(ctx, k, 0).Result(); err == nil {
			bytes += n
		}
	}
	return records, bytes
}

// redisInputBytes is Redis's total_net_input_bytes (INFO stats): every
// byte its clients sent it.
func (c *cluster) redisInputBytes(ctx context.Context) float64 {
	info, err := c.redis.Client.Info(ctx, "stats").Result()
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "total_net_input_bytes:"); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return n
		}
	}
	return 0
}

// apiRequests reads the API server's apiserver_request_total, summed by
// verb and resource[/subresource] (who asks what of the shared API
// server: Lease renewals, TokenReviews, status patches...).
func (c *cluster) apiRequests(ctx context.Context) map[string]float64 {
	out := map[string]float64{}
	b, err := c.kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return out
	}
	for _, l := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(l, "apiserver_request_total{")
		if !ok {
			continue
		}
		end := strings.LastIndexByte(rest, '}')
		if end < 0 {
			continue
		}
		labels := map[string]string{}
		for _, kv := range strings.Split(rest[:end], ",") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				labels[k] = strings.Trim(v, `"`)
			}
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest[end+1:]), 64)
		if err != nil {
			continue
		}
		what := labels["verb"] + " " + labels["resource"]
		if labels["subresource"] != "" {
			what += "/" + labels["subresource"]
		}
		out[what] += v
	}
	return out
}

// rates is the requests of each kind per unit (a second, a session)
// between a and b; kinds under 0.001 are left out.
func rates(a, b map[string]float64, per float64) map[string]float64 {
	out := map[string]float64{}
	if per <= 0 {
		return out
	}
	for k, v := range b {
		if r := (v - a[k]) / per; r >= 0.001 {
			out[k] = r
		}
	}
	return out
}

// Point is one step of a case's measured window.
type Point struct {
	T              float64 `json:"t_s"` // end of the step, from the window's start
	SessionsPerSec float64 `json:"sessions_per_s"`
	OperatorMs     float64 `json:"operator_cpu_ms_per_session"`
	RedisMs        float64 `json:"redis_cpu_ms_per_session"`
	CheckpointMB   float64 `json:"checkpoint_mb"` // all buckets' snapshots, at the end of the step
	EndedRecords   int64   `json:"ended_records"` // ended sessions' records kept, all buckets, at the end of the step
	OperatorCores  float64 `json:"operator_cores"`
}

// series waits out the window d in steps, recording each step's rate,
// CPU per session and checkpoint size.
func (c *cluster) series(rs []*replica, l *load, cp *checkpointSampler, d, step time.Duration) []Point {
	var out []Point
	start := time.Now()
	prev, done := c.snapshot(rs), l.completed()
	for elapsed := time.Duration(0); elapsed < d; {
		time.Sleep(min(step, d-elapsed))
		now, n := c.snapshot(rs), l.completed()
		cpu, dt := now.sub(prev), now.at.Sub(prev.at).Seconds()
		p := Point{T: now.at.Sub(start).Seconds(), SessionsPerSec: float64(n-done) / dt}
		var op float64
		for _, r := range rs {
			op += cpu["replica "+r.id]
		}
		p.OperatorCores = op / dt
		if n > done {
			p.OperatorMs = 1000 * op / float64(n-done)
			p.RedisMs = 1000 * cpu["redis-server"] / float64(n-done)
		}
		cp.mu.Lock()
		for _, b := range cp.last {
			p.CheckpointMB += float64(b) / 1e6
		}
		p.EndedRecords = cp.ended
		cp.mu.Unlock()
		out = append(out, p)
		prev, done, elapsed = now, n, time.Since(start)
	}
	return out
}
