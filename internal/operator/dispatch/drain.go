package dispatch

import "github.com/ziptrail/ziptrail/internal/invocation"

// Pending are the invocations queued and not taken by a worker (after a
// Drain: those that will not be sent).
func (d *Dispatcher) Pending() []*invocation.Envelope {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*invocation.Envelope(nil), d.queue...)
}

// Drain stops the workers from taking more invocations off the queue; the
// calls they are making go on, with the context Start was given, until
// they are answered or it ends. Wait returns once they are done. A graceful
// handover of the engine drains: the calls' outcomes reach the engine that
// made them, which saves them last, instead of being cut off mid-call.
// What is still queued stays with the engine's state (its invocations are
// recorded as dispatched) for the next owner.
func (d *Dispatcher) Drain() { d.drainOnce.Do(func() { close(d.drain) }) }

func (d *Dispatcher) isDraining() bool {
	select {
	case <-d.drain:
		return true
	default:
		return false
	}
}
