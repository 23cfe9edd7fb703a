package control_test

import (
	"context"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/controlclient"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// An empty object a sidecar reports reaches the engine's side as an empty
// object (issue 15, item 7): protobuf used to drop the empty inline bytes,
// the server refused the report, and the session hung until its deadline.
func TestEmptyObjectCrossesTheControlStream(t *testing.T) {
	rec := &recorder{got: make(chan struct{}, 16)}
	_, gs, addr := serve(t, "127.0.0.1:0", rec)
	defer gs.Stop()
	cl := controlclient.NewClient(addr, testToken("ns", "p1"), &controlv1.Hello{Namespace: "ns", Pod: "p1", Function: "f"}, controlclient.Commands{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = cl.Run(ctx) }()
	if err := cl.Send(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_ObjectReady{ObjectReady: &controlv1.ObjectReady{
		Session: "s", Bucket: "b", Key: "empty", Inline: []byte{}, InvocationId: "s.1"}}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rec.got:
	case <-time.After(10 * time.Second):
		t.Fatal("the empty object never reached the engine's side (refused as carrying neither a reference nor bytes?)")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if o := rec.objects[0]; o.Inline == nil || len(o.Inline) != 0 || o.Key != "empty" {
		t.Fatalf("delivered %+v", o)
	}
}
