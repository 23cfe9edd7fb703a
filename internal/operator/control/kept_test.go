package control_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/controlclient"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// A report kept under an id (the answer to the operator's dispatcher names
// it) is not sent while it waits for its release; a released one is never
// sent, not even to the next stream; one not released is sent to the next
// stream (its owner may not have the answer) or, on the same stream, once
// KeepFor has passed (the answer was lost, or not saved).
func TestKeptReportsAreSentOnlyWhenNotReleased(t *testing.T) {
	rec := &recorder{got: make(chan struct{}, 16)}
	srv, gs, addr := serve(t, "127.0.0.1:0", rec)
	keys := make(chan *controlv1.Keys, 8)
	drops := make(chan struct{}, 8)
	cl := controlclient.NewClient(addr, testToken("ns", "p1"), &controlv1.Hello{Namespace: "ns", Pod: "p1", Function: "f"},
		controlclient.Commands{Keys: func(k *controlv1.Keys) { keys <- k }, Drop: func(*controlv1.DropObjects) { drops <- struct{}{} }})
	cl.KeepFor = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = cl.Run(ctx) }()
	<-keys
	wait := func(what string) {
		t.Helper()
		select {
		case <-rec.got:
		case <-time.After(20 * time.Second):
			t.Fatalf("timed out waiting for %s", what)
		}
	}
	got := func() []string {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		var keys []string
		for _, o := range rec.objects {
			keys = append(keys, o.Key)
		}
		return keys
	}

	released, unreleased, empty := cl.Reserve(), cl.Reserve(), cl.Reserve()
	cl.Keep(released, objectEvent("released"))
	cl.Keep(unreleased, objectEvent("unreleased"))
	cl.Keep(empty) // an answer that ended before its report: nothing kept
	if err := cl.Send(objectEvent("sent")); err != nil {
		t.Fatal(err)
	}
	wait("the event sent after the kept ones")
	if g := got(); !slices.Equal(g, []string{"sent"}) {
		t.Fatalf("the operator got %v, want only [sent]: kept reports wait for their release", g)
	}
	if n := cl.Kept(); n != 2 {
		t.Fatalf("%d reports kept, want 2", n)
	}

	// The release of a saved answer, and of ids the pod does not know
	// (another pod's, or made up), which change nothing.
	srv.ReleaseKept("ns", map[string][]uint64{"p1": {released, 12345}, "p2": {unreleased}})
	_ = srv.Drop("ns", "other", nil) // after the release on the same stream
	<-drops
	if n := cl.Kept(); n != 1 {
		t.Fatalf("%d reports kept after the release, want 1", n)
	}

	// A new stream (the operator restarted) gets the unreleased report,
	// never the released one.
	gs.Stop()
	rec2 := &recorder{got: make(chan struct{}, 16)}
	_, gs2, _ := serve(t, addr, rec2)
	defer gs2.Stop()
	select {
	case <-rec2.got:
	case <-time.After(20 * time.Second):
		t.Fatal("the unreleased report did not reach the next stream")
	}
	rec2.mu.Lock()
	var keys2 []string
	for _, o := range rec2.objects {
		keys2 = append(keys2, o.Key)
	}
	rec2.mu.Unlock()
	if !slices.Equal(keys2, []string{"unreleased"}) {
		t.Fatalf("the next stream got %v, want [unreleased]", keys2)
	}
	if n := cl.Kept(); n != 0 {
		t.Fatalf("%d reports kept after they were sent, want 0", n)
	}
}

// A report whose release does not come within KeepFor is sent on the same
// stream; one released before it was filled (the operator saved the answer
// before the sidecar finished reporting) is dropped when filled.
func TestAKeptReportWithoutReleaseIsSentAfterKeepFor(t *testing.T) {
	rec := &recorder{got: make(chan struct{}, 16)}
	srv, gs, addr := serve(t, "127.0.0.1:0", rec)
	defer gs.Stop()
	drops := make(chan struct{}, 8)
	cl := controlclient.NewClient(addr, testToken("ns", "p1"), &controlv1.Hello{Namespace: "ns", Pod: "p1", Function: "f"},
		controlclient.Commands{Drop: func(*controlv1.DropObjects) { drops <- struct{}{} }})
	cl.KeepFor = 300 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = cl.Run(ctx) }()
	next := func(what string) string {
		t.Helper()
		select {
		case <-rec.got:
		case <-time.After(20 * time.Second):
			t.Fatalf("timed out waiting for %s", what)
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return rec.objects[len(rec.objects)-1].Key
	}
	if err := cl.Send(objectEvent("hello")); err != nil {
		t.Fatal(err)
	}
	next("the first event") // the stream is up and registered

	early := cl.Reserve()
	srv.ReleaseKept("ns", map[string][]uint64{"p1": {early}})
	_ = srv.Drop("ns", "other", nil) // after the release on the same stream
	<-drops
	cl.Keep(early, objectEvent("early")) // released before it was filled: dropped
	late := cl.Reserve()
	cl.Keep(late, objectEvent("late"))
	if k := next("the report kept without a release"); k != "late" {
		t.Fatalf("the operator got %q, want late (the released report is never sent)", k)
	}
	if n := cl.Kept(); n != 0 {
		t.Fatalf("%d reports kept, want 0", n)
	}
}
