package control_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/controlclient"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// saver is Events whose effects are "saved" when the test says so
// (control.Durability), as the orchestrator's checkpoints are.
type saver struct {
	recorder
	mu    sync.Mutex
	saved chan struct{} // closed by save
}

func (s *saver) Saved(control.Identity) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.saved
}

func (s *saver) save() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.saved)
	s.saved = make(chan struct{})
}

// An event is acknowledged only once a save covers it; until then the
// sidecar keeps it, and with QueueLimit events kept, Send waits for room
// (back-pressure) and fails with ErrQueueFull after QueueWait.
func TestAcksWaitForTheSaveAndHoldTheSenderBack(t *testing.T) {
	ev := &saver{recorder: recorder{got: make(chan struct{}, 64)}, saved: make(chan struct{})}
	_, gs, addr := serve(t, "127.0.0.1:0", ev)
	defer gs.Stop()
	cl := controlclient.NewClient(addr, testToken("ns", "p1"), &controlv1.Hello{Namespace: "ns", Pod: "p1", Function: "f"}, controlclient.Commands{})
	cl.QueueLimit, cl.QueueWait = 2, 200*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = cl.Run(ctx) }()
	for _, k := range []string{"a", "b"} {
		if err := cl.Send(objectEvent(k)); err != nil {
			t.Fatal(err)
		}
		<-ev.got // applied
	}
	// Applied, not saved: nothing is acknowledged, so a third event finds
	// the queue full.
	if err := cl.Send(objectEvent("c")); !errors.Is(err, controlclient.ErrQueueFull) {
		t.Fatalf("a third event with two awaiting their save: %v, want ErrQueueFull after the wait", err)
	}
	if n := cl.Unacked(); n != 2 {
		t.Fatalf("%d events kept, want 2 (applied, not saved)", n)
	}
	// A Send waiting for room goes through once a save acknowledges.
	sent := make(chan error, 1)
	cl.QueueWait = 20 * time.Second
	go func() { sent <- cl.Send(objectEvent("d")) }()
	ev.save()
	if err := <-sent; err != nil {
		t.Fatalf("a Send waiting for room after the save: %v", err)
	}
	<-ev.got
	waitFor(t, "d applied and kept", func() bool { return cl.Unacked() == 1 })
	ev.save()
	waitFor(t, "everything acknowledged", func() bool { return cl.Unacked() == 0 })
}
