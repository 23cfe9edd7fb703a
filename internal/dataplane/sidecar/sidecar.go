// Package sidecar is the ziptrail part of queue-proxy-zl: the pod's object
// store and Cap'n Proto producer server, the consumer client, and a handler
// wrapper that resolves references on incoming invocations (pulling the
// objects into the pod's shared memory) and turns large objects in outgoing
// function outputs into references (the bytes stay in this pod until a
// consumer pulls them). Requests without ziptrail content pass untouched.
package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/redis/go-redis/v9"

	"github.com/ziptrail/ziptrail/internal/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/controlclient"
	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/dataplane/tier"
	"github.com/ziptrail/ziptrail/internal/invocation"
)

// Config of a sidecar; FromEnv reads it from the pod's environment.
type Config struct {
	Namespace, Workflow, Function, Pod string
	PodIP                              string
	DataplanePort                      int    // Cap'n Proto server port (9192; Knative uses 9090/9091)
	ShmDir                             string // where resolved inputs are written for the function
	MemoryLimit                        int64  // store cap in bytes
	InlineThreshold                    int    // objects up to this size stay inline
	ObjectTTL                          time.Duration
	OperatorAddr                       string // control stream; empty: keys from KeyFile
	KeyFile                            string // JSON {"active": id, "keys": {id: base64}} for standalone use
	APISocket                          string // unix socket of the local API for the function; empty disables it
	MetricsPort                        int    // Prometheus /metrics of the data plane; 0 disables it
	// PutTimeout bounds how long a put waits for memory in a full pod
	// (no fast tier to spill to) before it fails with "store full".
	PutTimeout time.Duration
	// Tiers: Redis takes spilled objects, S3 the backup of unread objects
	// when the pod terminates. Nil tiers are disabled.
	Redis *tier.Redis
	S3    *tier.S3
	// BackupTimeout bounds the SIGTERM backup (inside Knative's drain).
	BackupTimeout time.Duration
}

// FromEnv builds a Config from Knative's and ziptrail's environment.
func FromEnv() Config {
	c := Config{
		Namespace: os.Getenv("SERVING_NAMESPACE"), Pod: os.Getenv("SERVING_POD"), PodIP: os.Getenv("SERVING_POD_IP"),
		Workflow: os.Getenv("ZIPTRAIL_WORKFLOW"), Function: os.Getenv("ZIPTRAIL_FUNCTION"),
		DataplanePort: envInt("ZIPTRAIL_DATAPLANE_PORT", 9192), ShmDir: envStr("ZIPTRAIL_SHM_DIR", "/dev/shm/ziptrail/objects"),
		MemoryLimit: int64(envInt("ZIPTRAIL_MEMORY_LIMIT", 256<<20)), InlineThreshold: envInt("ZIPTRAIL_INLINE_THRESHOLD", 64<<10),
		ObjectTTL:    time.Duration(envInt("ZIPTRAIL_OBJECT_TTL_SECONDS", 600)) * time.Second,
		OperatorAddr: os.Getenv("ZIPTRAIL_OPERATOR_ADDR"), KeyFile: os.Getenv("ZIPTRAIL_KEY_FILE"),
		APISocket: os.Getenv("ZIPTRAIL_SOCKET"), MetricsPort: envInt("ZIPTRAIL_METRICS_PORT", 9193),
	}
	if c.Function == "" {
		c.Function = os.Getenv("SERVING_SERVICE")
	}
	if c.APISocket == "" {
		// Knative sets queue-proxy's environment, so in a cluster only the
		// user container gets ZIPTRAIL_SOCKET: both agree on the path next
		// to the shared-memory object directory (/dev/shm/ziptrail).
		c.APISocket = filepath.Join(filepath.Dir(c.ShmDir), "sidecar.sock")
	}
	c.BackupTimeout = time.Duration(envInt("ZIPTRAIL_BACKUP_TIMEOUT_SECONDS", 25)) * time.Second
	c.PutTimeout = 30 * time.Second
	if d, err := time.ParseDuration(os.Getenv("ZIPTRAIL_PUT_TIMEOUT")); err == nil && d > 0 {
		c.PutTimeout = d
	}
	if addr := os.Getenv("ZIPTRAIL_REDIS_ADDR"); addr != "" {
		c.Redis = &tier.Redis{Client: redis.NewClient(&redis.Options{Addr: addr, Password: os.Getenv("ZIPTRAIL_REDIS_PASSWORD")}),
			Prefix: "zt:obj:" + c.Namespace + ":"}
	}
	if ep := os.Getenv("ZIPTRAIL_S3_ENDPOINT"); ep != "" {
		mc, err := minio.New(ep, &minio.Options{Creds: credentials.NewStaticV4(os.Getenv("ZIPTRAIL_S3_ACCESS_KEY"), os.Getenv("ZIPTRAIL_S3_SECRET_KEY"), ""),
			Secure: os.Getenv("ZIPTRAIL_S3_TLS") == "true"})
		if err == nil {
			c.S3 = &tier.S3{Client: mc, Bucket: envStr("ZIPTRAIL_S3_BUCKET", "ziptrail"), Prefix: c.Namespace + "/"}
		}
	}
	return c
}

func envStr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil {
		return v
	}
	return def
}

// Sidecar is one pod's data plane.
type Sidecar struct {
	cfg    Config
	Store  *store.Store
	keys   atomic.Pointer[ref.Keyring]
	server *pull.Server
	client *pull.Client
	ctl    *controlclient.Client
	api    *localapi.Server
	seq    atomic.Uint64
	ready  chan struct{} // closed once keys are known
	once   sync.Once

	backedUp chan struct{}
}

// New prepares a sidecar; Start runs its servers.
func New(cfg Config) *Sidecar {
	s := &Sidecar{cfg: cfg, Store: store.New(cfg.MemoryLimit, nil), ready: make(chan struct{}), backedUp: make(chan struct{})}
	if cfg.Redis != nil {
		s.Store.Spill = func(ctx context.Context, m store.Meta, data []byte) error {
			err := cfg.Redis.Put(ctx, m.ID, data, time.Until(m.Expires))
			spills.WithLabelValues(result(err)).Inc()
			if err == nil {
				spilledBytes.Add(float64(len(data)))
			}
			return err
		}
	}
	return s
}

// tiers is the read-through chain: Redis, then S3.
func (s *Sidecar) tiers() tier.Chain {
	var c tier.Chain
	if s.cfg.Redis != nil {
		c = append(c, s.cfg.Redis)
	}
	if s.cfg.S3 != nil {
		c = append(c, s.cfg.S3)
	}
	return c
}

// Backup copies every unread object to the slow tier (S3), so consumers
// can still read them after this pod is gone. It runs on SIGTERM.
func (s *Sidecar) Backup(ctx context.Context) (int, error) {
	if s.cfg.S3 == nil {
		return 0, nil
	}
	n := 0
	var errs []error
	for _, m := range s.Store.Unread() {
		data, _, ok := s.Store.Peek(m.ID)
		if !ok {
			continue
		}
		err := s.cfg.S3.Put(ctx, m.ID, data, 0)
		backups.WithLabelValues(result(err)).Inc()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// BackedUp is closed once the shutdown backup finished.
func (s *Sidecar) BackedUp() <-chan struct{} { return s.backedUp }

// Start listens for consumers, connects to the operator (or loads the key
// file) and runs until ctx ends.
func (s *Sidecar) Start(ctx context.Context) error {
	if s.cfg.KeyFile != "" {
		if err := s.loadKeyFile(); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(s.cfg.DataplanePort)))
	if err != nil {
		return fmt.Errorf("data plane listener: %w", err)
	}
	s.server = &pull.Server{Store: s.Store}
	if chain := s.tiers(); len(chain) > 0 && s.cfg.Redis != nil {
		s.server.Fallback = tier.Chain{s.cfg.Redis}
	}
	go func() {
		<-s.ready
		s.server.Keys = s.keys.Load()
		_ = s.server.Serve(ln)
	}()
	if s.cfg.OperatorAddr != "" {
		s.ctl = controlclient.NewClient(s.cfg.OperatorAddr, &controlv1.Hello{Namespace: s.cfg.Namespace, Workflow: s.cfg.Workflow,
			Function: s.cfg.Function, Pod: s.cfg.Pod, DataplaneAddr: s.addr()},
			controlclient.Commands{
				Keys: func(k *controlv1.Keys) { _ = s.setKeys(k) },
				Drop: func(d *controlv1.DropObjects) { s.Store.DropSession(d.Session) },
				KeepAlive: func(k *controlv1.KeepAlive) {
					for _, r := range k.Refs {
						if kr := s.keys.Load(); kr != nil {
							if rec, err := kr.Open(r, time.Now()); err == nil {
								s.Store.Extend(rec.Key, time.Now().Add(time.Duration(k.ExtendMs)*time.Millisecond))
							}
						}
					}
				}})
		go func() { _ = s.ctl.Run(ctx) }()
	}
	stopMetrics := func() {}
	if s.cfg.MetricsPort != 0 {
		if stopMetrics, err = s.serveMetrics(); err != nil {
			_ = ln.Close()
			return fmt.Errorf("metrics listener: %w", err)
		}
	}
	if s.cfg.APISocket != "" {
		if err := s.serveLocalAPI(); err != nil {
			_ = ln.Close()
			stopMetrics()
			return err
		}
	}
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				// SIGTERM: Knative drains for a while before stopping the
				// servers; back unread objects up meanwhile, then close.
				bctx, cancel := context.WithTimeout(context.Background(), s.cfg.BackupTimeout)
				_, _ = s.Backup(bctx)
				cancel()
				close(s.backedUp)
				_ = ln.Close()
				if s.api != nil {
					s.api.Stop()
				}
				stopMetrics()
				return
			case <-t.C:
				s.Store.Sweep()
			}
		}
	}()
	return nil
}

// serveLocalAPI starts the function container's API on its unix socket;
// object files go through the shared-memory directory.
func (s *Sidecar) serveLocalAPI() error {
	if err := os.MkdirAll(s.cfg.ShmDir, 0o777); err != nil {
		return fmt.Errorf("shared-memory directory: %w", err)
	}
	api := &localapi.Server{Store: s.Store, Addr: s.addr(), Dir: s.cfg.ShmDir, Namespace: s.cfg.Namespace, Function: s.cfg.Function,
		TTL: s.cfg.ObjectTTL, InlineThreshold: s.cfg.InlineThreshold, MaxObjectBytes: s.cfg.MemoryLimit, PutTimeout: s.cfg.PutTimeout,
		Keys: func(ctx context.Context) (*ref.Keyring, error) {
			if err := s.waitKeys(ctx); err != nil {
				return nil, err
			}
			return s.keys.Load(), nil
		},
		Pull: func(ctx context.Context, r string, dst func(size int64) (io.WriterAt, error)) (pull.Info, error) {
			if err := s.waitKeys(ctx); err != nil {
				return pull.Info{}, err
			}
			return s.client.PullTo(ctx, r, dst)
		},
	}
	if s.cfg.Redis != nil {
		api.Spilled = tier.Chain{s.cfg.Redis}
	}
	if s.cfg.S3 != nil {
		api.Persist = s.cfg.S3
	}
	if s.ctl != nil {
		api.Report = func(ev *controlv1.ObjectReady) error {
			return s.ctl.Send(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_ObjectReady{ObjectReady: ev}})
		}
	}
	ln, err := localapi.Listen(s.cfg.APISocket)
	if err != nil {
		return err
	}
	s.api = api
	go func() { _ = api.Serve(ln) }()
	return nil
}

func (s *Sidecar) putTimeout() time.Duration {
	if s.cfg.PutTimeout > 0 {
		return s.cfg.PutTimeout
	}
	return 30 * time.Second
}

func (s *Sidecar) addr() string {
	return net.JoinHostPort(s.cfg.PodIP, strconv.Itoa(s.cfg.DataplanePort))
}

func (s *Sidecar) setKeys(k *controlv1.Keys) error {
	keys := map[string][]byte{}
	for _, key := range k.Keys {
		keys[key.Id] = key.Secret
	}
	if kr := s.keys.Load(); kr != nil {
		return kr.Set(keys, k.ActiveKeyId)
	}
	kr, err := ref.NewKeyring(s.cfg.Namespace, keys, k.ActiveKeyId)
	if err != nil {
		return err
	}
	s.keys.Store(kr)
	client := &pull.Client{Keys: kr}
	if chain := s.tiers(); len(chain) > 0 {
		client.Fallback = chain
	}
	s.client = client
	s.once.Do(func() { close(s.ready) })
	return nil
}

func (s *Sidecar) loadKeyFile() error {
	data, err := os.ReadFile(s.cfg.KeyFile)
	if err != nil {
		return fmt.Errorf("key file: %w", err)
	}
	var f struct {
		Active string            `json:"active"`
		Keys   map[string][]byte `json:"keys"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return fmt.Errorf("key file %s: %w", s.cfg.KeyFile, err)
	}
	k := &controlv1.Keys{ActiveKeyId: f.Active}
	for id, secret := range f.Keys {
		k.Keys = append(k.Keys, &controlv1.Key{Id: id, Secret: secret})
	}
	return s.setKeys(k)
}

// waitKeys blocks until the operator sent the namespace's keys.
func (s *Sidecar) waitKeys(ctx context.Context) error {
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("no reference keys from the operator yet: %w", ctx.Err())
	}
}

// Wrap returns the handler chain extension: resolve inputs on the way in,
// turn large outputs into references on the way out.
func (s *Sidecar) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.Header.Get("Content-Type"), invocation.ContentType) {
			next.ServeHTTP(w, r) // a stock request: exactly as queue-proxy does
			return
		}
		env, err := invocation.Decode(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		dir, err := s.resolve(r.Context(), env)
		if dir != "" {
			defer os.RemoveAll(dir) // the function is done with its inputs
		}
		if err != nil {
			// 424: the invocation cannot run without its inputs; the
			// header names the error class for the caller's SDK.
			if reason := localapi.ReasonOf(err); reason != "" {
				w.Header().Set(invocation.HeaderErrorReason, reason)
			}
			http.Error(w, "ziptrail: resolve inputs: "+err.Error(), http.StatusFailedDependency)
			return
		}
		body, _ := json.Marshal(env)
		r2 := r.Clone(r.Context())
		r2.Body = io.NopCloser(bytes.NewReader(body))
		r2.ContentLength = int64(len(body))
		r2.Header.Set("Content-Length", strconv.Itoa(len(body)))
		rec := &recorder{header: http.Header{}, code: http.StatusOK}
		next.ServeHTTP(rec, r2)
		// Objects the function sent through the local API are reported on
		// their own: the response says how many, so none is missed.
		s.api.MarkOutputsSent(rec.header, env.Session, env.Invocation)
		out := rec.body.Bytes()
		if rec.code == http.StatusOK && strings.HasPrefix(rec.header.Get("Content-Type"), invocation.OutputsContentType) {
			if out, err = s.externalize(r.Context(), env, out); err != nil {
				http.Error(w, "ziptrail: store outputs: "+err.Error(), http.StatusInsufficientStorage)
				return
			}
		}
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(out)))
		w.WriteHeader(rec.code)
		_, _ = w.Write(out)
	})
}

// resolve pulls every referenced input into the shared-memory directory.
func (s *Sidecar) resolve(ctx context.Context, env *invocation.Envelope) (string, error) {
	var refs []int
	for i, o := range env.Objects {
		if o.Ref != "" && o.Inline == nil {
			refs = append(refs, i)
		}
	}
	if len(refs) == 0 {
		return "", nil
	}
	if err := s.waitKeys(ctx); err != nil {
		return "", err
	}
	dir := filepath.Join(s.cfg.ShmDir, fmt.Sprintf("inv-%d", s.seq.Add(1)))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	errs := make(chan error, len(refs))
	for _, i := range refs {
		go func() {
			o := &env.Objects[i]
			path := filepath.Join(dir, strconv.Itoa(i))
			f, err := os.Create(path)
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			_, err = s.client.PullTo(ctx, o.Ref, func(size int64) (io.WriterAt, error) { return f, f.Truncate(size) })
			if err != nil {
				errs <- fmt.Errorf("%s/%s: %w", o.Bucket, o.Key, err)
				return
			}
			o.Path = path
			errs <- nil
		}()
	}
	var all []error
	for range refs {
		all = append(all, <-errs)
	}
	return dir, errors.Join(all...)
}

// externalize moves large inline outputs into the store and references them.
func (s *Sidecar) externalize(ctx context.Context, env *invocation.Envelope, body []byte) ([]byte, error) {
	outs, err := invocation.DecodeOutputs(body)
	if err != nil {
		return nil, err
	}
	changed := false
	for i := range outs.Objects {
		o := &outs.Objects[i]
		if len(o.Inline) <= s.cfg.InlineThreshold {
			continue
		}
		if err := s.waitKeys(ctx); err != nil {
			return nil, err
		}
		id := fmt.Sprintf("%s/%s/%s/%d", env.Session, o.Bucket, o.Key, s.seq.Add(1))
		exp := time.Now().Add(s.cfg.ObjectTTL)
		putCtx, cancel := context.WithTimeout(ctx, s.putTimeout())
		// Outputs may be read by several targets: they live until the
		// session is collected or the TTL passes.
		err := s.Store.Put(putCtx, store.Meta{ID: id, Session: env.Session, Bucket: o.Bucket, Key: o.Key, Reads: math.MaxUint32, Expires: exp}, o.Inline)
		cancel()
		if err != nil {
			return nil, err
		}
		r, err := s.keys.Load().Seal(ref.Record{Addr: s.addr(), Key: id, Expires: exp, Reads: math.MaxUint32})
		if err != nil {
			return nil, err
		}
		o.Size, o.Ref, o.Inline = int64(len(o.Inline)), r, nil
		changed = true
	}
	if !changed {
		return body, nil
	}
	return json.Marshal(outs)
}

// recorder buffers the function's response so outputs can be rewritten.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) WriteHeader(code int)        { r.code = code }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
