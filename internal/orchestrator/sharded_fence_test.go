package orchestrator

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/checkpoint"
	"github.com/ziptrail/ziptrail/internal/sessions"
	"github.com/ziptrail/ziptrail/internal/testservers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// TestDemotedOwnersSaveIsRefused: a bucket's owner (Lease transitions 3)
// keeps running after another replica won the bucket (transitions 4), as
// a partitioned replica would until its renew deadline. Its own save
// counter is far ahead, yet once the new owner has claimed the bucket's
// checkpoint, the old owner's next save is refused (checkpoint.ErrStale)
// and it stops; the checkpoint stays the new owner's, which serves the
// restored session.
func TestDemotedOwnersSaveIsRefused(t *testing.T) {
	redis := testservers.StartRedis(t)
	store := &checkpoint.Store{Client: redis.Client, Key: "ziptrail:test:engine:ziptrail-engine.00-of-01"}
	fns := &testservers.Functions{}
	release := make(chan struct{})
	fns.Add(t, "slow-run", ziptrail.FunctionHandler(func(ctx context.Context, _ *ziptrail.Invocation) ([]byte, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return []byte("done"), nil
	}))
	t.Cleanup(func() { close(release) })
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "slow"},
		Spec: v1alpha1.WorkflowSpec{Entry: "run", Functions: []v1alpha1.FunctionSpec{{Name: "run", Image: "example.com/run"}}}}
	start := func(gen int64) (*Orchestrator, chan error, context.CancelFunc) {
		o, err := New(Options{Resolver: fns, Checkpoint: store, CheckpointInterval: 10 * time.Millisecond, Log: logr.Discard(),
			Generation: gen, Claim: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := o.SetWorkflow(wf, true, ""); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- o.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return o, done, cancel
	}

	old, oldDone, _ := start(3)
	waitFor(t, "the old owner to serve", func() bool { _, g, found, _ := store.Load(context.Background()); return found && g > 3<<32 })
	id, err := old.StartSession(context.Background(), "ns", "slow", []byte("in"))
	if err != nil {
		t.Fatal(err)
	}
	// Far more saves than the new owner will have made (a save writes
	// only what changed: sessions keep starting).
	waitFor(t, "many saves of the old owner", func() bool {
		if _, err := old.StartSession(context.Background(), "ns", "slow", []byte("in")); err != nil {
			t.Fatal(err)
		}
		_, g, _, _ := store.Load(context.Background())
		return g > 3<<32+20
	})

	heir, _, _ := start(4)
	select {
	case err := <-oldDone:
		oldDone <- err // for the cleanup
		if !errors.Is(err, checkpoint.ErrStale) {
			t.Fatalf("the old owner stopped with %v, want checkpoint.ErrStale", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the old owner still saves after the new owner claimed the bucket")
	}
	_, g, _, err := store.Load(context.Background())
	if err != nil || g>>32 != 4 {
		t.Fatalf("checkpoint generation %d (%d<<32 + %d), err %v: want the new owner's (4<<32 + n)", g, g>>32, g&(1<<32-1), err)
	}
	s, err := heir.Sessions().Get(id)
	if err != nil || s.State != sessions.Running {
		t.Fatalf("the new owner's session %s: %+v %v", id, s, err)
	}
}
