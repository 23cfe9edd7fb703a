package calibrate

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/redis/go-redis/v9"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
)

// step is one measurement of a run.
type step struct {
	label string
	run   func(ctx context.Context) (string, error)
}

// runner holds a run's stores and what it wrote.
type runner struct {
	cfg    Config
	m      *Measurements
	prefix string
	redis  redisTarget
	s3     s3Target
	pod    *podTarget
	// sidecar is the two queue-proxy-zl of the sidecar-path points (nil:
	// not measured).
	sidecar *sidecars
	// python drives the Python SDK on them (nil: not measured).
	python *pyProcess
	// control is the control path's engine, sidecars and functions,
	// started by the first control point.
	control *controlEnv
	seq     atomic.Int64 // makes every point's keys new (a pod store remembers freed ids)
	mu      sync.Mutex
	// written are keys still to remove, by target.
	written map[target]map[string]bool
}

// Measure runs every measurement against the configured Redis and S3 and
// the in-process pod data plane, printing a line per step to
// cfg.Progress, and returns the tables. It removes the objects it wrote,
// also when it fails or ctx ends.
func Measure(ctx context.Context, cfg Config) (*Measurements, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	maxW := cfg.Workers[len(cfg.Workers)-1]
	conns := max(cfg.MaxConcurrency, cfg.ServerClients, maxW) + 4
	ro := *cfg.Redis
	ro.PoolSize = max(ro.PoolSize, conns)
	// a 100 MB value behind others on a busy machine takes seconds
	ro.ReadTimeout, ro.WriteTimeout = 2*time.Minute, 2*time.Minute
	rc := redis.NewClient(&ro)
	defer rc.Close()
	if err := rc.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("redis %s: %w", ro.Addr, err)
	}
	tr, err := minio.DefaultTransport(cfg.S3.Secure)
	if err != nil {
		return nil, err
	}
	tr.MaxIdleConnsPerHost = conns
	sc, err := minio.New(cfg.S3.Endpoint, &minio.Options{
		Creds: credentials.NewStaticV4(cfg.S3.AccessKey, cfg.S3.SecretKey, ""), Secure: cfg.S3.Secure, Transport: http.RoundTripper(tr)})
	if err != nil {
		return nil, fmt.Errorf("s3 %s: %w", cfg.S3.Endpoint, err)
	}
	if ok, err := sc.BucketExists(ctx, cfg.S3.Bucket); err != nil || !ok {
		if err == nil {
			err = errors.New("no such bucket")
		}
		return nil, fmt.Errorf("s3 %s bucket %s: %w", cfg.S3.Endpoint, cfg.S3.Bucket, err)
	}
	pod, err := newPodTarget(maxW, int64(4*cfg.MaxObject))
	if err != nil {
		return nil, err
	}
	defer pod.close()

	id := make([]byte, 4)
	_, _ = rand.Read(id)
	r := &runner{cfg: cfg, m: &Measurements{}, redis: redisTarget{rc}, s3: s3Target{sc, cfg.S3.Bucket}, pod: pod,
		prefix:  "ziptrail-calibrate/" + time.Now().UTC().Format("20060102T150405") + "-" + hex.EncodeToString(id) + "/",
		written: map[target]map[string]bool{}}
	defer r.cleanup(ctx)
	defer func() {
		if r.control != nil {
			r.control.close()
		}
	}()
	if cfg.Sidecar != nil {
		fmt.Fprintf(cfg.Progress, "starting two queue-proxy-zl (%s) with these tiers\n", cfg.Sidecar.Binary)
		if r.sidecar, err = startSidecars(cfg); err != nil {
			return nil, fmt.Errorf("sidecars: %w", err)
		}
		defer r.sidecar.close()
		if cfg.Sidecar.Python != "" {
			if r.python, err = r.sidecar.startPythonSDK(cfg.Sidecar.Python); err != nil {
				return nil, fmt.Errorf("python SDK: %w", err)
			}
		}
	}

	steps := r.steps()
	sidecar := ""
	if r.sidecar != nil {
		sidecar = fmt.Sprintf("; CPU through the sidecar at %s", sizes(sidecarSizes(cfg.MaxObject)))
	}
	fmt.Fprintf(cfg.Progress, "calibrating: %d steps of about %s each (bandwidth of %v workers at %s objects; request rates at %s; Redis server bandwidth; pod pulls%s)\n",
		len(steps), cfg.DurationPerPoint, cfg.Workers, sizes(BandwidthSizes(cfg.MaxObject)), sizes(RateSizes(cfg.MaxObject)), sidecar)
	start := time.Now()
	for i, s := range steps {
		fmt.Fprintf(cfg.Progress, "[%*d/%d] %s: ", len(fmt.Sprint(len(steps))), i+1, len(steps), s.label)
		out, err := s.run(ctx)
		if err != nil {
			fmt.Fprintln(cfg.Progress, "failed")
			return nil, fmt.Errorf("%s: %w", s.label, err)
		}
		fmt.Fprintln(cfg.Progress, out)
	}
	fmt.Fprintf(cfg.Progress, "measured in %s\n", time.Since(start).Round(time.Second))
	return r.m, nil
}

func sizes(s []float64) string {
	var out []string
	for _, v := range s {
		out = append(out, FormatSize(v))
	}
	return strings.Join(out, ", ")
}

// steps lists the run: per store the bandwidth grid (writes, then reads of
// objects written for them), then the request rates, then Redis's server
// bandwidth.
func (r *runner) steps() []step {
	cfg := r.cfg
	var steps []step
	for _, t := range []target{r.s3, r.redis, r.pod} {
		for _, size := range BandwidthSizes(cfg.MaxObject) {
			if t != target(r.pod) { // a producer's put stays in its own memory: no transfer to measure
				for _, w := range cfg.Workers {
					steps = append(steps, step{fmt.Sprintf("%s write, %d worker(s) × %s", t.name(), w, FormatSize(size)),
						func(ctx context.Context) (string, error) { return r.bandwidthPoint(ctx, t, Write, w, size) }})
				}
			}
			for _, w := range cfg.Workers {
				steps = append(steps, step{fmt.Sprintf("%s read, %d worker(s) × %s", t.name(), w, FormatSize(size)),
					func(ctx context.Context) (string, error) { return r.bandwidthPoint(ctx, t, Read, w, size) }})
			}
		}
	}
	for _, t := range []target{r.s3, r.redis} {
		for _, size := range RateSizes(cfg.MaxObject) {
			for _, op := range []string{Write, Read} {
				steps = append(steps, step{fmt.Sprintf("%s %s rate, %s objects", t.name(), op, FormatSize(size)),
					func(ctx context.Context) (string, error) { return r.ratePoint(ctx, t, op, size) }})
			}
		}
	}
	size := min(10*model.MB, cfg.MaxObject)
	steps = append(steps, step{fmt.Sprintf("redis server bandwidth, %d clients × %s (half write, half read)", cfg.ServerClients, FormatSize(size)),
		func(ctx context.Context) (string, error) { return r.serverPoint(ctx, r.redis, size) }})
	if r.sidecar != nil {
		for _, store := range []string{S3, Redis, Pod} {
			for _, op := range []string{Write, Read} {
				for _, size := range sidecarSizes(cfg.MaxObject) {
					steps = append(steps, step{fmt.Sprintf("%s %s through the sidecar, %d worker(s) × %s", store, op, cfg.Sidecar.Workers, FormatSize(size)),
						func(ctx context.Context) (string, error) { return r.sidecarPoint(ctx, store, op, size) }})
				}
			}
		}
	}
	if r.python != nil {
		for _, store := range []string{S3, Redis, Pod} {
			for _, op := range []string{Write, Read} {
				for _, size := range sidecarSizes(cfg.MaxObject) {
					steps = append(steps, step{fmt.Sprintf("%s %s through the sidecar, Python SDK, %d thread(s) × %s", store, op, cfg.Sidecar.Workers, FormatSize(size)),
						func(ctx context.Context) (string, error) { return r.pythonPoint(ctx, store, op, size) }})
				}
			}
		}
		for _, cp := range controlPoints(cfg.MaxObject < 100*model.MB) {
			steps = append(steps, step{fmt.Sprintf("control path: %d maps × %d objects into %d groups (engine, sidecars, Python functions)", cp.Maps, cp.ObjectsPerMap, cp.Groups),
				func(ctx context.Context) (string, error) { return r.controlPoint(ctx, cp) }})
		}
	}
	return steps
}

func (r *runner) key(parts ...any) string {
	s := make([]string, len(parts))
	for i, p := range parts {
		s[i] = fmt.Sprint(p)
	}
	return r.prefix + strings.Join(s, "/")
}

func (r *runner) wrote(t target, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.written[t] == nil {
		r.written[t] = map[string]bool{}
	}
	r.written[t][key] = true
}

// remove deletes keys from t (and forgets them).
func (r *runner) remove(ctx context.Context, t target, keys []string) error {
	r.mu.Lock()
	for _, k := range keys {
		delete(r.written[t], k)
	}
	r.mu.Unlock()
	return t.del(ctx, keys)
}

// cleanup removes whatever is left, even after ctx ended.
func (r *runner) cleanup(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	for t, keys := range r.written {
		var ks []string
		for k := range keys {
			ks = append(ks, k)
		}
		_ = r.remove(ctx, t, ks)
	}
}

// populate writes one object of size per key (keys[i] by worker i) and
// returns the keys.
func (r *runner) populate(ctx context.Context, t target, size float64, n int, kind string) ([]string, error) {
	data := payload(int(size))
	keys := make([]string, n)
	seq := r.seq.Add(1)
	for i := range keys {
		keys[i] = r.key(kind, int(size), seq, i)
		r.wrote(t, keys[i])
	}
	err := parallel(n, func(i int) error { return t.put(ctx, i, keys[i], data) })
	return keys, err
}

// bandwidthPoint measures w workers moving objects of size.
func (r *runner) bandwidthPoint(ctx context.Context, t target, op string, w int, size float64) (string, error) {
	n := int(size)
	var res result
	var err error
	var keys []string
	if op == Write {
		data := payload(n)
		keys = make([]string, w)
		seq := r.seq.Add(1)
		for i := range keys {
			keys[i] = r.key("bw-write", n, seq, i)
			r.wrote(t, keys[i])
		}
		res, err = r.runWorkers(ctx, t, Write, size, w, r.cfg.DurationPerPoint, func(ctx context.Context, i int) (int, error) {
			return n, t.put(ctx, i, keys[i], data)
		})
	} else {
		if keys, err = r.populate(ctx, t, size, w, "bw-read"); err != nil {
			return "", err
		}
		bufs := make([][]byte, w)
		for i := range bufs {
			bufs[i] = make([]byte, n)
		}
		res, err = r.runWorkers(ctx, t, Read, size, w, r.cfg.DurationPerPoint, func(ctx context.Context, i int) (int, error) {
			m, err := t.get(ctx, i, keys[i], bufs[i])
			if err == nil && m != n {
				err = fmt.Errorf("read %d bytes of %d", m, n)
			}
			return m, err
		})
	}
	if derr := r.remove(ctx, t, keys); err == nil && derr != nil {
		err = derr
	}
	if err != nil {
		return "", err
	}
	p := BandwidthPoint{Store: t.name(), Op: op, Workers: w, Size: size, PerWorker: res.perWorker, Aggregate: res.aggregate, Requests: res.requests, Seconds: res.seconds}
	r.m.Bandwidth = append(r.m.Bandwidth, p)
	lo, hi := minMax(res.perWorker)
	spread := ""
	if w > 1 {
		spread = fmt.Sprintf(" (%s–%s)", FormatRate(lo), FormatRate(hi))
	}
	return fmt.Sprintf("%s per worker%s, %s in all, %d requests in %.2fs", FormatRate(p.Typical()), spread, FormatRate(p.Aggregate), p.Requests, p.Seconds), nil
}

// ratePoint probes a store's request rate at one size: clients doubled
// from 1 until two doublings in a row did not raise the best rate by 10 %
// (one could be noise), or the concurrency or in-flight bytes bound is
// reached.
func (r *runner) ratePoint(ctx context.Context, t target, op string, size float64) (string, error) {
	n := int(size)
	maxC := 1
	for maxC*2 <= r.cfg.MaxConcurrency && float64(maxC*2)*size <= r.cfg.InflightBytes {
		maxC *= 2
	}
	var keys []string
	var data []byte
	var bufs [][]byte
	var err error
	if op == Write {
		data = payload(n)
		keys = make([]string, maxC)
		seq := r.seq.Add(1)
		for i := range keys {
			keys[i] = r.key("rate-write", n, seq, i)
			r.wrote(t, keys[i])
		}
	} else {
		if keys, err = r.populate(ctx, t, size, maxC, "rate-read"); err != nil {
			return "", err
		}
		bufs = make([][]byte, maxC)
		for i := range bufs {
			bufs[i] = make([]byte, n)
		}
	}
	defer func() { _ = r.remove(ctx, t, keys) }()
	p := RatePoint{Store: t.name(), Op: op, Size: size}
	var out []string
	flat := 0 // probes in a row that did not beat the best by 10 %
	for c := 1; c <= maxC; c *= 2 {
		res, err := r.runWorkers(ctx, t, op, size, c, r.cfg.DurationPerPoint/2, func(ctx context.Context, i int) (int, error) {
			if op == Write {
				return n, t.put(ctx, i, keys[i], data)
			}
			return t.get(ctx, i, keys[i], bufs[i])
		})
		if err != nil {
			return "", err
		}
		rate := float64(res.requests) / res.seconds
		p.Probes = append(p.Probes, RateProbe{Concurrency: c, PerSecond: rate})
		out = append(out, fmt.Sprintf("%d→%s/s", c, FormatCount(rate)))
		if c > 1 && rate < 1.1*p.PerSecond {
			flat++
		} else {
			flat = 0
		}
		if rate > p.PerSecond {
			p.PerSecond, p.Concurrency = rate, c
		}
		if flat == 2 {
			break
		}
	}
	r.m.Rates = append(r.m.Rates, p)
	return fmt.Sprintf("%s: %s/s (%s) with %d clients", strings.Join(out, " "), FormatCount(p.PerSecond), FormatRate(p.PerSecond*size), p.Concurrency), nil
}

// serverPoint loads a store with many clients, half writing their own
// object, half reading one.
func (r *runner) serverPoint(ctx context.Context, t target, size float64) (string, error) {
	n := int(size)
	c := r.cfg.ServerClients
	readKeys, err := r.populate(ctx, t, size, c, "server-read")
	if err != nil {
		return "", err
	}
	writeKeys := make([]string, c)
	seq := r.seq.Add(1)
	for i := range writeKeys {
		writeKeys[i] = r.key("server-write", n, seq, i)
		r.wrote(t, writeKeys[i])
	}
	defer func() { _ = r.remove(ctx, t, append(readKeys, writeKeys...)) }()
	data := payload(n)
	bufs := make([][]byte, c)
	for i := 1; i < c; i += 2 {
		bufs[i] = make([]byte, n)
	}
	res, err := r.runWorkers(ctx, t, "mixed", size, c, r.cfg.DurationPerPoint, func(ctx context.Context, i int) (int, error) {
		if i%2 == 0 {
			return n, t.put(ctx, i, writeKeys[i], data)
		}
		return t.get(ctx, i, readKeys[i], bufs[i])
	})
	if err != nil {
		return "", err
	}
	p := ServerPoint{Store: t.name(), Clients: c, Size: size, Aggregate: res.aggregate, Seconds: res.seconds}
	r.m.Server = append(r.m.Server, p)
	return fmt.Sprintf("%s in all, %d requests in %.2fs", FormatRate(p.Aggregate), res.requests, p.Seconds), nil
}

// result is what runWorkers measured.
type result struct {
	perWorker []float64
	aggregate float64
	requests  int
	bytes     float64
	seconds   float64
}

// runWorkers is runWorkers with the CPU time of t's server (if its PID is
// known) and of this process read before and after, recorded as a
// CPUSample of op on objects of size.
func (r *runner) runWorkers(ctx context.Context, t target, op string, size float64, n int, d time.Duration, f func(ctx context.Context, worker int) (int, error)) (result, error) {
	pid := r.cfg.ServerPIDs[t.name()]
	server0, serr := -1.0, error(nil)
	if pid > 0 {
		server0, serr = ProcessCPU(pid)
	}
	self0 := selfCPU()
	res, err := runWorkers(ctx, t, n, d, f)
	self1 := selfCPU()
	if err != nil {
		return res, err
	}
	cs := CPUSample{Store: t.name(), Op: op, Size: size, Workers: n, Requests: res.requests, Bytes: res.bytes, Seconds: res.seconds,
		ServerCPU: -1, ClientCPU: self1 - self0}
	if pid > 0 && serr == nil {
		server1, err := ProcessCPU(pid)
		if err != nil {
			return res, fmt.Errorf("%s server (pid %d) CPU: %w", t.name(), pid, err)
		}
		cs.ServerCPU = server1 - server0
	} else if serr != nil {
		return res, fmt.Errorf("%s server (pid %d) CPU: %w", t.name(), pid, serr)
	}
	r.mu.Lock()
	r.m.CPU = append(r.m.CPU, cs)
	r.mu.Unlock()
	return res, nil
}

// runWorkers runs n workers at once, each calling op back to back (at
// least once) until d has passed; op returns the bytes it moved. Each
// worker's connection is opened first, untimed.
func runWorkers(ctx context.Context, t target, n int, d time.Duration, op func(ctx context.Context, worker int) (int, error)) (result, error) {
	if err := parallel(n, func(i int) error { return t.warm(ctx, i) }); err != nil {
		return result{}, fmt.Errorf("connect: %w", err)
	}
	moved := make([]int64, n)
	reqs := make([]int, n)
	per := make([]float64, n)
	start := time.Now()
	deadline := start.Add(d)
	err := parallel(n, func(i int) error {
		t0 := time.Now()
		for {
			m, err := op(ctx, i)
			if err != nil {
				return err
			}
			moved[i] += int64(m)
			reqs[i]++
			if !time.Now().Before(deadline) {
				break
			}
		}
		per[i] = float64(moved[i]) / time.Since(t0).Seconds()
		return nil
	})
	if err != nil {
		return result{}, err
	}
	wall := time.Since(start).Seconds()
	res := result{perWorker: per, seconds: wall}
	var total int64
	for i := range moved {
		total += moved[i]
		res.requests += reqs[i]
	}
	res.bytes = float64(total)
	res.aggregate = float64(total) / wall
	return res, nil
}

// parallel runs f(0..n-1) at once and returns the errors joined.
func parallel(n int, f func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f(i) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// payload is n bytes that do not compress (a store that compresses must
// not look faster than it is for real data).
func payload(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func minMax(v []float64) (lo, hi float64) {
	for i, x := range v {
		if i == 0 || x < lo {
			lo = x
		}
		if x > hi {
			hi = x
		}
	}
	return lo, hi
}
