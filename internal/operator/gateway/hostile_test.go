package gateway_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ziptrail/ziptrail/internal/operator/control/guard"
	"github.com/ziptrail/ziptrail/internal/operator/control/guard/guardtest"
	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/operator/orchestrator"
)

// Hostile input on the gRPC gateway's port, played from the outside: raw
// HTTP/2 clients whose messages are generated as they are sent, so the
// heap measured is the server's (the client holds none of it).

const startMethod = gatewayv1.Gateway_StartSession_FullMethodName

// startPrefix is a StartSessionRequest's fields before its input (field 3).
func startPrefix(ns, wf string) []byte {
	b, _ := proto.Marshal(&gatewayv1.StartSessionRequest{Namespace: ns, Workflow: wf})
	return b
}

// TestGRPCRefusesBodiesOfUnauthenticatedCalls: four connections with the
// token "not-a-token" each send a 60 MiB StartSession to a gateway
// accepting 64 MiB inputs (the chart's default). Each is refused with
// Unauthenticated, and the server neither reads nor holds their messages:
// its heap grows by less than 16 MiB, and it reads less than 16 MiB from
// the four connections together. An authenticated client still works.
func TestGRPCRefusesBodiesOfUnauthenticatedCalls(t *testing.T) {
	f := newFixture(t, func(f *fixture, _ *orchestrator.Options) { f.maxInput = 64 << 20 })
	f.namespace(t, "a")
	runner := f.serviceAccount(t, "a", "runner", "a")
	f.workflow(t, "a", "echo", echo)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const conns, size = 4, 60 << 20
	readBefore := f.grpcRead.Read.Load()
	heap := guardtest.WatchHeap()
	results := make([]guardtest.Result, conns)
	errs := make([]error, conns)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() {
			results[i], errs[i] = guardtest.Call(ctx, f.grpcAddr, startMethod, "not-a-token",
				guardtest.BytesMessage(startPrefix("a", "echo"), 3, size))
		})
	}
	wg.Wait()
	grew := heap.Stop()
	read := f.grpcRead.Read.Load() - readBefore
	t.Logf("%d connections sending %d MiB each with a bad token: the server's heap grew by %.1f MiB, it read %.1f MiB",
		conns, size>>20, float64(grew)/(1<<20), float64(read)/(1<<20))
	for i := range conns {
		if errs[i] != nil || results[i].Code != codes.Unauthenticated {
			t.Errorf("connection %d: %v %v, want Unauthenticated", i, results[i], errs[i])
		} else {
			t.Logf("connection %d: %v", i, results[i])
		}
	}
	if grew > 16<<20 {
		t.Errorf("the server's heap grew by %d MiB while unauthenticated clients sent %d MiB: it buffers their messages", grew>>20, conns*size>>20)
	}
	if read > 16<<20 {
		t.Errorf("the server read %d MiB from unauthenticated clients", read>>20)
	}

	// An authenticated client still runs sessions.
	s, err := f.gw.StartSession(withToken(ctx, runner), &gatewayv1.StartSessionRequest{Namespace: "a", Workflow: "echo", Input: []byte("hi")})
	if err != nil {
		t.Fatalf("authenticated StartSession after the flood: %v", err)
	}
	r, err := f.gw.WaitSession(withToken(ctx, runner), &gatewayv1.WaitSessionRequest{Namespace: "a", Id: s.Id, TimeoutMs: 30000})
	if err != nil || string(r.Result) != "hi" {
		t.Errorf("authenticated WaitSession after the flood: %v %q", err, r.GetResult())
	}
}

// TestGRPCStartSessionBound: an authenticated StartSession larger than the
// gateway accepts (its input limit, plus the names) is refused with
// ResourceExhausted naming the limit before its message is read.
func TestGRPCStartSessionBound(t *testing.T) {
	f := newFixture(t, nil)
	f.namespace(t, "a")
	runner := f.serviceAccount(t, "a", "runner", "a")
	f.workflow(t, "a", "echo", echo)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	before := f.grpcRead.Read.Load()
	res, err := guardtest.Call(ctx, f.grpcAddr, startMethod, runner, guardtest.BytesMessage(startPrefix("a", "echo"), 3, maxInput+64<<10))
	read := f.grpcRead.Read.Load() - before
	t.Logf("input of the limit + 64 KiB: %v; the server read %.1f MiB", res, float64(read)/(1<<20))
	if err != nil || res.Code != codes.ResourceExhausted {
		t.Fatalf("StartSession over the limit: %v %v, want ResourceExhausted", res, err)
	}
	if limit := fmt.Sprint(f.g.MaxStartMessage()); !strings.Contains(res.Msg, limit) {
		t.Errorf("%q does not name the limit (%s bytes)", res.Msg, limit)
	}
	if read > 4<<20 {
		t.Errorf("the server read %d MiB of a message it refuses", read>>20)
	}
	// An input within the limit still starts a session (this fixture runs
	// no input store: 64 KiB is the largest it holds), and the largest
	// input with the longest names is within the bound.
	if _, err := f.gw.StartSession(withToken(ctx, runner), &gatewayv1.StartSessionRequest{Namespace: "a", Workflow: "echo", Input: make([]byte, 64<<10)}); err != nil {
		t.Errorf("StartSession of 64 KiB: %v", err)
	}
	longest := &gatewayv1.StartSessionRequest{Namespace: strings.Repeat("n", 63), Workflow: strings.Repeat("w", 253), Input: make([]byte, maxInput)}
	if n := proto.Size(longest); n > f.g.MaxStartMessage() {
		t.Errorf("a StartSession of the largest input with the longest names is %d bytes, over the gateway's bound of %d", n, f.g.MaxStartMessage())
	}
}

// TestGRPCStalledMessageEnded: an authenticated call whose message stops
// arriving midway is ended once the receive limit passes, both a unary
// call (StartSession) and a streaming one (WatchSession).
func TestGRPCStalledMessageEnded(t *testing.T) {
	const limit = time.Second
	f := newFixture(t, func(f *fixture, _ *orchestrator.Options) { f.grpcLimits = guard.Limits{RecvTimeout: limit} })
	f.namespace(t, "a")
	runner := f.serviceAccount(t, "a", "runner", "a")
	f.workflow(t, "a", "echo", echo)

	for _, c := range []struct {
		method string
		prefix []byte
	}{
		{startMethod, startPrefix("a", "echo")},
		{gatewayv1.Gateway_WatchSession_FullMethodName, []byte{0x0a, 0x01, 'a'}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		// A 1 MiB message of which only the first bytes come.
		msg := io.LimitReader(guardtest.BytesMessage(c.prefix, 3, 1<<20), 64)
		start := time.Now()
		res, err := guardtest.Call(ctx, f.grpcAddr, c.method, runner, guardtest.Stall(ctx, msg))
		took := time.Since(start)
		cancel()
		t.Logf("%s stalled after 64 bytes: %v %v after %s", c.method, res, err, took.Round(time.Millisecond))
		if err != nil || res.Code != codes.DeadlineExceeded || took > limit+3*time.Second {
			t.Errorf("%s stalled midway: %v %v after %s, want DeadlineExceeded within about %s", c.method, res, err, took, limit)
		}
	}
	// A call that sends its message in time is not hurried afterwards.
	ctx := withToken(context.Background(), runner)
	s, err := f.gw.StartSession(ctx, &gatewayv1.StartSessionRequest{Namespace: "a", Workflow: "echo", Input: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(limit + 200*time.Millisecond)
	if _, err := f.gw.WaitSession(ctx, &gatewayv1.WaitSessionRequest{Namespace: "a", Id: s.Id, TimeoutMs: 2 * limit.Milliseconds()}); err != nil {
		t.Errorf("WaitSession (longer than the receive limit): %v", err)
	}
}

// TestGRPCConnectionCaps: connections that authenticate nothing are capped
// and closed after the auth timeout, and so are connections altogether;
// connections over a cap are refused while an authenticated client keeps
// working.
func TestGRPCConnectionCaps(t *testing.T) {
	f := newFixture(t, func(f *fixture, _ *orchestrator.Options) {
		f.grpcLimits = guard.Limits{MaxConns: 4, MaxUnauthConns: 2, AuthTimeout: 1500 * time.Millisecond}
	})
	f.namespace(t, "a")
	runner := f.serviceAccount(t, "a", "runner", "a")
	f.workflow(t, "a", "echo", echo)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	works := func(gw gatewayv1.GatewayClient, what string) {
		t.Helper()
		if _, err := gw.StartSession(withToken(ctx, runner), &gatewayv1.StartSessionRequest{Namespace: "a", Workflow: "echo", Input: []byte("x")}); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	refused := func(what string, want bool) {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		r, c, err := guardtest.Refused(rctx, f.grpcAddr)
		if c != nil {
			defer c.Close()
		}
		if err != nil || r != want {
			t.Fatalf("%s: refused %v (%v), want %v", what, r, err, want)
		}
	}
	works(f.gw, "the first client") // its connection authenticated a call

	var idle []net.Conn
	for range 2 {
		c, err := guardtest.Idle(ctx, f.grpcAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	refused("a third connection that has not authenticated", true)
	works(f.gw, "the authenticated client while unauthenticated connections are at their cap")

	for i, c := range idle {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if !guardtest.Closed(cctx, c) {
			t.Errorf("idle connection %d still open after the auth timeout", i)
		}
		cancel()
	}

	// Three more authenticated clients: four connections in all.
	for i := range 3 {
		cc, err := grpc.NewClient(f.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		works(gatewayv1.NewGatewayClient(cc), fmt.Sprintf("client %d", i+2))
	}
	refused("a fifth connection", true)
	works(f.gw, "the first client with connections at their cap")
	if _, err := f.gw.GetSession(withToken(ctx, "not-a-token"), &gatewayv1.SessionRef{Namespace: "a", Id: "x"}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a bad token on an authenticated connection: %v, want Unauthenticated", err)
	}
}
