package messaging

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
)

// authTTL is how long one sealed authenticator is used for a group's
// deliveries; receivers accept it until it expires.
const authTTL = 5 * time.Minute

// authKey is what an authenticator seals: the group it is valid for.
func authKey(session, group string) string { return "msg\x00" + session + "\x00" + group }

// Outgoing is a message to send: Data when small, else File (Size bytes
// from its start; the caller closes it after Send returns).
type Outgoing struct {
	Session, Group string
	From, To       uint32
	Tag            int64
	Data           []byte
	File           *os.File
	Size           uint64
}

// Send delivers a message to the rank To of the group, as the rank From
// that runs in this pod. It waits for a rank that has not joined yet
// (unless the group has mailboxes), and returns once the receiver's
// sidecar queued the message; mailboxed reports that the fast tier holds
// it for a rank not running.
func (r *Router) Send(ctx context.Context, o Outgoing) (mailboxed bool, err error) {
	msg, auth, err := r.prepare(o)
	if err != nil {
		return false, err
	}
	return r.deliver(ctx, o, msg, auth, nil)
}

// prepare checks that the sender runs here and the receiver is in the
// group, numbers the message and returns the group's authenticator.
func (r *Router) prepare(o Outgoing) (Message, string, error) {
	k := gkey{o.Session, o.Group}
	r.mu.Lock()
	g := r.groups[k]
	if g == nil || g.local[o.From] == nil {
		r.mu.Unlock()
		return Message{}, "", fmt.Errorf("%w: rank %d of group %s does not run in this pod (join first)", ErrClosed, o.From, o.Group)
	}
	if o.To >= g.size {
		r.mu.Unlock()
		return Message{}, "", fmt.Errorf("%w: rank %d outside the group's 0..%d", ErrInvalid, o.To, g.size-1)
	}
	g.seq[[2]uint32{o.From, o.To}]++
	seq := g.seq[[2]uint32{o.From, o.To}]
	r.mu.Unlock()
	auth, err := r.authenticator(k)
	if err != nil {
		return Message{}, "", err
	}
	msg := Message{Session: o.Session, Group: o.Group, From: o.From, To: o.To, Tag: o.Tag, Seq: seq, Data: o.Data, Size: o.Size}
	if o.File == nil {
		msg.Size = uint64(len(o.Data))
	}
	return msg, auth, nil
}

// attempt is a delivery's outcome.
type attempt struct {
	st  Status
	err error
}

// deliver sends a prepared message until the receiver's sidecar takes it,
// the directory says the receiver is gone, or ctx ends; first is the
// outcome of a delivery already tried (nil: none yet).
func (r *Router) deliver(ctx context.Context, o Outgoing, msg Message, auth string, first *attempt) (mailboxed bool, err error) {
	k := gkey{o.Session, o.Group}
	// A listed receiver that cannot be reached (its stream broke, its pod
	// died) is tried again every retryPause: the directory soon says
	// whether it is gone (PeerGone); one still listed after
	// unreachableFor is a network failure (ErrUnreachable), not a death.
	var failingSince time.Time
	for {
		r.mu.Lock()
		g := r.groups[k]
		if g == nil || g.local[o.From] == nil {
			r.mu.Unlock()
			return false, fmt.Errorf("%w: rank %d left group %s", ErrClosed, o.From, o.Group)
		}
		v, ch, mbox := g.view, g.changed, g.mailbox
		r.mu.Unlock()
		peer, gone := lookup(v, o.To)
		pause := r.cfg.GoneGrace // not joined yet: wait for a view
		switch {
		case peer != nil:
			var st Status
			var err error
			if first != nil {
				st, err, first = first.st, first.err, nil
			} else {
				st, err = r.streams.Deliver(ctx, peer.DataplaneAddr, auth, msg, o.File)
			}
			if done, err := r.delivered(ctx, o, st, err); done {
				return false, err
			}
			// Not there (it left) or unreachable.
			now := r.now()
			if failingSince.IsZero() {
				failingSince = now
			}
			if now.Sub(failingSince) > r.unreachableFor() {
				if err == nil { // answered "not here" all along
					return false, fmt.Errorf("%w: rank %d of group %s does not run where the directory says", ErrPeerGone, o.To, o.Group)
				}
				return false, fmt.Errorf("%w: rank %d of group %s, for %v: %v", ErrUnreachable, o.To, o.Group, r.unreachableFor(), err)
			}
			pause = retryPause
		case mbox && r.cfg.Mailbox != nil:
			if o.File != nil && msg.Data == nil {
				// The fast tier holds the bytes themselves.
				if msg.Data, err = readAll(o.File, o.Size); err != nil {
					return false, err
				}
			}
			if err := r.cfg.Mailbox.Push(ctx, o.Session, o.Group, o.To, msg); err != nil {
				return false, fmt.Errorf("mailbox: %w", err)
			}
			return true, nil
		case gone:
			return false, fmt.Errorf("%w: rank %d of group %s left or died", ErrPeerGone, o.To, o.Group)
		}
		wait := time.NewTimer(pause)
		select {
		case <-ch:
		case <-wait.C:
		case <-ctx.Done():
			wait.Stop()
			return false, r.timeout(ctx, o)
		}
		wait.Stop()
	}
}

// delivered tells a final outcome of one delivery (done) from one to try
// again (the receiver was not there, or not reachable).
func (r *Router) delivered(ctx context.Context, o Outgoing, st Status, err error) (done bool, _ error) {
	switch {
	case err == nil && st == Queued:
		return true, nil
	case err == nil && st == Foreign:
		return true, fmt.Errorf("%w: rank %d's sidecar refused this namespace's authenticator", ErrForeign, o.To)
	case err == nil && st == Refused:
		return true, fmt.Errorf("%w: no room for it at rank %d (its shared-memory directory is full)", ErrRefused, o.To)
	case err != nil && ctx.Err() != nil:
		return true, r.timeout(ctx, o)
	case err != nil && !errors.Is(err, ErrUnreachable):
		return true, err
	}
	return false, nil
}

// retryPause is the pause between deliveries to a listed receiver that
// could not be reached.
const retryPause = 50 * time.Millisecond

// unreachableFor is how long a listed receiver may stay unreachable
// before a send fails: the directory's grace and then some.
func (r *Router) unreachableFor() time.Duration { return 3 * r.cfg.GoneGrace }

func (r *Router) timeout(ctx context.Context, o Outgoing) error {
	return fmt.Errorf("%w: sending to rank %d of group %s: %v", ErrTimeout, o.To, o.Group, context.Cause(ctx))
}

// authenticator is the group's sealed authenticator, renewed well before
// it expires.
func (r *Router) authenticator(k gkey) (string, error) {
	now := r.now()
	r.mu.Lock()
	a, ok := r.auth[k]
	r.mu.Unlock()
	if ok && now.Add(authTTL/2).Before(a.expires) {
		return a.token, nil
	}
	kr := r.cfg.Keys()
	if kr == nil {
		return "", fmt.Errorf("%w: the sidecar has no reference keys yet", ErrClosed)
	}
	exp := now.Add(authTTL)
	tok, err := kr.Seal(ref.Record{Addr: r.cfg.Self, Key: authKey(k.session, k.group), Expires: exp, Reads: 1})
	if err != nil {
		return "", err
	}
	r.mu.Lock()
	r.auth[k] = sealed{tok, exp}
	r.mu.Unlock()
	return tok, nil
}

func readAll(f *os.File, size uint64) ([]byte, error) {
	b := make([]byte, size)
	_, err := f.ReadAt(b, 0)
	if errors.Is(err, io.EOF) {
		err = fmt.Errorf("the message's file is shorter than its %d bytes", size)
	}
	return b, err
}
