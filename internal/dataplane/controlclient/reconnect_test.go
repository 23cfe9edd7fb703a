package controlclient

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// TestRedialsTheOperatorWithinSeconds: while the operator is away (a
// rollout), the sidecar's connection is dialled again every 2 s at most.
// gRPC's own backoff grows to 2 minutes: after half a minute away, the
// next attempt came up to a minute after the operator was back (dials at
// about 1, 2.6, 5.2, 9.4, 16, 27, 44 s), and the sidecar's events waited
// that long. Counted here over 8 s of an address that refuses: gRPC's
// default makes 4 or 5 attempts, the bounded backoff about 10.
func TestRedialsTheOperatorWithinSeconds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there: every dial is refused
	var dials atomic.Int32
	dialer := func(ctx context.Context, a string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "tcp", a)
	}
	c := NewClient(addr, func() (string, error) { return "t", nil }, &controlv1.Hello{Namespace: "ns", Pod: "p"}, Commands{},
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dialer))
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	if err := c.Run(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	n := dials.Load()
	t.Logf("%d dials in 8 s", n)
	if n < 7 {
		t.Fatalf("%d dials in 8 s of the operator away, want at least 7 (a reconnection every 2 s at most)", n)
	}
}
