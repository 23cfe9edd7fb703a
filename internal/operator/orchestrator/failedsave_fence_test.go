package orchestrator

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"

	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// redisCut is a go-redis hook that fails every command while cut: the
// checkpoint store unreachable from this one owner only (a partition),
// while the successor reaches it.
type redisCut struct{ cut atomic.Bool }

var errRedisCut = errors.New("test: this owner cannot reach redis")

func (c *redisCut) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *redisCut) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if c.cut.Load() {
			return errRedisCut
		}
		return next(ctx, cmd)
	}
}
func (c *redisCut) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// An unsharded owner whose saves failed for a while (the store unreachable
// from it alone) must not come back ahead of a successor that claimed the
// checkpoint meanwhile: before, every failed save moved its generation on
// (a failed save may have landed, and a retry at the same generation was
// refused), so after a dozen failures its next save outran the successor's
// claim and overwrote it. Now a failed save is repeated at its own
// generation, which the successor's claim already holds: refused, and the
// old owner stops.
func TestAnOwnerWhoseSavesFailedDoesNotOutrunItsSuccessor(t *testing.T) {
	rs := servers.StartRedis(t)
	hook := &redisCut{}
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr, MaxRetries: -1})
	rc.AddHook(hook)
	t.Cleanup(func() { _ = rc.Close() })
	const key = "ziptrail:test:failedsave"
	wf := testWorkflow("failedsave", "entry", "entry")
	fns := &servers.Functions{}
	fns.Add(t, "failedsave-entry", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		return nil, ziptrail.SendObject(ctx, "output", "result", inv.Objects[0].Bytes(), nil)
	}))
	o, err := New(Options{Resolver: fns, Log: logr.Discard(), CheckpointInterval: 10 * time.Millisecond, SaveTimeout: time.Second,
		Checkpoint: &checkpoint.Store{Client: rc, Key: key}})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.SetWorkflow(wf, true, ""); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx) }()
	defer cancel()
	session(t, o, wf, "before")

	// Cut off: the engine changes (a start, refused: not saved) and
	// every save fails for a while.
	hook.cut.Store(true)
	sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, _ = o.StartSession(sctx, wf.Namespace, wf.Name, []byte("during"))
	scancel()
	time.Sleep(300 * time.Millisecond) // tens of failed saves

	// The successor loads what landed and claims it.
	next := &checkpoint.Store{Client: rs.Client, Key: key}
	_, loaded, found, err := next.Load(context.Background())
	if err != nil || !found {
		t.Fatalf("load: %v %v", found, err)
	}
	if err := next.Write(context.Background(), loaded+1, checkpoint.Write{Snapshot: []byte(`{"claim":true}`), Claim: true, From: loaded}, time.Now()); err != nil {
		t.Fatalf("the successor's claim: %v", err)
	}

	// The old owner reaches the store again: its next save is refused and
	// it stops; the successor's claim stands.
	hook.cut.Store(false)
	select {
	case err := <-done:
		if !errors.Is(err, checkpoint.ErrStale) {
			t.Fatalf("the old owner stopped with %v, want ErrStale", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the old owner goes on after its successor claimed")
	}
	data, gen, _, err := next.Load(context.Background())
	if err != nil || gen != loaded+1 || string(data) != `{"claim":true}` {
		t.Fatalf("the stored checkpoint is %q at generation %d (%v), want the successor's claim at %d", data, gen, err, loaded+1)
	}
}
