package messaging

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// accept queues a message from another sidecar (its authenticator
// checked, admitted with room kept in res, nil when none was) for a rank
// of this pod. A message that finds no member here is dropped (its file
// removed) and answered NotHere.
//
// A receive waiting for it (RecvFunc) gets it right away, from the
// caller's goroutine: accept returns after calling its function.
func (r *Router) accept(m Message, res *member) Status {
	k := gkey{m.Session, m.Group}
	r.mu.Lock()
	r.unreserveLocked(res, m.Size)
	g := r.groups[k]
	if g == nil || g.local[m.To] == nil {
		r.mu.Unlock()
		m.discard()
		return NotHere
	}
	mb := g.local[m.To]
	// A delivery retried after a broken stream may have arrived before.
	id := [2]uint64{uint64(m.From), m.Seq}
	if _, dup := mb.seen[id]; dup {
		r.mu.Unlock()
		m.discard()
		return Queued
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
		return Queued
	}
	mb.inbox = append(mb.inbox, m)
	mb.bytes += int64(m.Size)
	signal(&mb.wake)
	r.mu.Unlock()
	return Queued
}

// Back-pressure (docs/messaging.md, "Semantics"): a member's inbox holds
// up to Config.QueueBytes. A stream reader that reads the header of a
// message for a member whose inbox (with the room kept for messages
// other readers are reading) is at its cap waits, in admit, before
// reading the message's body: it reads nothing more of its stream, the
// socket's buffers fill, and TCP's flow control holds the sending
// sidecar's writes, so its sends wait (until their deadline: ErrTimeout)
// for the receiving function to take messages. Memory stays bounded (the
// cap, one message, the sockets' buffers), and no goroutine waits per
// message.
//
// Head-of-line blocking, the choice: one stream carries every message of
// one sending pod to every member of the receiving pod, so while it
// waits for one full inbox, the messages behind it for the pod's other
// members wait too. The other ways out were to read on and keep the
// messages (memory without bound: issue 31 measured 23 times the cap),
// to refuse them (the sender retries: a busy loop, and the per-sender
// order lost), or a credit window per member and sender (a new protocol
// between sidecars). A full inbox is one whose function stopped
// receiving with 64 MiB unread, and its pod's other members wait only
// for messages from the senders that fill it. The wait never holds a
// message its member asks for: a receive waiting in the member that
// matches the message lets it through (a selective receive, say of a
// tag, while the inbox is full of others, still gets it; one message per
// waiting receive). A reader whose peer hangs up while it waits ends (the
// sender fails those messages over to a new stream, and they are not
// kept twice, nor out of their order).

// hangupPoll is how often a reader waiting for room looks whether its
// peer hung up.
const hangupPoll = time.Second

// admit waits until the member the message of w goes to has room for it
// in its inbox, and keeps that room (the member, to give to accept, or
// back with unreserve); NotHere when no such member runs here. It fails
// only when the peer hung up meanwhile, or the stream was closed.
func (r *Router) admit(c net.Conn, w *wire) (Status, *member, error) {
	k := gkey{w.session, w.group}
	probe := Message{From: w.from, Tag: w.tag}
	var tick *time.Ticker
	defer func() {
		if tick != nil {
			tick.Stop()
		}
	}()
	for {
		r.mu.Lock()
		var mb *member
		if g := r.groups[k]; g != nil {
			mb = g.local[w.to]
		}
		if mb == nil {
			r.mu.Unlock()
			return NotHere, nil, nil
		}
		if mb.bytes+mb.reserved < r.cfg.QueueBytes || mb.wanted(&probe, true) {
			mb.reserved += int64(w.size)
			r.mu.Unlock()
			return Queued, mb, nil
		}
		mb.parked++
		if mb.room == nil {
			mb.room = make(chan struct{})
		}
		ch := mb.room
		r.mu.Unlock()
		if tick == nil {
			streamWaits.Inc()
			tick = time.NewTicker(hangupPoll)
		}
		select {
		case <-ch:
		case <-tick.C:
		}
		r.mu.Lock()
		mb.parked--
		r.mu.Unlock()
		// A sender that gave up on this stream (a send's deadline cut a
		// frame, and it broke the stream) tries again on a new one: what
		// this one holds is not taken, so that none of it comes after
		// what follows on the new stream.
		if err := hungUp(c); err != nil {
			return 0, nil, err
		}
	}
}

// unreserve gives back the room admit kept for a message of size bytes
// that will not be queued.
func (r *Router) unreserve(mb *member, size uint64) {
	if mb == nil {
		return
	}
	r.mu.Lock()
	r.unreserveLocked(mb, size)
	mb.roomChanged()
	r.mu.Unlock()
}

func (r *Router) unreserveLocked(mb *member, size uint64) {
	if mb != nil {
		mb.reserved -= int64(size)
	}
}

// unreserveFailed is unreserve for a message admitted but not read (its
// stream broke): a waiting Recv it was admitted for may let another
// through.
func (r *Router) unreserveFailed(mb *member, size uint64) {
	if mb == nil {
		return
	}
	r.mu.Lock()
	for _, w := range mb.wants {
		w.taken = false
	}
	r.mu.Unlock()
	r.unreserve(mb, size)
}

// wanted: a receive waiting in the member takes a message like m (under
// Router.mu). A waiting Recv lets one message through (take: it is
// spoken for until the Recv looks again); a RecvFunc's waiter is taken
// out by the message that comes to it.
func (mb *member) wanted(m *Message, take bool) bool {
	for _, w := range mb.waiters {
		if w.f.match(m) {
			return true
		}
	}
	for _, w := range mb.wants {
		if !w.taken && w.f.match(m) {
			w.taken = take
			return true
		}
	}
	return false
}

// want is a blocking receive's filter while it waits (Recv).
type want struct {
	f     Filter
	taken bool // a message for it is admitted
}

// roomChanged wakes the stream readers waiting for the member's room
// (under Router.mu): its inbox has more, or a receive now waits (it may
// take the message they hold back), or the member ended.
func (mb *member) roomChanged() {
	if mb.parked > 0 {
		signal(&mb.room)
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
		// While it waits, the stream readers holding messages back for
		// a full inbox let through one this receive takes (admit).
		wt := &want{f: f}
		mb.wants = append(mb.wants, wt)
		mb.roomChanged()
		v, vch, wch, mbox := g.view, g.changed, mb.wake, g.mailbox && r.cfg.Mailbox != nil
		r.mu.Unlock()
		err := r.recvWait(ctx, k, mb, v, rank, f, name, vch, wch, mbox)
		r.mu.Lock()
		mb.unwant(wt)
		r.mu.Unlock()
		if err != nil {
			return Message{}, err
		}
	}
}

// recvWait is a Recv's wait for something to change (nil), or its end.
func (r *Router) recvWait(ctx context.Context, k gkey, mb *member, v *controlv1.GroupView, rank uint32, f Filter, name string,
	vch, wch chan struct{}, mbox bool) error {
	if mbox && r.drainMailbox(ctx, k, mb) > 0 {
		return nil
	}
	if err := peersGone(v, rank, f); err != nil {
		return fmt.Errorf("%w (group %s)", err, name)
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
		return fmt.Errorf("%w: receiving as rank %d of group %s: %v", ErrTimeout, rank, name, context.Cause(ctx))
	}
	return nil
}

// unwant takes a waiting Recv's filter out (under Router.mu).
func (mb *member) unwant(w *want) {
	for i, x := range mb.wants {
		if x == w {
			mb.wants = append(mb.wants[:i], mb.wants[i+1:]...)
			return
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
	mb.roomChanged()
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
