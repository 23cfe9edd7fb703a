package messaging

import (
	"context"
	"fmt"
	"time"

	"github.com/ziptrail/ziptrail/internal/control/controlv1"
)

// accept queues a message from another sidecar (its authenticator
// checked) for a rank of this pod. A message that finds no member here is
// dropped (its file removed) and answered NotHere.
//
// A receive waiting for it (RecvFunc) gets it right away, from the
// caller's goroutine: accept returns after calling its function.
func (r *Router) accept(m Message) (Status, func(context.Context) error) {
	k := gkey{m.Session, m.Group}
	r.mu.Lock()
	g := r.groups[k]
	if g == nil || g.local[m.To] == nil {
		r.mu.Unlock()
		m.discard()
		return NotHere, nil
	}
	mb := g.local[m.To]
	// A delivery retried after a broken stream may have arrived before.
	id := [2]uint64{uint64(m.From), m.Seq}
	if _, dup := mb.seen[id]; dup {
		r.mu.Unlock()
		m.discard()
		return Queued, nil
	}
	if len(mb.seen) >= maxSeen {
		clear(mb.seen)
	}
	mb.seen[id] = struct{}{}
	received.Inc()
	// A waiting receive exists only while nothing queued matches it, so
	// the message it takes is the one a Recv would take.
	if w := mb.waiting(&m); w != nil {
		r.mu.Unlock()
		w.end(m, nil)
		return Queued, nil
	}
	defer r.mu.Unlock()
	mb.inbox = append(mb.inbox, m)
	mb.bytes += int64(m.Size)
	signal(&mb.wake)
	if mb.bytes <= r.cfg.QueueBytes {
		return Queued, nil
	}
	// Full: the sender waits for room (back-pressure), or for the member
	// to end (its messages are dropped with it, and the sender told so).
	return Queued, func(ctx context.Context) error {
		for {
			r.mu.Lock()
			full, closed, ch := mb.bytes > r.cfg.QueueBytes, mb.closed, mb.wake
			r.mu.Unlock()
			switch {
			case closed:
				return fmt.Errorf("%w: rank %d ended with the message unread", ErrPeerGone, m.To)
			case !full:
				return nil
			}
			select {
			case <-ch:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// maxSeen bounds a member's record of delivered (sender, number) pairs.
const maxSeen = 1 << 14

// Filter selects the messages a receive takes.
type Filter struct {
	AnySource bool
	From      uint32
	AnyTag    bool // any tag >= 0: negative tags are the SDKs' collectives'
	Tag       int64
	all       bool // every tag, the collectives' too (a member channel)
}

func (f Filter) match(m *Message) bool {
	if f.all {
		return f.AnySource || m.From == f.From
	}
	return (f.AnySource || m.From == f.From) && ((f.AnyTag && m.Tag >= 0) || (!f.AnyTag && m.Tag == f.Tag))
}

// mailboxPoll is how often a waiting receive of a mailbox group looks in
// the fast tier for messages sent while this rank was not yet listed.
const mailboxPoll = 50 * time.Millisecond

// Recv takes the oldest message for the rank that matches f, waiting for
// one until ctx ends. It fails at once with ErrPeerGone when the sender it
// waits for (every other rank, for any source) is gone and nothing
// matching is queued.
func (r *Router) Recv(ctx context.Context, session, name string, rank uint32, f Filter) (Message, error) {
	k := gkey{session, name}
	for {
		r.mu.Lock()
		g := r.groups[k]
		var mb *member
		if g != nil {
			mb = g.local[rank]
		}
		if mb == nil {
			r.mu.Unlock()
			return Message{}, fmt.Errorf("%w: rank %d of group %s does not run in this pod", ErrClosed, rank, name)
		}
		if m, ok := mb.take(f); ok {
			signal(&mb.wake)
			r.mu.Unlock()
			return m, nil
		}
		v, vch, wch, mbox := g.view, g.changed, mb.wake, g.mailbox && r.cfg.Mailbox != nil
		r.mu.Unlock()
		if mbox && r.drainMailbox(ctx, k, mb) > 0 {
			continue
		}
		if err := peersGone(v, rank, f); err != nil {
			return Message{}, fmt.Errorf("%w (group %s)", err, name)
		}
		var poll <-chan time.Time
		if mbox {
			t := time.NewTimer(mailboxPoll)
			poll = t.C
			defer t.Stop()
		}
		select {
		case <-vch:
		case <-wch:
		case <-poll:
		case <-ctx.Done():
			return Message{}, fmt.Errorf("%w: receiving as rank %d of group %s: %v", ErrTimeout, rank, name, context.Cause(ctx))
		}
	}
}

// take removes the message a receive gets: the first match in arrival
// order, or an earlier-numbered one of the same sender (one that came
// through the mailbox after later ones came directly).
func (mb *member) take(f Filter) (Message, bool) {
	pick := -1
	for i := range mb.inbox {
		m := &mb.inbox[i]
		if !f.match(m) {
			continue
		}
		if pick < 0 {
			pick = i
		} else if m.From == mb.inbox[pick].From && m.Seq < mb.inbox[pick].Seq {
			pick = i
		}
	}
	if pick < 0 {
		return Message{}, false
	}
	m := mb.inbox[pick]
	mb.inbox = append(mb.inbox[:pick], mb.inbox[pick+1:]...)
	mb.bytes -= int64(m.Size)
	return m, true
}

// peersGone: the senders a receive waits for are all gone.
func peersGone(v *controlv1.GroupView, self uint32, f Filter) error {
	if v == nil {
		return nil
	}
	if !f.AnySource {
		if m, gone := lookup(v, f.From); m == nil && gone {
			return fmt.Errorf("%w: rank %d left or died", ErrPeerGone, f.From)
		}
		return nil
	}
	if v.Size <= 1 {
		return nil
	}
	for rank := range v.Size {
		if m, gone := lookup(v, rank); rank != self && (m != nil || !gone) {
			return nil
		}
	}
	return fmt.Errorf("%w: every other rank left or died", ErrPeerGone)
}

// drainMailbox moves the rank's stored messages into its inbox.
func (r *Router) drainMailbox(ctx context.Context, k gkey, mb *member) int {
	msgs, err := r.cfg.Mailbox.Take(ctx, k.session, k.group, mb.rank)
	if err != nil || len(msgs) == 0 {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if mb.closed {
		// Ended meanwhile: the messages wait for the rank's next instance.
		go func() {
			for _, m := range msgs {
				_ = r.cfg.Mailbox.Push(context.WithoutCancel(ctx), k.session, k.group, mb.rank, m)
			}
		}()
		return 0
	}
	for _, m := range msgs {
		mb.inbox = append(mb.inbox, m)
		mb.bytes += int64(m.Size)
	}
	mailboxed.Add(float64(len(msgs)))
	signal(&mb.wake)
	return len(msgs)
}
