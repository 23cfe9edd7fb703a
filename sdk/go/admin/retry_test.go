package admin

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/rest"

	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
)

// flakyGateway is a gateway that honours idempotency keys, answers
// UNAVAILABLE (as the gateway answers 503: its engine moving, its input
// store full) to the first unavailable calls, loses the answer to the
// first start it carries out (UNAVAILABLE after starting), and breaks the
// first result stream halfway.
type flakyGateway struct {
	gatewayv1.UnimplementedGatewayServer
	result []byte

	mu          sync.Mutex
	unavailable int            // calls still to refuse
	lost        bool           // the first start's answer was lost
	keys        map[string]int // idempotency key -> starts carried out with it
	started     int
	broke       bool
	acked       []string
}

func (g *flakyGateway) refuse() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.unavailable > 0 {
		g.unavailable--
		return status.Error(codes.Unavailable, "the session inputs are using all the memory reserved for them")
	}
	return nil
}

func (g *flakyGateway) StartSession(ctx context.Context, req *gatewayv1.StartSessionRequest) (*gatewayv1.Session, error) {
	if err := g.refuse(); err != nil {
		return nil, err
	}
	md, _ := metadata.FromIncomingContext(ctx)
	key := md.Get(gateway.IdempotencyKeyMetadata)
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(key) != 1 || key[0] == "" {
		return nil, status.Error(codes.InvalidArgument, "no idempotency key")
	}
	if g.keys == nil {
		g.keys = map[string]int{}
	}
	if _, ok := g.keys[key[0]]; !ok {
		g.started++
		g.keys[key[0]] = g.started
	}
	if !g.lost { // started, but the answer is lost
		g.lost = true
		return nil, status.Error(codes.Unavailable, "error reading from server: EOF")
	}
	return &gatewayv1.Session{Id: "w-1", Namespace: req.Namespace, Workflow: req.Workflow, State: Running}, nil
}

func (g *flakyGateway) WaitSession(ctx context.Context, req *gatewayv1.WaitSessionRequest) (*gatewayv1.SessionResult, error) {
	if err := g.refuse(); err != nil {
		return nil, err
	}
	return &gatewayv1.SessionResult{Session: &gatewayv1.Session{Id: req.Id, Namespace: req.Namespace, State: Completed,
		ResultSize: int64(len(g.result))}, ResultStreamed: true}, nil
}

func (g *flakyGateway) ReadResult(req *gatewayv1.SessionRef, stream gatewayv1.Gateway_ReadResultServer) error {
	if err := g.refuse(); err != nil {
		return err
	}
	g.mu.Lock()
	broke := g.broke
	g.broke = true
	g.mu.Unlock()
	for off := 0; off < len(g.result); off += 1000 {
		if !broke && off >= len(g.result)/2 {
			return status.Error(codes.Unavailable, "read result: connection reset by peer")
		}
		if err := stream.Send(&gatewayv1.ResultChunk{Data: g.result[off:min(off+1000, len(g.result))]}); err != nil {
			return err
		}
	}
	return nil
}

func (g *flakyGateway) AckResult(ctx context.Context, req *gatewayv1.AckResultRequest) (*gatewayv1.AckResultResponse, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.acked = append(g.acked, req.Id)
	return &gatewayv1.AckResultResponse{}, nil
}

// TestSessionCallsRetry: RunSession goes through a gateway that refuses
// connections at first (its listener comes up only after the client
// retried three times), then answers UNAVAILABLE to three calls, loses the
// answer to its start and breaks the result's stream halfway: one session
// is started (its retries carry the same idempotency key), its whole
// result arrives, and it is acknowledged.
func TestSessionCallsRetry(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // connections are refused until it listens again

	retries := make(chan string, 1000)
	c, err := New(&rest.Config{Host: "http://127.0.0.1:1"}, Options{Namespace: "ns", Gateway: addr, GatewayToken: "t",
		OnRetry: func(op string, err error, pause time.Duration) {
			t.Logf("%s: %v; retrying in %v", op, err, pause)
			retries <- op
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })

	g := &flakyGateway{result: bytes.Repeat([]byte("0123456789"), 50_000), unavailable: 3}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type outcome struct {
		res *Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := c.RunSession(ctx, "w", []byte("in"))
		done <- outcome{res, err}
	}()
	for range 3 {
		select {
		case op := <-retries:
			if op != "start session" {
				t.Fatalf("retried %q, want the start", op)
			}
		case o := <-done:
			t.Fatalf("RunSession gave up while the gateway was down: %v", o.err)
		}
	}
	// The gateway comes up.
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	gatewayv1.RegisterGatewayServer(gs, g)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)

	o := <-done
	if o.err != nil {
		t.Fatalf("RunSession through a gateway coming up late: %v", o.err)
	}
	if !bytes.Equal(o.res.Output, g.result) {
		t.Fatalf("result: %d bytes, want %d", len(o.res.Output), len(g.result))
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started != 1 || len(g.keys) != 1 {
		t.Errorf("%d sessions started with %d keys, want 1 and 1", g.started, len(g.keys))
	}
	if !g.broke || len(g.acked) != 1 || g.acked[0] != "w-1" {
		t.Errorf("acknowledged %v (stream broken: %v), want [w-1]", g.acked, g.broke)
	}
}

// TestRetriesAreBounded: a gateway that stays away is reported once the
// retry budget is spent, and RetryFor < 0 retries nothing.
func TestRetriesAreBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	for _, c := range []struct {
		retryFor time.Duration
		retries  bool
	}{{-1, false}, {300 * time.Millisecond, true}} {
		n := 0
		cl, err := New(&rest.Config{Host: "http://127.0.0.1:1"}, Options{Namespace: "ns", Gateway: addr, GatewayToken: "t", RetryFor: c.retryFor,
			OnRetry: func(string, error, time.Duration) { n++ }})
		if err != nil {
			t.Fatal(err)
		}
		_, err = cl.StartSession(context.Background(), "w", nil)
		_ = cl.Close()
		if err == nil || (n > 0) != c.retries {
			t.Errorf("RetryFor %v: %d retries, %v; want an error after retries: %v", c.retryFor, n, err, c.retries)
		}
	}
}

var _ io.Reader = (*resultReader)(nil)
