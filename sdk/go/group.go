package ziptrail

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
)

// Direct messages between function instances (issue 16, after Pikachu):
// an instance joins a group of its session as rank r of n, then sends to
// and receives from the other ranks by rank. The pod's sidecar resolves
// ranks to pods through the operator's directory, so no address reaches
// the function, and a group exists only within its namespace: the same
// session and group name in another namespace is another group.

// AnySource, as Recv's from, receives from any rank.
const AnySource = -1

// AnyTag, as Recv's tag, receives a message of any user tag (>= 0). The
// collectives' messages (negative tags) never match it.
const AnyTag int64 = -1

// Group is this instance's membership in a group: its rank among size
// ranks. Send, Recv, Members and Watch are safe for concurrent use; the
// collectives (Barrier, Broadcast, ...) must be called by every member in
// the same order, one at a time per Group.
type Group struct {
	c       *Client
	session string
	name    string
	rank    int
	size    int
	mailbox bool
	seq     atomic.Int64 // collectives started, for their tags
	left    atomic.Bool
	// att receives locally and sends over same-node direct channels
	// (direct.go); nil with a sidecar without member channels.
	att *attached
}

// Members is a view of a group's membership.
type Members struct {
	Size int
	// Live lists the ranks running now, Gone the ranks that joined and then
	// left or died (ranks in neither have not joined yet).
	Live, Gone []int
	// Epoch grows with every membership change (see Group.Watch).
	Epoch uint64
	// Mailbox: messages to ranks not running wait for them (WithMailbox).
	Mailbox bool
}

// JoinOption adjusts Join.
type JoinOption func(*joinOptions)

type joinOptions struct {
	mailbox    bool
	invocation string
	invSet     bool
	waitAll    bool
	timeout    time.Duration
	recycle    bool
}

// WithMailbox makes the group keep messages to ranks that have not joined
// yet, or have left, in the fast tier until an instance joins as that rank
// (the first join decides). Without it, a send to a rank that has not
// joined waits for it, and a send to a rank that left fails with
// ErrPeerGone.
func WithMailbox() JoinOption { return func(o *joinOptions) { o.mailbox = true } }

// WithInvocationID ties the membership to an invocation: it ends when that
// invocation's request ends (the handler returned, failed or was killed).
// Default: the invocation of the handler whose context Join gets, else
// none (the membership lasts until Leave or the pod's end). An empty id
// asks for none even inside a handler.
func WithInvocationID(id string) JoinOption {
	return func(o *joinOptions) { o.invocation, o.invSet = id, true }
}

// WithRecycledBuffers makes received messages of 16 KiB to 4 MiB that
// came over a direct channel (same node or TCP) use buffers that Message.Close
// gives back for the next ones, instead of a new allocation each (and the
// garbage collections that follow): for a member that receives many such
// messages. With it, Bytes of every message is valid only until its
// Close, and a message not closed keeps its buffer (past 64 MiB of them,
// messages get buffers of their own again).
func WithRecycledBuffers() JoinOption { return func(o *joinOptions) { o.recycle = true } }

// WithWaitAll makes Join return only once every rank has joined (or the
// join timeout passed: ErrTimeout).
func WithWaitAll() JoinOption { return func(o *joinOptions) { o.waitAll = true } }

// WithJoinTimeout bounds how long Join waits for the other ranks
// (WithWaitAll); default: the context's deadline, if any.
func WithJoinTimeout(d time.Duration) JoinOption { return func(o *joinOptions) { o.timeout = d } }

// Join makes this instance rank rank (0..size-1) of the group named group
// in session. The first join fixes the group's size and mailbox setting: a
// differing size, or a rank another instance holds, fails with
// ErrConflict. An empty session means the session of the invocation in
// ctx (a handler's). Leave the group when done, unless the membership is
// tied to an invocation (the default inside a handler), which ends it.
func (c *Client) Join(ctx context.Context, session, group string, rank, size int, opts ...JoinOption) (*Group, error) {
	var o joinOptions
	for _, opt := range opts {
		opt(&o)
	}
	inv, inHandler := CurrentInvocation(ctx)
	if session == "" {
		if !inHandler {
			return nil, &Error{Kind: KindInvalid, Op: "join", Err: errors.New("no session given and no invocation in the context")}
		}
		session = inv.Session
	}
	if !o.invSet && inHandler {
		o.invocation = inv.ID
	}
	switch {
	case group == "":
		return nil, &Error{Kind: KindInvalid, Op: "join", Err: errors.New("empty group name")}
	case size < 1 || rank < 0 || rank >= size:
		return nil, &Error{Kind: KindInvalid, Op: "join", Err: fmt.Errorf("rank %d of size %d: want 0 <= rank < size", rank, size)}
	}
	jctx := ctx
	if o.timeout > 0 {
		var cancel context.CancelFunc
		jctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	mc, mailbox, err := c.messages().Attach(jctx, session, group, uint32(rank), uint32(size), o.mailbox, o.invocation)
	switch {
	case err == nil:
		g := &Group{c: c, session: session, name: group, rank: rank, size: size, mailbox: mailbox}
		var rec *recycler
		if o.recycle {
			rec = newRecycler()
		}
		g.att = newAttached(g, mc, rec)
		if o.waitAll {
			if err := g.att.waitAll(jctx); err != nil {
				g.att.close()
				return nil, err
			}
		}
		return g, nil
	case !errors.Is(err, localapi.ErrNoAttach):
		return nil, messageError(jctx, "join", err)
	}
	timeout := o.timeout.Milliseconds()
	if o.timeout <= 0 {
		timeout = timeoutMs(ctx)
	}
	resp, err := c.api.RPC().Join(ctx, &sidecarv1.JoinRequest{Session: session, Group: group, Rank: uint32(rank), Size: uint32(size),
		Mailbox: o.mailbox, InvocationId: o.invocation, WaitAll: o.waitAll, TimeoutMs: timeout})
	if err != nil {
		return nil, rpcError(ctx, "join", err)
	}
	return &Group{c: c, session: session, name: group, rank: rank, size: size, mailbox: resp.GetMailbox()}, nil
}

// JoinGroup joins a group of the running invocation's session, tied to
// that invocation, through the default client: inside a handler,
// JoinGroup(ctx, "shuffle", rank, n) is all it takes. See Client.Join.
func JoinGroup(ctx context.Context, group string, rank, size int, opts ...JoinOption) (*Group, error) {
	if _, ok := CurrentInvocation(ctx); !ok {
		return nil, &Error{Kind: KindInvalid, Op: "join", Err: errors.New("JoinGroup needs a handler's context (use Client.Join with a session elsewhere)")}
	}
	c, err := must("join")
	if err != nil {
		return nil, err
	}
	return c.Join(ctx, "", group, rank, size, opts...)
}

// Rank is this instance's rank.
func (g *Group) Rank() int { return g.rank }

// Size is the group's number of ranks.
func (g *Group) Size() int { return g.size }

// Name is the group's name.
func (g *Group) Name() string { return g.name }

// Session is the session the group belongs to.
func (g *Group) Session() string { return g.session }

// Mailbox reports whether the group keeps messages for ranks not running
// (WithMailbox, as the first join set it).
func (g *Group) Mailbox() bool { return g.mailbox }

// Send sends data to rank to with a user tag (>= 0), in order with this
// rank's other messages to it. It returns once the receiver's sidecar
// queued the message (a full queue holds the sender back), or, in a
// mailbox group, once the fast tier holds it for a rank not running. Data
// above the client's inline threshold passes through a file in the
// shared-memory directory, as Put's objects do; data may be reused once
// Send returns. Errors: ErrPeerGone (the receiver left or died; a
// *PeerError names it), ErrTimeout, ErrForeign, ErrClosed.
func (g *Group) Send(ctx context.Context, to int, tag int64, data []byte) error {
	if tag < 0 {
		return &Error{Kind: KindInvalid, Op: "send", Err: fmt.Errorf("tag %d: user tags are >= 0 (negative ones are the collectives')", tag)}
	}
	if g.att != nil {
		if err := g.checkRank("send", to); err != nil {
			return err
		}
		c, err := g.att.path(ctx, "send", to)
		if err != nil {
			return err
		}
		if c != nil {
			return g.att.sendDirect(ctx, "send", c, to, tag, data)
		}
	}
	if err := g.checkRank("send", to); err != nil {
		return err
	}
	inline, path, name, err := g.c.api.MessagePayload(data)
	if err != nil {
		return &Error{Kind: KindInternal, Op: "send", Err: fmt.Errorf("write to the shared-memory directory: %w", err)}
	}
	if path == "" {
		return g.send(ctx, "send", to, tag, inline, "")
	}
	// A file this client reuses: the sidecar gives it back once sent.
	_, returned, err := g.c.messages().SendFile(ctx, g.session, g.name, uint32(g.rank), uint32(to), tag, path)
	g.c.api.MessageSent(name, err == nil && returned)
	if err != nil {
		return peerError(messageError(ctx, "send", err), to)
	}
	return nil
}

// send sends data, or the shared-memory file at path, which the sidecar
// takes over (or it is removed), to rank to.
func (g *Group) send(ctx context.Context, op string, to int, tag int64, data []byte, path string) error {
	err := g.checkRank(op, to)
	if err == nil {
		if _, err = g.c.messages().Send(ctx, g.session, g.name, uint32(g.rank), uint32(to), tag, data, path); err != nil {
			err = peerError(messageError(ctx, op, err), to)
		}
	}
	if err != nil && path != "" {
		_ = os.Remove(path)
	}
	return err
}

// checkRank refuses a rank outside the group.
func (g *Group) checkRank(op string, rank int) error {
	if rank < 0 || rank >= g.size {
		return &Error{Kind: KindInvalid, Op: op, Err: fmt.Errorf("rank %d outside the group's 0..%d", rank, g.size-1)}
	}
	return nil
}

// Message is a received message. Large data is a mapping of the file the
// sidecar wrote into the shared-memory directory (no copy), as Get's
// objects are: Close it when done.
type Message struct {
	From int   // the sender's rank
	Tag  int64 // its tag
	Size int64 // len(Bytes())
	data []byte
	buf  []byte    // the whole mapping, when mapped
	rec  *recycler // data is a recycled buffer (WithRecycledBuffers)
	// back releases buf's file, lent by the sidecar, once unmapped.
	back func()
	// memfd: buf maps a direct channel's memfd (samenode.MapSealed), in
	// x/sys/unix's table of mappings: syscall.Munmap would not find it.
	memfd bool
}

// Bytes returns the message's data, read-only; for a mapped message, and
// any message of a group joined WithRecycledBuffers, it is valid until
// Close.
func (m *Message) Bytes() []byte { return m.data }

// Mapped reports whether Bytes maps a shared-memory file rather than bytes
// that arrived inline.
func (m *Message) Mapped() bool { return m.buf != nil }

// Close releases a mapped message's memory, or gives its recycled buffer
// back; Bytes is nil afterwards.
func (m *Message) Close() error {
	if m != nil && m.rec != nil {
		m.rec.put(m.data)
		m.rec, m.data = nil, nil
		return nil
	}
	if m == nil || m.buf == nil {
		return nil
	}
	var err error
	if m.memfd {
		err = samenode.Unmap(m.buf)
	} else {
		err = (&Object{data: m.buf, mapped: true}).Close()
	}
	m.buf, m.data = nil, nil
	if m.back != nil && err == nil {
		m.back() // unmapped: the sidecar may fill the file again
	}
	m.back = nil
	return err
}

// Recv returns the oldest queued message from rank from (or AnySource)
// with tag tag (or AnyTag: any tag >= 0), waiting for one; the messages of
// one sender arrive in the order it sent them. Errors: ErrPeerGone when
// from is gone (with AnySource: every other rank is) and nothing matching
// is queued, ErrTimeout when ctx ends, ErrClosed when this instance is not
// a member.
func (g *Group) Recv(ctx context.Context, from int, tag int64) (*Message, error) {
	if tag < 0 && tag != AnyTag {
		return nil, &Error{Kind: KindInvalid, Op: "recv", Err: fmt.Errorf("tag %d: user tags are >= 0, or AnyTag", tag)}
	}
	return g.recv(ctx, "recv", from, tag, tag == AnyTag)
}

func (g *Group) recv(ctx context.Context, op string, from int, tag int64, anyTag bool) (*Message, error) {
	resp, err := g.recvRaw(ctx, op, from, tag, anyTag)
	if err != nil {
		return nil, err
	}
	m := &Message{From: resp.from, Tag: resp.tag, data: resp.data, buf: resp.mapping, memfd: resp.mapping != nil, rec: resp.rec}
	if resp.token != "" {
		// A lent file, mapped at its push.
		if resp.ferr != nil {
			resp.release()
			return nil, &Error{Kind: KindInternal, Op: op, Err: resp.ferr}
		}
		m.data, m.buf, m.back = resp.fmap, resp.fmap, resp.giveBack()
	} else if resp.path != "" {
		data, mapped, err := mapFile(resp.path, true)
		if err != nil {
			return nil, &Error{Kind: KindInternal, Op: op, Err: err}
		}
		m.data = data
		if mapped {
			m.buf = data
		}
	} else if m.data == nil {
		m.data = []byte{}
	}
	m.Size = int64(len(m.data))
	return m, nil
}

// recvRaw receives a message: its bytes (a mapping of a memfd, for a
// large one from a direct channel), or the path of a shared-memory file
// for the caller to map and remove.
func (g *Group) recvRaw(ctx context.Context, op string, from int, tag int64, anyTag bool) (*inMsg, error) {
	var peer uint32
	if from != AnySource {
		if err := g.checkRank(op, from); err != nil {
			return nil, err
		}
		peer = uint32(from)
	}
	if g.att != nil {
		return g.att.recv(ctx, op, from, tag, anyTag)
	}
	if anyTag {
		tag = 0
	}
	resp, err := g.c.messages().Recv(ctx, g.session, g.name, uint32(g.rank), from == AnySource, peer, anyTag, tag)
	if err != nil {
		return nil, peerError(messageError(ctx, op, err), from)
	}
	return &inMsg{from: int(resp.From), tag: resp.Tag, data: resp.Data, path: resp.Path}, nil
}

// Members returns the group's current membership.
func (g *Group) Members(ctx context.Context) (*Members, error) {
	resp, err := g.c.api.RPC().Members(ctx, &sidecarv1.MembersRequest{Session: g.session, Group: g.name})
	if err != nil {
		return nil, rpcError(ctx, "members", err)
	}
	return members(resp), nil
}

// watchPoll bounds one long poll of Watch (it polls again until ctx ends).
const watchPoll = 30 * time.Second

// Watch waits for a membership change newer than epoch (a Members.Epoch
// seen before; 0 for any view) and returns the new view. It returns
// ErrTimeout when ctx ends first.
func (g *Group) Watch(ctx context.Context, epoch uint64) (*Members, error) {
	for {
		wait := watchPoll
		if d, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(d))
		}
		if wait <= 0 {
			return nil, &Error{Kind: KindTimeout, Op: "watch", Err: context.DeadlineExceeded}
		}
		resp, err := g.c.api.RPC().Members(ctx, &sidecarv1.MembersRequest{Session: g.session, Group: g.name, AfterEpoch: epoch,
			TimeoutMs: max(wait.Milliseconds(), 1)})
		if err != nil {
			err = rpcError(ctx, "watch", err)
			if IsKind(err, KindTimeout) && ctx.Err() == nil {
				continue // the sidecar's poll ended without a change
			}
			return nil, err
		}
		if m := members(resp); m.Epoch > epoch {
			return m, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, &Error{Kind: KindTimeout, Op: "watch", Err: err}
		}
	}
}

// Leave ends this instance's membership: the other ranks see it gone
// (their sends to it fail with ErrPeerGone, unless the group has a
// mailbox). Leaving twice is a no-op.
func (g *Group) Leave(ctx context.Context) error {
	if g.left.Swap(true) {
		return nil
	}
	_, err := g.c.api.RPC().Leave(ctx, &sidecarv1.LeaveRequest{Session: g.session, Group: g.name, Rank: uint32(g.rank)})
	if g.att != nil {
		g.att.close()
	}
	if err != nil {
		return rpcError(ctx, "leave", err)
	}
	return nil
}

func members(resp *sidecarv1.MembersResponse) *Members {
	m := &Members{Size: int(resp.GetSize()), Epoch: resp.GetEpoch(), Mailbox: resp.GetMailbox(),
		Live: make([]int, 0, len(resp.GetLive())), Gone: make([]int, 0, len(resp.GetGone()))}
	for _, r := range resp.GetLive() {
		m.Live = append(m.Live, int(r))
	}
	for _, r := range resp.GetGone() {
		m.Gone = append(m.Gone, int(r))
	}
	return m
}

// timeoutMs passes ctx's deadline to the sidecar as a timeout (0: none).
func timeoutMs(ctx context.Context) int64 {
	d, ok := ctx.Deadline()
	if !ok {
		return 0
	}
	return max(time.Until(d).Milliseconds(), 1)
}

// PeerError names the rank a messaging error is about: the peer that is
// gone (ErrPeerGone) or, in a collective, the rank whose failure aborted
// it. errors.As(err, &pe) finds it inside the SDK's *Error.
type PeerError struct {
	Rank int
	Err  error
}

// Error names the rank, then the cause.
func (e *PeerError) Error() string { return fmt.Sprintf("rank %d: %v", e.Rank, e.Err) }

// Unwrap returns the cause.
func (e *PeerError) Unwrap() error { return e.Err }

// peerError names rank in a PeerGone error about it.
func peerError(err error, rank int) error {
	var e *Error
	if rank < 0 || !errors.As(err, &e) || e.Kind != KindPeerGone {
		return err
	}
	var pe *PeerError
	if errors.As(e.Err, &pe) {
		return err
	}
	e.Err = &PeerError{Rank: rank, Err: e.Err}
	return err
}
