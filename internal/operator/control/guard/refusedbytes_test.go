package guard_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/ziptrail/ziptrail/internal/operator/control/guard"
	"github.com/ziptrail/ziptrail/internal/operator/control/guard/guardtest"
)

// countingListener counts the bytes its connections read.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{c, l.n}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// newGuard is a guard whose Authenticate accepts the token "good".
func newGuard(l guard.Limits) *guard.Guard {
	return guard.New("test", l, func(ctx context.Context, info *tap.Info) (any, error) {
		if tok := info.Header.Get("authorization"); len(tok) == 1 && tok[0] == "Bearer good" {
			return who{"good"}, nil
		}
		return nil, status.Error(codes.Unauthenticated, "bad token")
	})
}

// countingServer serves the health service behind a guard of l, counting
// the bytes it reads; it returns a client connection to it.
func countingServer(t *testing.T, l guard.Limits, exempt ...func(context.Context) bool) (*grpc.ClientConn, *guard.Guard, *atomic.Int64) {
	t.Helper()
	read := &atomic.Int64{}
	g := newGuard(l)
	if len(exempt) > 0 {
		g.Exempt = exempt[0]
	}
	gs := grpc.NewServer(g.ServerOptions()...)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(g.Listener(countingListener{ln, read})) }()
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(128<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc, g, read
}

// send sends body as a Check request with token.
func send(cc *grpc.ClientConn, token string, body []byte) error {
	ctx, cancel := context.WithTimeout(as(context.Background(), token), 30*time.Second)
	defer cancel()
	return cc.Invoke(ctx, healthpb.Health_Check_FullMethodName, body, &healthpb.HealthCheckResponse{}, grpc.ForceCodec(guardtest.RawCodec{}))
}

// TestARefusedCallCostsAWindow: a caller whose calls are refused — for
// its token (before the message) or its message's size (after its
// length) — makes the server read about one flow-control window a call
// (Limits.Window), not the body it sends, however often it sends it
// (issue 33: with gRPC's growing windows a flood of refused 60 MiB calls
// cost the server 0.5–2 MiB each, a CPU of the operator, and slowed the
// other tenants' sessions). An accepted call still carries a large
// message.
func TestARefusedCallCostsAWindow(t *testing.T) {
	const window = 256 << 10
	for _, tc := range []struct {
		name, token string
		size        int
		want        codes.Code
	}{
		{"unauthenticated", "bad", 60 << 20, codes.Unauthenticated},
		{"oversized", "good", 100 << 20, codes.ResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc, _, read := countingServer(t, guard.Limits{MaxRecvMsgSize: 64 << 20, Window: window, RefusalsPerSecond: -1})
			// A large accepted message first: gRPC's windows would have
			// grown with it.
			if err := send(cc, "good", make([]byte, 32<<20)); status.Code(err) != codes.Internal {
				t.Fatalf("an accepted 32 MiB message (not a health request): %v, want Internal (it was read)", err)
			}
			body := make([]byte, tc.size)
			const calls = 40
			read.Store(0)
			for i := 0; i < calls; i++ {
				if err := send(cc, tc.token, body); status.Code(err) != tc.want {
					t.Fatalf("call %d: %v, want %v", i, err, tc.want)
				}
			}
			per := read.Load() / calls
			t.Logf("%d refused %d MiB calls: the server read %d KiB a call (window %d KiB)", calls, tc.size>>20, per>>10, window>>10)
			if per > 2*window {
				t.Errorf("the server read %d KiB a refused call, want at most about its window (%d KiB)", per>>10, window>>10)
			}
		})
	}
}

// TestRefusedInALoopIsPaced: a connection refused faster than
// RefusalsPerSecond has its next calls wait (each still refused with its
// own code); one refused within the rate never waits, and the paced
// connection's accepted calls still go through.
func TestRefusedInALoopIsPaced(t *testing.T) {
	cc, g, _ := countingServer(t, guard.Limits{MaxRecvMsgSize: 1 << 20, RefusalsPerSecond: 50})
	for i := 0; i < 40; i++ { // within the burst (50)
		if err := send(cc, "bad", nil); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if n := g.Paced(); n != 0 {
		t.Fatalf("%d calls paced within the rate", n)
	}
	for i := 0; i < 30; i++ { // past it, refused for the token or the size
		tok, body, want := "bad", []byte(nil), codes.Unauthenticated
		if i%2 == 1 {
			tok, body, want = "good", make([]byte, 2<<20), codes.ResourceExhausted
		}
		if err := send(cc, tok, body); status.Code(err) != want {
			t.Fatalf("call %d past the rate: %v, want %v", i, err, want)
		}
	}
	if n := g.Paced(); n == 0 {
		t.Fatal("no call paced after 70 refusals on one connection at a rate of 50 a second, bursts of 50")
	}
	if err := send(cc, "good", nil); err != nil {
		t.Fatalf("an accepted call on the paced connection: %v", err)
	}
}

// TestAnExemptConnectionIsNotPaced: a connection Guard.Exempt names (one
// carrying many clients' calls, as another replica's) is never paced.
func TestAnExemptConnectionIsNotPaced(t *testing.T) {
	cc, g, _ := countingServer(t, guard.Limits{MaxRecvMsgSize: 1 << 20, RefusalsPerSecond: 5}, func(context.Context) bool { return true })
	for i := 0; i < 30; i++ {
		if err := send(cc, "bad", nil); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if n := g.Paced(); n != 0 {
		t.Fatalf("%d calls of an exempt connection paced", n)
	}
}
