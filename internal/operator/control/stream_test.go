package control_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ziptrail/ziptrail/internal/dataplane/controlclient"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

type staticKeys struct{}

func (staticKeys) Keys(context.Context, string) (*controlv1.Keys, error) {
	return &controlv1.Keys{ActiveKeyId: "k1", Keys: []*controlv1.Key{{Id: "k1", Secret: make([]byte, 32)}}}, nil
}

// testAuth is a stand-in Authenticator for tests that are not about
// authentication (those run TokenReview against a real API server, see
// auth_test.go): token "test:<ns>:<pod>" is pod <pod> of namespace <ns>.
// It records the tokens it sees.
type testAuth struct {
	mu   sync.Mutex
	seen []string
}

func (a *testAuth) Authenticate(_ context.Context, token string) (control.Caller, error) {
	a.mu.Lock()
	a.seen = append(a.seen, token)
	a.mu.Unlock()
	parts := strings.Split(token, ":")
	if len(parts) != 3 || parts[0] != "test" {
		return control.Caller{}, status.Error(codes.Unauthenticated, "not a test token")
	}
	return control.Caller{Username: "system:serviceaccount:" + parts[1] + ":fn", Namespace: parts[1], ServiceAccount: "fn",
		Pod: parts[2], PodUID: parts[1] + "-" + parts[2]}, nil
}

func (a *testAuth) tokens() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.seen...)
}

// testToken is a TokenSource of a test token.
// objectEvent is an ObjectReady of key in session s, bucket b.
func objectEvent(key string) *controlv1.SidecarMessage {
	return &controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_ObjectReady{ObjectReady: &controlv1.ObjectReady{
		Session: "s", Bucket: "b", Key: key, Inline: []byte("x")}}}
}

func testToken(ns, pod string) controlclient.TokenSource {
	return func() (string, error) { return "test:" + ns + ":" + pod, nil }
}

func serve(t *testing.T, addr string, ev control.Events) (*control.Server, *grpc.Server, string) {
	t.Helper()
	return serveAuth(t, addr, ev, &testAuth{})
}

func serveAuth(t *testing.T, addr string, ev control.Events, auth control.Authenticator) (*control.Server, *grpc.Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := control.NewServer(ev, staticKeys{})
	srv.Auth = auth
	gs := grpc.NewServer()
	controlv1.RegisterControlServer(gs, srv)
	go gs.Serve(ln)
	return srv, gs, ln.Addr().String()
}

// TestClientSurvivesOperatorRestart: events sent while the operator is down
// are delivered once it is back, keys are re-sent on every connect, and
// every connect presents the token file's current token (the kubelet
// rotates it in place).
func TestClientSurvivesOperatorRestart(t *testing.T) {
	rec := &recorder{got: make(chan struct{}, 16)}
	auth := &testAuth{}
	srv, gs, addr := serveAuth(t, "127.0.0.1:0", rec, auth)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("test:ns:p1"), 0o600); err != nil {
		t.Fatal(err)
	}

	keys := make(chan *controlv1.Keys, 4)
	drops := make(chan *controlv1.DropObjects, 4)
	cl := controlclient.NewClient(addr, controlclient.FileToken(tokenFile), &controlv1.Hello{Namespace: "ns", Pod: "p1", Function: "f"},
		controlclient.Commands{Keys: func(k *controlv1.Keys) { keys <- k }, Drop: func(d *controlv1.DropObjects) { drops <- d }})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { _ = cl.Run(ctx); close(done) }()

	wait := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(20 * time.Second):
			t.Fatalf("timed out waiting for %s", what)
		}
	}
	if k := <-keys; k.ActiveKeyId != "k1" {
		t.Fatalf("keys %v", k)
	}
	if err := cl.Send(objectEvent("a")); err != nil {
		t.Fatal(err)
	}
	wait("first event", rec.got)

	// Commands reach the client.
	if err := srv.Drop("ns", "s", nil); err != nil {
		t.Fatal(err)
	}
	if d := <-drops; d.Session != "s" {
		t.Errorf("drop %v", d)
	}

	// The operator goes away; events are queued meanwhile, and the
	// kubelet rotates the token.
	gs.Stop()
	for _, k := range []string{"b", "c"} {
		if err := cl.Send(objectEvent(k)); err != nil {
			t.Fatal(err)
		}
	}
	rotated := "test:ns:p1:rotated"
	auth2 := &rotatingAuth{testAuth: &testAuth{}, rotated: rotated}
	if err := os.WriteFile(tokenFile, []byte(rotated), 0o600); err != nil {
		t.Fatal(err)
	}
	_, gs2, _ := serveAuth(t, addr, rec, auth2)
	defer gs2.Stop()
	<-keys // re-sent on reconnect
	if seen := auth2.tokens(); len(seen) == 0 || seen[len(seen)-1] != rotated {
		t.Errorf("after the rotation the client presented %v, want the token file's new content", seen)
	}
	go func() {
		for range rec.got { // drain notifications; the check below reads the log
		}
	}()
	waitFor(t, "queued events", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.objects) > 0 && rec.objects[len(rec.objects)-1].Key == "c"
	})
	// Delivery is at least once: b and c arrive (in order), a may repeat if
	// its ack was lost with the first operator.
	rec.mu.Lock()
	var got []string
	for _, o := range rec.objects {
		got = append(got, o.Key)
	}
	rec.mu.Unlock()
	if len(got) < 3 || got[len(got)-2] != "b" || got[len(got)-1] != "c" {
		t.Errorf("delivered %v, want a then b, c in order", got)
	}
	waitFor(t, "acks to drain the queue", func() bool { return cl.Unacked() == 0 })
	cancel()
	<-done
}

// rotatingAuth accepts the rotated token as the one it replaced.
type rotatingAuth struct {
	*testAuth
	rotated string
}

func (a *rotatingAuth) Authenticate(ctx context.Context, token string) (control.Caller, error) {
	if token == a.rotated {
		a.mu.Lock()
		a.seen = append(a.seen, token)
		a.mu.Unlock()
		return control.Caller{Username: "system:serviceaccount:ns:fn", Namespace: "ns", ServiceAccount: "fn", Pod: "p1", PodUID: "ns-p1"}, nil
	}
	return a.testAuth.Authenticate(ctx, token)
}

// waitFor polls cond (bounded) for asynchronous convergence.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
