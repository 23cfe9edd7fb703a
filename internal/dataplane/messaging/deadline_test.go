package messaging

import (
	"testing"
	"time"
)

// TestDeadlines: one timer serves every operation: each due deadline
// runs its function once, a cancelled one never, and one added before
// the deadline the timer is set for sets it again (it runs first).
func TestDeadlines(t *testing.T) {
	var d deadlines
	ran := make(chan string, 8)
	late := d.add(time.Now().Add(time.Hour), func() { ran <- "late" })
	soon := d.add(time.Now().Add(20*time.Millisecond), func() { ran <- "soon" })
	dropped := d.add(time.Now().Add(10*time.Millisecond), func() { ran <- "dropped" })
	if !dropped.cancel() {
		t.Fatal("cancelling a pending deadline: false")
	}
	if got := <-ran; got != "soon" {
		t.Fatalf("first to run: %s, want soon", got)
	}
	if soon.cancel() {
		t.Fatal("cancelling a deadline that ran: true")
	}
	if !late.cancel() {
		t.Fatal("the hour-long deadline is not pending")
	}
	// The timer is still set for the cancelled hour: an earlier deadline
	// sets it again.
	d.add(time.Now().Add(time.Millisecond), func() { ran <- "again" })
	if got := <-ran; got != "again" {
		t.Fatalf("after the timer rested: %s, want again", got)
	}
	select {
	case got := <-ran:
		t.Fatalf("%s ran as well", got)
	default:
	}
}
