package orchestrator

import (
	"strings"
	"sync"
	"time"

	"github.com/ziptrail/ziptrail/internal/engine"
	"github.com/ziptrail/ziptrail/internal/invocation"
)

// A restored checkpoint holds invocations that were dispatched and had not
// finished when it was saved. Their previous owner may have sent them and
// lost the answer (its sidecar then reports the outcome, FunctionFinished,
// to this owner), or never sent them (they were queued), or sent them to a
// pod that died. An invocation of which nothing is heard within
// RedispatchAfter of the restore is sent again, under the same id and
// attempt, so with the same idempotency key: the sidecar that ran it
// answers from its record, else the function runs again (at-least-once
// delivery, docs/guarantees.md).

// DefaultRedispatchAfter is Options.RedispatchAfter's default: long enough
// for the sidecars to reconnect and resend what they keep.
const DefaultRedispatchAfter = 15 * time.Second

type restoredCalls struct {
	mu      sync.Mutex
	pending map[string]engine.InFlight // by invocation id, nothing heard yet
}

// noteRestored remembers the restored invocations in flight.
func (o *Orchestrator) noteRestored() {
	list := o.engine.InFlight()
	if len(list) == 0 {
		return
	}
	o.restoredCalls.mu.Lock()
	defer o.restoredCalls.mu.Unlock()
	o.restoredCalls.pending = make(map[string]engine.InFlight, len(list))
	for _, c := range list {
		o.restoredCalls.pending[c.Invocation] = c
	}
}

// heard notes an event of an invocation: it reached a function (or its
// outcome arrived), so it is not sent again.
func (o *Orchestrator) heard(inv string) {
	r := &o.restoredCalls
	r.mu.Lock()
	if r.pending != nil {
		delete(r.pending, engine.BaseInvocation(inv))
	}
	r.mu.Unlock()
}

// redispatch sends again the restored invocations nothing was heard of.
func (o *Orchestrator) redispatch() {
	r := &o.restoredCalls
	r.mu.Lock()
	list := r.pending
	r.pending = nil
	r.mu.Unlock()
	o.send(list, "no outcome arrived after the operator restored the session")
}

// send sends the restored invocations again, those still outstanding.
func (o *Orchestrator) send(list map[string]engine.InFlight, why string) {
	for _, c := range list {
		if !o.engine.Outstanding(c.Session, c.Invocation) {
			continue
		}
		ns, wfName, _ := strings.Cut(c.Workflow, "/")
		env, err := invocation.RerunEnvelope(invocation.Envelope{Namespace: ns, Workflow: wfName, Function: v1alpha1ServiceName(wfName, c.Function),
			Session: c.Session, Invocation: c.Invocation}, c.Args)
		if err != nil {
			o.opts.Log.Error(err, "redispatch", "session", c.Session, "invocation", c.Invocation)
			continue
		}
		o.sessions.Log(c.Session, "Redispatched", "%s (%s): %s; sent again with the same idempotency key", c.Function, c.Invocation, why)
		redispatched.Inc()
		o.queue(env)
	}
}

// queuedIDs are the invocations decided and never sent: in the outbox, or
// queued in the dispatcher (after a drain).
func (o *Orchestrator) queuedIDs() []string {
	o.outMu.Lock()
	ids := make([]string, 0, len(o.outbox))
	for _, env := range o.outbox {
		ids = append(ids, env.Invocation)
	}
	o.outMu.Unlock()
	for _, env := range o.dispatcher.Pending() {
		ids = append(ids, env.Invocation)
	}
	return ids
}

// sendUnsent sends at once the restored invocations the previous owner's
// graceful stop left queued: nothing can be heard of them.
func (o *Orchestrator) sendUnsent() {
	if len(o.restoredUnsent) == 0 {
		return
	}
	r := &o.restoredCalls
	r.mu.Lock()
	now := map[string]engine.InFlight{}
	for _, id := range o.restoredUnsent {
		if c, ok := r.pending[id]; ok {
			now[id] = c
			delete(r.pending, id)
		}
	}
	r.mu.Unlock()
	o.restoredUnsent = nil
	o.send(now, "the previous owner's graceful stop left it queued")
}

// queue hands an envelope to the feed.
func (o *Orchestrator) queue(env *invocation.Envelope) {
	o.outMu.Lock()
	o.outbox = append(o.outbox, env)
	o.outMu.Unlock()
	select {
	case o.outSig <- struct{}{}:
	default:
	}
}
