package control_test

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ziptrail/ziptrail/internal/dataplane/controlclient"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// handshake opens a stream with token and Hello, and reads what the
// server sends until the stream ends: its messages and final status.
func (a *authEnv) handshake(t *testing.T, token string, hello *controlv1.Hello) ([]*controlv1.OperatorMessage, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := a.cl.Connect(withToken(ctx, token))
	if err != nil {
		return nil, err
	}
	_ = st.Send(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_Hello{Hello: hello}})
	var got []*controlv1.OperatorMessage
	for {
		m, err := st.Recv()
		if err == io.EOF {
			return got, nil // the server ended the stream
		}
		if err != nil {
			return got, err
		}
		got = append(got, m)
		if m.GetKeys() != nil {
			return got, nil // served here
		}
	}
}

// TestRedirectOnlyAfterAuthentication: a replica that does not own a
// workflow's bucket tells the sidecar where its owner is, but only once
// the caller has proved to be that workflow's pod. Forged, foreign and
// mismatched handshakes are refused as before, learn nothing of the
// owner (no Redirect, no address in the error), and the router is never
// even asked.
func TestRedirectOnlyAfterAuthentication(t *testing.T) {
	a := newAuthEnv(t)
	const owner, bucket = "10.77.0.9:9443", "ziptrail-engine.03-of-08"
	var asked atomic.Int32
	a.srv.Route = func(_ context.Context, id control.Identity) (*controlv1.Redirect, error) {
		asked.Add(1)
		return &controlv1.Redirect{Address: owner, Bucket: bucket}, nil
	}
	pa := a.pod(t, "team-a", "map-a")
	a.pod(t, "team-b", "map-b")
	good := a.podToken(t, pa, control.Audience)
	hello := func(ns, pod string) *controlv1.Hello {
		return &controlv1.Hello{Namespace: ns, Workflow: "wf", Function: "map", Pod: pod, DataplaneAddr: "10.0.0.1:9192"}
	}
	attacks := []struct {
		name  string
		token string
		hello *controlv1.Hello
		code  codes.Code
	}{
		{"no token", "", hello("team-a", "map-a"), codes.Unauthenticated},
		{"forged token", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln", hello("team-a", "map-a"), codes.Unauthenticated},
		{"another audience's token", a.podToken(t, pa, "vault"), hello("team-a", "map-a"), codes.Unauthenticated},
		{"a token bound to no pod", a.saToken(t, "team-a", "ci", control.Audience), hello("team-a", "map-a"), codes.PermissionDenied},
		{"a Hello naming another namespace", good, hello("team-b", "map-b"), codes.PermissionDenied},
		{"a Hello naming another pod", good, hello("team-a", "map-z"), codes.PermissionDenied},
	}
	for _, at := range attacks {
		msgs, err := a.handshake(t, at.token, at.hello)
		if status.Code(err) != at.code {
			t.Errorf("%s: %v, want %s", at.name, err, at.code)
		}
		for _, m := range msgs {
			t.Errorf("%s: the server sent %T", at.name, m.Msg)
		}
		if msg := status.Convert(err).Message(); strings.Contains(msg, owner) || strings.Contains(msg, bucket) || strings.Contains(msg, "10.77.") {
			t.Errorf("%s: the refusal names the owner: %q", at.name, msg)
		}
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("the router was asked %d times for unauthenticated or mismatched streams", n)
	}

	// The workflow's own pod learns where to go, and nothing else: no
	// tiers, no keys.
	msgs, err := a.handshake(t, good, hello("team-a", "map-a"))
	if err != nil {
		t.Fatalf("the owner's pod: %v", err)
	}
	if len(msgs) != 1 || msgs[0].GetRedirect() == nil {
		t.Fatalf("the owner's pod got %v, want exactly one Redirect", msgs)
	}
	if rd := msgs[0].GetRedirect(); rd.Address != owner || rd.Bucket != bucket {
		t.Errorf("redirect %+v, want %s (%s)", rd, owner, bucket)
	}
	if n := asked.Load(); n != 1 {
		t.Errorf("the router was asked %d times, want 1", n)
	}
}

// movingEvents refuses events with control.ErrMoved while moved is set.
type movingEvents struct {
	moved atomic.Bool
	mu    sync.Mutex
	keys  []string
}

func (m *movingEvents) ObjectReady(_ context.Context, _ control.Identity, ev *controlv1.ObjectReady) error {
	if m.moved.Load() {
		return control.ErrMoved
	}
	m.mu.Lock()
	m.keys = append(m.keys, ev.Key)
	m.mu.Unlock()
	return nil
}
func (m *movingEvents) FunctionStarted(context.Context, control.Identity, *controlv1.FunctionStarted) error {
	return nil
}
func (m *movingEvents) FunctionFinished(context.Context, control.Identity, *controlv1.FunctionFinished) error {
	return nil
}
func (m *movingEvents) got() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.keys...)
}

// TestClientFollowsTheBucket: the sidecar's client connects to the
// control Service (replica A), is redirected to the owner B with the same
// token, and its events reach B. When B gives the bucket up (Moved) the
// client goes back to the Service and on to the new owner (A now); an
// event B refused as moved is not lost but resent there.
func TestClientFollowsTheBucket(t *testing.T) {
	a := newAuthEnv(t)
	evA := &movingEvents{}
	evB := &movingEvents{}
	srvA := control.NewServer(evA, a.keys)
	srvA.Auth = &control.TokenReviewer{Client: a.k8s}
	srvB := control.NewServer(evB, a.keys)
	srvB.Auth = srvA.Auth
	serve := func(s *control.Server) string {
		gs := grpc.NewServer()
		controlv1.RegisterControlServer(gs, s)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = gs.Serve(ln) }()
		t.Cleanup(gs.Stop)
		return ln.Addr().String()
	}
	addrA, addrB := serve(srvA), serve(srvB)
	var ownerIsB atomic.Bool
	ownerIsB.Store(true)
	srvA.Route = func(context.Context, control.Identity) (*controlv1.Redirect, error) {
		if ownerIsB.Load() {
			return &controlv1.Redirect{Address: addrB, Bucket: "b1"}, nil
		}
		return nil, nil
	}

	p := a.pod(t, "team-a", "map-a")
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(a.podToken(t, p, control.Audience)), 0o600); err != nil {
		t.Fatal(err)
	}
	cl := controlclient.NewClient(addrA, controlclient.FileToken(file), &controlv1.Hello{Namespace: "team-a", Workflow: "wf", Pod: "map-a", Function: "map"},
		controlclient.Commands{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = cl.Run(ctx) }()
	send := func(key string) {
		if err := cl.Send(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_ObjectReady{ObjectReady: &controlv1.ObjectReady{
			Session: "s1", Bucket: "out", Key: key, Inline: []byte("x")}}}); err != nil {
			t.Fatal(err)
		}
	}
	send("one")
	waitFor(t, "event one at the owner B", func() bool { return len(evB.got()) == 1 && cl.Unacked() == 0 })
	if len(evA.got()) != 0 {
		t.Errorf("replica A, which does not own the bucket, got %v", evA.got())
	}

	// B loses the bucket to A: an event in between is refused as moved,
	// then B closes the bucket's streams.
	evB.moved.Store(true)
	ownerIsB.Store(false)
	send("two")
	if n := srvB.Moved(func(id control.Identity) bool { return id.Workflow == "wf" }, &controlv1.Redirect{Bucket: "b1"}); n > 1 {
		t.Errorf("Moved ended %d streams, want at most 1", n)
	}
	waitFor(t, "event two at the new owner A", func() bool {
		got := evA.got()
		return len(got) == 1 && got[0] == "two" && cl.Unacked() == 0
	})
	if got := evB.got(); len(got) != 1 {
		t.Errorf("B applied %v after it gave the bucket up", got)
	}
}
