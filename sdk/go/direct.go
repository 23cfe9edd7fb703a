package ziptrail

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/directmsg"
	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
)

// An attached member (docs/messaging.md, "Same-node direct channels"):
// the sidecar pushes this member's sidecar-path messages, the group's
// views and the direct channels of same-node senders on one connection,
// and the SDK receives locally, from that connection and from every
// direct channel, into one inbox. Sends to a same-node rank go straight
// into a direct channel (the first send to a rank decides its path for
// the group's lifetime).

// inboxCap bounds the local inbox's bytes, as the sidecar's queue: past
// it, the readers stop reading their sockets (their senders wait).
const inboxCap = 64 << 20

type inMsg struct {
	from  int
	tag   int64
	data  []byte
	path  string // a sidecar-path file to map and remove (or, with token, release)
	token string // path is lent: released through mc, not removed
	mc    *localapi.MemberChannel
	// fmap maps a lent file (token), from its push on: the sidecar may
	// forget a lending held too long (and remove the name), never the
	// pages of a mapping. ferr: it could not be mapped.
	fmap    []byte
	ferr    error
	mapping []byte    // a memfd's mapping (data is all of it)
	rec     *recycler // data is a recycled buffer to give back to rec
}

// inChan is a direct channel from a sender.
type inChan struct {
	c   *directmsg.Conn
	eof bool
	err error // the channel broke (a malformed frame): recv callers see it
	// reported: an any-source receive returned err already.
	reported bool
	// ending: the view says the sender is gone and its TCP channel has
	// not ended (endGone watches it); ended: endGone closed it, quiet
	// (its close is the channel's end).
	ending, ended bool
}

// goneGrace is how long a TCP channel whose sender the view says is gone
// may take to end by itself (its FIN follows the sender's last frames)
// before the receiver, once the channel is quiet, takes it for ended: a
// sender whose node went away sends no FIN.
const goneGrace = 100 * time.Millisecond

// outChan is this member's path to one receiver: decided at the first
// send; c nil means through the sidecars.
type outChan struct {
	mu      sync.Mutex
	decided bool
	c       *directmsg.Conn
}

func (oc *outChan) conn() *directmsg.Conn {
	oc.mu.Lock()
	defer oc.mu.Unlock()
	return oc.c
}

type attached struct {
	g   *Group
	mc  *localapi.MemberChannel
	rec *recycler // WithRecycledBuffers; nil: none

	mu     sync.Mutex
	wake   chan struct{} // closed and replaced on every change
	inbox  []*inMsg
	bytes  int64
	over   atomic.Bool // bytes > inboxCap: TCP channels' credits wait
	view   *localapi.View
	in     map[int]*inChan
	ended  error // the member channel ended (the member left or the sidecar went)
	closed bool

	omu sync.Mutex
	out map[int]*outChan
	wg  sync.WaitGroup
}

func newAttached(g *Group, mc *localapi.MemberChannel, rec *recycler) *attached {
	a := &attached{g: g, mc: mc, rec: rec, wake: make(chan struct{}), in: map[int]*inChan{}, out: map[int]*outChan{}}
	a.wg.Go(a.readMember)
	return a
}

// changed wakes the waiting receives (under a.mu).
func (a *attached) changed() {
	close(a.wake)
	a.wake = make(chan struct{})
}

// add queues a message, then waits while the inbox is over its cap
// (unless nowait: a TCP channel's reader reads whatever its sender's
// window allows; its credits wait instead, directmsg/stream.go).
func (a *attached) add(m *inMsg, nowait bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		m.release()
		return
	}
	a.inbox = append(a.inbox, m)
	a.bytes += int64(len(m.data))
	a.over.Store(a.bytes > inboxCap)
	a.changed()
	for a.bytes > inboxCap && !a.closed && !nowait {
		ch := a.wake
		a.mu.Unlock()
		<-ch
		a.mu.Lock()
	}
}

// mapLent maps a lent file read-only, all of it.
func mapLent(path string) ([]byte, error) {
	data, mapped, err := mapFile(path, false)
	if err == nil && !mapped {
		return nil, fmt.Errorf("lent file %s is empty", path)
	}
	return data, err
}

// giveBack returns what releases m's lent file once it is unmapped (nil:
// not lent).
func (m *inMsg) giveBack() func() {
	if m.token == "" {
		return nil
	}
	mc, token := m.mc, m.token
	return func() { mc.Release(token) }
}

func (m *inMsg) release() {
	if m.mapping != nil {
		_ = samenode.Unmap(m.mapping)
	}
	switch {
	case m.token != "":
		if m.fmap != nil {
			_ = syscall.Munmap(m.fmap)
		}
		m.mc.Release(m.token)
	case m.path != "":
		_ = os.Remove(m.path)
	}
	if m.rec != nil {
		m.rec.put(m.data)
	}
}

func (a *attached) readMember() {
	for {
		p, err := a.mc.Next()
		if err != nil {
			// The membership ended (Leave, the invocation's end) or the
			// sidecar went: the channels end with it (what is queued
			// stays receivable).
			a.mu.Lock()
			a.ended = err
			for _, ic := range a.in {
				if ic.c != nil {
					_ = ic.c.Close()
				}
			}
			a.changed()
			a.mu.Unlock()
			a.omu.Lock()
			for _, oc := range a.out {
				if c := oc.conn(); c != nil {
					_ = c.CloseSend()
				}
			}
			a.omu.Unlock()
			return
		}
		switch {
		case p.View != nil:
			a.mu.Lock()
			if a.view == nil || p.View.Epoch > a.view.Epoch {
				a.view = p.View
				for _, r := range p.View.Gone {
					if ic := a.in[int(r)]; ic != nil && ic.c != nil && ic.c.Stream() && !ic.eof && ic.err == nil && !ic.ending {
						ic.ending = true
						time.AfterFunc(goneGrace, func() { a.endGone(ic) })
					}
				}
			}
			a.changed()
			a.mu.Unlock()
		case p.Direct != nil:
			c, err := directmsg.NewConn(p.Direct)
			if c != nil && a.rec != nil {
				c.Alloc = a.rec.get
			}
			if c != nil {
				c.SetHold(a.over.Load)
			}
			from := int(p.From)
			a.mu.Lock()
			if old := a.in[from]; old != nil && old.c != nil {
				_ = old.c.Close() // a sender opens once: a second channel replaces nothing it still uses
			}
			ic := &inChan{c: c, err: err}
			if a.closed && c != nil {
				_ = c.Close()
				c = nil
			}
			a.in[from] = ic
			a.changed()
			a.mu.Unlock()
			if c != nil {
				a.wg.Go(func() { a.readDirect(from, ic) })
			}
		default:
			m := &inMsg{from: int(p.Msg.From), tag: p.Msg.Tag, data: p.Msg.Data, path: p.Msg.Path}
			if p.Msg.Token != "" {
				m.token, m.mc = p.Msg.Token, a.mc
				m.fmap, m.ferr = mapLent(p.Msg.Path)
			}
			if m.path == "" && m.data == nil {
				m.data = []byte{}
			}
			a.add(m, false)
		}
	}
}

// endGone ends the TCP channel ic of a sender the view says is gone once
// it is quiet (nothing of a frame read, nothing in its socket), unless it
// ended meanwhile; while bytes still come it looks again later (a node
// gone in the middle of a frame: the keepalive ends the channel).
func (a *attached) endGone(ic *inChan) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ic.eof || ic.err != nil || a.closed {
		return
	}
	if !ic.c.Quiet() {
		time.AfterFunc(goneGrace, func() { a.endGone(ic) })
		return
	}
	ic.ended = true
	_ = ic.c.Close() // readDirect's Recv fails: the channel's end
}

func (a *attached) readDirect(from int, ic *inChan) {
	for {
		m, err := ic.c.Recv()
		if err != nil {
			a.mu.Lock()
			if errors.Is(err, io.EOF) || ic.ended {
				ic.eof = true
			} else if !a.closed {
				ic.err = &PeerError{Rank: from, Err: fmt.Errorf("direct channel dropped: %w", err)}
			}
			_ = ic.c.Close()
			a.changed()
			a.mu.Unlock()
			return
		}
		im := &inMsg{from: from, tag: m.Tag, data: m.Data}
		if m.Mapped {
			im.mapping = m.Data
		}
		if m.Recycled {
			im.rec = a.rec
		}
		a.add(im, ic.c.Stream())
	}
}

// take removes the oldest message matching (under a.mu).
func (a *attached) take(from int, tag int64, anyTag bool) *inMsg {
	for i, m := range a.inbox {
		if (from == AnySource || m.from == from) && ((anyTag && m.tag >= 0) || (!anyTag && m.tag == tag)) {
			a.inbox = slices.Delete(a.inbox, i, i+1)
			a.bytes -= int64(len(m.data))
			if a.over.Load() && a.bytes <= inboxCap {
				a.over.Store(false)
				for _, ic := range a.in {
					if ic.c != nil && ic.c.Stream() {
						go ic.c.Release() // the credits held while the inbox was full
					}
				}
			}
			a.changed()
			return m
		}
	}
	return nil
}

// gone: the view says rank left or died, and its direct channel (if
// any) has ended with nothing left in it (under a.mu).
func (a *attached) gone(rank int) bool {
	v := a.view
	if v == nil || !slices.Contains(v.Gone, uint32(rank)) || slices.Contains(v.Live, uint32(rank)) {
		return false
	}
	ic := a.in[rank]
	return ic == nil || ic.eof || ic.err != nil
}

// failed is why a receive that found nothing cannot wait (under a.mu).
func (a *attached) failed(op string, from int) error {
	if from != AnySource {
		if ic := a.in[from]; ic != nil && ic.err != nil {
			ic.reported = true
			return &Error{Kind: KindInternal, Op: op, Err: ic.err}
		}
		if a.gone(from) {
			return &Error{Kind: KindPeerGone, Op: op, Err: &PeerError{Rank: from, Err: fmt.Errorf("rank %d left or died (group %s)", from, a.g.name)}}
		}
	} else {
		for _, ic := range a.in {
			if ic.err != nil && !ic.reported {
				ic.reported = true
				return &Error{Kind: KindInternal, Op: op, Err: ic.err}
			}
		}
		if v := a.view; v != nil && v.Size > 1 {
			all := true
			for r := range int(v.Size) {
				if r != a.g.rank && !a.gone(r) {
					all = false
					break
				}
			}
			if all {
				return &Error{Kind: KindPeerGone, Op: op, Err: fmt.Errorf("every other rank left or died (group %s)", a.g.name)}
			}
		}
	}
	if a.ended != nil || a.closed {
		return &Error{Kind: KindClosed, Op: op, Err: fmt.Errorf("rank %d of group %s: the member channel ended: %v", a.g.rank, a.g.name, a.ended)}
	}
	return nil
}

// recv takes the oldest matching message, waiting until ctx ends.
func (a *attached) recv(ctx context.Context, op string, from int, tag int64, anyTag bool) (*inMsg, error) {
	a.mu.Lock()
	for {
		if m := a.take(from, tag, anyTag); m != nil {
			a.mu.Unlock()
			return m, nil
		}
		if err := a.failed(op, from); err != nil {
			a.mu.Unlock()
			return nil, err
		}
		ch := a.wake
		a.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, &Error{Kind: KindTimeout, Op: op, Err: fmt.Errorf("receiving as rank %d of group %s: %w", a.g.rank, a.g.name, context.Cause(ctx))}
		}
		a.mu.Lock()
	}
}

// path returns the direct channel to rank to, or nil for the sidecar
// path; the first call decides. It waits for to to be listed (a rank not
// joined yet), as a send through the sidecar does.
func (a *attached) path(ctx context.Context, op string, to int) (*directmsg.Conn, error) {
	if a.g.mailbox {
		return nil, nil
	}
	a.omu.Lock()
	oc := a.out[to]
	if oc == nil {
		oc = &outChan{}
		a.out[to] = oc
	}
	a.omu.Unlock()
	oc.mu.Lock()
	defer oc.mu.Unlock()
	if oc.decided {
		return oc.c, nil
	}
	a.mu.Lock()
	for {
		v := a.view
		if v != nil && (slices.Contains(v.Live, uint32(to)) || slices.Contains(v.Gone, uint32(to))) {
			break
		}
		if a.ended != nil || a.closed {
			a.mu.Unlock()
			return nil, nil
		}
		ch := a.wake
		a.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, &Error{Kind: KindTimeout, Op: op, Err: fmt.Errorf("rank %d has not joined group %s: %w", to, a.g.name, context.Cause(ctx))}
		}
		a.mu.Lock()
	}
	a.mu.Unlock()
	f, err := a.g.c.messages().Open(ctx, a.g.session, a.g.name, uint32(a.g.rank), uint32(to))
	if err != nil {
		return nil, peerError(messageError(ctx, op, err), to)
	}
	if f != nil {
		if oc.c, err = directmsg.NewConn(f); err != nil {
			return nil, &Error{Kind: KindInternal, Op: op, Err: err}
		}
	}
	oc.decided = true
	return oc.c, nil
}

// sendDirect writes one message into a direct channel; to a rank the
// view says is gone it fails with PeerGone (a peer whose node went away
// still takes bytes into its socket, and a dead one may not have reset
// the channel yet), as a send through the sidecars does.
func (a *attached) sendDirect(ctx context.Context, op string, c *directmsg.Conn, to int, tag int64, data []byte) error {
	a.mu.Lock()
	v := a.view
	a.mu.Unlock()
	if v != nil && slices.Contains(v.Gone, uint32(to)) && !slices.Contains(v.Live, uint32(to)) {
		return &Error{Kind: KindPeerGone, Op: op, Err: &PeerError{Rank: to, Err: fmt.Errorf("rank %d left or died (group %s)", to, a.g.name)}}
	}
	err := c.Send(ctx, tag, data)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ETIMEDOUT):
		return &Error{Kind: KindPeerGone, Op: op, Err: &PeerError{Rank: to, Err: fmt.Errorf("its direct channel closed: %w", err)}}
	case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded):
		return &Error{Kind: KindTimeout, Op: op, Err: fmt.Errorf("sending to rank %d: %w", to, context.Cause(ctx))}
	default:
		return &Error{Kind: KindInternal, Op: op, Err: fmt.Errorf("sending to rank %d: %w", to, err)}
	}
}

// close ends every channel and drops what is queued.
func (a *attached) close() {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.closed = true
	for _, ic := range a.in {
		if ic.c != nil {
			_ = ic.c.Close()
		}
	}
	for _, m := range a.inbox {
		m.release()
	}
	a.inbox, a.bytes = nil, 0
	a.changed()
	a.mu.Unlock()
	_ = a.mc.Close()
	a.omu.Lock()
	for _, oc := range a.out {
		if c := oc.conn(); c != nil {
			_ = c.CloseSend() // a TCP channel's last frames still go out
		}
	}
	a.omu.Unlock()
	a.wg.Wait()
}

// waitAll waits until every rank joined once (WithWaitAll).
func (a *attached) waitAll(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for {
		if v := a.view; v != nil && len(v.Live)+len(v.Gone) >= int(v.Size) {
			return nil
		}
		if a.ended != nil {
			return &Error{Kind: KindClosed, Op: "join", Err: a.ended}
		}
		ch := a.wake
		a.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			a.mu.Lock()
			return &Error{Kind: KindTimeout, Op: "join", Err: fmt.Errorf("waiting for every rank of group %s to join: %w", a.g.name, context.Cause(ctx))}
		}
		a.mu.Lock()
	}
}
