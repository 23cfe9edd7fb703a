package messaging

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// Member channels and same-node direct channels (docs/messaging.md,
// "Same-node direct channels"). A function that attaches its member
// (JoinAttached) gets, on one connection, in order: every message the
// sidecar path delivers for it, the group's view on every change, and
// the ends of direct channels that same-node senders opened to it. Its
// SDK then receives locally; the sidecar stays the authority for
// membership, liveness, mailboxes and cross-node delivery.

// ErrNoDirect: no direct channel for this pair (the SDK sends through the
// sidecars for the group's lifetime).
var ErrNoDirect = errors.New("no direct channel")

// attachment is a member's channel state, under Router.mu.
type attachment struct {
	directs  []directEnd // socket ends to push, oldest first
	detached bool
	tcp      bool // the SDK takes direct channels across nodes (TCP)
}

type directEnd struct {
	from uint32
	f    *os.File
}

// Attachment is the member channel of one attached member: the sidecar's
// writer takes what to push with Next.
type Attachment struct {
	r    *Router
	k    gkey
	g    *group
	mb   *member
	att  *attachment
	Rank uint32
}

// Push is one item of a member channel: a message (Msg), a view (View) or
// a direct channel from the rank From (Direct, the receiving end).
type Push struct {
	Msg    *Message
	View   *controlv1.GroupView
	Direct *os.File
	From   uint32
}

// JoinAttached joins as Join does (without waiting for every rank) and
// attaches the member before the directory announces it, so no same-node
// sender can find it listed and not attached. With tcp the member takes
// direct channels across nodes too (its SDK reads TCP channels).
func (r *Router) JoinAttached(ctx context.Context, session, name string, rank, size uint32, mailbox bool, invocation string, tcp bool) (*controlv1.GroupView, *Attachment, error) {
	att := &attachment{tcp: tcp}
	v, err := r.join(ctx, session, name, rank, size, mailbox, invocation, false, att)
	if v == nil {
		return nil, nil, err
	}
	k := gkey{session, name}
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.groups[k]
	if g == nil || g.local[rank] == nil || g.local[rank].att != att {
		return nil, nil, fmt.Errorf("%w: rank %d of group %s left while joining", ErrClosed, rank, name)
	}
	return v, &Attachment{r: r, k: k, g: g, mb: g.local[rank], att: att, Rank: rank}, err
}

// attachedFilter takes every message, the collectives' too.
var attachedFilter = Filter{AnySource: true, all: true}

// Next waits for the next item to push: a direct channel end first, then
// the oldest message, then a view newer than epoch. It fails with
// ErrClosed once the member ended (or Detach), and with ctx's error.
func (a *Attachment) Next(ctx context.Context, epoch uint64) (Push, error) {
	r := a.r
	for {
		r.mu.Lock()
		if a.mb.closed || a.att.detached {
			r.mu.Unlock()
			return Push{}, fmt.Errorf("%w: rank %d of group %s ended", ErrClosed, a.Rank, a.k.group)
		}
		if len(a.att.directs) > 0 {
			d := a.att.directs[0]
			a.att.directs = a.att.directs[1:]
			r.mu.Unlock()
			return Push{Direct: d.f, From: d.from}, nil
		}
		// Messages before views: a view that says a sender is gone must
		// not overtake the messages it sent before.
		if m, ok := a.mb.take(attachedFilter); ok {
			signal(&a.mb.wake)
			r.mu.Unlock()
			return Push{Msg: &m}, nil
		}
		if v := a.g.view; v != nil && v.Epoch > epoch {
			r.mu.Unlock()
			return Push{View: v}, nil
		}
		wch, vch, mbox := a.mb.wake, a.g.changed, a.g.mailbox && r.cfg.Mailbox != nil
		r.mu.Unlock()
		if mbox && r.drainMailbox(ctx, a.k, a.mb) > 0 {
			continue
		}
		var poll <-chan time.Time
		var t *time.Timer
		if mbox {
			t = time.NewTimer(mailboxPoll)
			poll = t.C
		}
		select {
		case <-wch:
		case <-vch:
		case <-poll:
		case <-ctx.Done():
		}
		if t != nil {
			t.Stop()
		}
		if err := ctx.Err(); err != nil {
			return Push{}, err
		}
	}
}

// Unsent puts back a message Next returned that could not be written:
// it is the oldest again (a receive through the sidecar takes it).
func (a *Attachment) Unsent(m Message) {
	r := a.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if a.mb.closed {
		m.discard()
		return
	}
	a.mb.inbox = append([]Message{m}, a.mb.inbox...)
	a.mb.bytes += int64(m.Size)
	signal(&a.mb.wake)
}

// Detach ends the member channel (its connection closed): the membership
// stays (the invocation's end, or Leave, ends it); direct channel ends not
// pushed yet are closed (their senders see the channel broken).
func (a *Attachment) Detach() {
	r := a.r
	r.mu.Lock()
	a.att.detached = true
	ds := a.att.directs
	a.att.directs = nil
	if a.mb.att == a.att {
		a.mb.att = nil
	}
	signal(&a.mb.wake)
	r.mu.Unlock()
	for _, d := range ds {
		_ = d.f.Close()
	}
}

// OfferDirect is the receiving side of an open (the node socket, after
// its authenticator was checked): when rank to runs here attached, it
// makes a socketpair, queues one end for to's member channel and returns
// the other for the sender from.
func (r *Router) OfferDirect(session, name string, from, to uint32) (*os.File, error) {
	var theirs *os.File
	err := r.offer(session, name, from, to, false, func() (*os.File, error) {
		mine, t, err := socketPair()
		theirs = t
		return mine, err
	})
	return theirs, err
}

// OfferTCP is the receiving side of an open across nodes (the data-plane
// port, after its authenticator and its peer were checked): when rank to
// runs here attached and takes TCP channels, it queues f, the
// connection, for to's member channel (and owns it; on an error the
// caller still does).
func (r *Router) OfferTCP(session, name string, from, to uint32, f *os.File) error {
	return r.offer(session, name, from, to, true, func() (*os.File, error) { return f, nil })
}

// offer queues the receiving end newEnd returns for rank to's member
// channel, when the pair may have a direct channel: rank to runs here
// attached (and takes TCP channels, for tcp), not a mailbox group, the
// sender live in the view (on this node, unless tcp).
func (r *Router) offer(session, name string, from, to uint32, tcp bool, newEnd func() (*os.File, error)) error {
	r.waitListed(session, name, from)
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.groups[gkey{session, name}]
	if g == nil || g.local[to] == nil {
		return fmt.Errorf("%w: rank %d of group %s does not run here", ErrNoDirect, to, name)
	}
	mb := g.local[to]
	switch {
	case g.mailbox:
		return fmt.Errorf("%w: group %s keeps mailboxes", ErrNoDirect, name)
	case mb.att == nil:
		return fmt.Errorf("%w: rank %d is not attached", ErrNoDirect, to)
	case tcp && !mb.att.tcp:
		return fmt.Errorf("%w: rank %d takes no TCP channels (an older SDK)", ErrNoDirect, to)
	case from >= g.size || from == to:
		return fmt.Errorf("%w: sender rank %d", ErrNoDirect, from)
	}
	peer, _ := lookup(g.view, from)
	switch {
	case peer == nil:
		return fmt.Errorf("%w: rank %d is not live", ErrNoDirect, from)
	case !tcp && (peer.Node != r.cfg.Node || r.cfg.Node == ""):
		return fmt.Errorf("%w: rank %d is not live on this node", ErrNoDirect, from)
	}
	mine, err := newEnd()
	if err != nil {
		return err
	}
	mb.att.directs = append(mb.att.directs, directEnd{from: from, f: mine})
	signal(&mb.wake)
	return nil
}

// CheckPeer: an open across nodes for the pair from -> to comes from
// remote, the host of the data-plane address the group's view gives
// rank from (a sidecar of the namespace cannot open a channel in another
// pod's name).
func (r *Router) CheckPeer(session, name string, from uint32, remote *net.TCPAddr) error {
	r.waitListed(session, name, from)
	r.mu.Lock()
	g := r.groups[gkey{session, name}]
	var peer *controlv1.GroupMember
	if g != nil {
		peer, _ = lookup(g.view, from)
	}
	r.mu.Unlock()
	if peer == nil {
		return fmt.Errorf("rank %d of group %s is not live here", from, name)
	}
	host, _, err := net.SplitHostPort(peer.DataplaneAddr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.Equal(remote.IP) {
		return fmt.Errorf("rank %d of group %s does not run at %s", from, name, remote.IP)
	}
	return nil
}

// listedWait bounds how long an open waits for this sidecar's view to list
// its sender: the sender's sidecar saw the view with both ranks, this one
// may see it a moment later (the directory pushes to both at once).
const listedWait = 2 * time.Second

// waitListed waits until the group's view lists rank (live or gone), or
// listedWait passed.
func (r *Router) waitListed(session, name string, rank uint32) {
	t := time.NewTimer(listedWait)
	defer t.Stop()
	for {
		r.mu.Lock()
		g := r.groups[gkey{session, name}]
		if g == nil {
			r.mu.Unlock()
			return
		}
		m, gone := lookup(g.view, rank)
		ch := g.changed
		r.mu.Unlock()
		if m != nil || gone {
			return
		}
		select {
		case <-ch:
		case <-t.C:
			return
		}
	}
}

// DirectMaxFrame bounds a direct channel's socket buffer: a frame (an
// inline message) must fit in one SOCK_SEQPACKET message.
const DirectMaxFrame = 1 << 20

// socketPair makes a direct channel: SOCK_SEQPACKET, so that every frame
// is one message and a descriptor travels with exactly its frame.
func socketPair() (*os.File, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	for _, fd := range fds {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, DirectMaxFrame)
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, DirectMaxFrame)
	}
	return os.NewFile(uintptr(fds[0]), "direct"), os.NewFile(uintptr(fds[1]), "direct"), nil
}

// directTarget is where the pair from -> to may have a direct channel:
// to's pod UID when to runs on this sidecar's node (the node socket), or,
// with tcp, to's data-plane address when it runs on another (a TCP
// channel); and the group's authenticator for to's sidecar. An error
// wraps ErrNoDirect (the pair then uses the sidecars), or ErrClosed.
func (r *Router) directTarget(session, name string, from, to uint32, tcp bool) (podUID, addr, auth string, err error) {
	k := gkey{session, name}
	r.mu.Lock()
	g := r.groups[k]
	if g == nil || g.local[from] == nil {
		r.mu.Unlock()
		return "", "", "", fmt.Errorf("%w: rank %d of group %s does not run in this pod (join first)", ErrClosed, from, name)
	}
	peer, _ := lookup(g.view, to)
	mbox := g.mailbox
	r.mu.Unlock()
	switch {
	case mbox:
		return "", "", "", fmt.Errorf("%w: group %s keeps mailboxes", ErrNoDirect, name)
	case peer == nil:
		return "", "", "", fmt.Errorf("%w: rank %d is not live", ErrNoDirect, to)
	case to == from:
		return "", "", "", fmt.Errorf("%w: rank %d is this member", ErrNoDirect, to)
	case r.cfg.Node != "" && r.cfg.OpenDirect != nil && peer.Node == r.cfg.Node && peer.PodUid != "":
		podUID = peer.PodUid
	case peer.DataplaneAddr == r.cfg.Self:
		return "", "", "", fmt.Errorf("%w: rank %d runs in this pod", ErrNoDirect, to)
	case tcp && r.cfg.OpenTCP != nil && peer.DataplaneAddr != "":
		addr = peer.DataplaneAddr
	case !tcp || r.cfg.OpenTCP == nil:
		return "", "", "", fmt.Errorf("%w: rank %d runs on another node", ErrNoDirect, to)
	default:
		return "", "", "", fmt.Errorf("%w: rank %d has no address", ErrNoDirect, to)
	}
	auth, err = r.authenticator(k)
	if err != nil {
		return "", "", "", err
	}
	return podUID, addr, auth, nil
}

// OpenDirect is the sending side of an open: a direct channel's sending
// end for the pair from -> to (a socketpair end on one node, with tcp a
// TCP socket across nodes), or an error wrapping ErrNoDirect (the pair
// then uses the sidecars), or ErrClosed when from does not run here.
func (r *Router) OpenDirect(ctx context.Context, session, name string, from, to uint32, tcp bool) (*os.File, error) {
	uid, addr, auth, err := r.directTarget(session, name, from, to, tcp)
	if err != nil {
		return nil, err
	}
	var f *os.File
	if uid != "" {
		f, err = r.cfg.OpenDirect(ctx, uid, auth, session, name, from, to)
	} else {
		f, err = r.cfg.OpenTCP(ctx, addr, auth, session, name, from, to)
	}
	if err != nil {
		if !errors.Is(err, ErrNoDirect) {
			err = fmt.Errorf("%w: %v", ErrNoDirect, err)
		}
		return nil, err
	}
	return f, nil
}

// CheckAuth opens an authenticator for a group with this namespace's
// keys, as a delivery's (stream.go); a refusal is counted.
func (r *Router) CheckAuth(auth, session, name string) error {
	w := wire{auth: auth, session: session, group: name}
	switch r.check(map[authID]time.Time{}, &w) {
	case Queued:
		return nil
	case NotHere:
		return fmt.Errorf("%w: no keys yet", ErrForeign)
	default:
		return fmt.Errorf("%w: authenticator refused", ErrForeign)
	}
}
