package calibrate

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
)

// Config says what to measure and for how long.
type Config struct {
	// Redis is the fast tier's shard (its pool size and timeouts are set
	// here to what the measurement needs).
	Redis *redis.Options
	// S3 is the slow tier and Bucket a bucket in it the run may write to
	// (it removes what it wrote).
	S3 S3Endpoint

	// DurationPerPoint is how long each point runs (every worker at least
	// one request); default 2 s. A rate probe runs half of it.
	DurationPerPoint time.Duration
	// MaxObject is the largest object size (default 100 MB); sizes are
	// 10 KB, 100 KB, 1 MB, 10 MB and 100 MB up to it.
	MaxObject float64
	// Workers are the parallelisms of the bandwidth grid (default 1, 2, 4,
	// 8).
	Workers []int
	// MaxConcurrency bounds a rate probe's clients (default 32), and
	// InflightBytes the bytes they may have in flight (default 1 GiB).
	MaxConcurrency int
	InflightBytes  float64
	// ServerClients is the number of clients of the Redis server-bandwidth
	// point (default 16).
	ServerClients int
	// ServerPIDs are the processes of the stores' servers on this machine,
	// by store (S3, Redis), whose CPU time is read from /proc around every
	// measurement (ListenerPID finds a local server's). A store without
	// one has its server's CPU unmeasured (CPUSample.ServerCPU −1), and
	// the fit leaves its CPU cost unknown.
	ServerPIDs map[string]int
	// Sidecar, when set, adds the sidecar-path points: objects of 256 KB
	// to 16 MB through two real queue-proxy-zl processes (SidecarPath),
	// with their CPU, the servers' and the SDK's. The fit prices the
	// platform's CPU from these points where they exist.
	Sidecar *SidecarPath
	// CheckpointInterval is how often the control path's engine saves
	// its state, as the installation's does (its checkpoints grow with
	// the objects it keeps, and a running shuffle changes its state at
	// every save): 0 is the orchestrator's default (1 s, the chart's);
	// the local cluster saves every 250 ms (localcluster.CheckpointInterval).
	CheckpointInterval time.Duration
	// Progress receives a line per step (nil: none).
	Progress io.Writer
}

// S3Endpoint is an S3 (or MinIO) endpoint and bucket.
type S3Endpoint struct {
	Endpoint             string
	AccessKey, SecretKey string
	Secure               bool
	Bucket               string
}

func (c *Config) defaults() error {
	if c.Redis == nil || c.Redis.Addr == "" {
		return errors.New("calibrate: no Redis address")
	}
	if c.S3.Endpoint == "" || c.S3.Bucket == "" {
		return errors.New("calibrate: no S3 endpoint and bucket")
	}
	if c.DurationPerPoint <= 0 {
		c.DurationPerPoint = 2 * time.Second
	}
	if c.MaxObject == 0 {
		c.MaxObject = 100 * model.MB
	}
	if c.MaxObject < 1*model.MB {
		return fmt.Errorf("calibrate: the largest object must be at least 1 MB, not %s", FormatSize(c.MaxObject))
	}
	if len(c.Workers) == 0 {
		c.Workers = []int{1, 2, 4, 8}
	}
	for i, w := range c.Workers {
		if w < 1 || (i > 0 && w <= c.Workers[i-1]) {
			return fmt.Errorf("calibrate: workers %v: want increasing counts ≥ 1", c.Workers)
		}
	}
	if c.MaxConcurrency <= 0 {
		c.MaxConcurrency = 32
	}
	if c.InflightBytes <= 0 {
		c.InflightBytes = model.GiB
	}
	if c.ServerClients <= 0 {
		c.ServerClients = 16
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Sidecar != nil && c.Sidecar.Python != "" {
		if err := pythonWithSDK(c.Sidecar.Python); err != nil {
			return fmt.Errorf("calibrate: %s cannot import the ziptrail SDK (pip install ./sdk/python): %w", c.Sidecar.Python, err)
		}
	}
	if c.Sidecar != nil {
		if c.Sidecar.Binary == "" {
			return errors.New("calibrate: the sidecar path needs the queue-proxy-zl binary")
		}
		if c.Sidecar.Workers <= 0 {
			c.Sidecar.Workers = 2
		}
	}
	return nil
}

// Table1Sizes are the object sizes of Locus Table 1, at which request rates
// are measured.
var Table1Sizes = []float64{10 * model.KB, 100 * model.KB, 1 * model.MB, 10 * model.MB, 100 * model.MB}

// RateSizes are the request-rate sizes up to maxObject.
func RateSizes(maxObject float64) []float64 {
	var out []float64
	for _, s := range Table1Sizes {
		if s <= maxObject {
			out = append(out, s)
		}
	}
	return out
}

// BandwidthSizes are the bandwidth grid's object sizes up to maxObject:
// Table 1's sizes from 1 MB (below that a request's latency, not the
// bandwidth, is what is measured).
func BandwidthSizes(maxObject float64) []float64 {
	var out []float64
	for _, s := range RateSizes(maxObject) {
		if s >= 1*model.MB {
			out = append(out, s)
		}
	}
	return out
}
