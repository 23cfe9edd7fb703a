package gateway

import (
	"context"
	"io"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ziptrail/ziptrail/internal/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/sessions"
)

func TestGRPCGateway(t *testing.T) {
	reg := sessions.NewRegistry()
	h := New(&Handler{Starter: &starter{reg: reg}, Sessions: reg, Results: inlineResults{}})
	gs := grpc.NewServer()
	gatewayv1.RegisterGatewayServer(gs, &GRPC{H: h})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	defer gs.Stop()
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := gatewayv1.NewGatewayClient(cc)
	ctx := context.Background()

	if _, err := c.StartSession(ctx, &gatewayv1.StartSessionRequest{Namespace: "ns", Workflow: "missing"}); status.Code(err) != codes.NotFound {
		t.Errorf("missing workflow: %v", err)
	}
	if _, err := c.StartSession(ctx, &gatewayv1.StartSessionRequest{Namespace: "ns", Workflow: "cold"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("cold workflow: %v", err)
	}
	s, err := c.StartSession(ctx, &gatewayv1.StartSessionRequest{Namespace: "ns", Workflow: "wc", Input: []byte("in")})
	if err != nil || s.State != "Running" {
		t.Fatalf("%v %v", s, err)
	}
	if _, err := c.GetSession(ctx, &gatewayv1.SessionRef{Namespace: "other", Id: s.Id}); status.Code(err) != codes.NotFound {
		t.Errorf("foreign namespace: %v", err)
	}

	watch, err := c.WatchSession(ctx, &gatewayv1.SessionRef{Namespace: "ns", Id: s.Id})
	if err != nil {
		t.Fatal(err)
	}
	if e, err := watch.Recv(); err != nil || e.Kind != "Started" {
		t.Fatalf("first event %v %v", e, err)
	}
	done := make(chan *gatewayv1.SessionResult)
	go func() {
		r, err := c.WaitSession(ctx, &gatewayv1.WaitSessionRequest{Namespace: "ns", Id: s.Id, TimeoutMs: 60_000})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	_ = reg.Finish(s.Id, sessions.Completed, &sessions.Result{Bucket: "output", Key: "r", Inline: []byte("42")}, "")
	r := <-done
	if r.Session.State != "Completed" || string(r.Result) != "42" || r.Session.ResultBucket != "output" {
		t.Errorf("result %v", r)
	}
	var kinds []string
	for {
		e, err := watch.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, e.Kind)
	}
	if len(kinds) == 0 || kinds[len(kinds)-1] != "Completed" {
		t.Errorf("events after start: %v", kinds)
	}
}
