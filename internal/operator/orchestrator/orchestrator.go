// Package orchestrator runs the trigger engine inside the operator: it loads
// Workflows into the engine, starts sessions for the gateway, turns the
// engine's actions into dispatched invocations, session results and GC
// commands, feeds back what functions produce (objects in their responses or
// reported by sidecars over the control stream), drives the engine's clock,
// and checkpoints everything to Redis.
package orchestrator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/engine"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/invocation/call"
	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/dispatch"
	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// Options configure an Orchestrator.
type Options struct {
	Resolver dispatch.Resolver
	Ingress  string // see dispatch.Options.Ingress
	// Router, when set, sends invocations straight to a ready pod of the
	// function's revision (see dispatch.Options.Router, package
	// dispatch/direct).
	Router     call.Router
	Control    *control.Server
	Checkpoint *checkpoint.Store
	// TickInterval is how often the engine's clock advances (ByTime windows,
	// re-execution timeouts, deadlines); default 10ms.
	TickInterval time.Duration
	// CheckpointInterval is how often state is saved; default 1s.
	CheckpointInterval time.Duration
	// RedispatchAfter is how long after a restore an invocation in flight
	// of which nothing was heard is sent again (redispatch.go); default
	// DefaultRedispatchAfter.
	RedispatchAfter time.Duration
	// DrainTimeout bounds how long a graceful stop (shutdown, a demoted
	// bucket) waits for the calls in flight before the last save; default
	// 10s.
	DrainTimeout time.Duration
	// SaveTimeout bounds one save (default 5s): a checkpoint store that
	// does not answer (paused, partitioned) holds the engine's loop no
	// longer; the save is retried at the next tick while sessions run on.
	SaveTimeout time.Duration
	// CheckpointMaxShare bounds the share of the time the periodic saves
	// take: after a save that took d, the next one waits at least
	// d/CheckpointMaxShare. A save's cost follows the running sessions'
	// state (a shuffle keeping 17,000 objects takes ~40 ms to encode and
	// store), so without a bound a large state saved every 250 ms takes a
	// sixth of a core. Default DefaultCheckpointMaxShare; what a crash can
	// lose grows with it to max(CheckpointInterval, d/CheckpointMaxShare).
	CheckpointMaxShare float64
	Concurrency        int
	Log                logr.Logger
	Now                func() time.Time
	// Keys are the namespaces' reference keys (control.SecretKeys): the
	// gateway needs them to read results held by reference.
	Keys KeySource
	// Inputs holds session inputs over InlineInput (nil: such inputs are
	// refused with gateway.ErrInputTooLarge).
	Inputs *Inputs
	// InlineInput is the largest input that travels inline; default
	// DefaultInlineInput (64 KiB).
	InlineInput int64
	// ResultHold is how long a completed session's objects stay in their
	// pods for its result, held by reference, to be read whole. Default
	// 10m (the sidecars' object TTL).
	ResultHold time.Duration
	// ResultGrace is how long they stay after the result's first full
	// read when the client does not acknowledge it (an acknowledgement
	// frees them at once); default DefaultResultGrace (results.go).
	ResultGrace time.Duration
	// WorkflowExists, when set, is asked about a start of a workflow this
	// engine does not know: one that exists (and is not being deleted)
	// has not been handed to a new owner by its reconciler yet (a
	// takeover), and the start is answered 503 (retry), not 404.
	WorkflowExists func(ctx context.Context, namespace, name string) (bool, error)
	// LoadWorkflows, when set, lists the Workflows (the manager's cache)
	// for Run to load after restoring the checkpoint and before serving:
	// a sidecar's events resent to a new owner, and its restored
	// sessions, find their workflow instead of being refused while the
	// Workflow reconciler has not run yet (the sharded engine does the
	// same per bucket).
	LoadWorkflows func(ctx context.Context) ([]v1alpha1.Workflow, error)
	// Generation fences this orchestrator's checkpoints: they are written
	// at generations above Generation<<32 (a sharded bucket's Lease
	// transitions, so a later owner outranks every earlier one).
	Generation int64
	// Claim saves a checkpoint at once after restoring it, before serving:
	// a previous owner's late save is refused from then on.
	Claim bool
	// OnStarted is called once the checkpoint is restored (and claimed),
	// before the clock starts.
	OnStarted func()
	// Delegate hands the workflows' Immediate and ByName triggers to their
	// pods' sidecars, which fire them themselves (delegate.go); off: the
	// engine fires every trigger.
	Delegate bool
	// Limits are the per-namespace limits of the engine's sessions
	// (limits.go); zero: none. The input store's and the gateway's are
	// set on them (InputsOptions.PerNamespace, gateway.RateLimit).
	Limits Limits
	// LimitEvents, when set, records refusals by a limit as Kubernetes
	// Events on the workflow.
	LimitEvents *LimitEvents
	// pool accounts the engine's sessions per namespace: one for every
	// bucket's orchestrator of a Sharded (nil: New makes one).
	pool *engine.Pool
}

// Orchestrator connects the engine to the rest of the operator.
type Orchestrator struct {
	opts       Options
	engine     *engine.Engine
	sessions   *sessions.Registry
	dispatcher *dispatch.Dispatcher

	mu        sync.RWMutex
	workflows map[string]*workflowInfo
	gen       int64 // checkpoint generation

	// outbox decouples deciding an invocation from queueing it: execute
	// may run on a dispatcher worker, which must never block on its own
	// queue.
	outMu  sync.Mutex
	outbox []*invocation.Envelope
	outSig chan struct{}

	changes chan event.TypedGenericEvent[*v1alpha1.Workflow]

	keys *keyrings // reference keys and data-plane clients, per namespace
	// heldMu guards held: completed sessions whose result is held by
	// reference, so their objects stay until the result is read.
	heldMu   sync.Mutex
	held     map[string]*heldResult // by session
	heldRefs map[string]string      // result reference -> session

	// producers are the nodes of the pods that reported references
	// (ObjectReady), for the dispatcher's Ziptrail-Producer-Node.
	producers *producerNodes

	// counts are the triggers' firings and re-executions, for their
	// child Triggers' status (TriggerCounts).
	counts *triggerCounts

	// kept are the sidecars' kept reports to release after a save (acks.go).
	kept keptReleases
	// runCtx is Run's context: an invocation that failed because it ended
	// is lost with this orchestrator, not failed (its next owner
	// re-executes it per the re-execution rules).
	runCtx context.Context

	deleg delegations // delegated triggers per workflow (delegate.go)

	cp checkpointState // what the incremental saves keep (checkpoint.go)
	// waiters are the events' acknowledgements waiting for a save (acks.go).
	waiters saveWaiters
	// applying is the barrier between applications and snapshots
	// (applyBarrier, acks.go).
	applying sync.RWMutex
	// testHookInvoke, when set (tests only), is called as an invocation
	// is decided and before its arguments are recorded.
	testHookInvoke func(engine.Action)
	// fence is this owner's fence on its invocations, and the sidecars'
	// refusals of them (fence.go).
	fence fenceState
	// restoredCalls are the restored invocations in flight nothing was
	// heard of yet (redispatch.go).
	restoredCalls restoredCalls
	// unsent are the invocations a graceful stop left queued (its last
	// save records them); restoredUnsent are those a restore found.
	unsent, restoredUnsent []string
	// failing is the last save's error while saves fail (saveFailing).
	failing atomic.Pointer[error]
	// saveNow asks Run's loop for a save now (a started session waits
	// for it: durable.go); serving is closed while Run serves.
	saveNow             chan chan error
	serving, stopped    chan struct{}
	serveOnce, stopOnce sync.Once
	lastSave            error // Run's last save, read once stopped is closed
	restored            bool  // restore found a checkpoint
}

type workflowInfo struct {
	namespace, name string
	ready           bool
	notReady        string
	outputs         map[string][]string // function -> dependency buckets of its return value
}

// New builds an orchestrator; Run starts it.
func New(opts Options) (*Orchestrator, error) {
	if opts.TickInterval <= 0 {
		opts.TickInterval = 10 * time.Millisecond
	}
	if opts.CheckpointInterval <= 0 {
		opts.CheckpointInterval = time.Second
	}
	if opts.RedispatchAfter <= 0 {
		opts.RedispatchAfter = DefaultRedispatchAfter
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = 10 * time.Second
	}
	if opts.SaveTimeout <= 0 {
		opts.SaveTimeout = 5 * time.Second
	}
	if opts.CheckpointMaxShare <= 0 || opts.CheckpointMaxShare > 1 {
		opts.CheckpointMaxShare = DefaultCheckpointMaxShare
	}
	if opts.Checkpoint != nil {
		// Every owner writes as a writer of its own: the store lets a
		// writer write its generation again (a save that failed may have
		// landed), which must never let one owner pass for another that
		// shares its Store.
		opts.Checkpoint = opts.Checkpoint.NewWriter()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.InlineInput <= 0 {
		opts.InlineInput = DefaultInlineInput
	}
	if opts.ResultHold <= 0 {
		opts.ResultHold = 10 * time.Minute
	}
	o := &Orchestrator{opts: opts, engine: engine.New(0), sessions: sessions.NewRegistry(), workflows: map[string]*workflowInfo{}, outSig: make(chan struct{}, 1),
		changes: make(chan event.TypedGenericEvent[*v1alpha1.Workflow], 1024), keys: &keyrings{src: opts.Keys},
		held: map[string]*heldResult{}, heldRefs: map[string]string{}, producers: newProducerNodes(DefaultProducerNodes),
		counts: newTriggerCounts(), saveNow: make(chan chan error, 1024), serving: make(chan struct{}), stopped: make(chan struct{}),
		fence: fenceState{sig: make(chan struct{}, 1)}}
	o.sessions.Now = opts.Now
	o.sessions.Checkpointed = opts.Checkpoint != nil
	o.engine.TombstoneTTL = tombstoneTTL
	if opts.pool == nil {
		opts.pool = engine.NewPool(opts.Limits.Engine())
	}
	o.engine.SetPool(opts.pool)
	d, err := dispatch.New(dispatch.Options{Resolver: opts.Resolver, Ingress: opts.Ingress, Concurrency: opts.Concurrency,
		MaxBody: invocation.MaxEnvelopeBytes, OnResult: o.onResult, ProducerNode: o.producerNode, Fence: o.ownerFence, Router: opts.Router})
	if err != nil {
		return nil, err
	}
	o.dispatcher = d
	return o, nil
}

// SetControl connects the control-stream server (for GC commands); the
// server itself needs the orchestrator as its event sink, hence the setter.
func (o *Orchestrator) SetControl(s *control.Server) { o.opts.Control = s }

// Sessions is the registry the gateway serves.
func (o *Orchestrator) Sessions() *sessions.Registry { return o.sessions }

// Engine exposes the engine (benchmarks, tests).
func (o *Orchestrator) Engine() *engine.Engine { return o.engine }

// Run restores the last checkpoint, then drives the clock, the dispatcher
// and checkpoints until ctx ends.
func (o *Orchestrator) Run(ctx context.Context) error {
	o.runCtx = ctx
	// Stopped, its sessions no longer count against the namespaces'
	// limits of the replica (a sharded bucket moves on, restored and
	// counted by its next owner).
	defer o.engine.Release()
	defer o.stopOnce.Do(func() { close(o.stopped) })
	if err := o.restoreAndClaim(ctx); err != nil {
		o.lastSave = err // a start waiting for the first save is not held
		return err
	}
	o.setFence() // the claim's generation: on every invocation from now on (fence.go)
	o.noteRestored()
	o.loadWorkflows(ctx)
	if o.opts.OnStarted != nil {
		o.opts.OnStarted()
	}
	o.serveOnce.Do(func() { close(o.serving) })
	// The calls to functions outlive ctx by the drain (a graceful stop),
	// and no longer: a superseded owner (ErrStale) cuts them at once.
	dctx, cut := context.WithCancel(context.WithoutCancel(ctx))
	defer func() {
		o.dispatcher.Drain()
		cut()
		o.dispatcher.Wait()
	}()
	o.dispatcher.Start(dctx)
	// Queueing for the dispatcher ends with Run, a superseded owner's too.
	fctx, stopFeed := context.WithCancel(ctx)
	defer stopFeed()
	go o.feed(fctx)
	go o.refreshDelegations(fctx)
	o.sendUnsent()
	tick := time.NewTicker(o.opts.TickInterval)
	defer tick.Stop()
	save := time.NewTicker(o.opts.CheckpointInterval)
	defer save.Stop()
	prune := time.NewTicker(time.Minute)
	defer prune.Stop()
	redispatch := time.NewTimer(o.opts.RedispatchAfter) // restoredCalls
	defer redispatch.Stop()
	for {
		select {
		case <-redispatch.C:
			o.redispatch()
		case <-ctx.Done():
			o.drain(cut)
			o.unsent = o.queuedIDs()
			o.keys.close()
			if o.opts.Checkpoint != nil {
				// A last save so a clean handover loses nothing.
				o.lastSave = o.save(context.WithoutCancel(ctx), false)
			}
			return nil
		case <-tick.C:
			// A tick that decides nothing changes nothing a save needs
			// (its next owner's ticks do the same).
			release := o.applyBarrier()
			if acts := o.engine.Tick(o.opts.Now()); len(acts) > 0 {
				o.execute(acts)
			}
			release()
		case req := <-o.saveNow:
			if err := o.saveFor(ctx, req); errors.Is(err, checkpoint.ErrStale) {
				return o.supersede(err)
			}
		case <-o.fence.sig:
			// A function's sidecar refused an invocation: it saw a newer
			// owner's fence. Stop at once, as on a refused save (fence.go).
			if err := o.staleRefusals(ctx); err != nil {
				return o.supersede(err)
			}
		case <-save.C:
			if o.opts.Checkpoint == nil {
				break
			}
			if !o.cp.due(time.Now()) {
				// Saves spaced out (CheckpointMaxShare): the fence alone.
				if err := o.checkFence(ctx); errors.Is(err, checkpoint.ErrStale) {
					return o.supersede(err)
				}
				break
			}
			if err := o.periodicSave(ctx); errors.Is(err, checkpoint.ErrStale) {
				return o.supersede(err) // another operator leads now: stop driving the engine
			} else if err != nil {
				o.opts.Log.Error(err, "checkpoint")
			}
		case <-prune.C:
			o.sessions.Prune()
			o.releaseResults(false)
		}
	}
}

// restoreAndClaim restores the checkpoint and claims it before anything is
// served: the previous owner's late saves are refused from then on, and the
// sessions' invocation counters, moved past what it may have handed out
// (engine.SeqBlock), are saved before this owner hands out any. The claim
// holds only if nothing was saved since the load (a previous owner that
// does not know yet it lost the bucket, and acknowledged what it saved):
// else the checkpoint is loaded again.
func (o *Orchestrator) restoreAndClaim(ctx context.Context) error {
	for try := 1; ; try++ {
		if err := o.restore(ctx); err != nil {
			return err
		}
		if !(o.opts.Claim || o.restored) || o.opts.Checkpoint == nil {
			return nil
		}
		err := o.save(ctx, true)
		if err == nil {
			return nil
		}
		if !errors.Is(err, checkpoint.ErrChanged) || try == 5 {
			return fmt.Errorf("orchestrator: claim the checkpoint: %w", err)
		}
		o.opts.Log.Info("the checkpoint changed between its load and the claim (a previous owner saved): loading it again")
	}
}

// drain ends a graceful stop's calls: nothing more is dispatched, the
// calls in flight have DrainTimeout to be answered (their outcomes reach
// the engine, and the last save), then the rest are cut (their sidecars
// report their outcomes to the next owner).
func (o *Orchestrator) drain(cut context.CancelFunc) {
	o.dispatcher.Drain()
	done := make(chan struct{})
	go func() { o.dispatcher.Wait(); close(done) }()
	t := time.NewTimer(o.opts.DrainTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		o.opts.Log.Info("drain: calls still in flight were cut off; their sidecars report them to the next owner", "after", o.opts.DrainTimeout)
		cut()
		<-done
	}
}

// SetWorkflow loads or updates a workflow (called by the Workflow reconciler).
func (o *Orchestrator) SetWorkflow(wf *v1alpha1.Workflow, ready bool, notReady string) error {
	spec := engineSpec(wf)
	spec.Delegate = o.opts.Delegate
	if err := o.engine.SetWorkflow(spec); err != nil {
		return err
	}
	defer o.setDelegations(wf.Namespace, wf.Name, spec, ready)
	defer o.touch()
	o.counts.setWorkflow(spec)
	info := &workflowInfo{namespace: wf.Namespace, name: wf.Name, ready: ready, notReady: notReady, outputs: wf.Spec.OutputBuckets()}
	o.mu.Lock()
	o.workflows[Key(wf.Namespace, wf.Name)] = info
	o.mu.Unlock()
	return nil
}

// RemoveWorkflow forgets a deleted workflow.
func (o *Orchestrator) RemoveWorkflow(namespace, name string) {
	o.engine.RemoveWorkflow(Key(namespace, name))
	o.deleg.mu.Lock()
	delete(o.deleg.by, Key(namespace, name))
	o.deleg.mu.Unlock()
	o.counts.removeWorkflow(Key(namespace, name))
	o.touch()
	o.mu.Lock()
	delete(o.workflows, Key(namespace, name))
	o.mu.Unlock()
}

// Changes implements controllers.WorkflowSink: workflows whose session
// counts changed, so their status is refreshed.
func (o *Orchestrator) Changes() <-chan event.TypedGenericEvent[*v1alpha1.Workflow] { return o.changes }

// changed notes a session state change of a workflow (never blocks: a full
// channel already holds a pending refresh).
func (o *Orchestrator) changed(key string) {
	ns, name, _ := strings.Cut(key, "/")
	wf := &v1alpha1.Workflow{}
	wf.Namespace, wf.Name = ns, name
	select {
	case o.changes <- event.TypedGenericEvent[*v1alpha1.Workflow]{Object: wf}:
	default:
	}
}

func (o *Orchestrator) workflow(key string) *workflowInfo {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.workflows[key]
}

// StartSession starts a session with an input in memory; see Start.
func (o *Orchestrator) StartSession(ctx context.Context, namespace, name string, input []byte) (string, error) {
	return o.Start(ctx, namespace, name, bytes.NewReader(input), int64(len(input)))
}

// Start implements gateway.Starter: inputs up to InlineInput travel inline,
// larger ones are held in Inputs and travel by reference.
func (o *Orchestrator) Start(ctx context.Context, namespace, name string, input io.Reader, size int64) (string, error) {
	id, done, release, err := o.claimStart(ctx, namespace, name) // startkeys.go
	if done {
		return id, err // an earlier start with the same Idempotency-Key started it
	}
	defer release()
	key := Key(namespace, name)
	info := o.workflow(key)
	if info == nil {
		if o.opts.WorkflowExists != nil {
			if ok, err := o.opts.WorkflowExists(ctx, namespace, name); err != nil || ok {
				// A new owner whose reconciler has not handed it the
				// workflow yet (or the question failed): try again.
				return "", fmt.Errorf("%w: workflow %s is not loaded by this engine yet", gateway.ErrEngineMoving, key)
			}
		}
		return "", fmt.Errorf("%w: %s", gateway.ErrWorkflowNotFound, key)
	}
	if !info.ready {
		return "", fmt.Errorf("%w: %s: %s", gateway.ErrWorkflowNotReady, key, info.notReady)
	}
	// Refused before the input is read (StartSession decides for good).
	if err := o.engine.Pool().CheckStart(namespace); err != nil {
		return "", o.startRefused(key, err)
	}
	// The checkpoint store failing, a start could not be saved: refused
	// at once, before anything runs (503).
	if err := o.saveFailing(); err != nil {
		return "", fmt.Errorf("%w: the checkpoint store: %v", gateway.ErrNotSaved, err)
	}
	in, err := o.readInput(ctx, namespace, id, input, size)
	if err != nil {
		return "", o.startRefused(key, err)
	}
	if in.Ref == "" {
		in.Inline = nonNil(in.Inline)
	}
	unbar := o.applyBarrier()
	if err := o.sessions.Start(id, namespace, name); err != nil {
		unbar()
		o.dropInput(id)
		return "", err
	}
	acts, err := o.engine.StartSession(key, id, in, o.opts.Now())
	if err != nil {
		o.dropInput(id)
		if le := (*engine.LimitError)(nil); errors.As(err, &le) {
			o.sessions.Forget(id) // it never ran
			unbar()
			return "", o.startRefused(key, err)
		}
		_ = o.sessions.Finish(id, sessions.Failed, nil, err.Error())
		unbar()
		return "", err
	}
	o.changed(key)
	o.execute(acts)
	unbar() // before the wait: the save takes the barrier
	if err := o.durable(ctx); err != nil {
		if errors.Is(err, gateway.ErrNotSaved) && gateway.IdempotencyKey(ctx) == "" {
			// Its client is told it did not start (503): nothing of it
			// runs on. A keyed start runs on instead: its client sends
			// the start again with the same key (a 503 says so) and is
			// answered with this session once a checkpoint covers it, or
			// it starts afresh on a new owner that never saved it.
			unbar := o.applyBarrier()
			o.execute(o.engine.FailSession(id, err.Error(), o.opts.Now()))
			unbar()
		}
		return "", err
	}
	return id, nil
}
