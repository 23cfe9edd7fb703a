package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"

	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// TestARedisPauseDegradesAndRecovers is issue 32's defect 7: with Redis
// stopped (SIGSTOP) for a while, a save timed out, the client sent it
// again, both landed once Redis resumed, and the second one's refusal read
// as "a newer snapshot exists": the engine stopped for good, though no
// other owner existed. Losing the checkpoint store must degrade — starts
// are refused with 503 (ErrNotSaved) while saves fail, running sessions
// go on — and the engine must carry on once the store is back.
func TestARedisPauseDegradesAndRecovers(t *testing.T) {
	rs := servers.StartRedis(t)
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr, ReadTimeout: 100 * time.Millisecond, MaxRetries: 3,
		MinRetryBackoff: 50 * time.Millisecond, MaxRetryBackoff: 100 * time.Millisecond})
	t.Cleanup(func() { _ = rc.Close() })
	wf := testWorkflow("pause", "entry", "entry")
	fns := &servers.Functions{}
	var calls atomic.Int32
	fns.Add(t, "pause-entry", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		calls.Add(1)
		return nil, ziptrail.SendObject(ctx, "output", "result", inv.Objects[0].Bytes(), nil)
	}))
	o, err := New(Options{Resolver: fns, Log: logr.Discard(), CheckpointInterval: 20 * time.Millisecond, SaveTimeout: time.Second,
		Checkpoint: &checkpoint.Store{Client: rc, Key: "ziptrail:test:pause"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.SetWorkflow(wf, true, ""); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	run := func(what string) {
		t.Helper()
		if s, _ := session(t, o, wf, what); s.State != sessions.Completed {
			t.Fatalf("%s: session %s", what, s.State)
		}
	}
	run("before")

	rs.Pause(t)
	// A start while the store does not answer is refused with 503, at
	// the latest once a save has failed.
	// Starts with an idempotency key are refused the same way; sent
	// again with their key once the store is back, each is answered with
	// one session that completes.
	refused := false
	var keys []string
	for deadline := time.Now().Add(10 * time.Second); !refused && time.Now().Before(deadline); {
		key := fmt.Sprintf("during-%d", len(keys))
		keys = append(keys, key)
		sctx, scancel := context.WithTimeout(gateway.WithIdempotencyKey(context.Background(), key), 3*time.Second)
		_, err := o.StartSession(sctx, "ns", "pause", []byte("during"))
		scancel()
		switch {
		case errors.Is(err, gateway.ErrNotSaved):
			refused = true
		case err != nil:
			t.Fatalf("a start while Redis is paused: %v, want ErrNotSaved (503)", err)
		}
	}
	if !refused {
		t.Fatal("starts were acknowledged while no checkpoint could be written")
	}
	// Redis stalls a few more times, each time long enough for the
	// client to send a timed-out save again, and resumes in the middle of
	// those attempts.
	for i := 0; i < 8; i++ {
		time.Sleep(time.Duration(150+40*i) * time.Millisecond)
		rs.Resume(t)
		time.Sleep(20 * time.Millisecond)
		rs.Pause(t)
	}
	rs.Resume(t)

	select {
	case err := <-done:
		t.Fatalf("the engine stopped after a Redis pause: %v", err)
	default:
	}
	// Once saves succeed again, starts are answered 201 again.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if o.saveFailing() == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("saves still fail after Redis resumed: %v", o.saveFailing())
		}
	}
	run("after")
	for _, key := range keys {
		kctx := gateway.WithIdempotencyKey(context.Background(), key)
		id, err := o.StartSession(kctx, "ns", "pause", []byte("during"))
		if err != nil {
			t.Fatalf("start %s sent again after Redis resumed: %v", key, err)
		}
		again, err := o.StartSession(kctx, "ns", "pause", []byte("during"))
		if err != nil || again != id {
			t.Fatalf("start %s sent a third time: %s, %v; want %s", key, again, err, id)
		}
		wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
		s, err := o.Sessions().Wait(wctx, id)
		wcancel()
		if err != nil || s.State != sessions.Completed {
			t.Fatalf("session %s of start %s, sent again after Redis resumed: %v %v %s", id, key, err, s.State, s.Error)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("the engine stopped after a Redis pause: %v", err)
	default:
	}
}
