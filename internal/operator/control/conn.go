package control

import (
	"sync"

	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// conn is one sidecar's control stream as the server holds it: where its
// messages go, and the events it reported that wait for their
// acknowledgement (Durability).
type conn struct {
	id      Identity
	sid     uint64 // the stream's id in the directory
	out     chan *controlv1.OperatorMessage
	gone    chan struct{}
	once    sync.Once
	ackWake chan struct{}
	// pending are the events processed but not acknowledged yet, in seq
	// order, each with what its acknowledgement waits for (Durability).
	pendMu  sync.Mutex
	pending []pendingAck
	// moved is closed (once, with redirect set) when the stream's bucket
	// moved away (Server.Moved): the sender sends redirect and ends it.
	moved    chan struct{}
	moveOnce sync.Once
	redirect *controlv1.Redirect
}

func (c *conn) close() { c.once.Do(func() { close(c.gone) }) }

// pendingAck is a processed event waiting for its acknowledgement.
type pendingAck struct {
	seq   uint64
	saved <-chan struct{} // nil: nothing to wait for
}

// processed notes that the event seq was handled; its acknowledgement
// waits for saved.
func (c *conn) processed(seq uint64, saved <-chan struct{}) {
	c.pendMu.Lock()
	c.pending = append(c.pending, pendingAck{seq: seq, saved: saved})
	c.pendMu.Unlock()
	unackedEvents.Inc()
	select {
	case c.ackWake <- struct{}{}:
	default:
	}
}

// ackable pops the leading events whose saves are done and returns the
// highest of their seqs (0: none), and what the next one waits for.
func (c *conn) ackable() (seq uint64, next <-chan struct{}) {
	c.pendMu.Lock()
	defer c.pendMu.Unlock()
	i := 0
	for ; i < len(c.pending); i++ {
		p := c.pending[i]
		if p.saved != nil {
			select {
			case <-p.saved:
			default:
				next = p.saved
			}
		}
		if next != nil {
			break
		}
		seq = p.seq
	}
	c.pending = c.pending[i:]
	unackedEvents.Sub(float64(i))
	return seq, next
}

// dropPending forgets the unacknowledged events of an ended stream (the
// sidecar sends them again on its next one).
func (c *conn) dropPending() {
	c.pendMu.Lock()
	n := len(c.pending)
	c.pending = nil
	c.pendMu.Unlock()
	unackedEvents.Sub(float64(n))
}
