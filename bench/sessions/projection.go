package main

import (
	"fmt"
	"math"
	"strings"
)

// Projection extends the 1- and 2-replica measurements to more replicas.
//
// Operator CPU per session with N replicas, each on its own core:
//
//	c(N) = e + g·h·(N−1)/N + Ret·s·k
//
// e: the operator's CPU per session without proxying and without the
// checkpoint's re-encoding of ended sessions (measured at 1 replica, less
// the checkpoint encoding of the run); g: gateway calls per session (2: a
// start and a result wait), of which (N−1)/N land on a replica that does
// not own the workflow and are proxied to its owner, h CPU each (from the
// 2-replica runs); Ret·s·k: each ended session stays in its bucket's
// checkpoint for Ret (1 h) and is re-encoded at every save (one a
// second), s bytes at k ns a byte (k fitted on the windows' steps: the
// operator's CPU per session against the checkpoint bytes it rewrote
// per session, which grow as ended sessions pile up). A replica serves 1/c(N) sessions per
// CPU-second, N replicas N/c(N).
//
// Shared, not sharded: Redis writes every bucket's whole checkpoint every
// second, Rate·Ret·s bytes a second in steady state, at r ns a byte of
// Redis's single thread: it saturates at 1e9/(Ret·s·r) sessions/s
// whatever N. The API server's cost per session (TokenReview and
// SubjectAccessReview per token every 10 s, the Workflow status patches
// every 5 s while sessions run) and per replica (its bucket Leases' and
// announcement's renewals, its watches) is given per 1000 sessions/s.
type Projection struct {
	EngineMs        float64 `json:"e_ms"`                  // e
	CallsPerSession float64 `json:"g_calls_per_session"`   // g
	Proxied2        float64 `json:"proxied_fraction_2"`    // measured with 2 replicas
	ProxyHopMs      float64 `json:"h_ms_per_proxied_call"` // h
	RetentionS      float64 `json:"retention_s"`           // Ret
	BytesPerSession float64 `json:"s_bytes_per_session"`   // s
	EncodeNsPerByte float64 `json:"k_ns_per_byte"`         // k, fitted on the windows' steps
	// MarshalNsPerByte is json.Marshal alone of the largest checkpoint
	// (bench process's CPU): the floor of k.
	MarshalNsPerByte float64 `json:"marshal_ns_per_byte"`
	RedisNsPerByte   float64 `json:"r_ns_per_byte"` // r
	RedisCeiling     float64 `json:"redis_ceiling_sessions_per_s"`
	APIMsPerSession  float64 `json:"apiserver_etcd_ms_per_session"`
	APIIdlePerRep    float64 `json:"apiserver_etcd_idle_cores_per_replica"`
	Rows             []Row   `json:"rows"`
}

// Row is the projection for one replica count.
type Row struct {
	Replicas      int     `json:"replicas"`
	Proxied       float64 `json:"proxied_fraction"`
	ShortMs       float64 `json:"cpu_ms_per_session_short_run"` // without the 1 h of ended sessions
	ShortCeiling  float64 `json:"sessions_per_s_short_run"`
	SteadyMs      float64 `json:"cpu_ms_per_session_steady"`
	SteadyCeiling float64 `json:"sessions_per_s_steady"`
	Effective     float64 `json:"sessions_per_s_effective"` // with Redis's ceiling
	Limit         string  `json:"limited_by"`
	RedisMBps     float64 `json:"redis_checkpoint_mb_per_s"`
	APICores      float64 `json:"apiserver_etcd_cores"`
}

func project(one, two Summary, cases []Case) *Projection {
	p := &Projection{RetentionS: 3600, Proxied2: two.Proxied}
	var enc, redis, bps, calls, api1Idle, api2Idle []float64
	for _, c := range cases {
		if c.Checkpoint.EncodeNsPerByte > 0 {
			enc = append(enc, c.Checkpoint.EncodeNsPerByte)
		}
		if c.Checkpoint.BytesPerSession > 0 {
			bps = append(bps, c.Checkpoint.BytesPerSession)
		}
		if w := c.CheckpointBytesPerSec * c.Seconds; w > 0 {
			redis = append(redis, 1e9*c.CPU["redis-server"]/w)
		}
		if c.Sessions > 0 {
			calls = append(calls, float64(c.Requests)/float64(c.Sessions))
		}
		idle := c.IdleCores["kube-apiserver"] + c.IdleCores["etcd"]
		if c.Replicas == 1 {
			api1Idle = append(api1Idle, idle)
		} else if c.Replicas == 2 {
			api2Idle = append(api2Idle, idle)
		}
	}
	p.MarshalNsPerByte, p.RedisNsPerByte, p.BytesPerSession, p.CallsPerSession = median(enc), median(redis), median(bps), median(calls)
	// k from the windows' steps: the operator's CPU per session grows with
	// the checkpoint bytes it rewrites per session (fixed-effects slope,
	// one intercept per replica count); the bare json.Marshal's cost if
	// the steps do not tell.
	groups := map[int][][2]float64{}
	for _, c := range cases {
		for _, pt := range c.Series {
			if pt.SessionsPerSec > 0 && pt.OperatorMs > 0 {
				groups[c.Replicas] = append(groups[c.Replicas], [2]float64{pt.CheckpointMB * 1e6 / pt.SessionsPerSec, pt.OperatorMs})
			}
		}
	}
	p.EncodeNsPerByte = fixedEffectsSlope(groups) * 1e6 // ms per byte -> ns per byte
	if p.EncodeNsPerByte <= 0 {
		p.EncodeNsPerByte = p.MarshalNsPerByte
	}
	core := map[int]float64{} // operator ms per session less its checkpoint rewriting
	for n, pts := range groups {
		var v []float64
		for _, pt := range pts {
			v = append(v, pt[1]-pt[0]*p.EncodeNsPerByte/1e6)
		}
		core[n] = median(v)
	}
	p.EngineMs = core[1]
	if p.Proxied2 > 0 && p.CallsPerSession > 0 {
		p.ProxyHopMs = math.Max(0, (core[2]-p.EngineMs)/(p.CallsPerSession*p.Proxied2))
	}
	if p.RedisNsPerByte > 0 && p.BytesPerSession > 0 {
		p.RedisCeiling = 1e9 / (p.RetentionS * p.BytesPerSession * p.RedisNsPerByte)
	}
	p.APIIdlePerRep = median(api2Idle) - median(api1Idle)
	var apiLoad []float64 // with 2 replicas: the sharded case, its Lease reads for routing included
	for _, c := range cases {
		if c.SessionsPerSec > 0 && c.Replicas == 2 {
			l := c.Cores["kube-apiserver"] + c.Cores["etcd"] - c.IdleCores["kube-apiserver"] - c.IdleCores["etcd"]
			apiLoad = append(apiLoad, 1000*l/c.SessionsPerSec)
		}
	}
	p.APIMsPerSession = median(apiLoad)
	steadyEncode := p.RetentionS * p.BytesPerSession * p.EncodeNsPerByte / 1e6
	for _, n := range []int{1, 2, 4, 10, 16, 32} {
		f := float64(n-1) / float64(n)
		r := Row{Replicas: n, Proxied: f}
		r.ShortMs = p.EngineMs + p.CallsPerSession*p.ProxyHopMs*f
		r.SteadyMs = r.ShortMs + steadyEncode
		if r.ShortMs > 0 {
			r.ShortCeiling = float64(n) * 1000 / r.ShortMs
			r.SteadyCeiling = float64(n) * 1000 / r.SteadyMs
		}
		r.Effective, r.Limit = r.SteadyCeiling, "the replicas' cores"
		if p.RedisCeiling > 0 && p.RedisCeiling < r.Effective {
			r.Effective, r.Limit = p.RedisCeiling, "Redis (one thread) rewriting the checkpoints"
		}
		r.RedisMBps = r.Effective * p.RetentionS * p.BytesPerSession / 1e6
		r.APICores = r.Effective*p.APIMsPerSession/1000 + float64(n)*math.Max(p.APIIdlePerRep, 0)
		p.Rows = append(p.Rows, r)
	}
	return p
}

func (p *Projection) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nprojection: c(N) = e + g·h·(N−1)/N + Ret·s·k; e %.3f ms, g %.2f, h %.3f ms (proxied %.0f %% at 2), Ret %.0f s, s %.0f B, k %.2f ns/B (json.Marshal alone %.2f; Ret·s·k = %.2f ms); Redis r %.2f ns/B -> ceiling %.0f sessions/s; API server+etcd %.3f ms/session, %.3f cores idle per replica\n\n",
		p.EngineMs, p.CallsPerSession, p.ProxyHopMs, 100*p.Proxied2, p.RetentionS, p.BytesPerSession, p.EncodeNsPerByte, p.MarshalNsPerByte,
		p.RetentionS*p.BytesPerSession*p.EncodeNsPerByte/1e6, p.RedisNsPerByte, p.RedisCeiling, p.APIMsPerSession, p.APIIdlePerRep)
	b.WriteString("| replicas | proxied | ms/session (no ended sessions kept) | sessions/s (idem) | ms/session (steady, 1 h kept) | sessions/s (steady) | with Redis | limited by | Redis MB/s | API server cores |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range p.Rows {
		fmt.Fprintf(&b, "| %d | %.0f %% | %.3f | %.0f | %.3f | %.0f | %.0f | %s | %.0f | %.2f |\n", r.Replicas, 100*r.Proxied, r.ShortMs, r.ShortCeiling,
			r.SteadyMs, r.SteadyCeiling, r.Effective, r.Limit, r.RedisMBps, r.APICores)
	}
	return b.String()
}

// fixedEffectsSlope fits y = a_g + b·x over groups of (x, y) points, one
// intercept a_g per group, and returns b (0 without spread in x).
func fixedEffectsSlope(groups map[int][][2]float64) float64 {
	var sxy, sxx float64
	for _, pts := range groups {
		if len(pts) < 2 {
			continue
		}
		var mx, my float64
		for _, pt := range pts {
			mx += pt[0]
			my += pt[1]
		}
		mx /= float64(len(pts))
		my /= float64(len(pts))
		for _, pt := range pts {
			sxy += (pt[0] - mx) * (pt[1] - my)
			sxx += (pt[0] - mx) * (pt[0] - mx)
		}
	}
	if sxx == 0 {
		return 0
	}
	return sxy / sxx
}
