package main

import (
	"fmt"
	"math"
	"strings"
)

// Projection extends the 1- and 2-replica measurements to more replicas.
//
// Operator CPU per session with N replicas, each on its own core, each
// serving x sessions/s of its own buckets:
//
//	c(N, K) = e + g·h·(N−1)/N + b·K,  K = x·Ret
//
// e: the operator's CPU per session with no ended session kept (measured
// at 1 replica, its part that grows with K taken out); g: gateway calls per
// session (2: a start and a result wait), of which (N−1)/N land on a
// replica that does not own the workflow and are proxied to its owner, h
// CPU each (from the 2-replica runs); b·K: what grows with the ended
// sessions a replica keeps for Ret (1 h), K of them in steady state (the
// registry's walks of every kept session at each Workflow status
// reconcile), b fitted on the windows' steps as K grows (one intercept per
// replica count). Since incremental checkpoints (290e480) no checkpoint
// term grows with K: an ended session's record is written once. A
// replica's core is saturated when x·c = 1000 ms, so in steady state
// x = (−A + √(A² + 4000·b·Ret)) / (2·b·Ret), A = e + g·h·(N−1)/N; N
// replicas serve N·x.
//
// Shared, not sharded: Redis takes every bucket's records and snapshots on
// one thread, r ms of its CPU per session (measured): it saturates at
// 1000/r sessions/s whatever N. It keeps an hour of records,
// rate·Ret·m bytes (m per record, MEMORY USAGE). The API server's cost per
// session (TokenReview and SubjectAccessReview per token every 10 s, the
// Workflow status patches every 5 s while sessions run) and per replica
// (its bucket Leases' and announcement's renewals, its watches) is given
// per 1000 sessions/s.
type Projection struct {
	EngineMs        float64 `json:"e_ms"`                  // e
	CallsPerSession float64 `json:"g_calls_per_session"`   // g
	Proxied2        float64 `json:"proxied_fraction_2"`    // measured with 2 replicas
	ProxyHopMs      float64 `json:"h_ms_per_proxied_call"` // h
	RetentionS      float64 `json:"retention_s"`           // Ret
	// KeptMsPerSession is b: operator ms per session per ended session a
	// replica keeps, fitted on the windows' steps.
	KeptMsPerSession float64 `json:"b_ms_per_session_per_kept_session"`
	RedisMsPerSess   float64 `json:"r_redis_ms_per_session"` // r
	RedisInBytes     float64 `json:"redis_input_bytes_per_session"`
	RecordBytes      float64 `json:"m_redis_bytes_per_kept_record"` // m
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
	RedisMBps     float64 `json:"redis_input_mb_per_s"`
	RedisGB       float64 `json:"redis_records_gb"` // an hour of records at the effective rate
	APICores      float64 `json:"apiserver_etcd_cores"`
}

func project(one, two Summary, cases []Case) *Projection {
	p := &Projection{RetentionS: 3600, Proxied2: two.Proxied}
	var redis, in, rec, calls, api1Idle, api2Idle []float64
	for _, c := range cases {
		if c.Sessions > 0 {
			calls = append(calls, float64(c.Requests)/float64(c.Sessions))
			redis = append(redis, 1000*c.CPU["redis-server"]/float64(c.Sessions))
		}
		if c.RedisInBytesPerSession > 0 {
			in = append(in, c.RedisInBytesPerSession)
		}
		if c.Checkpoint.BytesPerEndedRecord > 0 {
			rec = append(rec, c.Checkpoint.BytesPerEndedRecord)
		}
		idle := c.IdleCores["kube-apiserver"] + c.IdleCores["etcd"]
		if c.Replicas == 1 {
			api1Idle = append(api1Idle, idle)
		} else if c.Replicas == 2 {
			api2Idle = append(api2Idle, idle)
		}
	}
	p.RedisMsPerSess, p.RedisInBytes, p.RecordBytes, p.CallsPerSession = median(redis), median(in), median(rec), median(calls)
	// b from the windows' steps: the operator's CPU per session against
	// the ended sessions each replica keeps (fixed-effects slope, one
	// intercept per replica count).
	groups := map[int][][2]float64{}
	for _, c := range cases {
		for _, pt := range c.Series {
			if pt.SessionsPerSec > 0 && pt.OperatorMs > 0 {
				groups[c.Replicas] = append(groups[c.Replicas], [2]float64{float64(pt.EndedRecords) / float64(c.Replicas), pt.OperatorMs})
			}
		}
	}
	p.KeptMsPerSession = math.Max(0, fixedEffectsSlope(groups))
	core := map[int]float64{} // operator ms per session with nothing kept
	for n, pts := range groups {
		var v []float64
		for _, pt := range pts {
			v = append(v, pt[1]-pt[0]*p.KeptMsPerSession)
		}
		core[n] = median(v)
	}
	p.EngineMs = core[1]
	if p.Proxied2 > 0 && p.CallsPerSession > 0 {
		p.ProxyHopMs = math.Max(0, (core[2]-p.EngineMs)/(p.CallsPerSession*p.Proxied2))
	}
	if p.RedisMsPerSess > 0 {
		p.RedisCeiling = 1000 / p.RedisMsPerSess
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
	for _, n := range []int{1, 2, 4, 10, 16, 32} {
		f := float64(n-1) / float64(n)
		r := Row{Replicas: n, Proxied: f}
		r.ShortMs = p.EngineMs + p.CallsPerSession*p.ProxyHopMs*f
		if r.ShortMs > 0 {
			r.ShortCeiling = float64(n) * 1000 / r.ShortMs
			x := saturated(r.ShortMs, p.KeptMsPerSession*p.RetentionS)
			r.SteadyMs = 1000 / x
			r.SteadyCeiling = float64(n) * x
		}
		r.Effective, r.Limit = r.SteadyCeiling, "the replicas' cores"
		if p.RedisCeiling > 0 && p.RedisCeiling < r.Effective {
			r.Effective, r.Limit = p.RedisCeiling, "Redis (one thread)"
		}
		r.RedisMBps = r.Effective * p.RedisInBytes / 1e6
		r.RedisGB = r.Effective * p.RetentionS * p.RecordBytes / 1e9
		r.APICores = r.Effective*p.APIMsPerSession/1000 + float64(n)*math.Max(p.APIIdlePerRep, 0)
		p.Rows = append(p.Rows, r)
	}
	return p
}

// saturated is the rate x (sessions/s) at which one core is busy when a
// session costs a + bRet·x ms (x·(a + bRet·x) = 1000).
func saturated(a, bRet float64) float64 {
	if bRet <= 0 {
		return 1000 / a
	}
	return (-a + math.Sqrt(a*a+4000*bRet)) / (2 * bRet)
}

func (p *Projection) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nprojection: c(N, K) = e + g·h·(N−1)/N + b·K, K = x·Ret; e %.3f ms, g %.2f, h %.3f ms (proxied %.0f %% at 2), b %.3g ms per kept session, Ret %.0f s; Redis r %.3f ms/session -> ceiling %.0f sessions/s, %.0f B in per session, %.0f B per kept record; API server+etcd %.3f ms/session, %.3f cores idle per replica\n\n",
		p.EngineMs, p.CallsPerSession, p.ProxyHopMs, 100*p.Proxied2, p.KeptMsPerSession, p.RetentionS,
		p.RedisMsPerSess, p.RedisCeiling, p.RedisInBytes, p.RecordBytes, p.APIMsPerSession, p.APIIdlePerRep)
	b.WriteString("| replicas | proxied | ms/session (nothing kept) | sessions/s (idem) | ms/session (steady, 1 h kept) | sessions/s (steady) | with Redis | limited by | Redis in MB/s | Redis records GB | API server cores |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range p.Rows {
		fmt.Fprintf(&b, "| %d | %.0f %% | %.3f | %.0f | %.3f | %.0f | %.0f | %s | %.1f | %.1f | %.2f |\n", r.Replicas, 100*r.Proxied, r.ShortMs, r.ShortCeiling,
			r.SteadyMs, r.SteadyCeiling, r.Effective, r.Limit, r.RedisMBps, r.RedisGB, r.APICores)
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
