package control_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/ziptrail/ziptrail/internal/control"
	"github.com/ziptrail/ziptrail/internal/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/controlclient"
)

type staticKeys struct{}

func (staticKeys) Keys(context.Context, string) (*controlv1.Keys, error) {
	return &controlv1.Keys{ActiveKeyId: "k1", Keys: []*controlv1.Key{{Id: "k1", Secret: make([]byte, 32)}}}, nil
}

func serve(t *testing.T, addr string, ev control.Events) (*control.Server, *grpc.Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := control.NewServer(ev, staticKeys{})
	gs := grpc.NewServer()
	controlv1.RegisterControlServer(gs, srv)
	go gs.Serve(ln)
	return srv, gs, ln.Addr().String()
}

// TestClientSurvivesOperatorRestart: events sent while the operator is down
// are delivered once it is back, and keys are re-sent on every connect.
func TestClientSurvivesOperatorRestart(t *testing.T) {
	rec := &recorder{got: make(chan struct{}, 16)}
	srv, gs, addr := serve(t, "127.0.0.1:0", rec)

	keys := make(chan *controlv1.Keys, 4)
	drops := make(chan *controlv1.DropObjects, 4)
	cl := controlclient.NewClient(addr, &controlv1.Hello{Namespace: "ns", Pod: "p1", Function: "f"},
		controlclient.Commands{Keys: func(k *controlv1.Keys) { keys <- k }, Drop: func(d *controlv1.DropObjects) { drops <- d }})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { _ = cl.Run(ctx); close(done) }()

	obj := func(key string) *controlv1.SidecarMessage {
		return &controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_ObjectReady{ObjectReady: &controlv1.ObjectReady{
			Session: "s", Bucket: "b", Key: key, Inline: []byte("x")}}}
	}
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
	if err := cl.Send(obj("a")); err != nil {
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

	// The operator goes away; events are queued meanwhile.
	gs.Stop()
	for _, k := range []string{"b", "c"} {
		if err := cl.Send(obj(k)); err != nil {
			t.Fatal(err)
		}
	}
	_, gs2, _ := serve(t, addr, rec)
	defer gs2.Stop()
	<-keys // re-sent on reconnect
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
