// Package messaging is a sidecar's part of direct messages between
// function instances (Pikachu, docs/messaging.md): the pod's members of
// messaging groups, their inboxes, and sending by rank.
//
// An instance joins a group of its session as a rank; the operator's
// directory (package directory, over the control stream) answers and
// pushes the group's view, rank -> pod address, to every pod with a
// member. Sends resolve the receiver's rank in that view and deliver over
// a message stream to the receiver's sidecar on the data-plane port
// (stream.go); addresses never leave the sidecar. Each delivery carries an authenticator sealed
// with the namespace's key, so the receiving sidecar takes messages only
// from sidecars of its own namespace. Large messages go from the sender's
// shared-memory file to the receiver's without a copy through either
// sidecar's heap (sendfile, then a read into a new file).
//
// Per sender and receiver, messages are numbered: a receive takes the
// oldest matching message and, of one sender's, the lowest number, so the
// order holds even when some went through a mailbox. A full inbox holds
// the sender back (the delivery returns once there is room).
package messaging

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// Errors of messaging; the local API reports each as its own class.
var (
	ErrPeerGone    = errors.New("peer gone")
	ErrTimeout     = errors.New("message timeout")
	ErrForeign     = errors.New("peer of another namespace")
	ErrClosed      = errors.New("not a member of the group")
	ErrConflict    = errors.New("group conflict")
	ErrInvalid     = errors.New("invalid message request")
	ErrNoDirectory = errors.New("messaging needs the operator's directory (no control stream)")
	ErrRefused     = errors.New("the receiving pod could not store the message")
)

// Config of a Router.
type Config struct {
	Self string // this pod's data-plane address
	// Keys is the namespace's keyring (nil until the operator sent it).
	Keys func() *ref.Keyring
	// Control sends a message to the operator; nil: no directory.
	Control func(*controlv1.SidecarMessage) error
	// Mailbox holds messages for ranks not running (the fast tier); nil
	// without one.
	Mailbox Mailbox
	// NewFile makes (or reuses) a file of size bytes in the pod's object
	// directory for a large incoming message, mapped writable: the body is
	// read into it, and the receiving function takes it over (File); nil
	// keeps every message in memory.
	NewFile func(size int64) (File, error)
	// InlineMax is the largest incoming message kept in memory rather
	// than in a file (default 64 KiB).
	InlineMax int
	// QueueBytes caps one member's queued message bytes (default 64 MiB):
	// past it, deliveries wait.
	QueueBytes int64
	// MaxStreams caps the message streams from other sidecars this one
	// serves at once (0: $ZIPTRAIL_MSG_STREAMS_MAX, else 1024, about 70
	// MiB of buffers at most): past it, a new stream is closed right
	// after its magic, counted and logged (its sender tries again).
	MaxStreams int
	// HandshakeTimeout bounds the wait for a new stream's first message
	// header after its magic (0: $ZIPTRAIL_MSG_STREAM_HANDSHAKE_TIMEOUT,
	// else 5 s): a peer that sends the magic and then nothing is closed.
	HandshakeTimeout time.Duration
	// MaxStreamsPerPeer caps the streams served at once from one source
	// address (0: $ZIPTRAIL_MSG_STREAMS_PER_PEER, else 64), so that one
	// pod cannot hold the places of MaxStreams that others need.
	MaxStreamsPerPeer int
	// GoneGrace bounds how long a send waits for the directory to confirm
	// that a receiver whose sidecar failed is gone (default 1 s).
	GoneGrace time.Duration
	// Node is this pod's node when the same-node direct channels are on
	// (the node directory is configured); empty: never direct.
	Node string
	// OpenDirect asks the receiver's sidecar, pod podUID on this node, for
	// a direct channel (the sender's end); nil: never direct.
	OpenDirect func(ctx context.Context, podUID, auth, session, group string, from, to uint32) (*os.File, error)
	// OpenTCP asks the receiver's sidecar at addr (its data-plane
	// address) for a direct channel across nodes: a TCP socket, the
	// sender's end; nil keeps pairs across nodes on the sidecars.
	OpenTCP func(ctx context.Context, addr, auth, session, group string, from, to uint32) (*os.File, error)
	Now     func() time.Time
}

func (c *Config) inlineMax() int {
	if c.InlineMax > 0 {
		return c.InlineMax
	}
	return 64 << 10
}

// Message is a message as a member's inbox holds it.
type Message struct {
	Session, Group string
	From, To       uint32
	Tag            int64
	Seq            uint64 // per sender and receiver, from 1
	Data           []byte // a small message's bytes
	// Path is a large message's file in the pod's object directory: the
	// inbox owns it until a receive hands it over (HandOut).
	Path string
	// File is Path's file as Config.NewFile made it (nil: a plain file,
	// removed by name when nobody will read it).
	File File
	Size uint64
}

// File is the file a large incoming message was read into (Config.NewFile),
// which the sidecar may reuse for later messages once a function is done
// with it.
type File interface {
	// Path is the file's path in the object directory.
	Path() string
	// Mem maps the whole file writable until the file is handed out.
	Mem() []byte
	// HandOut gives the file to the function that receives the message.
	// lent: the function gives it back (a release of the token, after
	// which the sidecar fills it again); otherwise the name is the
	// function's from now on. Handing out again (a response that could
	// not be written, its message queued anew) ends the earlier lending.
	HandOut(lent bool) (token string)
	// Discard removes the file: nobody will read it.
	Discard()
}

// HandOut hands a large message's file to the function that receives it
// (see File.HandOut); it returns the release token of a lent file ("" for
// a file given away, or one the sidecar does not reuse).
func (m *Message) HandOut(lent bool) (token string) {
	if m.File == nil {
		return ""
	}
	return m.File.HandOut(lent)
}

// discard removes a large message's file: nobody will read it.
func (m *Message) discard() {
	switch {
	case m.File != nil:
		m.File.Discard()
	case m.Path != "":
		_ = os.Remove(m.Path)
	}
}

// Mailbox stores messages for a rank of a group, in order.
type Mailbox interface {
	Push(ctx context.Context, session, group string, rank uint32, m Message) error
	// Take removes and returns the rank's stored messages.
	Take(ctx context.Context, session, group string, rank uint32) ([]Message, error)
}

// Router is one pod's messaging state. It is safe for concurrent use.
type Router struct {
	cfg Config

	mu     sync.Mutex
	groups map[gkey]*group
	joins  map[string]chan *controlv1.GroupJoinResult
	auth   map[gkey]sealed
	left   chan struct{} // closed and replaced whenever a member ends
	// streams are the message streams to other sidecars.
	streams Streams
	// serving counts the streams from other sidecars served (MaxStreams).
	serving atomic.Int64
	// peers counts them by source address (MaxStreamsPerPeer).
	peersMu sync.Mutex
	peers   map[string]int
	// deadlines end the function socket's waiting sends and receives.
	deadlines deadlines
}

type gkey struct{ session, group string }

type sealed struct {
	token   string
	expires time.Time
}

type group struct {
	view    *controlv1.GroupView
	changed chan struct{} // closed and replaced on every new view
	local   map[uint32]*member
	seq     map[[2]uint32]uint64 // (from, to) -> last sent
	mailbox bool
	size    uint32
}

type member struct {
	rank       uint32
	invocation string
	inbox      []Message
	seen       map[[2]uint64]struct{} // (sender, number) of messages delivered
	bytes      int64
	wake       chan struct{} // closed and replaced when the inbox or state changes
	closed     bool
	// Back-pressure on the streams from other sidecars (inbox.go, admit):
	reserved int64         // bytes of messages admitted, being read
	parked   int           // stream readers waiting for room
	room     chan struct{} // closed and replaced when they may have it (nil until one waits)
	wants    []*want       // blocking receives (Recv) waiting
	// waiters are the receives waiting without a goroutine (RecvFunc),
	// oldest first; a message that one of them takes skips the inbox.
	waiters []*waiter
	// att is the member's channel to its function, when attached.
	att *attachment
}

// New returns a router.
func New(cfg Config) *Router {
	if cfg.QueueBytes <= 0 {
		cfg.QueueBytes = 64 << 20
	}
	if cfg.GoneGrace <= 0 {
		cfg.GoneGrace = time.Second
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = envInt("ZIPTRAIL_MSG_STREAMS_MAX", defaultMaxStreams)
	}
	if cfg.MaxStreamsPerPeer <= 0 {
		cfg.MaxStreamsPerPeer = envInt("ZIPTRAIL_MSG_STREAMS_PER_PEER", defaultMaxStreamsPerPeer)
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = envDuration("ZIPTRAIL_MSG_STREAM_HANDSHAKE_TIMEOUT", defaultHandshakeTimeout)
	}
	return &Router{cfg: cfg, groups: map[gkey]*group{}, joins: map[string]chan *controlv1.GroupJoinResult{}, auth: map[gkey]sealed{},
		left: make(chan struct{})}
}

// Live is the number of group members running in this pod.
func (r *Router) Live() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, g := range r.groups {
		n += len(g.local)
	}
	return n
}

// WaitIdle waits until no group member runs in this pod, or ctx ends. A
// terminating pod (Knative scaling it away) keeps its data plane and
// local API serving until then, so a live group is not cut under its
// members: their invocations are requests in flight, which Knative's
// drain waits for too.
func (r *Router) WaitIdle(ctx context.Context) error {
	for {
		r.mu.Lock()
		n, ch := len(r.groups), r.left
		r.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (r *Router) now() time.Time {
	if r.cfg.Now != nil {
		return r.cfg.Now()
	}
	return time.Now()
}

func signal(ch *chan struct{}) {
	close(*ch)
	*ch = make(chan struct{})
}

// Join makes this pod the rank's member and waits for the directory's
// answer; with waitAll it also waits until every rank joined once.
func (r *Router) Join(ctx context.Context, session, name string, rank, size uint32, mailbox bool, invocation string, waitAll bool) (*controlv1.GroupView, error) {
	return r.join(ctx, session, name, rank, size, mailbox, invocation, waitAll, nil)
}

func (r *Router) join(ctx context.Context, session, name string, rank, size uint32, mailbox bool, invocation string, waitAll bool, att *attachment) (*controlv1.GroupView, error) {
	switch {
	case r.cfg.Control == nil:
		return nil, ErrNoDirectory
	case session == "" || name == "":
		return nil, fmt.Errorf("%w: session and group are required", ErrInvalid)
	case size == 0 || rank >= size:
		return nil, fmt.Errorf("%w: rank %d of size %d", ErrInvalid, rank, size)
	}
	k := gkey{session, name}
	id := newID()
	res := make(chan *controlv1.GroupJoinResult, 1)
	r.mu.Lock()
	g := r.groups[k]
	if g == nil {
		g = &group{changed: make(chan struct{}), local: map[uint32]*member{}, seq: map[[2]uint32]uint64{}, mailbox: mailbox, size: size}
		r.groups[k] = g
	}
	if _, ok := g.local[rank]; ok {
		r.mu.Unlock()
		return nil, fmt.Errorf("%w: rank %d of group %s already runs in this pod", ErrConflict, rank, name)
	}
	// The member exists before the directory announces it, so a message
	// sent as soon as a peer sees the view finds it.
	m := &member{rank: rank, invocation: invocation, wake: make(chan struct{}), seen: map[[2]uint64]struct{}{}, att: att}
	g.local[rank] = m
	r.joins[id] = res
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.joins, id)
		r.mu.Unlock()
	}()
	fail := func(err error) (*controlv1.GroupView, error) {
		r.drop(k, rank, m)
		return nil, err
	}
	err := r.cfg.Control(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_GroupJoin{GroupJoin: &controlv1.GroupJoin{
		JoinId: id, Session: session, Group: name, Rank: rank, Size: size, Mailbox: mailbox}}})
	if err != nil {
		return fail(fmt.Errorf("join: %w", err))
	}
	select {
	case jr := <-res:
		if jr.Error != "" {
			if jr.Code == 6 { // codes.AlreadyExists
				return fail(fmt.Errorf("%w: %s", ErrConflict, jr.Error))
			}
			if jr.Code == 7 { // codes.PermissionDenied
				return fail(fmt.Errorf("%w: %s", ErrForeign, jr.Error))
			}
			return fail(fmt.Errorf("%w: %s", ErrInvalid, jr.Error))
		}
	case <-ctx.Done():
		r.leave(k, rank, m, false)
		return nil, fmt.Errorf("%w: no answer from the directory: %v", ErrTimeout, context.Cause(ctx))
	}
	if mailbox && r.cfg.Mailbox != nil {
		r.drainMailbox(ctx, k, m)
	}
	// Wait for the view that has this pod's rank (it follows the result),
	// and for every rank with waitAll.
	for {
		r.mu.Lock()
		v, ch := g.view, g.changed
		r.mu.Unlock()
		if v != nil && hasRank(v, rank, r.cfg.Self) && (!waitAll || uint32(len(v.Members)+len(v.Gone)) >= v.Size) {
			return v, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			if v != nil && hasRank(v, rank, r.cfg.Self) {
				return v, fmt.Errorf("%w: waiting for every rank of group %s to join", ErrTimeout, name)
			}
			r.leave(k, rank, m, false)
			return nil, fmt.Errorf("%w: waiting for the directory's view: %v", ErrTimeout, context.Cause(ctx))
		}
	}
}

func hasRank(v *controlv1.GroupView, rank uint32, addr string) bool {
	for _, m := range v.Members {
		if m.Rank == rank {
			return m.DataplaneAddr == addr
		}
	}
	return false
}

func newID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// JoinResult routes the directory's answer to the waiting Join.
func (r *Router) JoinResult(res *controlv1.GroupJoinResult) {
	r.mu.Lock()
	ch := r.joins[res.JoinId]
	r.mu.Unlock()
	if ch != nil {
		select {
		case ch <- res:
		default:
		}
	}
}

// View takes a group's new membership from the directory.
func (r *Router) View(v *controlv1.GroupView) {
	r.mu.Lock()
	g := r.groups[gkey{v.Session, v.Group}]
	if g == nil || (g.view != nil && v.Epoch <= g.view.Epoch) {
		r.mu.Unlock()
		return
	}
	g.view = v
	g.size, g.mailbox = v.Size, v.Mailbox
	signal(&g.changed)
	// Waiting receives whose senders are all gone fail now.
	var es []ended
	for rank, mb := range g.local {
		for i := 0; i < len(mb.waiters); {
			w := mb.waiters[i]
			if err := peersGone(v, rank, w.f); err != nil {
				mb.unwait(w)
				es = append(es, ended{w, fmt.Errorf("%w (group %s)", err, v.Group)})
				continue
			}
			i++
		}
	}
	r.mu.Unlock()
	endAll(es)
}

// Resync joins this pod's members again on a new control stream (the
// operator forgot them when the old one ended).
func (r *Router) Resync() {
	if r.cfg.Control == nil {
		return
	}
	r.mu.Lock()
	var msgs []*controlv1.SidecarMessage
	for k, g := range r.groups {
		for rank := range g.local {
			msgs = append(msgs, &controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_GroupJoin{GroupJoin: &controlv1.GroupJoin{
				JoinId: newID(), Session: k.session, Group: k.group, Rank: rank, Size: g.size, Mailbox: g.mailbox}}})
		}
	}
	r.mu.Unlock()
	for _, m := range msgs {
		_ = r.cfg.Control(m)
	}
}

// Leave ends the rank's membership in this pod.
func (r *Router) Leave(session, name string, rank uint32) error {
	k := gkey{session, name}
	r.mu.Lock()
	g := r.groups[k]
	var m *member
	if g != nil {
		m = g.local[rank]
	}
	r.mu.Unlock()
	if m == nil {
		return fmt.Errorf("%w: rank %d of group %s does not run in this pod", ErrClosed, rank, name)
	}
	r.leave(k, rank, m, false)
	return nil
}

// InvocationEnded ends the memberships of an invocation whose request
// ended (failed: it did not answer, e.g. the function was killed).
func (r *Router) InvocationEnded(invocation string, failed bool) {
	if invocation == "" {
		return
	}
	type lm struct {
		k    gkey
		rank uint32
		m    *member
	}
	var ls []lm
	r.mu.Lock()
	for k, g := range r.groups {
		for rank, m := range g.local {
			if m.invocation == invocation {
				ls = append(ls, lm{k, rank, m})
			}
		}
	}
	r.mu.Unlock()
	for _, l := range ls {
		r.leave(l.k, l.rank, l.m, failed)
	}
}

func (r *Router) leave(k gkey, rank uint32, m *member, failed bool) {
	if !r.drop(k, rank, m) {
		return
	}
	if r.cfg.Control != nil {
		_ = r.cfg.Control(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_GroupLeave{GroupLeave: &controlv1.GroupLeave{
			Session: k.session, Group: k.group, Rank: rank, Failed: failed}}})
	}
}

// drop removes a member (false when it was gone already).
func (r *Router) drop(k gkey, rank uint32, m *member) bool {
	r.mu.Lock()
	var es []ended
	defer func() {
		r.mu.Unlock()
		endAll(es)
	}()
	g := r.groups[k]
	if g == nil || g.local[rank] != m {
		return false
	}
	delete(g.local, rank)
	m.closed = true
	for len(m.waiters) > 0 {
		w := m.waiters[0]
		m.unwait(w)
		es = append(es, ended{w, fmt.Errorf("%w: rank %d of group %s does not run in this pod", ErrClosed, rank, k.group)})
	}
	for _, msg := range m.inbox {
		msg.discard() // unread: nobody will map it
	}
	m.inbox, m.bytes = nil, 0
	m.roomChanged()
	if m.att != nil {
		for _, d := range m.att.directs {
			_ = d.f.Close()
		}
		m.att.directs = nil
	}
	signal(&m.wake)
	signal(&r.left)
	if len(g.local) == 0 {
		delete(r.groups, k)
		delete(r.auth, k)
	}
	return true
}

// Members returns the group's view once its epoch is past after (at once
// when after is 0), or the latest one when ctx ends first.
func (r *Router) Members(ctx context.Context, session, name string, after uint64) (*controlv1.GroupView, error) {
	k := gkey{session, name}
	for {
		r.mu.Lock()
		g := r.groups[k]
		if g == nil {
			r.mu.Unlock()
			return nil, fmt.Errorf("%w: no rank of group %s runs in this pod", ErrClosed, name)
		}
		v, ch := g.view, g.changed
		r.mu.Unlock()
		if v != nil && v.Epoch > after {
			return v, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			if v != nil {
				return v, nil
			}
			return nil, fmt.Errorf("%w: no view of group %s yet", ErrTimeout, name)
		}
	}
}

// lookup finds a rank in a view: its live member, or gone when it joined
// and left (nil, false: it has not joined yet).
func lookup(v *controlv1.GroupView, rank uint32) (m *controlv1.GroupMember, gone bool) {
	if v == nil {
		return nil, false
	}
	for _, m := range v.Members {
		if m.Rank == rank {
			return m, true
		}
	}
	return nil, slices.Contains(v.Gone, rank)
}
