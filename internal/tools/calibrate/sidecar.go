package calibrate

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	ziptrail "github.com/ziptrail/ziptrail/sdk/go"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// SidecarPath configures the measurement of the CPU a worker's transfers
// cost on the path a function really uses: the SDK (this process) → its
// pod's queue-proxy-zl (local API: unix socket, files in the pod's object
// directory) → the store, and back. The in-process measurements (the
// bandwidth grid, the rate probes) move bytes with bare clients (minio-go,
// go-redis, pull.Client) and miss the sidecar's own work: the copies
// between the function and the sidecar, its framing, the tier client in
// another process.
type SidecarPath struct {
	// Binary is the queue-proxy-zl to run (two of them, `--standalone`: a
	// producer pod's and a consumer pod's).
	Binary string
	// Workers is the number of the function's threads moving objects at
	// once, each through its own local-API connection (default 2).
	Workers int
	// Python, when set, is a python with the ziptrail SDK installed
	// (`pip install ./sdk/python`): the same points are then measured with
	// the Python SDK as the function (sdkpython.go), and the control path
	// with a real engine and Python functions (control.go).
	Python string
}

// sidecarSizes are the object sizes of the sidecar-path points: a sort's
// partitions (≈ 0.25–1 MB in bench/sort), its output partitions (16 MB)
// and between; at most 16 MB (a pod's object directory is /dev/shm, 64 MiB
// in a pod) and cfg.MaxObject.
func sidecarSizes(maxObject float64) []float64 {
	var out []float64
	for _, s := range []float64{256 * model.KB, 1 * model.MB, 4 * model.MB, 16 * model.MB} {
		if s <= maxObject {
			out = append(out, s)
		}
	}
	return out
}

// sidecarPod is one running queue-proxy-zl and an SDK client per worker on
// its local API.
type sidecarPod struct {
	cmd         *exec.Cmd
	socket, shm string // its local API and object directory
	clients     []*ziptrail.Client
}

// sidecars is the two pods of the sidecar-path points: a (the worker's
// own pod: tier puts and gets, pod-memory puts) and b (a consumer pulling
// a's objects).
type sidecars struct {
	a, b *sidecarPod
	tb   *servers.ProcessTB
}

// startSidecars runs two queue-proxy-zl processes with the run's Redis and
// S3 as their tiers, in one namespace (one keyring, so b may pull a's
// objects), each with its own object directory (in /dev/shm when there is
// one, as in a pod).
func startSidecars(cfg Config) (s *sidecars, err error) {
	tb := &servers.ProcessTB{}
	if _, err := os.Stat("/dev/shm"); err == nil {
		tb.Dir = "/dev/shm"
	}
	defer func() {
		if err != nil {
			tb.Close()
		}
	}()
	err = tb.Do(func() {
		dir := tb.TempDir()
		key := make([]byte, 32)
		_, _ = rand.Read(key)
		keys := filepath.Join(dir, "keys.json")
		if err := os.WriteFile(keys, []byte(`{"active":"k1","keys":{"k1":"`+base64.StdEncoding.EncodeToString(key)+`"}}`), 0o600); err != nil {
			tb.Fatal(err)
		}
		tiers := tierEnv(cfg)
		start := func(name string) *sidecarPod {
			p := runSidecar(tb, cfg.Sidecar.Binary, dir, name, keys, tiers, fmt.Sprintf("127.0.0.1:%d", servers.FreePort(tb)), "http://127.0.0.1:9")
			for range cfg.Sidecar.Workers {
				c, err := ziptrail.NewClient(ziptrail.Config{Socket: p.socket, ShmDir: p.shm})
				if err != nil {
					tb.Fatal(err)
				}
				tb.Cleanup(func() { c.Close() })
				p.clients = append(p.clients, c)
			}
			return p
		}
		s = &sidecars{a: start("a"), b: start("b"), tb: tb}
	})
	return s, err
}

func (s *sidecars) close() { s.tb.Close() }

// tierEnv is a sidecar's environment for the run's Redis and S3 as its
// tiers.
func tierEnv(cfg Config) []string {
	return []string{"ZIPTRAIL_REDIS_ADDR=" + cfg.Redis.Addr, "ZIPTRAIL_REDIS_PASSWORD=" + cfg.Redis.Password,
		"ZIPTRAIL_S3_ENDPOINT=" + cfg.S3.Endpoint, "ZIPTRAIL_S3_ACCESS_KEY=" + cfg.S3.AccessKey, "ZIPTRAIL_S3_SECRET_KEY=" + cfg.S3.SecretKey,
		"ZIPTRAIL_S3_BUCKET=" + cfg.S3.Bucket, fmt.Sprintf("ZIPTRAIL_S3_TLS=%t", cfg.S3.Secure)}
}

// runSidecar starts `binary --standalone` as pod name of namespace
// "calibrate" (object directory and local API socket in dir, keyring
// keys), with env added to its environment, invocations on listen
// forwarded to upstream, and waits (bounded) for its local API. tb stops
// it.
func runSidecar(tb *servers.ProcessTB, binary, dir, name, keys string, env []string, listen, upstream string) *sidecarPod {
	shm := filepath.Join(dir, name)
	sock := filepath.Join(dir, name+".sock")
	p := &sidecarPod{cmd: exec.Command(binary, "--standalone", "--listen", listen, "--upstream", upstream), socket: sock, shm: shm}
	p.cmd.Env = append(append(os.Environ(), "SERVING_NAMESPACE=calibrate", "SERVING_POD="+name, "SERVING_POD_IP=127.0.0.1",
		fmt.Sprintf("ZIPTRAIL_DATAPLANE_PORT=%d", servers.FreePort(tb)), "ZIPTRAIL_METRICS_PORT=0",
		"ZIPTRAIL_KEY_FILE="+keys, "ZIPTRAIL_SOCKET="+sock, "ZIPTRAIL_SHM_DIR="+shm), env...)
	var log bytes.Buffer // its stderr, shown if it does not start
	p.cmd.Stderr = &lockedWriter{w: &log}
	if err := p.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- p.cmd.Wait() }()
	tb.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-exited
	})
	// ready once its local API socket exists (bounded poll)
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		select {
		case err := <-exited:
			exited <- err
			tb.Fatalf("queue-proxy-zl exited at start: %v\n%s", err, p.cmd.Stderr.(*lockedWriter).String())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("queue-proxy-zl did not open its local API within 30 s\n%s", p.cmd.Stderr.(*lockedWriter).String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.cmd.Stderr.(*lockedWriter).discard()
	return p
}

// cpu is the two sidecars' CPU seconds.
func (s *sidecars) cpu() (float64, error) {
	var sum float64
	for _, p := range []*sidecarPod{s.a, s.b} {
		c, err := ProcessCPU(p.cmd.Process.Pid)
		if err != nil {
			return 0, fmt.Errorf("queue-proxy-zl's CPU: %w", err)
		}
		sum += c
	}
	return sum, nil
}

// lockedWriter keeps a sidecar's log until it has started (to show why
// it did not), then drops it (a line per object would drown the
// progress).
type lockedWriter struct {
	mu   sync.Mutex
	w    *bytes.Buffer
	drop bool
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.drop {
		l.w.Write(p)
	}
	return len(p), nil
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.String()
}

func (l *lockedWriter) discard() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.drop, l.w = true, nil
}

// sidecarPoint moves objects of size through the sidecar for about
// DurationPerPoint (timed batches, each worker size·k ≤ 32 MB at a time),
// and records the CPU of the timed parts: the store's server, both
// sidecars and this process (the SDK's side, as in a function):
//
//   - s3/redis write: TierPut into the tier through a; then (timed apart,
//     a sample of its own, op "delete") TierDelete of the batch's keys;
//   - s3/redis read: TierGet through a of objects put before (untimed);
//   - pod write: Put into a's own store (the producer's side; the objects
//     are then read back locally and dropped, untimed);
//   - pod read: b's Get of objects a holds (put untimed): a pull from the
//     producer pod over the data plane into b's object directory.
func (r *runner) sidecarPoint(ctx context.Context, store, op string, size float64) (string, error) {
	s := r.sidecar
	w := len(s.a.clients)
	per := max(1, int(32*model.MB/size))
	data := make([]byte, int(size))
	_, _ = rand.Read(data)
	tier := ziptrail.TierSlow
	if store == Redis {
		tier = ziptrail.TierFast
	}
	session := ziptrail.WithSession("calibrate")
	key := func(worker, i int) string { return fmt.Sprintf("sidecar-%s-%d-%d", FormatSize(size), worker, i) }
	var keys []string
	for wi := range w {
		for i := range per {
			keys = append(keys, key(wi, i))
		}
	}
	if store != Pod {
		defer func() { _ = s.a.clients[0].TierDelete(context.WithoutCancel(ctx), tier, keys, session) }()
	}
	// each is run by every worker on its batch: prepare untimed, then op timed, then after untimed
	refs := make([][]string, w)
	populated := false // a read point's tier objects, written once
	prepare := func(ctx context.Context, wi int) error {
		refs[wi] = refs[wi][:0]
		for i := range per {
			var err error
			switch {
			case store == Pod && op == Read:
				var ref string
				ref, err = s.a.clients[wi].Put(ctx, data, 1, session)
				refs[wi] = append(refs[wi], ref)
			case store != Pod && op == Read && !populated:
				_, err = s.a.clients[wi].TierPut(ctx, tier, key(wi, i), data, session)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	timed := func(ctx context.Context, wi int) error {
		for i := range per {
			var obj *ziptrail.Object
			var err error
			switch {
			case store == Pod && op == Write:
				var ref string
				ref, err = s.a.clients[wi].Put(ctx, data, 1, session)
				refs[wi] = append(refs[wi], ref)
			case store == Pod:
				obj, err = s.b.clients[wi].Get(ctx, refs[wi][i])
			case op == Write:
				_, err = s.a.clients[wi].TierPut(ctx, tier, key(wi, i), data, session)
			default:
				obj, err = s.a.clients[wi].TierGet(ctx, tier, key(wi, i), session)
			}
			if err != nil {
				return err
			}
			if obj != nil {
				if obj.Size != int64(len(data)) {
					obj.Close()
					return fmt.Errorf("got %d bytes, put %d", obj.Size, len(data))
				}
				obj.Close()
			}
		}
		return nil
	}
	after := func(ctx context.Context, wi int) error {
		if store == Pod && op == Write { // free a's store: read each object back in its own pod
			for _, ref := range refs[wi] {
				obj, err := s.a.clients[wi].Get(ctx, ref)
				if err != nil {
					return err
				}
				obj.Close()
			}
		}
		refs[wi] = refs[wi][:0]
		return nil
	}
	parallel := func(f func(context.Context, int) error) error {
		errs := make([]error, w)
		var wg sync.WaitGroup
		for wi := range w {
			wg.Go(func() { errs[wi] = f(ctx, wi) })
		}
		wg.Wait()
		return errors.Join(errs...)
	}

	// a tier's write point also times deleting what each batch wrote (the
	// shuffle library deletes every piece its consumer read)
	deleteBatch := func(ctx context.Context, wi int) error {
		ks := make([]string, per)
		for i := range per {
			ks[i] = key(wi, i)
		}
		return s.a.clients[wi].TierDelete(ctx, tier, ks, session)
	}
	pid, hasServer := r.cfg.ServerPIDs[store]
	newSample := func(op string) CPUSample {
		cs := CPUSample{Store: store, Op: op, Size: size, Workers: w, ServerCPU: -1}
		if hasServer {
			cs.ServerCPU = 0
		}
		return cs
	}
	// measure runs f on every worker and adds its time and CPU (server,
	// sidecars, this process) to cs
	measure := func(cs *CPUSample, f func(context.Context, int) error) error {
		var srv0, srv1 float64
		var err error
		if hasServer {
			if srv0, err = ProcessCPU(pid); err != nil {
				return err
			}
		}
		sc0, err := s.cpu()
		if err != nil {
			return err
		}
		self0, t0 := selfCPU(), time.Now()
		if err := parallel(f); err != nil {
			return err
		}
		cs.Seconds += time.Since(t0).Seconds()
		cs.ClientCPU += selfCPU() - self0
		sc1, err := s.cpu()
		if err != nil {
			return err
		}
		cs.SidecarCPU += sc1 - sc0
		if hasServer {
			if srv1, err = ProcessCPU(pid); err != nil {
				return err
			}
			cs.ServerCPU += srv1 - srv0
		}
		cs.Requests += w * per
		cs.Bytes += float64(w*per) * size
		return nil
	}
	sample, del := newSample(op), newSample(Delete)
	withDeletes := store != Pod && op == Write
	for sample.Seconds < r.cfg.DurationPerPoint.Seconds() || sample.Requests == 0 {
		if err := parallel(prepare); err != nil {
			return "", err
		}
		populated = true
		if err := measure(&sample, timed); err != nil {
			return "", err
		}
		if withDeletes {
			if err := measure(&del, deleteBatch); err != nil {
				return "", err
			}
		}
		if err := parallel(after); err != nil {
			return "", err
		}
	}
	r.m.SidecarPath = append(r.m.SidecarPath, sample)
	deletes := ""
	if withDeletes {
		r.m.SidecarPath = append(r.m.SidecarPath, del)
		deletes = fmt.Sprintf("; deleting them: %.2fs, %s per object", del.Seconds, FormatCPUSeconds(del.Total()/float64(del.Requests)))
	}
	server := "-"
	if sample.ServerCPU >= 0 {
		server = fmt.Sprintf("%.2fs", sample.ServerCPU)
	}
	return fmt.Sprintf("%s in %.2fs, %d requests; CPU: server %s, sidecars %.2fs, SDK %.2fs (%s in all)%s",
		FormatRate(sample.Bytes/sample.Seconds), sample.Seconds, sample.Requests, server, sample.SidecarCPU, sample.ClientCPU,
		FormatCPUPerByte(sample.Total()/sample.Bytes), deletes), nil
}
