package controlclient

import (
	"errors"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// Kept reports count against QueueLimit with the events: a sidecar whose
// operator saves nothing is held back, not grown without bound; a release
// makes room.
func TestKeptReportsAreBoundedWithTheEvents(t *testing.T) {
	c := NewClient("127.0.0.1:1", nil, &controlv1.Hello{}, Commands{})
	c.QueueLimit, c.QueueWait = 3, 100*time.Millisecond
	msg := func() *controlv1.SidecarMessage {
		return &controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_FunctionFinished{FunctionFinished: &controlv1.FunctionFinished{}}}
	}
	if err := c.Send(msg()); err != nil {
		t.Fatal(err)
	}
	a, b, d := c.Reserve(), c.Reserve(), c.Reserve()
	for _, id := range []uint64{a, b} {
		if err := c.Keep(id, msg()); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Keep(d, msg()); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("a third report with one event and two reports waiting (limit 3): %v, want ErrQueueFull after the wait", err)
	}
	if err := c.Send(msg()); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("an event with one event and two reports waiting (limit 3): %v, want ErrQueueFull after the wait", err)
	}
	// A Keep waiting for room goes on once a release frees some.
	c.QueueWait = 20 * time.Second
	e := c.Reserve()
	kept := make(chan error, 1)
	go func() { kept <- c.Keep(e, msg()) }()
	c.release([]uint64{a})
	if err := <-kept; err != nil {
		t.Fatalf("a Keep waiting for room after a release: %v", err)
	}
	if n, m := c.Kept(), c.Unacked(); n != 2 || m != 1 {
		t.Fatalf("%d reports kept and %d events, want 2 and 1", n, m)
	}
}
