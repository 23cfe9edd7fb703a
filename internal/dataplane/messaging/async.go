package messaging

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Sends and receives that do not hold a goroutine while they wait: the
// function's socket (localapi's fast path) starts one and goes back to
// reading its connection, and the result is handed to a callback by the
// goroutine that has it: a receive's message by the stream reader that
// queued it (ServeStream), a send's answer by the stream's answer reader.
// On the small-message path that saves a goroutine hand-off, a wake-up of
// another thread, at each end. The slow cases (a receiver not listed yet
// or unreachable, a mailbox group, a large message) run the blocking
// Send and Recv on a goroutine of their own, with the same outcomes.

// SendFunc is Send for callers that do not wait for it: fn gets Send's
// result once, before SendFunc returns or later from another goroutine.
// timeout bounds the send (0: none). cancel gives up: fn then gets
// ErrTimeout, unless it had its result already.
func (r *Router) SendFunc(o Outgoing, timeout time.Duration, fn func(mailboxed bool, err error)) (cancel func()) {
	msg, auth, err := r.prepare(o)
	if err != nil {
		fn(false, err)
		return func() {}
	}
	ctx, stop := r.opContext(timeout)
	var once sync.Once
	stopAfter := func() bool { return false }
	finish := func(mailboxed bool, err error) {
		once.Do(func() {
			stopAfter() // before stop: its function must not run for nothing
			stop()
			fn(mailboxed, err)
		})
	}
	slow := func(first *attempt) {
		go func() { finish(r.deliver(ctx, o, msg, auth, first)) }()
	}
	var ps *peerStream
	if o.File == nil {
		r.mu.Lock()
		if g := r.groups[gkey{o.Session, o.Group}]; g != nil {
			if peer, _ := lookup(g.view, o.To); peer != nil {
				ps = r.streams.live(peer.DataplaneAddr)
			}
		}
		r.mu.Unlock()
	}
	if ps == nil {
		slow(nil)
		return stop
	}
	// The receiver is listed and its sidecar's stream is open: the answer
	// finishes the send from the stream's reader. A timeout or cancel
	// that comes first takes the delivery's answerFunc back (when the
	// reader has it already, the answer decides).
	var sent atomic.Uint64
	giveUp := func() {
		if id := sent.Load(); id != 0 && ps.forget(id) {
			finish(false, r.timeout(ctx, o))
		}
	}
	stopAfter = context.AfterFunc(ctx, giveUp)
	id, err := ps.send(ctx, auth, &msg, nil, func(st Status, err error) {
		if done, err := r.delivered(ctx, o, st, err); done {
			finish(false, err)
			return
		}
		slow(&attempt{st, err}) // not there, or unreachable: retried as Send does
	})
	if err != nil {
		if ctx.Err() != nil {
			finish(false, r.timeout(ctx, o)) // the stream was full until the send's end
			return stop
		}
		slow(&attempt{0, err})
		return stop
	}
	sent.Store(id)
	if ctx.Err() != nil {
		giveUp()
	}
	return stop
}

// waiter is a receive waiting in a member for a matching message.
type waiter struct {
	f        Filter
	fn       func(Message, error)
	deadline *deadline
	done     bool // under Router.mu: fn has been or is being called
}

// RecvFunc is Recv for callers that do not wait for it: fn gets Recv's
// result once, before RecvFunc returns or later from another goroutine
// (the message's, from the stream reader that queued it). timeout bounds
// the receive (0: none). cancel gives up: fn then gets ErrTimeout, unless
// it had its result (a message) already.
func (r *Router) RecvFunc(session, name string, rank uint32, f Filter, timeout time.Duration, fn func(Message, error)) (cancel func()) {
	k := gkey{session, name}
	r.mu.Lock()
	g := r.groups[k]
	var mb *member
	if g != nil {
		mb = g.local[rank]
	}
	if mb == nil {
		r.mu.Unlock()
		fn(Message{}, fmt.Errorf("%w: rank %d of group %s does not run in this pod", ErrClosed, rank, name))
		return func() {}
	}
	if m, ok := mb.take(f); ok {
		signal(&mb.wake)
		r.mu.Unlock()
		fn(m, nil)
		return func() {}
	}
	if g.view == nil || (g.mailbox && r.cfg.Mailbox != nil) {
		// No view yet, or messages may also come through the fast tier
		// (polled): the blocking receive, on its own goroutine.
		r.mu.Unlock()
		ctx, stop := r.opContext(timeout)
		go func() {
			m, err := r.Recv(ctx, session, name, rank, f)
			stop()
			fn(m, err)
		}()
		return stop
	}
	if err := peersGone(g.view, rank, f); err != nil {
		r.mu.Unlock()
		fn(Message{}, fmt.Errorf("%w (group %s)", err, name))
		return func() {}
	}
	w := &waiter{f: f, fn: fn}
	mb.waiters = append(mb.waiters, w)
	mb.roomChanged() // a stream reader may hold back what it waits for
	if timeout > 0 {
		w.deadline = r.deadlines.add(time.Now().Add(timeout), func() {
			r.endWait(mb, w, fmt.Errorf("%w: receiving as rank %d of group %s: %v", ErrTimeout, rank, name, context.DeadlineExceeded))
		})
	}
	r.mu.Unlock()
	return func() {
		r.endWait(mb, w, fmt.Errorf("%w: receiving as rank %d of group %s: %v", ErrTimeout, rank, name, context.Canceled))
	}
}

// Unreceive puts back a message a receive took but could not hand over
// (its caller had gone before its hang-up was seen): to a receive now
// waiting for it, or first in the member's inbox, so that nothing is lost
// and the order holds. A member that ended meanwhile drops it, as it drops
// everything it had queued.
func (r *Router) Unreceive(session, name string, rank uint32, m Message) {
	r.mu.Lock()
	var mb *member
	if g := r.groups[gkey{session, name}]; g != nil {
		mb = g.local[rank]
	}
	if mb == nil || mb.closed {
		r.mu.Unlock()
		m.discard()
		return
	}
	if w := mb.waiting(&m); w != nil {
		r.mu.Unlock()
		w.end(m, nil)
		return
	}
	mb.inbox = append([]Message{m}, mb.inbox...)
	mb.bytes += int64(m.Size)
	signal(&mb.wake)
	r.mu.Unlock()
}

// endWait ends a waiting receive with err, unless it ended already.
func (r *Router) endWait(mb *member, w *waiter, err error) {
	r.mu.Lock()
	ok := mb.unwait(w)
	r.mu.Unlock()
	if ok {
		w.end(Message{}, err)
	}
}

// unwait takes w out of the member's waiting receives (under Router.mu):
// false when it ended already.
func (mb *member) unwait(w *waiter) bool {
	if w.done {
		return false
	}
	w.done = true
	for i, x := range mb.waiters {
		if x == w {
			mb.waiters = append(mb.waiters[:i], mb.waiters[i+1:]...)
			break
		}
	}
	return true
}

// end calls a waiter's fn (after unwait, outside Router.mu).
func (w *waiter) end(m Message, err error) {
	w.deadline.cancel()
	w.fn(m, err)
}

// waiting finds the first waiting receive that takes m and takes it out
// (under Router.mu); nil when none does.
func (mb *member) waiting(m *Message) *waiter {
	for _, w := range mb.waiters {
		if w.f.match(m) {
			mb.unwait(w)
			return w
		}
	}
	return nil
}

// ended is a waiting receive to end with an error once Router.mu is
// released.
type ended struct {
	w   *waiter
	err error
}

func endAll(es []ended) {
	for _, e := range es {
		e.w.end(Message{}, e.err)
	}
}
