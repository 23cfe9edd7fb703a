package guard_test

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/ziptrail/ziptrail/internal/operator/control/guard"
	"github.com/ziptrail/ziptrail/internal/operator/control/guard/guardtest"
)

// who is the identity the test's Authenticate returns.
type who struct{ name string }

// server serves gRPC's health service behind a guard whose Authenticate
// accepts the token "good" (as who{"good"}), lets "unverified" through
// without an identity, and stalls on "slow" until its context ends. seen
// receives the identity each call's handler found.
func server(t *testing.T, l guard.Limits) (addr string, g *guard.Guard, seen chan any) {
	t.Helper()
	seen = make(chan any, 16)
	g = guard.New("test", l, func(ctx context.Context, info *tap.Info) (any, error) {
		switch tok := info.Header.Get("authorization"); {
		case len(tok) == 1 && tok[0] == "Bearer good":
			return who{"good"}, nil
		case len(tok) == 1 && tok[0] == "Bearer unverified":
			return nil, nil
		case len(tok) == 1 && tok[0] == "Bearer slow":
			<-ctx.Done()
			return nil, status.Errorf(codes.Unavailable, "review: %v", ctx.Err())
		}
		return nil, status.Error(codes.Unauthenticated, "bad token")
	})
	record := func(ctx context.Context) {
		var id any
		if v, ok := guard.IdentityOf[who](ctx); ok {
			id = v
		}
		select {
		case seen <- id:
		default: // a test not reading them
		}
	}
	opts := append(g.ServerOptions(),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			record(ctx)
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			record(ss.Context())
			return h(srv, ss)
		}))
	gs := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(g.Listener(ln)) }()
	t.Cleanup(gs.Stop)
	return ln.Addr().String(), g, seen
}

func client(t *testing.T, addr string) healthpb.HealthClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return healthpb.NewHealthClient(cc)
}

func as(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// TestAuthenticatedBeforeTheMessage: a refused token gets the
// Authenticate's status, and the handler never runs; an accepted one
// reaches it with its identity in the context; a call Authenticate let
// through unverified reaches it without one.
func TestAuthenticatedBeforeTheMessage(t *testing.T) {
	addr, g, seen := server(t, guard.Limits{ReviewTimeout: 200 * time.Millisecond})
	hc := client(t, addr)
	ctx := context.Background()
	if _, err := hc.Check(as(ctx, "bad"), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("bad token: %v, want Unauthenticated", err)
	}
	start := time.Now()
	_, err := hc.Check(as(ctx, "slow"), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "within 200ms") || time.Since(start) > 2*time.Second {
		t.Errorf("a review slower than ReviewTimeout: %v after %s, want Unavailable naming the bound", err, time.Since(start))
	}
	select {
	case id := <-seen:
		t.Fatalf("a handler ran for a refused call (identity %v)", id)
	default:
	}
	if _, err := hc.Check(as(ctx, "good"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if id := <-seen; id != (who{"good"}) {
		t.Errorf("the handler found identity %v, want the tap's", id)
	}
	w, err := hc.Watch(as(ctx, "unverified"), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	if id := <-seen; id != nil {
		t.Errorf("an unverified call carries identity %v", id)
	}
	if open, unauth := g.Open(); open != 1 || unauth != 0 {
		t.Errorf("open %d, unauthenticated %d; want the one authenticated connection", open, unauth)
	}
}

// TestRecvClock: a message that stops midway ends its call after
// RecvTimeout, for a unary and a streaming call; a call whose message
// came in time lives on past it.
func TestRecvClock(t *testing.T) {
	const limit = 300 * time.Millisecond
	addr, _, _ := server(t, guard.Limits{RecvTimeout: limit})
	for _, method := range []string{healthpb.Health_Check_FullMethodName, healthpb.Health_Watch_FullMethodName} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		msg := append(guardtest.Frame(10), 0x0a, 0x08, 'x')
		res, err := guardtest.Call(ctx, addr, method, "good", guardtest.Stall(ctx, bytes.NewReader(msg)))
		cancel()
		if err != nil || res.Code != codes.DeadlineExceeded || time.Since(start) > limit+2*time.Second {
			t.Errorf("%s stalled: %v %v after %s, want DeadlineExceeded after about %s", method, res, err, time.Since(start), limit)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w, err := client(t, addr).Watch(as(ctx, "good"), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * limit)
	if err := w.Context().Err(); err != nil {
		t.Fatalf("a stream whose message came in time ended: %v", err)
	}
}

// TestConnectionCaps: beyond MaxUnauthConns, and beyond MaxConns, a new
// connection is closed at once; one that authenticates nothing is closed
// after AuthTimeout; an authenticated connection works on throughout; a
// connection that never finishes its handshake is closed after
// HandshakeTimeout.
func TestConnectionCaps(t *testing.T) {
	addr, g, _ := server(t, guard.Limits{MaxConns: 3, MaxUnauthConns: 1, AuthTimeout: 500 * time.Millisecond,
		HandshakeTimeout: 300 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a := client(t, addr)
	works := func(what string) {
		t.Helper()
		if _, err := a.Check(as(ctx, "good"), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	works("the first client")
	idle, err := guardtest.Idle(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	refused(t, ctx, addr, "a second unauthenticated connection", true)
	works("the authenticated client with unauthenticated connections at their cap")
	if !closed(ctx, idle, 3*time.Second) {
		t.Error("the idle connection is open after AuthTimeout")
	}

	// A connection that sends nothing at all: closed after the handshake
	// timeout (before AuthTimeout).
	var d net.Dialer
	silent, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	start := time.Now()
	if !closed(ctx, silent, 3*time.Second) || time.Since(start) > 450*time.Millisecond {
		t.Errorf("a connection that never sent the HTTP/2 preface was closed after %s, want about 300ms", time.Since(start))
	}

	for range 2 {
		if _, err := client(t, addr).Check(as(ctx, "good"), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if open, unauth := g.Open(); open != 3 || unauth != 0 {
		t.Fatalf("open %d, unauthenticated %d; want 3 authenticated", open, unauth)
	}
	refused(t, ctx, addr, "a fourth connection", true)
	works("the first client with connections at their cap")
	// A bad token on an authenticated connection is refused, and does not
	// unmark it.
	if _, err := a.Check(as(ctx, "bad"), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a bad token on an authenticated connection: %v", err)
	}
	works("the first client after a refused call")
}

func refused(t *testing.T, ctx context.Context, addr, what string, want bool) {
	t.Helper()
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r, c, err := guardtest.Refused(rctx, addr)
	if c != nil {
		c.Close()
	}
	if err != nil || r != want {
		t.Fatalf("%s: refused %v (%v), want %v", what, r, err, want)
	}
}

func closed(ctx context.Context, c net.Conn, within time.Duration) bool {
	cctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	return guardtest.Closed(cctx, c)
}

// TestLimitsOr: zero fields take the defaults, others are kept.
func TestLimitsOr(t *testing.T) {
	def := guard.Limits{MaxConns: 10, MaxUnauthConns: 2, RecvTimeout: time.Second, MaxRecvMsgSize: 5}
	got := guard.Limits{MaxConns: -1, RecvTimeout: 3 * time.Second}.Or(def)
	want := guard.Limits{MaxConns: -1, MaxUnauthConns: 2, RecvTimeout: 3 * time.Second, MaxRecvMsgSize: 5}
	if got != want {
		t.Errorf("Or: %+v, want %+v", got, want)
	}
}

// TestConnectionsUncounted: connections their clients close are
// uncounted, so the caps do not leak: twenty rounds of an idle connection
// and an authenticated client, each closed, against caps of 2.
func TestConnectionsUncounted(t *testing.T) {
	addr, g, _ := server(t, guard.Limits{MaxConns: 2, MaxUnauthConns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 20 {
		c, err := guardtest.Idle(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		// The idle connection's close may not have reached the server yet:
		// the client retries a refused connection.
		_, err = healthpb.NewHealthClient(cc).Check(as(ctx, "good"), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		cc.Close()
		if err != nil {
			open, unauth := g.Open()
			t.Fatalf("round %d: %v (server: %d open, %d unauthenticated)", i, err, open, unauth)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		open, unauth := g.Open()
		if open == 0 && unauth == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections (%d unauthenticated) counted open after every client closed", open, unauth)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
