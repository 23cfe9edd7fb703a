package orchestrator

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/dataplane/sidecar"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
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
	redis := servers.StartRedis(t)
	store := &checkpoint.Store{Client: redis.Client, Key: "ziptrail:test:engine:ziptrail-engine.00-of-01"}
	fns := &servers.Functions{}
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

// TestASupersededOwnerStopsAtItsNextDispatch: a bucket's owner (Lease
// transitions 3) keeps running after another replica won the bucket
// (transitions 4), as a partitioned or paused replica would; it saves
// nothing meanwhile (its checkpoint interval is an hour), so the refusal
// of a save cannot tell it. The function `run` has one pod, with its real
// sidecar: the old owner's call of it is running when the new owner claims
// the bucket and dispatches to the same pod. When that call returns, the
// old owner's engine fires `run` again: the pod refuses the invocation as
// from a stale owner (its fence is older than the new owner's), the
// function does not run, and the old owner's Run returns at once with
// checkpoint.ErrStale — without having tried to save — while the
// checkpoint and the session stay the new owner's.
func TestASupersededOwnerStopsAtItsNextDispatch(t *testing.T) {
	redis := servers.StartRedis(t)
	store := &checkpoint.Store{Client: redis.Client, Key: "ziptrail:test:engine:ziptrail-engine.00-of-01"}
	pod := sidecar.New(sidecar.Config{Namespace: "ns", Workflow: "fence", Function: "run", PodIP: "127.0.0.1",
		DataplanePort: servers.FreePort(t), ShmDir: t.TempDir(), MemoryLimit: 64 << 20, InlineThreshold: 1024, ObjectTTL: time.Minute})
	pctx, stopPod := context.WithCancel(context.Background())
	t.Cleanup(stopPod)
	if err := pod.Start(pctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs := map[string][]string{} // session -> the inputs `run` ran with
	ran := func(session string) []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), runs[session]...)
	}
	running := make(chan struct{}, 1)
	release := make(chan struct{})
	fns := &servers.Functions{}
	fns.Add(t, "fence-run", pod.Wrap(ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		in := string(inv.Objects[0].Bytes())
		mu.Lock()
		runs[inv.Session] = append(runs[inv.Session], in)
		mu.Unlock()
		if in != "block" {
			return []byte("done"), nil
		}
		running <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return nil, ziptrail.SendObject(ctx, "again", "x", []byte("after"), nil) // fires `run` again
	})))
	released := false
	t.Cleanup(func() {
		if !released {
			close(release)
		}
	})
	wf := testWorkflow("fence", "run", "run")
	wf.Spec.SessionDeadline.Duration = time.Minute
	wf.Spec.Triggers = []v1alpha1.NamedTrigger{immediate("again", "again", "run")}
	start := func(gen int64) (*Orchestrator, chan error) {
		o, err := New(Options{Resolver: fns, Checkpoint: store, CheckpointInterval: time.Hour, RedispatchAfter: time.Hour,
			Log: logr.Discard(), Generation: gen, Claim: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := o.SetWorkflow(wf, true, ""); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- o.Run(ctx) }()
		t.Cleanup(func() { cancel(); err := <-done; done <- err })
		return o, done
	}

	old, oldDone := start(3)
	a, err := old.StartSession(context.Background(), "ns", "fence", []byte("block"))
	if err != nil {
		t.Fatal(err)
	}
	<-running           // the old owner's call of `run` runs in the pod
	savedGen := old.gen // its last save (the start's); read after StartSession returned
	heir, _ := start(4) // claims the bucket
	b, err := heir.StartSession(context.Background(), "ns", "fence", []byte("quick"))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new owner's invocation to reach the pod", func() bool { return len(ran(b)) == 1 })

	close(release) // the old owner's call returns; its engine fires `run` again
	released = true
	select {
	case err := <-oldDone:
		oldDone <- err // for the cleanup
		if !errors.Is(err, checkpoint.ErrStale) || !strings.Contains(err.Error(), "stale engine owner") {
			t.Fatalf("the old owner stopped with %v, want checkpoint.ErrStale from the pod's stale-owner refusal", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the old owner still runs 10 s after it dispatched to a pod that had seen its successor (session %s ran `run` with %q)", a, ran(a))
	}
	if old.gen != savedGen {
		t.Errorf("the old owner's generation moved from %d to %d: it tried to save before it stopped", savedGen, old.gen)
	}
	if got := ran(a); len(got) != 1 {
		t.Errorf("session %s ran `run` with %q: the stale owner's second invocation ran", a, got)
	}
	_, g, _, err := store.Load(context.Background())
	if err != nil || g>>32 != 4 {
		t.Fatalf("checkpoint generation %d (%d<<32 + %d), err %v: want the new owner's (4<<32 + n)", g, g>>32, g&(1<<32-1), err)
	}
	if s, err := heir.Sessions().Get(a); err != nil || s.State != sessions.Running {
		t.Fatalf("the new owner's session %s: %+v %v", a, s, err)
	}
}

// TestASupersededOwnerThatDispatchesNothingStops: an owner whose saves are
// spaced out (CheckpointMaxShare: after a save that wrote, the next one
// waits far longer than the test) and that has nothing left to dispatch
// still checks its fence at every CheckpointInterval: once another
// replica claimed the bucket, it stops within a tick or two, with
// checkpoint.ErrStale.
func TestASupersededOwnerThatDispatchesNothingStops(t *testing.T) {
	redis := servers.StartRedis(t)
	store := &checkpoint.Store{Client: redis.Client, Key: "ziptrail:test:engine:ziptrail-engine.00-of-01"}
	fns := &servers.Functions{}
	fns.Add(t, "idle-run", ziptrail.FunctionHandler(func(context.Context, *ziptrail.Invocation) ([]byte, error) {
		time.Sleep(200 * time.Millisecond) // ends after the start's save
		return []byte("done"), nil
	}))
	wf := testWorkflow("idle", "run", "run")
	start := func(gen int64) (*Orchestrator, chan error) {
		o, err := New(Options{Resolver: fns, Checkpoint: store, CheckpointInterval: 20 * time.Millisecond, CheckpointMaxShare: 1e-9,
			Log: logr.Discard(), Generation: gen, Claim: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := o.SetWorkflow(wf, true, ""); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- o.Run(ctx) }()
		t.Cleanup(func() { cancel(); err := <-done; done <- err })
		return o, done
	}
	old, oldDone := start(3)
	id, err := old.StartSession(context.Background(), "ns", "idle", []byte("in"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if s, err := old.Sessions().Wait(ctx, id); err != nil || s.State != sessions.Completed {
		t.Fatalf("session %s: %+v %v", id, s, err)
	}
	// A periodic save wrote the session's end (nothing else saves now):
	// the next one is put off for good.
	waitFor(t, "a periodic save of the session's end", func() bool {
		recs, _ := store.LoadEnded(context.Background(), time.Now())
		for _, r := range recs {
			if r.ID == id {
				return true
			}
		}
		return false
	})
	time.Sleep(100 * time.Millisecond) // a few ticks: nothing more to save

	start(4)
	select {
	case err := <-oldDone:
		oldDone <- err
		if !errors.Is(err, checkpoint.ErrStale) {
			t.Fatalf("the old owner stopped with %v, want checkpoint.ErrStale", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the old owner, which has nothing to save or dispatch, still runs 10 s after another claimed the bucket")
	}
}

// TestAForgedFenceDoesNotStopTheOwner: anyone who can reach a function's
// route can send it an owner fence. A pod that saw a forged one, far
// above the real owner's, refuses the owner's invocation as stale; the
// owner asks the checkpoint store, which holds no such generation: the
// refusal is no successor's, so the owner does not stop, and sends the
// invocation again without a fence: it runs, once, and the session
// completes. (So does an unsharded owner whose checkpoint store lost its
// data, whose claims start again from 0.)
func TestAForgedFenceDoesNotStopTheOwner(t *testing.T) {
	redis := servers.StartRedis(t)
	store := &checkpoint.Store{Client: redis.Client, Key: "ziptrail:test:engine:snapshot"}
	pod := sidecar.New(sidecar.Config{Namespace: "ns", Workflow: "forged", Function: "run", PodIP: "127.0.0.1",
		DataplanePort: servers.FreePort(t), ShmDir: t.TempDir(), MemoryLimit: 64 << 20, InlineThreshold: 1024, ObjectTTL: time.Minute})
	pctx, stopPod := context.WithCancel(context.Background())
	t.Cleanup(stopPod)
	if err := pod.Start(pctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var fences []string // of the invocations that reached the pod
	var runs atomic.Int32
	fns := &servers.Functions{}
	run := pod.Wrap(ziptrail.FunctionHandler(func(context.Context, *ziptrail.Invocation) ([]byte, error) {
		runs.Add(1)
		return []byte("done"), nil
	}))
	fns.Add(t, "forged-run", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		fences = append(fences, r.Header.Get(invocation.HeaderOwnerFence))
		mu.Unlock()
		run.ServeHTTP(w, r)
	}))
	u, _ := fns.URL(context.Background(), "ns", "forged-run")
	forge, _ := http.NewRequest(http.MethodPost, u.String(), strings.NewReader(`{"namespace":"ns","function":"forged-run","session":"x","invocation":"x.0"}`))
	forge.Header.Set("Content-Type", invocation.ContentType)
	forged := store.Key + "/" + strconv.FormatInt(1<<62, 10)
	forge.Header.Set(invocation.HeaderOwnerFence, forged)
	resp, err := http.DefaultClient.Do(forge)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	runs.Store(0)

	o, err := New(Options{Resolver: fns, Checkpoint: store, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.SetWorkflow(testWorkflow("forged", "run", "run"), true, ""); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	unconfirmed0 := testutil.ToFloat64(unconfirmedRefusals)
	id, err := o.StartSession(context.Background(), "ns", "forged", []byte("in"))
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if s, err := o.Sessions().Wait(wctx, id); err != nil || s.State != sessions.Completed {
		t.Fatalf("session %s: %s %q (%v), want Completed", id, s.State, s.Error, err)
	}
	select {
	case err := <-done:
		done <- err
		t.Fatalf("the owner stopped on a forged fence: %v", err)
	default:
	}
	mu.Lock()
	defer mu.Unlock()
	if len(fences) != 3 || fences[0] != forged || fences[1] == "" || fences[2] != "" || runs.Load() != 1 {
		t.Errorf("fences that reached the pod %q, the function ran %d times: want the forger's, the owner's (refused), none (run once)", fences, runs.Load())
	}
	if got := testutil.ToFloat64(unconfirmedRefusals) - unconfirmed0; got != 1 {
		t.Errorf("ziptrail_engine_unconfirmed_stale_refusals_total grew by %v, want 1", got)
	}
}
