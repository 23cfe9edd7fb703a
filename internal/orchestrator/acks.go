package orchestrator

import (
	"sync"

	"github.com/ziptrail/ziptrail/internal/control"
)

// Durable acknowledgements (docs/guarantees.md). The control server
// acknowledges a sidecar's event only once a checkpoint holds what it
// changed; until then the sidecar keeps the event and sends it again to
// the next owner, which applies it idempotently (the engine keeps objects
// by bucket/key and finished invocations by id). Nothing on a step's
// critical path waits for a save: the engine acts on the event at once,
// only the sidecar's retention lasts until the save.
//
// Every change of the engine is followed by touch (cp.ver); a save covers
// every version it read before taking its snapshot. Saved hands out a
// channel closed by the first save that covers the version current when it
// was called.

// saveWaiters are the open Saved channels, by the version they wait for.
type saveWaiters struct {
	mu      sync.Mutex
	saved   uint64 // the highest version a save covered
	waiters []saveWaiter
}

type saveWaiter struct {
	ver uint64
	ch  chan struct{}
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
	v := o.cp.ver.Load()
	if v <= w.saved {
		return closedCh
	}
	if n := len(w.waiters); n > 0 && w.waiters[n-1].ver == v {
		return w.waiters[n-1].ch
	}
	ch := make(chan struct{})
	w.waiters = append(w.waiters, saveWaiter{ver: v, ch: ch})
	return ch
}

// covered notes that a save holds every change up to version ver and
// releases what waited for it.
func (o *Orchestrator) covered(ver uint64) {
	w := &o.waiters
	w.mu.Lock()
	defer w.mu.Unlock()
	if ver <= w.saved {
		return
	}
	w.saved = ver
	i := 0
	for ; i < len(w.waiters) && w.waiters[i].ver <= ver; i++ {
		close(w.waiters[i].ch)
	}
	w.waiters = append(w.waiters[:0:0], w.waiters[i:]...)
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
