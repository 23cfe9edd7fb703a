package orchestrator

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// TestAGracefulStopDrainsCallsInFlight is issue 32's defect 1: a graceful
// stop (shutdown, a demoted bucket, a rollout) cancelled the dispatcher's
// calls to functions; the response was dropped, and the next owner found
// the invocation still running, for ever without a re-execution rule.
// Now a graceful stop dispatches nothing more and waits (bounded) for the
// calls in flight; their outcomes are in its last save.
func TestAGracefulStopDrainsCallsInFlight(t *testing.T) {
	rs := servers.StartRedis(t)
	store := &checkpoint.Store{Client: rs.Client, Key: "ziptrail:test:drain"}
	wf := testWorkflow("drain", "entry", "entry", "second")
	wf.Spec.Triggers = append(wf.Spec.Triggers, immediate("next", "next", "second"))
	fns := &servers.Functions{}
	fns.Add(t, "drain-second", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		return nil, ziptrail.SendObject(ctx, "output", "result", append([]byte("second:"), inv.Objects[0].Bytes()...), nil)
	}))
	running := make(chan struct{}, 1)
	var cancelled atomic.Bool
	fns.Add(t, "drain-entry", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		running <- struct{}{}
		select {
		case <-time.After(300 * time.Millisecond):
		case <-ctx.Done():
			cancelled.Store(true)
			return nil, ctx.Err()
		}
		return nil, ziptrail.SendObject(ctx, "next", "x", []byte("done"), nil)
	}))
	start := func() (*Orchestrator, context.CancelFunc, chan error) {
		o, err := New(Options{Resolver: fns, Log: logr.Discard(), Checkpoint: store, CheckpointInterval: time.Hour, RedispatchAfter: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if err := o.SetWorkflow(wf, true, ""); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- o.Run(ctx) }()
		return o, cancel, done
	}
	first, stop, done := start()
	id, err := first.StartSession(context.Background(), "ns", "drain", []byte("in"))
	if err != nil {
		t.Fatal(err)
	}
	<-running
	stop() // a graceful stop while the call runs
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if cancelled.Load() {
		t.Error("the graceful stop cancelled the function's call")
	}
	second, stop2, done2 := start()
	defer func() { stop2(); <-done2 }()
	// The call in flight finished in the first owner's drain; the one it
	// fired was left queued, and the second owner sends it at once.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waitFor(t, "the session restored", func() bool { _, err := second.Sessions().Get(id); return err == nil })
	if s, err := second.Sessions().Wait(ctx, id); err != nil || s.State != sessions.Completed {
		t.Fatalf("after a graceful handover, session %s is %s (%v): the call in flight, or the one it fired, was lost with the first owner", id, s.State, err)
	}
}
