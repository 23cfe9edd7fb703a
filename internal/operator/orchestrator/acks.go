package orchestrator

import (
	"net/http"
	"sync"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/control"
)

// Durable acknowledgements (docs/guarantees.md). The control server
// acknowledges a sidecar's event only once a checkpoint holds what it
// changed; until then the sidecar keeps the event and sends it again to
// the next owner, which applies it idempotently (the engine keeps objects
// by bucket/key and finished invocations by id). Nothing on a step's
// critical path waits for a save: the engine acts on the event at once,
// only the sidecar's retention lasts until the save.
//
// An acknowledgement waits for the first save whose snapshot is taken
// after it was asked for (Saved), not for one that covers a version
// number: an event may need nothing applied of its own because another
// goroutine has applied the same outcome and not yet finished (the
// dispatcher's response and the sidecar's FunctionFinished arrive
// together; the second finds the invocation settled), and a save that
// took its snapshot before that change but ended after it would
// acknowledge what no checkpoint holds. A snapshot is taken only between
// applications (the barrier, applying): what an event saw is in every
// snapshot taken after it.

// saveWaiters are the open Saved channels.
type saveWaiters struct {
	mu sync.Mutex
	// next is closed by the first save whose snapshot is taken after it
	// was handed out.
	next chan struct{}
	// carried were handed to a save that failed: the next confirmed save
	// closes them.
	carried []chan struct{}
}

// closedCh is the answer of Saved when nothing needs a save.
var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Saved implements control.Durability: a channel closed once a checkpoint
// holds everything applied so far (at once without checkpoints).
func (o *Orchestrator) Saved(control.Identity) <-chan struct{} { return o.afterSave() }

func (o *Orchestrator) afterSave() <-chan struct{} {
	if o.opts.Checkpoint == nil {
		return closedCh
	}
	w := &o.waiters
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.next == nil {
		w.next = make(chan struct{})
	}
	return w.next
}

// take hands a save about to take its snapshot (under the barrier) what
// waits for one.
func (w *saveWaiters) take() []chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.carried
	w.carried = nil
	if w.next != nil {
		out = append(out, w.next)
		w.next = nil
	}
	return out
}

// settle releases what a save took once the save is confirmed; a save
// that failed (or was refused) carries them to the next one.
func (w *saveWaiters) settle(chs []chan struct{}, saved bool) {
	if saved {
		for _, c := range chs {
			close(c)
		}
		return
	}
	if len(chs) == 0 {
		return
	}
	w.mu.Lock()
	w.carried = append(chs, w.carried...)
	w.mu.Unlock()
}

// applyBarrier is held (shared) while an event or a decision is applied:
// the engine's change, its actions (an invocation's arguments recorded, the
// session's registry entry) and touch. A save takes it exclusively for its
// snapshot, so that no snapshot holds half of an application: an
// invocation the engine decided and whose arguments are not recorded yet
// would be restored as never started, and nothing would ever send it again.
func (o *Orchestrator) applyBarrier() (release func()) {
	o.applying.RLock()
	return o.applying.RUnlock
}

// Saved implements control.Durability for the bucket's orchestrator of
// from's workflow. When this replica no longer serves it (the bucket was
// given up, or its engine stopped for a newer owner, between the event's
// application and this call), the channel never closes: no save of this
// replica is known to hold the event, so it is not acknowledged; the
// stream is moving, and the sidecar sends the event again to the next
// owner, which applies it idempotently.
func (s *Sharded) Saved(from control.Identity) <-chan struct{} {
	ch := neverCh
	_ = s.serve(from.Namespace, from.Workflow, func(o *Orchestrator) error { ch = o.afterSave(); return nil })
	return ch
}

// neverCh is never closed.
var neverCh <-chan struct{} = make(chan struct{})

var (
	_ control.Durability = (*Orchestrator)(nil)
	_ control.Durability = (*Sharded)(nil)
)

// Kept reports (controlclient/kept.go). A sidecar keeps the report of an
// invocation the dispatcher sent it unsent, naming it in its answer
// (invocation.HeaderOutcomeKept): the answer is the first copy of the
// outcome. Once a checkpoint holds what the answer changed, the report is
// released to its pod (one Saved message per pod and save); without the
// release the sidecar sends it, and this owner or the next applies it
// idempotently.

// keptReleases are the releases waiting for a save, by the channel of the
// save (afterSave) that holds them, then by namespace and pod.
type keptReleases struct {
	mu      sync.Mutex
	batches map[<-chan struct{}]map[string]map[string][]uint64
}

// releaseKept releases, after the next save, the report named by the
// answer h of an invocation of namespace. It is called while the answer's
// application holds the barrier, so that the save that closes the
// channel took its snapshot after the application.
func (o *Orchestrator) releaseKept(namespace string, h http.Header) {
	pod, id, ok := invocation.ParseKept(h)
	if !ok || o.opts.Control == nil {
		return
	}
	ch := o.afterSave()
	k := &o.kept
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.batches == nil {
		k.batches = map[<-chan struct{}]map[string]map[string][]uint64{}
	}
	b := k.batches[ch]
	if b == nil {
		b = map[string]map[string][]uint64{}
		k.batches[ch] = b
		var stop <-chan struct{}
		if o.runCtx != nil {
			stop = o.runCtx.Done()
		}
		go o.sendReleases(ch, stop)
	}
	if b[namespace] == nil {
		b[namespace] = map[string][]uint64{}
	}
	b[namespace][pod] = append(b[namespace][pod], id)
}

// sendReleases waits for the save ch and releases its batch; an owner that
// stops first releases nothing (the sidecars send their reports to the
// next one).
func (o *Orchestrator) sendReleases(ch <-chan struct{}, stop <-chan struct{}) {
	saved := true
	select {
	case <-ch:
	case <-stop:
		saved = false
	}
	k := &o.kept
	k.mu.Lock()
	b := k.batches[ch]
	delete(k.batches, ch)
	k.mu.Unlock()
	if !saved || o.fence.superseded.Load() {
		return
	}
	for ns, byPod := range b {
		o.opts.Control.ReleaseKept(ns, byPod)
	}
}
