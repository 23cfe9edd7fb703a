// Package controlclient is the sidecar's end of the control stream to the
// operator. It is its own package, apart from the operator's server in
// package control, so queue-proxy-zl links neither controller-runtime nor
// client-go: that kept ~10 MiB of resident memory per pod (bench/sidecarmem).
package controlclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/retry"
)

// Commands are what the operator asks of a sidecar. Callbacks run on the
// client's receive goroutine and must not block for long.
type Commands struct {
	Keys func(*controlv1.Keys)
	// Tiers are the storage tiers' endpoints and credentials, sent on
	// every stream before the Keys.
	Tiers     func(*controlv1.Tiers)
	Drop      func(*controlv1.DropObjects)
	KeepAlive func(*controlv1.KeepAlive)
	// Rejected learns of an event the operator refused (it is not sent
	// again); nil passes the refusal to Client.Log.
	Rejected func(*controlv1.Rejected)
	// GroupView and GroupJoinResult are the messaging directory's
	// (docs/messaging.md).
	GroupView       func(*controlv1.GroupView)
	GroupJoinResult func(*controlv1.GroupJoinResult)
	// Delegations are the triggers the sidecar fires itself (delegated
	// firing, docs/control-stream.md); each replaces the previous set.
	Delegations func(*controlv1.Delegations)
}

// Client is the sidecar's end of the control stream. It reconnects with
// backoff for as long as its context lives. Every event carries a sequence
// number and stays queued until the operator acknowledges it; after a
// reconnect the unacknowledged ones are sent again, so neither an operator
// restart nor a broken connection loses an event (the engine deduplicates).
type Client struct {
	addr     string
	token    TokenSource
	hello    *controlv1.Hello
	commands Commands
	opts     []grpc.DialOption
	// Log receives connection errors (the client retries them itself).
	Log func(error)
	// QueueLimit bounds the events kept until the operator acknowledges
	// them (it does once a saved checkpoint holds them); default 65,536.
	// Send waits up to QueueWait (default 30s) for room, then fails with
	// ErrQueueFull: the sender is held back while the operator cannot save.
	QueueLimit int
	QueueWait  time.Duration
	// KeepFor is how long a kept report waits for the operator's release
	// before it is sent (kept.go); default DefaultKeepFor.
	KeepFor time.Duration

	mu        sync.Mutex
	unacked   []*controlv1.SidecarMessage // in seq order
	seq       uint64
	wake      chan struct{}
	room      chan struct{} // closed (and replaced) when acks free room
	connected bool
	// kept are the reports kept unsent until the operator saves the
	// answers that named them (kept.go); keptFilled counts those filled.
	kept       map[uint64]*keptReport
	keptFilled int
	keptN      uint64
}

// ErrQueueFull is returned by Send when the operator has been unreachable
// long enough for the bounded queue to fill.
var ErrQueueFull = errors.New("control: event queue full, the operator has not acknowledged")

// NewClient returns a client for the operator at addr (host:port). Every
// stream it opens presents token's current token (FileToken re-reads the
// projected token file, which the kubelet rotates); the operator scopes
// the stream to that token's namespace and pod.
func NewClient(addr string, token TokenSource, hello *controlv1.Hello, commands Commands, opts ...grpc.DialOption) *Client {
	return &Client{addr: addr, token: token, hello: hello, commands: commands, opts: dialOptions(token, opts), wake: make(chan struct{}, 1), room: make(chan struct{})}
}

// dialOptions are opts (default: no TLS) plus the token as per-call
// credentials.
func dialOptions(token TokenSource, opts []grpc.DialOption) []grpc.DialOption {
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	// gRPC's own reconnection backs off up to 2 minutes: after an operator
	// rollout of half a minute the sidecars' connections would come back up
	// to a minute after the operator did, every stream call failing fast
	// meanwhile. Bounded at 2 s (opts may set their own).
	all := []grpc.DialOption{grpc.WithConnectParams(retry.GRPCReconnect)}
	return append(append(all, opts...), grpc.WithPerRPCCredentials(PerRPCCredentials(token)))
}

// Send queues an event for the operator; with QueueLimit events not
// acknowledged yet, it waits for room (QueueWait at most).
func (c *Client) Send(m *controlv1.SidecarMessage) error { return c.SendAll(m) }

// SendAll queues events for the operator together: they go in one
// message (Events) to an operator that understands it, in order.
func (c *Client) SendAll(msgs ...*controlv1.SidecarMessage) error {
	if len(msgs) == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.waitRoom(); err != nil {
		return err
	}
	c.queue(msgs)
	return nil
}

// waitRoom waits (QueueWait at most) until fewer than QueueLimit events
// and kept reports wait for the operator. c.mu is held; it is released
// while waiting.
func (c *Client) waitRoom() error {
	limit, wait := c.QueueLimit, c.QueueWait
	if limit <= 0 {
		limit = 65536
	}
	if wait <= 0 {
		wait = 30 * time.Second
	}
	var timer *time.Timer
	for len(c.unacked)+c.keptFilled >= limit {
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		}
		room := c.room
		c.mu.Unlock()
		select {
		case <-room:
		case <-timer.C:
			c.mu.Lock()
			return fmt.Errorf("%w: %d events and %d kept reports wait for the operator (it acknowledges and releases what a saved checkpoint holds)",
				ErrQueueFull, len(c.unacked), c.keptFilled)
		}
		c.mu.Lock()
	}
	return nil
}

// queue appends msgs to the events to send, in order. c.mu is held.
func (c *Client) queue(msgs []*controlv1.SidecarMessage) {
	for _, m := range msgs {
		c.seq++
		m.Seq = c.seq
		c.unacked = append(c.unacked, m)
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Connected reports whether a stream is up.
func (c *Client) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.connected
}

// Run keeps a stream to the operator until ctx ends. An operator replica
// that does not own the pod's workflow answers with a Redirect to the one
// that does (docs/sharding.md): the client reconnects there at once, with
// the same token, and goes back to addr (the control Service) when that
// stream ends.
func (c *Client) Run(ctx context.Context) error {
	if c.token == nil {
		return errors.New("controlclient: no service-account token source: the operator refuses unauthenticated streams")
	}
	conn, err := grpc.NewClient(c.addr, c.opts...)
	if err != nil {
		return err
	}
	defer conn.Close()
	home := controlv1.NewControlClient(conn)
	var away *grpc.ClientConn // the connection to a redirect's address
	defer func() {
		if away != nil {
			_ = away.Close()
		}
	}()
	cl, hops := home, 0
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		err := c.stream(ctx, cl)
		if ctx.Err() != nil {
			return nil
		}
		if away != nil {
			_ = away.Close()
			away = nil
		}
		cl = home
		if time.Since(start) > 10*time.Second {
			hops = 0 // it was up for a while: this is a new move
		}
		var rd *redirected
		if errors.As(err, &rd) && hops < maxRedirects {
			hops++
			if rd.addr == "" {
				continue // the bucket is moving: ask the control Service again
			}
			if away, err = grpc.NewClient(rd.addr, c.opts...); err == nil {
				cl = controlv1.NewControlClient(away)
				continue
			}
		}
		hops = 0
		if time.Since(start) > 10*time.Second {
			backoff = 100 * time.Millisecond // it was up for a while: retry fast
		}
		if err != nil && c.Log != nil {
			c.Log(err)
		}
		t := time.NewTimer(time.Duration(rand.Int64N(int64(backoff))) + backoff/2)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		backoff = min(backoff*2, 10*time.Second)
	}
	return nil
}

// maxRedirects is how many redirects in a row are followed before backing
// off (a bucket changing owners as the sidecar follows it).
const maxRedirects = 4

// redirected ends a stream the operator redirected.
type redirected struct{ addr, bucket string }

func (r *redirected) Error() string {
	return fmt.Sprintf("the operator redirected the stream to %q (bucket %s)", r.addr, r.bucket)
}

// stream runs one connection: Hello, then events out and commands in.
func (c *Client) stream(ctx context.Context, cl controlv1.ControlClient) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The owner at the other end may be another one than the last: it
	// learns the outcomes kept so far from their reports. (One kept from
	// here on waits for its release on this stream, or KeepFor.)
	c.mu.Lock()
	c.sendKept(time.Time{})
	c.mu.Unlock()
	st, err := cl.Connect(sctx)
	if err != nil {
		return err
	}
	if err := st.Send(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_Hello{Hello: c.hello}}); err != nil {
		if errors.Is(err, io.EOF) {
			// The operator ended the stream (e.g. refused the token, or
			// redirected it): its status is what Recv returns.
			var m *controlv1.OperatorMessage
			if m, err = st.Recv(); err == nil && m.GetRedirect() != nil {
				return &redirected{addr: m.GetRedirect().Address, bucket: m.GetRedirect().Bucket}
			}
		}
		return err
	}
	recvErr := make(chan error, 1)
	var batches atomic.Bool // the operator announced Features.events
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			if rd := m.GetRedirect(); rd != nil {
				recvErr <- &redirected{addr: rd.Address, bucket: rd.Bucket}
				return
			}
			if f := m.GetFeatures(); f != nil {
				batches.Store(f.Events)
				continue
			}
			c.handle(m)
		}
	}()
	c.setConnected(true)
	defer c.setConnected(false)
	tick := time.NewTicker(c.keepFor() / 2)
	defer tick.Stop()
	var sent uint64 // highest seq sent on this stream; a new stream resends all unacked
	for {
		c.mu.Lock()
		// unacked is in seq order: what this stream has not sent is its
		// tail (found by bisection, not a scan of every event kept).
		i := sort.Search(len(c.unacked), func(i int) bool { return c.unacked[i].Seq > sent })
		batch := slices.Clone(c.unacked[i:])
		c.mu.Unlock()
		for len(batch) > 0 {
			n := 1
			if batches.Load() {
				n = eventsMessage(batch)
			}
			m := batch[0]
			if n > 1 {
				m = &controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_Events{Events: &controlv1.Events{Events: batch[:n]}}}
			}
			if err := st.Send(m); err != nil {
				if errors.Is(err, io.EOF) {
					return <-recvErr // the operator's status
				}
				return err
			}
			sent = batch[n-1].Seq
			batch = batch[n:]
		}
		select {
		case <-c.wake:
		case <-tick.C:
			c.mu.Lock()
			c.sendKept(time.Now().Add(-c.keepFor())) // not released in time
			c.mu.Unlock()
		case err := <-recvErr:
			return err
		case <-ctx.Done():
			_ = st.CloseSend()
			return ctx.Err()
		}
	}
}

// Bounds of one Events message: the operator's (control.maxEvents), and
// bytes well below its 4 MiB message limit. A larger event goes alone.
const (
	maxEvents      = 256
	maxEventsBytes = 1 << 20
)

// eventsMessage is how many of the leading events go in one message.
func eventsMessage(evs []*controlv1.SidecarMessage) int {
	size := 0
	for i, m := range evs {
		if size += proto.Size(m); i == maxEvents || i > 0 && size > maxEventsBytes {
			return i
		}
	}
	return len(evs)
}

// ack forgets every event up to seq.
func (c *Client) ack(seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := 0
	for i < len(c.unacked) && c.unacked[i].Seq <= seq {
		i++
	}
	c.unacked = append(c.unacked[:0:0], c.unacked[i:]...)
	if i > 0 {
		close(c.room)
		c.room = make(chan struct{})
	}
}

// Unacked is the number of events the operator has not confirmed yet.
func (c *Client) Unacked() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.unacked)
}

func (c *Client) setConnected(v bool) {
	c.mu.Lock()
	c.connected = v
	c.mu.Unlock()
}

func (c *Client) handle(m *controlv1.OperatorMessage) {
	switch msg := m.Msg.(type) {
	case *controlv1.OperatorMessage_Ack:
		c.ack(msg.Ack.Seq)
	case *controlv1.OperatorMessage_Saved:
		c.release(msg.Saved.Kept)
	case *controlv1.OperatorMessage_Tiers:
		if c.commands.Tiers != nil {
			c.commands.Tiers(msg.Tiers)
		}
	case *controlv1.OperatorMessage_Keys:
		if c.commands.Keys != nil {
			c.commands.Keys(msg.Keys)
		}
	case *controlv1.OperatorMessage_Drop:
		if c.commands.Drop != nil {
			c.commands.Drop(msg.Drop)
		}
	case *controlv1.OperatorMessage_KeepAlive:
		if c.commands.KeepAlive != nil {
			c.commands.KeepAlive(msg.KeepAlive)
		}
	case *controlv1.OperatorMessage_GroupView:
		if c.commands.GroupView != nil {
			c.commands.GroupView(msg.GroupView)
		}
	case *controlv1.OperatorMessage_GroupJoinResult:
		if c.commands.GroupJoinResult != nil {
			c.commands.GroupJoinResult(msg.GroupJoinResult)
		}
	case *controlv1.OperatorMessage_Delegations:
		if c.commands.Delegations != nil {
			c.commands.Delegations(msg.Delegations)
		}
	case *controlv1.OperatorMessage_Rejected:
		switch {
		case c.commands.Rejected != nil:
			c.commands.Rejected(msg.Rejected)
		case c.Log != nil:
			c.Log(fmt.Errorf("the operator refused event %d: %s", msg.Rejected.Seq, msg.Rejected.Message))
		}
	}
}

// KeysClient reads namespaces' reference keys from the operator with
// unary GetKeys calls (activator-ext, which opens references of every
// namespace it proxies for). Each call presents the token's current token;
// the operator answers only callers it allow-lists, and pods for their own
// namespace.
type KeysClient struct {
	conn *grpc.ClientConn
	cl   controlv1.ControlClient
}

// NewKeysClient returns a client for the operator's control service at
// addr (host:port); it connects lazily.
func NewKeysClient(addr string, token TokenSource, opts ...grpc.DialOption) (*KeysClient, error) {
	if token == nil {
		return nil, errors.New("controlclient: no service-account token source: the operator refuses unauthenticated calls")
	}
	conn, err := grpc.NewClient(addr, dialOptions(token, opts)...)
	if err != nil {
		return nil, err
	}
	return &KeysClient{conn: conn, cl: controlv1.NewControlClient(conn)}, nil
}

// Keys returns the namespace's keys.
func (k *KeysClient) Keys(ctx context.Context, namespace string) (*controlv1.Keys, error) {
	return k.cl.GetKeys(ctx, &controlv1.GetKeysRequest{Namespace: namespace})
}

// Close closes the connection.
func (k *KeysClient) Close() error { return k.conn.Close() }
