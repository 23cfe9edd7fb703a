// Package guard bounds what the callers of one of the operator's gRPC
// servers (the session gateway, the control service) can make it hold
// before and after they authenticate:
//
//   - Every call is authenticated in the server's tap (grpc.InTapHandle),
//     which runs as soon as the call's headers arrive, before the call
//     exists: a caller whose token is refused never gets a message read
//     (HTTP/2 flow control holds it at the stream's initial window, which
//     the server discards), so an anonymous client cannot make the server
//     buffer anything. The verified identity travels in the call's context
//     (IdentityOf), so the handler does not verify it again.
//   - Connections are capped (Limits.MaxConns), and so are connections
//     that have not yet had a call authenticated (MaxUnauthConns), which
//     are also closed after AuthTimeout; beyond a cap a new connection is
//     closed as soon as it is accepted. The HTTP/2 handshake must finish
//     within HandshakeTimeout.
//   - Each connection carries at most MaxStreams calls at once, headers of
//     at most MaxHeaderBytes, messages of at most MaxRecvMsgSize, and
//     pings no more often than MinPingInterval.
//   - A call's (first) message must arrive whole within RecvTimeout of the
//     call's start, or the call is ended.
//
// The tap runs on the connection's reader goroutine, holding the
// transport's lock: while a token is being reviewed, that connection reads
// nothing else. Reviews are therefore bounded (ReviewTimeout), and
// authenticators cache their answers (gateway.KubeAuth, control.TokenReviewer),
// so a connection waits for the API server once per token and cache period.
package guard

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ziptrail/ziptrail/internal/recovery"
)

// Limits bound a server's callers. A zero field takes the server's
// default (Or); a negative one removes that bound (gRPC's own default
// then applies to MaxStreams, MaxRecvMsgSize, MaxHeaderBytes,
// HandshakeTimeout and MinPingInterval).
type Limits struct {
	// MaxConns bounds the connections open at once; one accepted beyond
	// it is closed at once. Each costs the server about 100 KiB (gRPC's
	// read and write buffers, its goroutines) before any call.
	MaxConns int
	// MaxUnauthConns bounds the open connections on which no call has yet
	// been authenticated; one accepted beyond it is closed at once. Such a
	// connection is closed when AuthTimeout passes without an
	// authenticated call.
	MaxUnauthConns int
	AuthTimeout    time.Duration
	// HandshakeTimeout bounds the connection's HTTP/2 handshake
	// (grpc.ConnectionTimeout).
	HandshakeTimeout time.Duration
	// ReviewTimeout bounds the authentication of one call (a TokenReview
	// when the token is not cached); beyond it the call is refused with
	// Unavailable.
	ReviewTimeout time.Duration
	// MaxStreams bounds the calls one connection has open at once
	// (grpc.MaxConcurrentStreams); clients queue the rest.
	MaxStreams int
	// MaxRecvMsgSize bounds one message of an authenticated call
	// (grpc.MaxRecvMsgSize): a larger one ends the call with
	// ResourceExhausted before it is read.
	MaxRecvMsgSize int
	// MaxHeaderBytes bounds a call's headers (grpc.MaxHeaderListSize),
	// which are read before the call can be authenticated.
	MaxHeaderBytes int
	// RecvTimeout bounds how long a call's first message may take to
	// arrive, from the call's start: a client sending it slower has the
	// call ended with DeadlineExceeded. Later messages of a stream are not
	// timed (a stream may rightly be idle between them).
	RecvTimeout time.Duration
	// MinPingInterval is the shortest interval at which a client may send
	// HTTP/2 pings (keepalive.EnforcementPolicy, with or without calls
	// open); a client pinging more often is disconnected.
	MinPingInterval time.Duration
	// Window is the HTTP/2 flow-control window of one call
	// (grpc.InitialWindowSize; the connection's is 4 times it): what a
	// client may send of a call's message before the server reads it, and
	// so the most a refused call makes the server read and throw away.
	// gRPC's own windows grow with the measured bandwidth up to 16 MiB (a
	// refused 60 MiB call then cost the server 0.5–2 MiB, issue 33); a
	// fixed window keeps that bound, and still carries a call at
	// Window/RTT (256 KiB: 256 MB/s at a 1 ms round trip). Negative:
	// gRPC's growing windows.
	Window int
	// RefusalsPerSecond paces a connection whose calls are refused (by
	// authentication, or after it, with Unauthenticated, PermissionDenied
	// or ResourceExhausted, e.g. a message over MaxRecvMsgSize): beyond
	// this rate (bursts of as many), the server stops reading that
	// connection before answering its next call, for as long as the rate
	// needs and at most a second a call. A client refused in a loop is
	// then held to the rate by TCP, not served as fast as it sends, and
	// costs the server and its other callers almost nothing; a client
	// refused now and then never waits. Negative: no pacing.
	RefusalsPerSecond float64
}

// Or fills l's zero fields from def.
func (l Limits) Or(def Limits) Limits {
	pick := func(v, d int) int {
		if v == 0 {
			return d
		}
		return v
	}
	pickD := func(v, d time.Duration) time.Duration {
		if v == 0 {
			return d
		}
		return v
	}
	return Limits{
		MaxConns: pick(l.MaxConns, def.MaxConns), MaxUnauthConns: pick(l.MaxUnauthConns, def.MaxUnauthConns),
		AuthTimeout: pickD(l.AuthTimeout, def.AuthTimeout), HandshakeTimeout: pickD(l.HandshakeTimeout, def.HandshakeTimeout),
		ReviewTimeout: pickD(l.ReviewTimeout, def.ReviewTimeout), MaxStreams: pick(l.MaxStreams, def.MaxStreams),
		MaxRecvMsgSize: pick(l.MaxRecvMsgSize, def.MaxRecvMsgSize), MaxHeaderBytes: pick(l.MaxHeaderBytes, def.MaxHeaderBytes),
		RecvTimeout: pickD(l.RecvTimeout, def.RecvTimeout), MinPingInterval: pickD(l.MinPingInterval, def.MinPingInterval),
		Window: pick(l.Window, def.Window), RefusalsPerSecond: cmp.Or(l.RefusalsPerSecond, def.RefusalsPerSecond),
	}
}

// Authenticate verifies a call from its headers (info.Header, and ctx's
// incoming metadata), before the call exists. It returns the caller's
// identity, which the call's context then carries (IdentityOf), or a gRPC
// status error that refuses the call (Unauthenticated, Unavailable, ...).
// A nil identity without an error lets the call through unverified: the
// handler authenticates it, and its connection does not count as
// authenticated. ctx ends after Limits.ReviewTimeout.
type Authenticate func(ctx context.Context, info *tap.Info) (identity any, err error)

// Guard applies Limits to one gRPC server: its ServerOptions and Listener
// go together (the listener tracks which connections authenticated a call).
type Guard struct {
	name string
	l    Limits
	auth Authenticate

	paced atomic.Int64 // Paced
	// Exempt, when set (before the server serves), says a call's
	// connection is not paced (Limits.RefusalsPerSecond): one that
	// carries many clients' calls, such as another replica's forwarding
	// connection. It sees the call's incoming metadata and peer.
	Exempt func(ctx context.Context) bool

	mu     sync.Mutex
	conns  map[string]*conn // by remote and local address
	open   int
	unauth int
}

// New returns the guard of the server named name (a label of its metrics:
// gateway, control). Fields of l left zero are used as zero, so fill them
// first (Limits.Or).
func New(name string, l Limits, auth Authenticate) *Guard {
	return &Guard{name: name, l: l, auth: auth, conns: map[string]*conn{}}
}

// Limits are the guard's limits.
func (g *Guard) Limits() Limits { return g.l }

// Metrics.
var (
	events = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ziptrail_grpc_guard_total",
		Help: "What the gRPC servers' guards refused or ended, by server (gateway, control) and event: " +
			"conn_refused_max (a connection beyond MaxConns), conn_refused_unauth (beyond MaxUnauthConns), " +
			"conn_auth_timeout (no call authenticated within AuthTimeout), call_refused (authentication refused a call " +
			"before its message was read), recv_timeout (a message slower than RecvTimeout), refusals_paced (a connection " +
			"refused faster than RefusalsPerSecond was not read for a while).",
	}, []string{"server", "event"})
	gauges = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "ziptrail_grpc_connections",
		Help: "Open connections of the gRPC servers, by server and state (authenticated: a call was authenticated on it; unauthenticated).",
	}, []string{"server", "state"})
)

func init() {
	// The operator serves controller-runtime's registry: its recovered
	// panics are counted there too.
	metrics.Registry.MustRegister(events, gauges, recovery.Collector())
}

func (g *Guard) count(event string) { events.WithLabelValues(g.name, event).Inc() }

// ServerOptions are the grpc.Server options applying the limits: the
// authenticating tap, the per-connection bounds and the receive clock.
// Its interceptors are chained (grpc.ChainUnaryInterceptor): add the
// server's own with the Chain options too, after these, so the receive
// clock stops before they run.
func (g *Guard) ServerOptions() []grpc.ServerOption {
	// Recovery first: a panic a caller's message reaches ends its call,
	// never the operator (every tenant's control stream and gateway).
	opts := []grpc.ServerOption{grpc.InTapHandle(g.tap),
		grpc.ChainUnaryInterceptor(recovery.UnaryInterceptor("operator"), g.unary),
		grpc.ChainStreamInterceptor(recovery.StreamInterceptor("operator"), g.stream)}
	if g.l.MaxStreams > 0 {
		opts = append(opts, grpc.MaxConcurrentStreams(uint32(g.l.MaxStreams)))
	}
	if g.l.MaxRecvMsgSize > 0 {
		opts = append(opts, grpc.MaxRecvMsgSize(g.l.MaxRecvMsgSize))
	}
	if g.l.MaxHeaderBytes > 0 {
		opts = append(opts, grpc.MaxHeaderListSize(uint32(g.l.MaxHeaderBytes)))
	}
	if g.l.HandshakeTimeout > 0 {
		opts = append(opts, grpc.ConnectionTimeout(g.l.HandshakeTimeout))
	}
	if g.l.MinPingInterval > 0 {
		opts = append(opts, grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: g.l.MinPingInterval, PermitWithoutStream: true}))
	}
	if g.l.Window > 0 {
		w := int32(max(g.l.Window, 64<<10)) // HTTP/2's initial window; gRPC ignores less
		opts = append(opts, grpc.InitialWindowSize(w), grpc.InitialConnWindowSize(4*w))
	}
	if g.l.RefusalsPerSecond > 0 {
		opts = append(opts, grpc.StatsHandler(refusals{g}))
	}
	return opts
}

// tap authenticates a call before it exists (see the package comment).
func (g *Guard) tap(ctx context.Context, info *tap.Info) (_ context.Context, err error) {
	// The tap runs on the connection's reader goroutine, outside any
	// interceptor.
	defer recovery.AsError("operator", "tap", &err) // (the method is the caller's, unauthenticated: not a label)
	c := g.connOf(ctx)
	c.pace(ctx)
	defer func() {
		if isRefusal(err) {
			c.refused()
		}
	}()
	rctx, cancel := ctx, context.CancelFunc(func() {})
	if g.l.ReviewTimeout > 0 {
		rctx, cancel = context.WithTimeout(ctx, g.l.ReviewTimeout)
	}
	id, err := g.auth(rctx, info)
	late := rctx.Err() != nil && ctx.Err() == nil
	cancel()
	if err != nil {
		g.count("call_refused")
		if _, ok := status.FromError(err); !ok {
			err = status.Error(codes.Unauthenticated, err.Error())
		}
		if late && status.Code(err) != codes.Unauthenticated {
			err = status.Errorf(codes.Unavailable, "the token could not be verified within %s: %s", g.l.ReviewTimeout, status.Convert(err).Message())
		}
		return ctx, err
	}
	if id != nil {
		g.authenticated(ctx)
		ctx = context.WithValue(ctx, identityKey{}, id)
	}
	if g.l.RecvTimeout > 0 {
		ctx = newRecvClock(ctx, g.l.RecvTimeout, func() { g.count("recv_timeout") })
	}
	return ctx, nil
}

type identityKey struct{}

// IdentityOf is the identity the guard's Authenticate returned for the
// call of ctx, when it is a T.
func IdentityOf[T any](ctx context.Context) (T, bool) {
	v, ok := ctx.Value(identityKey{}).(T)
	return v, ok
}

// unary stops the receive clock: the message has been read.
func (g *Guard) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if c := clockOf(ctx); c != nil && !c.received() {
		return nil, c.timeoutErr()
	}
	return handler(ctx, req)
}

// stream stops the receive clock when the stream's first message has been
// read.
func (g *Guard) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	c := clockOf(ss.Context())
	if c == nil {
		return handler(srv, ss)
	}
	return handler(srv, &clockedStream{ServerStream: ss, c: c})
}

type clockedStream struct {
	grpc.ServerStream
	c    *recvClock
	done bool
}

func (s *clockedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if !s.done {
		s.done = true
		if !s.c.received() {
			return s.c.timeoutErr()
		}
	}
	return err
}

// recvClock is a call's context that ends when the call's first message
// has not arrived within the limit, reporting DeadlineExceeded: gRPC's
// reader, waiting for the rest of the message, then ends the call with
// that status ("context deadline exceeded": gRPC writes it before any
// interceptor could say more). Once the message is read the clock stops
// and the context is its parent again, without a deadline.
type recvClock struct {
	context.Context // a cancelCtx of the call's context
	cancel          context.CancelFunc
	timer           *time.Timer
	fired           atomic.Bool
	limit           time.Duration
}

type clockKey struct{}

func newRecvClock(parent context.Context, limit time.Duration, fired func()) *recvClock {
	ctx, cancel := context.WithCancel(parent)
	c := &recvClock{Context: ctx, cancel: cancel, limit: limit}
	c.timer = time.AfterFunc(limit, func() {
		if ctx.Err() == nil {
			c.fired.Store(true)
			cancel()
			fired()
		}
	})
	// A call that ends before reading its message stops the clock too.
	context.AfterFunc(parent, func() { c.timer.Stop() })
	return c
}

func clockOf(ctx context.Context) *recvClock {
	c, _ := ctx.Value(clockKey{}).(*recvClock)
	return c
}

func (c *recvClock) Value(key any) any {
	if key == (clockKey{}) {
		return c
	}
	return c.Context.Value(key)
}

func (c *recvClock) Err() error {
	err := c.Context.Err()
	if err != nil && c.fired.Load() {
		return context.DeadlineExceeded
	}
	return err
}

// received stops the clock; false when it had run out.
func (c *recvClock) received() bool {
	c.timer.Stop()
	return !c.fired.Load()
}

func (c *recvClock) timeoutErr() error {
	return status.Errorf(codes.DeadlineExceeded, "the call's message did not arrive within %s of the call's start: the server ends calls whose message arrives slower", c.limit)
}

// Listener wraps the server's listener: it caps connections and closes
// unauthenticated ones (see Limits). Serve the server with it.
func (g *Guard) Listener(ln net.Listener) net.Listener {
	return &listener{Listener: ln, g: g}
}

type listener struct {
	net.Listener
	g *Guard
}

// Accept returns the next connection within the caps; one beyond them is
// closed at once (its client sees the connection refused, and retries).
func (l *listener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if c := l.g.admit(nc); c != nil {
			return c, nil
		}
		_ = nc.Close()
	}
}

// conn is an accepted connection, counted until it closes.
type conn struct {
	net.Conn
	g      *Guard
	key    string
	authed bool // under g.mu
	closed bool // under g.mu
	timer  *time.Timer
	pacer  *Pacer // Limits.RefusalsPerSecond; nil: not paced
}

func connKey(remote, local net.Addr) string {
	if remote == nil || local == nil {
		return ""
	}
	return remote.Network() + " " + remote.String() + " " + local.String()
}

// admit counts a new connection, nil when it is beyond a cap.
func (g *Guard) admit(nc net.Conn) *conn {
	c := &conn{Conn: nc, g: g, key: connKey(nc.RemoteAddr(), nc.LocalAddr())}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.l.MaxConns > 0 && g.open >= g.l.MaxConns {
		g.count("conn_refused_max")
		return nil
	}
	if g.l.MaxUnauthConns > 0 && g.unauth >= g.l.MaxUnauthConns {
		g.count("conn_refused_unauth")
		return nil
	}
	g.open++
	if _, dup := g.conns[c.key]; dup || c.key == "" {
		// Addresses that do not tell connections apart (a Unix socket's):
		// its calls cannot be matched to it, so it is not held to
		// MaxUnauthConns or AuthTimeout.
		c.authed = true
		c.key = ""
		g.gauge("authenticated", 1)
		return c
	}
	if r := g.l.RefusalsPerSecond; r > 0 {
		c.pacer = NewPacer(r)
	}
	g.conns[c.key] = c
	g.unauth++
	g.gauge("unauthenticated", 1)
	if g.l.AuthTimeout > 0 {
		c.timer = time.AfterFunc(g.l.AuthTimeout, c.authTimeout)
	}
	return c
}

func (g *Guard) gauge(state string, d float64) { gauges.WithLabelValues(g.name, state).Add(d) }

func (c *conn) authTimeout() {
	c.g.mu.Lock()
	stale := !c.authed && !c.closed
	c.g.mu.Unlock()
	if stale {
		c.g.count("conn_auth_timeout")
		_ = c.Close()
	}
}

// authenticated marks the connection of the call of ctx as having had a
// call authenticated.
func (g *Guard) authenticated(ctx context.Context) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return
	}
	key := connKey(p.Addr, p.LocalAddr)
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.conns[key]
	if c == nil || c.authed || c.closed {
		return
	}
	c.authed = true
	g.unauth--
	g.gauge("unauthenticated", -1)
	g.gauge("authenticated", 1)
	if c.timer != nil {
		c.timer.Stop()
	}
}

func (c *conn) Close() error {
	g := c.g
	g.mu.Lock()
	if !c.closed {
		c.closed = true
		g.open--
		if c.authed {
			g.gauge("authenticated", -1)
		} else {
			g.unauth--
			g.gauge("unauthenticated", -1)
		}
		if c.key != "" && g.conns[c.key] == c {
			delete(g.conns, c.key)
		}
		if c.timer != nil {
			c.timer.Stop()
		}
	}
	g.mu.Unlock()
	return c.Conn.Close()
}

// Open reports the guard's open connections and how many of them have not
// authenticated a call.
func (g *Guard) Open() (open, unauthenticated int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open, g.unauth
}

func (l Limits) String() string {
	return fmt.Sprintf("conns ≤ %d (unauthenticated ≤ %d, for ≤ %s), handshake ≤ %s, review ≤ %s, streams/conn ≤ %d, message ≤ %d B, headers ≤ %d B, first message within %s, pings ≥ %s apart",
		l.MaxConns, l.MaxUnauthConns, l.AuthTimeout, l.HandshakeTimeout, l.ReviewTimeout, l.MaxStreams, l.MaxRecvMsgSize, l.MaxHeaderBytes, l.RecvTimeout, l.MinPingInterval)
}
