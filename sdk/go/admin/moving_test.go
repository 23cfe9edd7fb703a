package admin

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/rest"

	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// movingGateway answers WaitSession as a gateway does while the session's
// workflow's engine moves between operator replicas: Unavailable with
// ErrEngineMoving, then Running at once (the wait on the old owner ended
// with the move), then the result.
type movingGateway struct {
	gatewayv1.UnimplementedGatewayServer
	calls atomic.Int32
}

func (g *movingGateway) WaitSession(ctx context.Context, req *gatewayv1.WaitSessionRequest) (*gatewayv1.SessionResult, error) {
	s := &gatewayv1.Session{Id: req.Id, Namespace: req.Namespace, State: Running}
	switch g.calls.Add(1) {
	case 1, 2:
		return nil, status.Errorf(codes.Unavailable, "%v: workflow %s/w (engine bucket b): no owner yet", gateway.ErrEngineMoving, req.Namespace)
	case 3:
		return &gatewayv1.SessionResult{Session: s}, nil
	}
	s.State = Completed
	return &gatewayv1.SessionResult{Session: s, Result: []byte("done")}, nil
}

func TestWaitAsksAgainWhileTheEngineMoves(t *testing.T) {
	g := &movingGateway{}
	c := clientOf(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := c.Wait(ctx, "w-1")
	if err != nil {
		t.Fatalf("Wait across a move: %v", err)
	}
	if string(res.Output) != "done" || g.calls.Load() != 4 {
		t.Fatalf("output %q after %d calls, want \"done\" after 4", res.Output, g.calls.Load())
	}

	// Other errors reach the caller at once (a gateway that cannot wait).
	_, err = clientOf(t, &gatewayv1.UnimplementedGatewayServer{}).Wait(ctx, "w-1")
	var zerr *ziptrail.Error
	if !errors.As(err, &zerr) || ctx.Err() != nil {
		t.Fatalf("Wait on a gateway that cannot wait: %v, want a ziptrail error at once", err)
	}
}

// clientOf is a Client of namespace ns whose gateway is srv, served on a
// loopback port until the test ends (no API server: sessions only).
func clientOf(t *testing.T, srv gatewayv1.GatewayServer) *Client {
	gs := grpc.NewServer()
	gatewayv1.RegisterGatewayServer(gs, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	c, err := New(&rest.Config{Host: "http://127.0.0.1:1"}, Options{Namespace: "ns", Gateway: ln.Addr().String(), GatewayToken: "t"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
