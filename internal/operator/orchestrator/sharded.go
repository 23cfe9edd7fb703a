package orchestrator

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"knative.dev/pkg/reconciler"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/controllers"
	"github.com/ziptrail/ziptrail/internal/engine"
	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/control"
)

// Buckets is the ownership of engine buckets (sharding.Set).
type Buckets interface {
	// BucketOf names the bucket of workflow namespace/name.
	BucketOf(namespace, name string) string
	// Generation is the bucket's Lease transitions, read fresh.
	Generation(ctx context.Context, bucket string) (int64, error)
}

// ShardedOptions configure a Sharded engine.
type ShardedOptions struct {
	// Options are every bucket's orchestrator's; Checkpoint names the
	// Redis client and the key prefix: bucket b checkpoints to <Key>:<b>.
	Options
	Buckets Buckets
	// Identity is this replica's (Workflow.status.engine.owner).
	Identity string
	// Workflows lists every Workflow (the manager's cache): a promoted
	// bucket's are reconciled into its engine before it serves.
	Workflows func(ctx context.Context) ([]types.NamespacedName, error)
	// LoadTimeout bounds that wait (a workflow whose reconcile keeps
	// failing never reaches the engine); default 10s.
	LoadTimeout time.Duration
	// OnMove learns that this replica took (owned) or gave up a bucket,
	// after it serves it or before it stops (control streams of a bucket
	// given up are redirected there).
	OnMove func(bucket string, owned bool)
}

// Sharded runs one Orchestrator per engine bucket this replica owns
// (docs/sharding.md). It implements reconciler.LeaderAware for Knative's
// bucket elector, and everything the operator's other parts ask of an
// Orchestrator (the Workflow reconciler's sink, the control stream's
// events, the gateway's starter, sessions and results), routed by
// workflow to its bucket's orchestrator.
type Sharded struct {
	opts    ShardedOptions
	changes chan event.TypedGenericEvent[*v1alpha1.Workflow]

	ctxMu   sync.Mutex
	ctx     context.Context // Run's; nil before it runs
	started chan struct{}   // closed once ctx is set

	mu     sync.RWMutex
	shards map[string]*shard
	seq    map[string]*sync.Mutex // per bucket: Promote and Demote in turn
	wg     sync.WaitGroup
}

type shard struct {
	bucket string
	o      *Orchestrator
	cancel context.CancelFunc
	done   chan struct{}

	// mu is held shared while an event, start or result is applied, and
	// exclusively to stop serving: once Demote holds it, nothing more
	// reaches the engine before its last save.
	mu      sync.RWMutex
	serving bool
	stopped bool // Demote began: never serve again

	loadMu  sync.Mutex
	pending map[string]bool // workflows not yet in the engine
	loaded  chan struct{}   // closed when pending empties
}

var bucketsOwned = prometheus.NewGauge(prometheus.GaugeOpts{
	Name: "ziptrail_engine_buckets_owned",
	Help: "Engine buckets this operator replica owns and serves (docs/sharding.md).",
})

func init() { metrics.Registry.MustRegister(bucketsOwned) }

// NewSharded builds a sharded engine; Run starts it.
func NewSharded(opts ShardedOptions) (*Sharded, error) {
	if opts.Buckets == nil {
		return nil, fmt.Errorf("orchestrator: a sharded engine needs its Buckets")
	}
	if opts.LoadTimeout <= 0 {
		opts.LoadTimeout = 10 * time.Second
	}
	if opts.pool == nil {
		// One account of every bucket's sessions: the limits per
		// namespace hold across the buckets this replica serves.
		opts.pool = engine.NewPool(opts.Limits.Engine())
	}
	return &Sharded{opts: opts, changes: make(chan event.TypedGenericEvent[*v1alpha1.Workflow], 1024),
		shards: map[string]*shard{}, seq: map[string]*sync.Mutex{}, started: make(chan struct{})}, nil
}

// Run serves until ctx ends, then stops every bucket after a last save.
// Start the elections (sharding.Set.Run) with a context that outlives
// this one, so the Leases are released only after the last saves.
func (s *Sharded) Run(ctx context.Context) error {
	s.ctxMu.Lock()
	s.ctx = ctx
	s.ctxMu.Unlock()
	close(s.started)
	<-ctx.Done()
	s.mu.RLock()
	var names []string
	for b := range s.shards {
		names = append(names, b)
	}
	s.mu.RUnlock()
	for _, b := range names {
		s.demote(b)
	}
	s.wg.Wait()
	return nil
}

func (s *Sharded) runCtx() context.Context {
	s.ctxMu.Lock()
	defer s.ctxMu.Unlock()
	return s.ctx
}

func (s *Sharded) seqLock(bucket string) *sync.Mutex {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.seq[bucket]
	if m == nil {
		m = &sync.Mutex{}
		s.seq[bucket] = m
	}
	return m
}

// Promote implements reconciler.LeaderAware: this replica won bucket b.
// Its orchestrator restores b's checkpoint, claims it under the Lease's
// generation, and serves once b's workflows are in its engine. It never
// fails (Knative's elector exits the process on a Promote error): what
// goes wrong is logged and the bucket is not served.
func (s *Sharded) Promote(b reconciler.Bucket, _ func(reconciler.Bucket, types.NamespacedName)) error {
	bucket := b.Name()
	<-s.started // an election may be won before Run starts
	lk := s.seqLock(bucket)
	lk.Lock()
	defer lk.Unlock()
	ctx := s.runCtx()
	if ctx.Err() != nil {
		return nil // not running (yet, or any more): the Lease lapses to another replica
	}
	s.mu.RLock()
	_, have := s.shards[bucket]
	s.mu.RUnlock()
	if have {
		return nil
	}
	var gen int64
	for {
		var err error
		if gen, err = s.opts.Buckets.Generation(ctx, bucket); err == nil {
			break
		}
		s.opts.Log.Error(err, "read the bucket's generation", "bucket", bucket)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
	opts := s.opts.Options
	if opts.Checkpoint != nil {
		opts.Checkpoint = &checkpoint.Store{Client: opts.Checkpoint.Client, Key: opts.Checkpoint.Key + ":" + bucket}
	}
	opts.Generation, opts.Claim = gen, true
	opts.Log = opts.Log.WithValues("bucket", bucket)
	sh := &shard{bucket: bucket, done: make(chan struct{}), loaded: make(chan struct{})}
	opts.OnStarted = func() {
		sh.mu.Lock()
		if sh.stopped {
			sh.mu.Unlock()
			return
		}
		sh.serving = true
		sh.mu.Unlock()
		bucketsOwned.Inc()
		opts.Log.Info("serving the bucket", "generation", gen)
		if s.opts.OnMove != nil {
			s.opts.OnMove(bucket, true)
		}
	}
	o, err := New(opts)
	if err != nil {
		s.opts.Log.Error(err, "bucket orchestrator", "bucket", bucket)
		return nil
	}
	o.changes = s.changes
	sh.o = o
	sctx, cancel := context.WithCancel(ctx)
	sh.cancel = cancel
	s.mu.Lock()
	s.shards[bucket] = sh
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(sh.done)
		s.load(sctx, sh)
		for {
			err := o.Run(sctx)
			if err == nil || sctx.Err() != nil {
				return
			}
			sh.mu.Lock()
			served := sh.serving
			sh.serving = false
			sh.mu.Unlock()
			if served {
				// A newer owner saved (checkpoint.ErrStale): this replica
				// lost the bucket and hears of it from its elector next.
				bucketsOwned.Dec()
				if s.opts.OnMove != nil {
					s.opts.OnMove(bucket, false)
				}
				opts.Log.Error(err, "the bucket's engine stopped")
				return
			}
			// Restoring or claiming failed (Redis unreachable): the Lease
			// is held, so keep trying rather than leave the bucket unserved.
			opts.Log.Error(err, "restore the bucket; retrying")
			select {
			case <-sctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}()
	return nil
}

// load puts the bucket's workflows into its engine (through the Workflow
// reconciler, which Owns lets through now) and waits for them, at most
// LoadTimeout.
func (s *Sharded) load(ctx context.Context, sh *shard) {
	pending := map[string]bool{}
	var keys []types.NamespacedName
	if s.opts.Workflows != nil {
		var all []types.NamespacedName
		for deadline := time.Now().Add(s.opts.LoadTimeout); ; {
			var err error
			if all, err = s.opts.Workflows(ctx); err == nil || ctx.Err() != nil {
				break
			}
			if time.Now().After(deadline) {
				s.opts.Log.Error(err, "list the workflows; serving the bucket without waiting for them", "bucket", sh.bucket)
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
		for _, k := range all {
			if s.opts.Buckets.BucketOf(k.Namespace, k.Name) == sh.bucket {
				keys = append(keys, k)
				pending[Key(k.Namespace, k.Name)] = true
			}
		}
	}
	sh.loadMu.Lock()
	sh.pending = pending
	if len(pending) == 0 {
		close(sh.loaded)
	}
	sh.loadMu.Unlock()
	for _, k := range keys {
		wf := &v1alpha1.Workflow{}
		wf.Namespace, wf.Name = k.Namespace, k.Name
		select {
		case s.changes <- event.TypedGenericEvent[*v1alpha1.Workflow]{Object: wf}:
		case <-ctx.Done():
			return
		}
	}
	t := time.NewTimer(s.opts.LoadTimeout)
	defer t.Stop()
	select {
	case <-sh.loaded:
	case <-t.C:
		sh.loadMu.Lock()
		var missing []string
		for k := range sh.pending {
			missing = append(missing, k)
		}
		sh.loadMu.Unlock()
		sort.Strings(missing)
		s.opts.Log.Info("serving the bucket without workflows that did not reconcile in time", "bucket", sh.bucket, "workflows", missing)
	case <-ctx.Done():
	}
}

// loadedOne notes that workflow key reached (or left) its engine.
func (sh *shard) loadedOne(key string) {
	sh.loadMu.Lock()
	defer sh.loadMu.Unlock()
	if sh.pending == nil || !sh.pending[key] {
		return
	}
	delete(sh.pending, key)
	if len(sh.pending) == 0 {
		close(sh.loaded)
	}
}

// Demote implements reconciler.LeaderAware: this replica lost bucket b
// (or is stopping). Nothing more reaches b's engine, its control streams
// are redirected, and its orchestrator stops after a last save (refused
// if the next owner has claimed the bucket already).
func (s *Sharded) Demote(b reconciler.Bucket) { s.demote(b.Name()) }

func (s *Sharded) demote(bucket string) {
	lk := s.seqLock(bucket)
	lk.Lock()
	defer lk.Unlock()
	s.mu.RLock()
	sh := s.shards[bucket]
	s.mu.RUnlock()
	if sh == nil {
		return
	}
	sh.mu.Lock()
	was := sh.serving
	sh.serving, sh.stopped = false, true
	sh.mu.Unlock()
	if was {
		bucketsOwned.Dec()
		if s.opts.OnMove != nil {
			s.opts.OnMove(bucket, false)
		}
	}
	sh.cancel()
	<-sh.done
	s.mu.Lock()
	delete(s.shards, bucket)
	s.mu.Unlock()
	s.opts.Log.Info("gave up the bucket", "bucket", bucket)
}

// shardOf is the shard of workflow key, if this replica holds its bucket.
func (s *Sharded) shardOf(namespace, name string) *shard {
	b := s.opts.Buckets.BucketOf(namespace, name)
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.shards[b]
}

// serve runs f on the orchestrator of workflow namespace/name while its
// bucket is served here; else it reports control.ErrMoved.
func (s *Sharded) serve(namespace, name string, f func(o *Orchestrator) error) error {
	sh := s.shardOf(namespace, name)
	if sh == nil {
		return fmt.Errorf("workflow %s/%s: %w", namespace, name, control.ErrMoved)
	}
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	if !sh.serving {
		return fmt.Errorf("workflow %s/%s: %w", namespace, name, control.ErrMoved)
	}
	return f(sh.o)
}

// Serving reports whether workflow namespace/name's bucket is served by
// this replica now (routing: the control stream and the gateway).
func (s *Sharded) Serving(namespace, name string) bool {
	sh := s.shardOf(namespace, name)
	if sh == nil {
		return false
	}
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	return sh.serving
}

// Owns tells the Workflow reconciler which workflows are this replica's:
// those of the buckets it holds (serving or loading).
func (s *Sharded) Owns(key types.NamespacedName) bool {
	return s.shardOf(key.Namespace, key.Name) != nil
}

// OwnedBuckets are the buckets this replica serves, sorted.
func (s *Sharded) OwnedBuckets() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []string
	for b, sh := range s.shards {
		sh.mu.RLock()
		if sh.serving {
			out = append(out, b)
		}
		sh.mu.RUnlock()
	}
	sort.Strings(out)
	return out
}

// EngineStatus is Workflow.status.engine for a workflow of this replica.
func (s *Sharded) EngineStatus(namespace, name string) *v1alpha1.WorkflowEngine {
	return &v1alpha1.WorkflowEngine{Bucket: s.opts.Buckets.BucketOf(namespace, name), Owner: s.opts.Identity}
}

// SetControl connects the control-stream server (GC commands) to the
// buckets' orchestrators; call it before Run.
func (s *Sharded) SetControl(c *control.Server) { s.opts.Control = c }

// orchestrators are the served buckets' (sessions are looked up by id).
func (s *Sharded) orchestrators() []*Orchestrator {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*Orchestrator, 0, len(s.shards))
	for _, sh := range s.shards {
		out = append(out, sh.o)
	}
	return out
}

var _ controllers.ShardedSink = (*Sharded)(nil)
