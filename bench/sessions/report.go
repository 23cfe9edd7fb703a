package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"
)

// Case is one measured run of n replicas.
type Case struct {
	Run            int            `json:"run"`
	Replicas       int            `json:"replicas"`
	Pinning        []string       `json:"pinning"` // each replica's Cpus_allowed_list
	LoadBefore     string         `json:"load_before"`
	LoadAfter      string         `json:"load_after"`
	SettleSeconds  float64        `json:"settle_s"` // start to buckets spread and workflows owned
	WorkflowsOwned map[string]int `json:"workflows_owned"`

	Seconds         float64 `json:"seconds"`
	Sessions        int     `json:"sessions"`
	SessionsPerSec  float64 `json:"sessions_per_s"`
	P50ms           float64 `json:"p50_ms"`
	P99ms           float64 `json:"p99_ms"`
	Errors          int     `json:"errors"`
	LastError       string  `json:"last_error,omitempty"`
	Requests        int     `json:"gateway_requests"`
	Proxied         int     `json:"gateway_proxied"` // sent to a replica that does not own the workflow
	ProxiedFraction float64 `json:"proxied_fraction"`

	CPU                     map[string]float64 `json:"cpu_s"` // CPU seconds in the window, by process group
	Cores                   map[string]float64 `json:"cores"` // the same per second of wall time
	CPUPerSessionMs         map[string]float64 `json:"cpu_ms_per_session"`
	OperatorCPUPerSessionMs float64            `json:"operator_cpu_ms_per_session"`   // all replicas together
	IdleCores               map[string]float64 `json:"idle_cores"`                    // before the load
	CoreBusy                []float64          `json:"core_busy"`                     // each core, every process on the machine
	EndedByReplica          map[string]float64 `json:"sessions_ended_by_replica"`     // ziptrail_sessions_ended_total deltas
	CheckpointBytesPerSec   float64            `json:"checkpoint_bytes_per_s"`        // mean total size of the buckets' snapshots (each saved at most once a second)
	RedisInBytesPerSession  float64            `json:"redis_input_bytes_per_session"` // Redis's total_net_input_bytes in the window, per session
	Checkpoint              Checkpoint         `json:"checkpoint_at_end"`
	// The API server's requests (apiserver_request_total) by verb and
	// resource: per second before the load, per session during it.
	IdleAPIRequestsPerSec map[string]float64 `json:"idle_apiserver_requests_per_s"`
	APIRequestsPerSession map[string]float64 `json:"apiserver_requests_per_session"`
	Series                []Point            `json:"series"` // the window step by step
	Notes                 []string           `json:"notes,omitempty"`
}

// Summary is the medians per replica count and the projection.
type Summary struct {
	Replicas       int     `json:"replicas"`
	Runs           int     `json:"runs"`
	SessionsPerSec float64 `json:"sessions_per_s"`
	P50ms          float64 `json:"p50_ms"`
	P99ms          float64 `json:"p99_ms"`
	OperatorCPUms  float64 `json:"operator_cpu_ms_per_session"`
	ReplicaCores   float64 `json:"replica_cores_busy"` // mean over replicas of each one's CPU per second
	Proxied        float64 `json:"proxied_fraction"`
	RedisCPUms     float64 `json:"redis_cpu_ms_per_session"`
	APICPUms       float64 `json:"apiserver_etcd_cpu_ms_per_session"`
	SidecarCPUms   float64 `json:"sidecars_cpu_ms_per_session"`
	FunctionsCPUms float64 `json:"functions_cpu_ms_per_session"`
	LoadGenCPUms   float64 `json:"load_generator_cpu_ms_per_session"`
	Load           string  `json:"load_range"`
}

// Report is docs/bench/sessions.json.
type Report struct {
	Host       map[string]any    `json:"host"`
	Options    map[string]any    `json:"options"`
	Placement  map[string]string `json:"placement"`
	Cases      []Case            `json:"cases"`
	Summary    []Summary         `json:"summary"`
	Ratio      float64           `json:"sessions_per_s_ratio_2_to_1"`
	Projection *Projection       `json:"projection,omitempty"`
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (r *Report) summarize() {
	byN := map[int][]Case{}
	var ns []int
	for _, c := range r.Cases {
		if _, ok := byN[c.Replicas]; !ok {
			ns = append(ns, c.Replicas)
		}
		byN[c.Replicas] = append(byN[c.Replicas], c)
	}
	sort.Ints(ns)
	for _, n := range ns {
		cs := byN[n]
		pick := func(f func(Case) float64) float64 {
			var v []float64
			for _, c := range cs {
				v = append(v, f(c))
			}
			return median(v)
		}
		var loads []string
		for _, c := range cs {
			loads = append(loads, strings.Fields(c.LoadBefore + " x")[0], strings.Fields(c.LoadAfter + " x")[0])
		}
		r.Summary = append(r.Summary, Summary{Replicas: n, Runs: len(cs), Load: strings.Join(loads, ", "),
			SessionsPerSec: pick(func(c Case) float64 { return c.SessionsPerSec }),
			P50ms:          pick(func(c Case) float64 { return c.P50ms }),
			P99ms:          pick(func(c Case) float64 { return c.P99ms }),
			OperatorCPUms:  pick(func(c Case) float64 { return c.OperatorCPUPerSessionMs }),
			ReplicaCores: pick(func(c Case) float64 {
				t := 0.0
				for g, v := range c.Cores {
					if strings.HasPrefix(g, "replica ") {
						t += v
					}
				}
				return t / float64(c.Replicas)
			}),
			Proxied:        pick(func(c Case) float64 { return c.ProxiedFraction }),
			RedisCPUms:     pick(func(c Case) float64 { return c.CPUPerSessionMs["redis-server"] }),
			APICPUms:       pick(func(c Case) float64 { return c.CPUPerSessionMs["kube-apiserver"] + c.CPUPerSessionMs["etcd"] }),
			SidecarCPUms:   pick(func(c Case) float64 { return c.CPUPerSessionMs["sidecars"] }),
			FunctionsCPUms: pick(func(c Case) float64 { return c.CPUPerSessionMs["functions"] }),
			LoadGenCPUms:   pick(func(c Case) float64 { return c.CPUPerSessionMs["load generator"] }),
		})
	}
	if len(r.Summary) >= 2 && r.Summary[0].Replicas == 1 && r.Summary[1].Replicas == 2 && r.Summary[0].SessionsPerSec > 0 {
		r.Ratio = r.Summary[1].SessionsPerSec / r.Summary[0].SessionsPerSec
		r.Projection = project(r.Summary[0], r.Summary[1], r.Cases)
	}
}

func (r *Report) write(jsonPath, pngPath string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(jsonPath, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return writeChart(pngPath, r)
}

func (r *Report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n| replicas | runs | sessions/s | p50 ms | p99 ms | operator CPU ms/session | replica core busy | proxied | Redis | API server+etcd | sidecars | functions | load gen | load |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.Summary {
		fmt.Fprintf(&b, "| %d | %d | %.1f | %.1f | %.1f | %.3f | %.2f | %.0f %% | %.3f | %.3f | %.3f | %.3f | %.3f | %s |\n",
			s.Replicas, s.Runs, s.SessionsPerSec, s.P50ms, s.P99ms, s.OperatorCPUms, s.ReplicaCores, 100*s.Proxied,
			s.RedisCPUms, s.APICPUms, s.SidecarCPUms, s.FunctionsCPUms, s.LoadGenCPUms, s.Load)
	}
	fmt.Fprintf(&b, "\n(CPU columns in ms per session; medians of the runs)\n\n| run | replicas | sessions/s | p50 ms | p99 ms | operator ms/session | per replica ms/own session | cores busy | proxied | errors | load before → after |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range r.Cases {
		var per []string
		for id, ended := range c.EndedByReplica {
			if ended > 0 {
				per = append(per, fmt.Sprintf("%s %.3f", id, 1000*c.CPU["replica "+id]/ended))
			}
		}
		sort.Strings(per)
		fmt.Fprintf(&b, "| %d | %d | %.1f | %.1f | %.1f | %.3f | %s | %s | %.0f %% | %d | %s → %s |\n", c.Run, c.Replicas, c.SessionsPerSec, c.P50ms, c.P99ms,
			c.OperatorCPUPerSessionMs, strings.Join(per, ", "), fmtFloats(c.CoreBusy), 100*c.ProxiedFraction, c.Errors, c.LoadBefore, c.LoadAfter)
	}
	b.WriteString("\nAPI server requests (apiserver_request_total) per session under load, and per second idle:\n\n")
	for _, c := range r.Cases {
		fmt.Fprintf(&b, "- run %d (%d replicas): per session %s; idle per second %s\n", c.Run, c.Replicas, top(c.APIRequestsPerSession, 6), top(c.IdleAPIRequestsPerSec, 6))
	}
	b.WriteString("\nThe window step by step (sessions/s, operator CPU ms/session, Redis CPU ms/session, checkpoints MB):\n\n")
	for _, c := range r.Cases {
		var pts []string
		for _, p := range c.Series {
			pts = append(pts, fmt.Sprintf("%.0fs: %.0f/s %.2f ms %.3f ms %.1f MB", p.T, p.SessionsPerSec, p.OperatorMs, p.RedisMs, p.CheckpointMB))
		}
		fmt.Fprintf(&b, "- run %d (%d replicas): %s\n", c.Run, c.Replicas, strings.Join(pts, "; "))
	}
	if r.Ratio > 0 {
		fmt.Fprintf(&b, "\nsessions/s 2 replicas / 1 replica: %.2fx\n", r.Ratio)
	}
	if p := r.Projection; p != nil {
		b.WriteString(p.markdown())
	}
	return b.String()
}

func fmtFloats(v []float64) string {
	var s []string
	for _, f := range v {
		s = append(s, fmt.Sprintf("%.2f", f))
	}
	return strings.Join(s, "/")
}

func hostInfo() map[string]any {
	h, _ := os.Hostname()
	info := map[string]any{"hostname": h, "time": time.Now().UTC().Format(time.RFC3339), "cpus": runtime.NumCPU(), "go": runtime.Version(),
		"loadavg_at_start": loadavg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				info["cpu"] = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	return info
}

// top lists the n largest entries of m.
func top(m map[string]float64, n int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] })
	var out []string
	for i, k := range keys {
		if i == n {
			break
		}
		out = append(out, fmt.Sprintf("%s %.3f", k, m[k]))
	}
	return strings.Join(out, ", ")
}
