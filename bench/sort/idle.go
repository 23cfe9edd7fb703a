package main

// The local cluster's idle CPU: what its processes (this one, which runs
// the control plane and the operator, and every descendant: API server,
// etcd, Knative, node agents, the functions' warm pods, Redis, MinIO) use
// while no session runs. The model takes it as Params.BackgroundCores:
// cores the sorts do not get.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
)

// IdleMeasure is the cluster's CPU while idle (sort-idle.json).
type IdleMeasure struct {
	Time time.Time `json:"time"`
	// BackgroundCores is the cluster's CPU seconds over the wall seconds.
	BackgroundCores float64 `json:"backgroundCores"`
	Seconds         float64 `json:"seconds"`
	CPUSeconds      float64 `json:"cpuSeconds"`
	Processes       int     `json:"processes"`
	// ByCommand is each command's share, in cores.
	ByCommand  map[string]float64 `json:"byCommand"`
	LoadBefore string             `json:"loadBefore"`
	LoadAfter  string             `json:"loadAfter"`
	What       string             `json:"what"`
}

// treeCPU is the CPU seconds (user + system, /proc/<pid>/stat) of root and
// its descendants now, by command name.
func treeCPU(root int) (map[string]float64, int, error) {
	type proc struct {
		ppid int
		cpu  float64
		comm string
	}
	procs := map[int]proc{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, 0, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		i, j := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if i < 0 || j < i {
			continue
		}
		f := strings.Fields(s[j+1:])
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		procs[pid] = proc{ppid, (ut + st) / 100, s[i+1 : j]}
	}
	kids := map[int][]int{}
	for pid, p := range procs {
		kids[p.ppid] = append(kids[p.ppid], pid)
	}
	out := map[string]float64{}
	n := 0
	for stack := []int{root}; len(stack) > 0; {
		pid := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if p, ok := procs[pid]; ok {
			out[p.comm] += p.cpu
			n++
		}
		stack = append(stack, kids[pid]...)
	}
	return out, n, nil
}

// measureIdle samples the cluster's CPU over d while nothing runs.
func measureIdle(d time.Duration, what string) (IdleMeasure, error) {
	m := IdleMeasure{Time: time.Now().UTC(), LoadBefore: loadavg(), What: what, ByCommand: map[string]float64{}}
	c0, _, err := treeCPU(os.Getpid())
	if err != nil {
		return m, err
	}
	t0 := time.Now()
	time.Sleep(d)
	c1, n, err := treeCPU(os.Getpid())
	if err != nil {
		return m, err
	}
	m.Seconds, m.Processes, m.LoadAfter = time.Since(t0).Seconds(), n, loadavg()
	for comm, v := range c1 {
		// a process that started during the window counts from 0; one that
		// ended is missed (an idle cluster starts and ends few)
		if dv := v - c0[comm]; dv > 0 {
			m.CPUSeconds += dv
			m.ByCommand[comm] = dv / m.Seconds
		}
	}
	m.BackgroundCores = m.CPUSeconds / m.Seconds
	return m, nil
}

// largest is the n largest entries of by, largest first, as "name
// value" with format for the value.
func largest(by map[string]float64, n int, format string) []string {
	keys := make([]string, 0, len(by))
	for k := range by {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return by[keys[i]] > by[keys[j]] })
	var out []string
	for _, k := range keys[:min(len(keys), n)] {
		out = append(out, fmt.Sprintf("%s "+format, k, by[k]))
	}
	return out
}

func (m IdleMeasure) String() string {
	parts := largest(m.ByCommand, 8, "%.3f")
	return fmt.Sprintf("%.3f cores over %.0f s (%d processes; %s; load %s → %s)", m.BackgroundCores, m.Seconds, m.Processes,
		strings.Join(parts, ", "), m.LoadBefore, m.LoadAfter)
}

// loadIdle reads sort-idle.json.
func loadIdle(path string) (IdleMeasure, error) {
	var m IdleMeasure
	b, err := os.ReadFile(path)
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("%s: %w", path, err)
	}
	if !(m.BackgroundCores >= 0) {
		return m, fmt.Errorf("%s: backgroundCores %v", path, m.BackgroundCores)
	}
	return m, nil
}

// withPlatform is p with the installation's CPU costs of the calibration
// plat (stores, control path, SDKs; the run's own storage parameters
// stay).
func withPlatform(p model.Params, plat model.Params) model.Params {
	p.SlowCPU, p.FastCPU, p.PodCPU = plat.SlowCPU, plat.FastCPU, plat.PodCPU
	p.ControlCPU, p.SDKCPU = plat.ControlCPU, plat.SDKCPU
	return p
}
