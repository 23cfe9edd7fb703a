package orchestrator

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"

	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// TestARestoredCallNothingIsHeardOfIsSentAgain: an owner crashed while an
// invocation it had dispatched was lost (its pod died, or it was still
// queued). The checkpoint holds it as running, and without a
// re-execution rule nothing ever moved it again: the session stayed
// Running until its deadline. Its new owner sends it again, under the
// same id, when nothing is heard of it after the restore.
func TestARestoredCallNothingIsHeardOfIsSentAgain(t *testing.T) {
	rs := servers.StartRedis(t)
	wf := testWorkflow("lost", "entry", "entry")
	fns := &servers.Functions{}
	var calls atomic.Int32
	lost := make(chan struct{})
	defer close(lost)
	keys := make(chan string, 4)
	fns.Add(t, "lost-entry", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		keys <- inv.ID
		if calls.Add(1) == 1 {
			<-lost // the first call's pod never answers
			return nil, nil
		}
		return nil, ziptrail.SendObject(ctx, "output", "result", []byte("done"), nil)
	}))
	start := func(rc *redis.Client) (*Orchestrator, context.CancelFunc, chan error) {
		o, err := New(Options{Resolver: fns, Log: logr.Discard(), CheckpointInterval: 20 * time.Millisecond,
			DrainTimeout: 50 * time.Millisecond, RedispatchAfter: 200 * time.Millisecond,
			Checkpoint: &checkpoint.Store{Client: rc, Key: "ziptrail:test:lost"}})
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
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr})
	first, crash, done := start(rc)
	id, err := first.StartSession(context.Background(), "ns", "lost", []byte("in"))
	if err != nil {
		t.Fatal(err)
	}
	firstID := <-keys
	_ = rc.Close() // a crash: nothing more is saved
	crash()
	<-done

	second, stop, done2 := start(rs.Client)
	defer func() { stop(); <-done2 }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waitFor(t, "the session restored", func() bool { _, err := second.Sessions().Get(id); return err == nil })
	s, err := second.Sessions().Wait(ctx, id)
	if err != nil || s.State != sessions.Completed {
		t.Fatalf("session %s after the crash: %s %v (the lost call was never sent again)", id, s.State, err)
	}
	if again := <-keys; again != firstID {
		t.Errorf("sent again as %q, want the same invocation %q", again, firstID)
	}
}
