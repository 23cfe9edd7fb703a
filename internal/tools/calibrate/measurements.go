package calibrate

import (
	"math"
	"sort"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
)

// Stores measured.
const (
	S3    = "s3"
	Redis = "redis"
	Pod   = "pod"
)

// Directions of a transfer.
const (
	Read  = "read"
	Write = "write"
	// Delete: removing objects (the sidecar-path points only).
	Delete = "delete"
)

// BandwidthPoint is one cell of the bandwidth grid: Workers workers, each
// moving objects of Size bytes to (Write) or from (Read) Store one after
// another for a while, all at once.
type BandwidthPoint struct {
	Store   string  `json:"store"`
	Op      string  `json:"op"`
	Workers int     `json:"workers"`
	Size    float64 `json:"size"`
	// WorkerMemory is the memory each worker had (0: not limited; the
	// workers were goroutines of the calibrating process).
	WorkerMemory float64 `json:"workerMemory,omitempty"`
	// PerWorker is each worker's bytes per second (its bytes over its own
	// time).
	PerWorker []float64 `json:"perWorker"`
	// Aggregate is all bytes over the wall time until the last worker
	// finished.
	Aggregate float64 `json:"aggregate"`
	Requests  int     `json:"requests"`
	Seconds   float64 `json:"seconds"`
}

// Typical is the point's per-worker bandwidth: the geometric mean of the
// workers' (a fit on log b weighs every point once).
func (p BandwidthPoint) Typical() float64 {
	if len(p.PerWorker) == 0 {
		return 0
	}
	var s float64
	for _, v := range p.PerWorker {
		if !(v > 0) {
			return 0
		}
		s += math.Log(v)
	}
	return math.Exp(s / float64(len(p.PerWorker)))
}

// RateProbe is one step of a request-rate probe: Concurrency clients
// issuing requests back to back.
type RateProbe struct {
	Concurrency int     `json:"concurrency"`
	PerSecond   float64 `json:"perSecond"`
}

// RatePoint is a store's request rate at one object size and direction:
// the best of its probes (concurrency doubled until the rate stopped
// rising).
type RatePoint struct {
	Store       string      `json:"store"`
	Op          string      `json:"op"`
	Size        float64     `json:"size"`
	Probes      []RateProbe `json:"probes"`
	PerSecond   float64     `json:"perSecond"`
	Concurrency int         `json:"concurrency"`
}

// ServerPoint is a store's aggregate throughput with many clients at once,
// half of them writing and half reading objects of Size bytes.
type ServerPoint struct {
	Store     string  `json:"store"`
	Clients   int     `json:"clients"`
	Size      float64 `json:"size"`
	Aggregate float64 `json:"aggregate"`
	Seconds   float64 `json:"seconds"`
}

// Measurements are everything a calibration run measured: the tables the
// fit reads.
type Measurements struct {
	Bandwidth []BandwidthPoint `json:"bandwidth"`
	Rates     []RatePoint      `json:"rates"`
	Server    []ServerPoint    `json:"server"`
	// CPU is the CPU time of every timed measurement (client and, where
	// visible, server).
	CPU []CPUSample `json:"cpu,omitempty"`
	// SidecarPath are the sidecar-path points (Config.Sidecar): the CPU
	// of moving objects through real queue-proxy-zl processes, with
	// SidecarCPU set.
	SidecarPath []CPUSample `json:"sidecarPath,omitempty"`
	// PythonSDK are the sidecar-path points with the Python SDK as the
	// function (SidecarPath.Python): ClientCPU is the Python process's.
	PythonSDK []CPUSample `json:"pythonSDK,omitempty"`
	// Control are the control-path sessions (SidecarPath.Python): a real
	// engine, real sidecars, Python functions.
	Control []ControlSample `json:"control,omitempty"`
	// CheckpointMaxShare is the control path's engine's bound on the time
	// its checkpoints take (orchestrator.Options.CheckpointMaxShare, the
	// installation's default): the most cores its upkeep of kept objects
	// takes (model.ControlCPU.MaxCores). 0 in measurements from before it.
	CheckpointMaxShare float64 `json:"checkpointMaxShare,omitempty"`
}

// bandwidth returns the points of one store and direction, by workers then
// size.
func (m *Measurements) bandwidth(store, op string) []BandwidthPoint {
	var out []BandwidthPoint
	for _, p := range m.Bandwidth {
		if p.Store == store && p.Op == op {
			out = append(out, p)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Workers != out[j].Workers {
			return out[i].Workers < out[j].Workers
		}
		return out[i].Size < out[j].Size
	})
	return out
}

// rates returns a store's rate points of one direction by size.
func (m *Measurements) rates(store, op string) []RatePoint {
	var out []RatePoint
	for _, p := range m.Rates {
		if p.Store == store && p.Op == op {
			out = append(out, p)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Size < out[j].Size })
	return out
}

// largestSize is the largest object size of the points (0 if none).
func largestSize(pts []BandwidthPoint) float64 {
	var s float64
	for _, p := range pts {
		s = max(s, p.Size)
	}
	return s
}

// atSize keeps the points of one size.
func atSize(pts []BandwidthPoint, size float64) []BandwidthPoint {
	var out []BandwidthPoint
	for _, p := range pts {
		if p.Size == size {
			out = append(out, p)
		}
	}
	return out
}

// maxAggregate is the largest aggregate bytes per second seen against a
// store with large objects: in bandwidth points, rate probes (rate × size)
// and server points of at least 10 MB objects (or of the largest size
// measured, if smaller). Smaller objects are the request-rate curve's
// business: a server's bandwidth is what it moves in bulk.
func (m *Measurements) maxAggregate(store string) float64 {
	var largest float64
	for _, p := range m.Bandwidth {
		if p.Store == store {
			largest = max(largest, p.Size)
		}
	}
	for _, p := range m.Rates {
		if p.Store == store {
			largest = max(largest, p.Size)
		}
	}
	for _, p := range m.Server {
		if p.Store == store {
			largest = max(largest, p.Size)
		}
	}
	floor := min(BulkSize, largest)
	var best float64
	for _, p := range m.Bandwidth {
		if p.Store == store && p.Size >= floor {
			best = max(best, p.Aggregate)
		}
	}
	for _, p := range m.Rates {
		if p.Store == store && p.Size >= floor {
			best = max(best, p.PerSecond*p.Size)
		}
	}
	for _, p := range m.Server {
		if p.Store == store && p.Size >= floor {
			best = max(best, p.Aggregate)
		}
	}
	return best
}

// BulkSize is the smallest object size whose throughput counts as a
// server's bandwidth.
const BulkSize = 10 * model.MB
