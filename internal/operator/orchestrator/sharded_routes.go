package orchestrator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// What the rest of the operator asks of the engine, each routed to the
// orchestrator of the workflow's bucket.

// SetWorkflow implements controllers.WorkflowSink (the reconciler calls it
// only for workflows this replica Owns).
func (s *Sharded) SetWorkflow(wf *v1alpha1.Workflow, ready bool, notReady string) error {
	sh := s.shardOf(wf.Namespace, wf.Name)
	if sh == nil {
		return nil // another replica's: its reconciler loads it
	}
	err := sh.o.SetWorkflow(wf, ready, notReady)
	sh.loadedOne(Key(wf.Namespace, wf.Name))
	return err
}

// RemoveWorkflow implements controllers.WorkflowSink.
func (s *Sharded) RemoveWorkflow(namespace, name string) {
	if sh := s.shardOf(namespace, name); sh != nil {
		sh.o.RemoveWorkflow(namespace, name)
		sh.loadedOne(Key(namespace, name))
	}
}

// SessionCounts implements controllers.WorkflowSink.
func (s *Sharded) SessionCounts(namespace, name string) v1alpha1.SessionCounts {
	if sh := s.shardOf(namespace, name); sh != nil {
		return sh.o.SessionCounts(namespace, name)
	}
	return v1alpha1.SessionCounts{}
}

// TriggerCounts implements controllers.WorkflowSink.
func (s *Sharded) TriggerCounts(namespace, name string) map[string]v1alpha1.TriggerStatus {
	if sh := s.shardOf(namespace, name); sh != nil {
		return sh.o.TriggerCounts(namespace, name)
	}
	return nil
}

// Changes implements controllers.WorkflowSink: every bucket's changes, and
// the workflows of a bucket just promoted.
func (s *Sharded) Changes() <-chan event.TypedGenericEvent[*v1alpha1.Workflow] { return s.changes }

// ObjectReady implements control.Events.
func (s *Sharded) ObjectReady(ctx context.Context, from control.Identity, ev *controlv1.ObjectReady) error {
	return s.serve(from.Namespace, from.Workflow, func(o *Orchestrator) error { return o.ObjectReady(ctx, from, ev) })
}

// FunctionStarted implements control.Events.
func (s *Sharded) FunctionStarted(ctx context.Context, from control.Identity, ev *controlv1.FunctionStarted) error {
	return s.serve(from.Namespace, from.Workflow, func(o *Orchestrator) error { return o.FunctionStarted(ctx, from, ev) })
}

// FunctionFinished implements control.Events.
func (s *Sharded) FunctionFinished(ctx context.Context, from control.Identity, ev *controlv1.FunctionFinished) error {
	return s.serve(from.Namespace, from.Workflow, func(o *Orchestrator) error { return o.FunctionFinished(ctx, from, ev) })
}

// SessionNamespace implements control.SessionScope.
func (s *Sharded) SessionNamespace(session string) (string, bool) {
	for _, o := range s.orchestrators() {
		if ns, ok := o.SessionNamespace(session); ok {
			return ns, true
		}
	}
	return "", false
}

// Start implements gateway.Starter. A workflow whose bucket is not served
// here (being taken over) is refused with gateway.ErrEngineMoving (503,
// retry); the gateway's router sends starts of other replicas' workflows
// to them before they get here.
func (s *Sharded) Start(ctx context.Context, namespace, name string, input io.Reader, size int64) (string, error) {
	var id string
	err := s.serve(namespace, name, func(o *Orchestrator) error {
		var err error
		id, err = o.Start(ctx, namespace, name, input, size)
		return err
	})
	if errors.Is(err, control.ErrMoved) {
		return "", fmt.Errorf("%w: %v", gateway.ErrEngineMoving, err)
	}
	return id, err
}

// StartSession starts a session with an input in memory (tests).
func (s *Sharded) StartSession(ctx context.Context, namespace, name string, input []byte) (string, error) {
	return s.Start(ctx, namespace, name, bytes.NewReader(input), int64(len(input)))
}

// Sessions is the gateway's view of the sessions of every bucket served
// here (gateway.SessionStore).
func (s *Sharded) Sessions() gateway.SessionStore { return shardedSessions{s} }

type shardedSessions struct{ s *Sharded }

// find is the registry holding session id.
func (ss shardedSessions) find(id string) (*sessions.Registry, error) {
	sh, err := ss.findShard(id)
	if err != nil {
		return nil, err
	}
	return sh.o.sessions, nil
}

// findShard is the shard whose registry holds session id.
func (ss shardedSessions) findShard(id string) (*shard, error) {
	ss.s.mu.RLock()
	defer ss.s.mu.RUnlock()
	for _, sh := range ss.s.shards {
		if _, err := sh.o.sessions.Get(id); err == nil {
			return sh, nil
		}
	}
	return nil, sessions.ErrNotFound
}

func (ss shardedSessions) Get(id string) (sessions.Session, error) {
	r, err := ss.find(id)
	if err != nil {
		return sessions.Session{}, err
	}
	return r.Get(id)
}

func (ss shardedSessions) List(namespace, workflow string) []sessions.Session {
	var out []sessions.Session
	for _, o := range ss.s.orchestrators() {
		out = append(out, o.sessions.List(namespace, workflow)...)
	}
	sessions.SortNewestFirst(out) // as one registry lists them
	return out
}

// Wait waits for session id to end, or for its bucket to leave this
// replica: then it returns the session as last seen here with
// gateway.ErrEngineMoving, at once, so that a caller waiting through the
// gateway asks again (and is routed to the new owner) instead of waiting
// out its timeout on a copy nothing updates any more.
func (ss shardedSessions) Wait(ctx context.Context, id string) (sessions.Session, error) {
	sh, err := ss.findShard(id)
	if err != nil {
		return sessions.Session{}, err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-sh.done: // Demote, or a newer owner's claim, stopped the bucket's engine
			cancel()
		case <-wctx.Done():
		}
	}()
	s, err := sh.o.sessions.Wait(wctx, id)
	if err != nil && ctx.Err() == nil {
		return s, fmt.Errorf("session %s: %w", id, gateway.ErrEngineMoving)
	}
	return s, err
}

func (ss shardedSessions) Watch(id string) (sessions.Session, <-chan struct{}, error) {
	r, err := ss.find(id)
	if err != nil {
		return sessions.Session{}, nil, err
	}
	return r.Watch(id)
}

// Results reads the results of every bucket served here
// (gateway.ResultReader).
func (s *Sharded) Results() gateway.ResultReader { return shardedResults{s} }

type shardedResults struct{ s *Sharded }

// OpenResult reads through the orchestrator that holds the result (so
// reading it whole releases its session's objects there).
func (sr shardedResults) OpenResult(ctx context.Context, namespace string, res *sessions.Result) (io.ReadCloser, error) {
	all := sr.s.orchestrators()
	if res != nil && res.Ref != "" {
		for _, o := range all {
			if o.holds(res.Ref) {
				return o.Results().OpenResult(ctx, namespace, res)
			}
		}
	}
	if len(all) == 0 {
		return Results{}.OpenResult(ctx, namespace, res)
	}
	return all[0].Results().OpenResult(ctx, namespace, res)
}

// holds reports whether result reference ref is held for reading here.
func (o *Orchestrator) holds(ref string) bool {
	o.heldMu.Lock()
	defer o.heldMu.Unlock()
	_, ok := o.heldRefs[ref]
	return ok
}
