package orchestrator

// The engine's actions carried out (invocations through the dispatcher)
// and what comes back: the dispatcher's results and the sidecars' events
// on the control stream.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ziptrail/ziptrail/internal/engine"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/operator/dispatch"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// execute carries out engine actions. Every change of the engine's
// sessions is followed by one (its actions may be none), which notes the
// change for the next checkpoint.
func (o *Orchestrator) execute(acts []engine.Action) {
	defer o.touch()
	for _, a := range acts {
		switch a.Kind {
		case engine.ActInvoke, engine.ActRerun:
			if a.Kind == engine.ActInvoke {
				o.counts.invoked(a, o.opts.Now())
			}
			o.invoke(a)
		case engine.ActSessionComplete:
			res := &sessions.Result{Bucket: a.Result.Bucket, Key: a.Result.Key, Size: a.Result.Size, Inline: a.Result.Inline, Ref: a.Result.Ref}
			if res.Size == 0 {
				res.Size = int64(len(res.Inline))
			}
			// A delegated firing whose claim came after the output is
			// counted by the engine, not by an ActInvoke.
			_ = o.sessions.Update(a.Session, func(s *sessions.Session) { s.Invocations = max(s.Invocations, a.Invocations) })
			_ = o.sessions.Finish(a.Session, sessions.Completed, res, "")
			o.holdResult(a.Workflow, a.Session, res)
			sessionsEnded.WithLabelValues(string(sessions.Completed)).Inc()
			o.changed(a.Workflow)
		case engine.ActSessionExpired:
			_ = o.sessions.Finish(a.Session, sessions.Expired, nil, "the session deadline passed")
			sessionsEnded.WithLabelValues(string(sessions.Expired)).Inc()
			o.changed(a.Workflow)
		case engine.ActSessionFailed:
			// The engine has ended it: nothing more runs, its objects go.
			_ = o.sessions.Finish(a.Session, sessions.Failed, nil, a.Reason)
			if a.Limit != "" {
				o.limitRefused(a.Workflow, a.Limit, "FailSession", fmt.Sprintf("session %s failed: %s", a.Session, a.Reason))
			}
			sessionsEnded.WithLabelValues(string(sessions.Failed)).Inc()
			o.changed(a.Workflow)
		case engine.ActDropObjects:
			o.dropInput(a.Session)
			if !o.dropPending(a.Session) { // else once its result is read
				// Not under the apply barrier: a slow sidecar holds the
				// broadcast up to the control server's SendTimeout.
				ns, _, _ := strings.Cut(a.Workflow, "/")
				go o.dropObjects(ns, a.Session)
			}
		}
	}
}

// invoke sends an Invoke or Rerun to the function's Knative Service.
func (o *Orchestrator) invoke(a engine.Action) {
	ns, wfName, _ := strings.Cut(a.Workflow, "/")
	env := &invocation.Envelope{Namespace: ns, Workflow: wfName, Function: v1alpha1ServiceName(wfName, a.Function), Session: a.Session,
		Invocation: a.Invocation, Attempt: a.Attempt, Trigger: a.Trigger, Group: a.Group}
	if a.Kind == engine.ActRerun {
		// A re-execution gets what its original invocation carried back:
		// objects, trigger, group.
		rerun, err := invocation.RerunEnvelope(*env, a.Args)
		if err != nil {
			o.execute(o.engine.FailSession(a.Session, err.Error(), o.opts.Now()))
			return
		}
		env = rerun
		if a.Speculative {
			o.sessions.Log(a.Session, "Rerun", "speculative copy of %s (attempt %d): most of its wave finished, it still runs", a.Function, a.Attempt)
			speculativeCopies.Inc()
		} else {
			o.sessions.Log(a.Session, "Rerun", "re-executing %s (attempt %d): its output is late", a.Function, a.Attempt)
		}
		reexecutions.Inc()
		o.counts.rerun(a)
	} else {
		for _, ob := range a.Objects {
			env.Objects = append(env.Objects, invocation.Object{Bucket: ob.Bucket, Key: ob.Key, Size: ob.Size, Ref: ob.Ref, Inline: ob.Inline, Metadata: ob.Metadata})
		}
		if a.Delegated {
			o.sessions.Log(a.Session, "Invoked", "%s with %d objects (trigger %s, by the producer's sidecar)", a.Function, len(env.Objects), a.Trigger)
		} else {
			o.sessions.Log(a.Session, "Invoked", "%s with %d objects (trigger %s)", a.Function, len(env.Objects), orEntry(a.Trigger))
		}
	}
	args, err := invocation.RerunArgs(env)
	if err != nil {
		o.execute(o.engine.FailSession(a.Session, fmt.Sprintf("invocation %s of %s: %v", a.Invocation, a.Function, err), o.opts.Now()))
		return
	}
	if o.testHookInvoke != nil {
		o.testHookInvoke(a)
	}
	o.execute(o.engine.FunctionStarted(a.Workflow, a.Session, a.Function, a.Invocation, args, o.opts.Now()))
	_ = o.sessions.Update(a.Session, func(s *sessions.Session) { s.Invocations++ })
	if a.Delegated {
		delegatedFirings.Inc() // the producer's sidecar sent it
		return
	}
	o.queue(env)
}

// feed moves decided invocations into the dispatcher's bounded queue.
func (o *Orchestrator) feed(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-o.outSig:
		}
		o.outMu.Lock()
		batch := o.outbox
		o.outbox = nil
		o.outMu.Unlock()
		for _, env := range batch {
			if err := o.dispatcher.SubmitWait(ctx, env); err != nil {
				if ctx.Err() != nil {
					return
				}
				// The dispatcher reported it through onResult: the engine
				// re-executes it or fails its session.
				o.opts.Log.Error(err, "dispatch", "function", env.Function, "session", env.Session)
			}
		}
	}
}

func orEntry(trigger string) string {
	if trigger == "" {
		return "entry"
	}
	return trigger
}

// v1alpha1ServiceName mirrors controllers.ServiceName without importing it.
func v1alpha1ServiceName(workflow, function string) string { return workflow + "-" + function }

// onResult feeds a function's response back into the engine: its objects
// first, then its return value, then that it finished with how many
// outputs it sent (those its sidecar reports on their own may come later;
// the engine waits for them). A failure, or a response that cannot be
// decoded, fails the session unless a re-execution rule covers the function.
func (o *Orchestrator) onResult(res dispatch.Result) {
	env := res.Envelope
	key := Key(env.Namespace, env.Workflow)
	fn := strings.TrimPrefix(env.Function, env.Workflow+"-")
	now := o.opts.Now()
	if res.Err != nil && o.runCtx != nil && o.runCtx.Err() != nil {
		return // stopping: its response is lost with this orchestrator, as in a crash
	}
	if o.fence.superseded.Load() {
		return // a newer owner has the session: what this one hears is lost with it
	}
	if errors.Is(res.Err, dispatch.ErrStaleOwner) {
		// The function did not run, and this owner is superseded: its
		// session is not failed (its next owner has it); Run stops.
		o.refusedAsStale(res)
		return
	}
	defer o.applyBarrier()()
	// Its sidecar's report, kept unsent, is released once a save holds
	// what the answer changes (run before the barrier is released).
	defer o.releaseKept(env.Namespace, res.Header)
	o.answered(env)
	o.heard(env.Invocation)
	if res.Err != nil {
		o.invocationFailed(key, env, fn, res.Err, now)
		return
	}
	var outs *invocation.Outputs
	if strings.HasPrefix(res.Header.Get("Content-Type"), invocation.OutputsContentType) {
		var err error
		if outs, err = invocation.DecodeOutputs(res.Body); err != nil {
			o.invocationFailed(key, env, fn, err, now)
			return
		}
	} else {
		outs = &invocation.Outputs{Return: res.Body}
	}
	sent := map[string]bool{} // distinct bucket/keys, as the engine counts them
	for _, ob := range outs.Objects {
		sent[ob.Bucket+"/"+ob.Key] = true
		o.objectReady(key, engine.Object{Bucket: ob.Bucket, Key: ob.Key, Session: env.Session, Size: ob.Len(), Ref: ob.Ref, Inline: ob.Inline,
			Metadata: ob.Metadata, Producer: fn, Invocation: env.Invocation, FiredLocally: ob.FiredLocally}, now)
	}
	o.returned(key, env.Session, fn, env.Invocation, outs.Return, sent, now)
	o.execute(o.engine.FunctionEnded(key, env.Session, fn, env.Invocation,
		engine.Finish{Outputs: len(sent) + invocation.OutputsSent(res.Header)}, now))
}

// invocationFailed tells the engine an invocation failed; with no
// re-execution rule for the function, the engine fails the session.
func (o *Orchestrator) invocationFailed(key string, env *invocation.Envelope, fn string, err error, now time.Time) {
	o.sessions.Log(env.Session, "InvokeFailed", "%s: %v", fn, err)
	o.execute(o.engine.FunctionEnded(key, env.Session, fn, env.Invocation, engine.Finish{Failed: true, Error: err.Error()}, now))
}

// objectReady hands an object to the engine; an error when a limit
// refused it (its session failed).
func (o *Orchestrator) objectReady(key string, obj engine.Object, now time.Time) error {
	var fresh bool
	acts := o.engine.ObjectReadyFresh(key, obj, now, &fresh)
	if fresh {
		// Counted once: a return value arrives both in the dispatcher's
		// response and in the sidecar's report, in either order.
		_ = o.sessions.Update(obj.Session, func(s *sessions.Session) { s.Objects++ })
		objectsReady.Inc()
	}
	o.execute(acts)
	return limitFailure(acts, obj.Session, fmt.Sprintf("object %s/%s", obj.Bucket, obj.Key))
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// ObjectReady implements control.Events: an object a sidecar reports. A
// reference is remembered with the reporting pod's node (the node its token
// names, see control.Identity) before the engine may invoke its consumer,
// so that consumer's request names the node to activator-ext.
func (o *Orchestrator) ObjectReady(ctx context.Context, from control.Identity, ev *controlv1.ObjectReady) error {
	if err := o.awaitServing(ctx); err != nil {
		return err
	}
	defer o.applyBarrier()()
	key := Key(from.Namespace, from.Workflow)
	if o.workflow(key) == nil {
		return fmt.Errorf("unknown workflow %s", key)
	}
	o.heard(ev.InvocationId)
	if from.Node != "" && ev.Ref != "" {
		o.producers.remember(from.Namespace, ev.Ref, from.Node)
	}
	return o.objectReady(key, engine.Object{Bucket: ev.Bucket, Key: ev.Key, Session: ev.Session, Size: ev.Size, Ref: ev.Ref, Inline: ev.Inline,
		Metadata: ev.Metadata, Producer: ev.ProducerFunction, Invocation: ev.InvocationId, FiredLocally: ev.FiredLocally}, o.opts.Now())
}

// FunctionStarted implements control.Events.
func (o *Orchestrator) FunctionStarted(ctx context.Context, from control.Identity, ev *controlv1.FunctionStarted) error {
	if err := o.awaitServing(ctx); err != nil {
		return err
	}
	defer o.applyBarrier()()
	o.heard(ev.InvocationId)
	acts := o.engine.FunctionStarted(Key(from.Namespace, from.Workflow), ev.Session, ev.Function, ev.InvocationId, ev.Args, o.opts.Now())
	o.execute(acts)
	return limitFailure(acts, ev.Session, "start of invocation "+ev.InvocationId)
}

// FunctionFinished implements control.Events.
func (o *Orchestrator) FunctionFinished(ctx context.Context, from control.Identity, ev *controlv1.FunctionFinished) error {
	if err := o.awaitServing(ctx); err != nil {
		return err
	}
	defer o.applyBarrier()()
	o.heard(ev.InvocationId)
	if o.engine.Settled(ev.Session, ev.InvocationId) {
		// The usual case for an invocation the engine dispatched: the
		// dispatcher's response was applied first; the sidecar's report
		// is for a new owner that lost that response.
		return nil
	}
	f := engine.Finish{Failed: ev.Failed, Error: ev.Error, Outputs: int(min(ev.OutputsSent, invocation.MaxOutputsSent))}
	key, now := Key(from.Namespace, from.Workflow), o.opts.Now()
	if ev.ReturnValue != nil && !ev.Failed {
		// An invocation a sidecar made itself (delegated firing): its
		// return value, which the dispatcher reads from the response
		// otherwise.
		sent := map[string]bool{}
		o.returned(key, ev.Session, ev.Function, ev.InvocationId, ev.ReturnValue, sent, now)
		f.Outputs += len(sent)
	}
	o.execute(o.engine.FunctionEnded(key, ev.Session, ev.Function, ev.InvocationId, f, now))
	return nil
}
