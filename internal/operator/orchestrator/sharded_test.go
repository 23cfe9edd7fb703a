package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// TestShardedFailover runs 3 operator replicas (each its reconcilers, its
// Knative bucket elections and its sharded engine) on one envtest API
// server and one redis-server, with workflows in every one of 6 buckets.
// Once the buckets have spread (2 each), a fan-in session runs on the
// victim workflow; while one of its branches is in flight the replica
// owning its bucket is stopped. Another replica takes the bucket over from
// its checkpoint, re-executes the lost branch per the workflow's rule, and
// the session completes with every trigger fired exactly once (the child
// Triggers' status counters). Meanwhile the other replicas' sessions keep
// completing and their buckets never move.
func TestShardedFailover(t *testing.T) { failover(t, false) }

// TestShardedFailoverAfterCrash is TestShardedFailover with the owner
// killed as by SIGKILL: it saves no last checkpoint and releases no Lease,
// so another replica takes the bucket once its Lease expires and restores
// the last checkpoint the dead owner had written.
func TestShardedFailoverAfterCrash(t *testing.T) { failover(t, true) }

func failover(t *testing.T, crash bool) {
	const ns, buckets = "shard-test", 6
	fns := &servers.Functions{}
	c := newShardedCluster(t, fns, buckets, ns)

	// One workflow per bucket: the victim ("v-*", a fan-in) and chains.
	probe := c.set("probe")
	byBucket := map[string]string{}
	for i := 0; len(byBucket) < buckets; i++ {
		name := fmt.Sprintf("w%d", i)
		if b := probe.BucketOf(ns, name); byBucket[b] == "" {
			byBucket[b] = name
		}
	}
	var names []string
	for _, n := range byBucket {
		names = append(names, n)
	}
	sort.Strings(names)

	var joins, cCalls atomic.Int32
	killed := make(chan struct{})
	cStarted := make(chan struct{}, 8)
	held := make(chan struct{}) // the first c: its response is lost with its replica
	for _, name := range names {
		fns.Add(t, name+"-split", ziptrail.FunctionHandler(func(ctx context.Context, _ *ziptrail.Invocation) ([]byte, error) {
			return nil, sendAll(ctx, "to-a", "x", "in", "to-b", "x", "in", "to-c", "x", "in")
		}))
		for _, p := range []string{"a", "b", "c"} {
			fns.Add(t, name+"-"+p, ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
				if p == "c" && strings.HasPrefix(inv.Session, names[0]+"-") {
					if cCalls.Add(1) == 1 {
						cStarted <- struct{}{}
						<-held
					} else {
						<-killed // a re-execution by the doomed replica is lost too
					}
				}
				return nil, ziptrail.SendObject(ctx, "parts", p, []byte("in|"+p), nil)
			}))
		}
		fns.Add(t, name+"-join", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
			if strings.HasPrefix(inv.Session, names[0]+"-") {
				joins.Add(1)
			}
			return nil, ziptrail.SendObject(ctx, "output", "result", []byte(strings.Join(inputs(inv), " + ")), nil)
		}))
	}
	var closeOnce sync.Once
	t.Cleanup(func() { close(held); closeOnce.Do(func() { close(killed) }) }) // before the function servers close

	begin := make(chan struct{})
	var live []*replica
	for i := range 3 {
		live = append(live, c.start(fmt.Sprintf("replica-%d", i), begin))
	}
	close(begin)
	c.settled(live...)

	ctx := context.Background()
	imm := func(name, target string) v1alpha1.NamedTrigger {
		return v1alpha1.NamedTrigger{Name: name, Spec: v1alpha1.TriggerSpec{Bucket: name, Primitive: v1alpha1.Immediate, Targets: []string{target}}}
	}
	for _, name := range names {
		wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.WorkflowSpec{Entry: "split", SessionDeadline: &metav1.Duration{Duration: 2 * time.Minute},
				Functions: []v1alpha1.FunctionSpec{{Name: "split", Image: "example.com/f"}, {Name: "a", Image: "example.com/f"},
					{Name: "b", Image: "example.com/f"}, {Name: "c", Image: "example.com/f"}, {Name: "join", Image: "example.com/f"}},
				Triggers: []v1alpha1.NamedTrigger{imm("to-a", "a"), imm("to-b", "b"), imm("to-c", "c"),
					{Name: "join", Spec: v1alpha1.TriggerSpec{Bucket: "parts", Primitive: v1alpha1.BySet, BySet: &v1alpha1.BySetParams{Keys: []string{"a", "b", "c"}},
						Targets: []string{"join"},
						// Every attempt the doomed owner makes is lost (c blocks
						// until the kill), and under load the kill may come many
						// seconds after c started: the CRD's largest budget keeps
						// an attempt for the heir however late the kill is (with
						// 3, a loaded CI machine exhausted them before the kill,
						// and the session waited for its deadline).
						Reexecution: []v1alpha1.ReexecutionRule{{SourceFunction: "c", Timeout: metav1.Duration{Duration: time.Second}, MaxAttempts: 100}}}}},
				Buckets: []v1alpha1.NamedBucket{{Name: "to-a"}, {Name: "to-b"}, {Name: "to-c"}, {Name: "parts"}},
			}}
		if err := c.k8s.Create(ctx, wf); err != nil {
			t.Fatal(err)
		}
		c.makeReady(ctx, wf)
	}
	victim := names[0]
	start := func(name string) (*replica, string, error) {
		r := c.owner(ns, name)
		if r == nil {
			return nil, "", fmt.Errorf("no replica serves %s", name)
		}
		id, err := r.engine.StartSession(ctx, ns, name, []byte("in"))
		return r, id, err
	}
	for _, name := range names[1:] {
		var last error
		defer func() {
			if last != nil {
				t.Logf("%s: %v", name, last)
			}
		}()
		waitForLong(t, 2*time.Minute, name+" to take sessions", func() bool {
			_, _, last = start(name)
			return last == nil
		})
	}
	var owner *replica
	var id string
	waitForLong(t, 2*time.Minute, victim+" to take sessions", func() bool {
		var err error
		owner, id, err = start(victim)
		return err == nil
	})
	<-cStarted
	// a and b are done (3 fan-out objects + 2 parts), and checkpointed.
	waitForLong(t, time.Minute, "a and b", func() bool { s, _ := owner.engine.Sessions().Get(id); return s.Objects >= 5 })
	time.Sleep(100 * time.Millisecond) // several checkpoints (every 20ms) later

	// The other replicas' sessions run on, one after another, through the
	// failover: none of their buckets may move, none of them may stall.
	var others []*replica
	var otherWfs []string
	for _, r := range live {
		if r != owner {
			others = append(others, r)
		}
	}
	for _, name := range names[1:] {
		if r := c.owner(ns, name); r != nil && r != owner {
			otherWfs = append(otherWfs, name)
		}
	}
	if len(otherWfs) == 0 {
		t.Fatalf("no workflow is served by a replica other than %s: buckets did not spread", owner.id)
	}
	stopLoad := make(chan struct{})
	var loadWg sync.WaitGroup
	var loadMu sync.Mutex
	var completions []time.Time
	var loadErrs int
	var firstErrs []string
	for _, name := range otherWfs {
		loadWg.Add(1)
		go func() {
			defer loadWg.Done()
			for {
				select {
				case <-stopLoad:
					return
				default:
				}
				r, sid, err := start(name)
				if err == nil {
					wctx, cancel := context.WithTimeout(ctx, time.Minute)
					var s sessions.Session
					s, err = r.engine.Sessions().Wait(wctx, sid)
					cancel()
					if err == nil && s.State != sessions.Completed {
						err = fmt.Errorf("%s: %s %s", sid, s.State, s.Error)
					}
				}
				loadMu.Lock()
				if err != nil {
					if loadErrs++; len(firstErrs) < 5 {
						firstErrs = append(firstErrs, fmt.Sprintf("%s: %v", name, err))
					}
				} else {
					completions = append(completions, time.Now())
				}
				loadMu.Unlock()
				if err != nil {
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
	}
	waitForLong(t, time.Minute, "the other replicas' sessions to run", func() bool {
		loadMu.Lock()
		defer loadMu.Unlock()
		return len(completions) >= 3
	})

	before := map[*replica][]string{}
	for _, r := range others {
		before[r] = r.engine.OwnedBuckets()
	}
	// A wait on the owner (a gateway's ?wait=) ends when the owner gives
	// the bucket up, telling its caller to ask again, rather than at its
	// timeout on a copy of the session nothing updates any more.
	oldWait := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		defer cancel()
		_, err := owner.engine.Sessions().Wait(wctx, id)
		oldWait <- err
	}()
	killedAt := time.Now()
	victimBucket := probe.BucketOf(ns, victim)
	if crash {
		owner.crash()
	} else {
		owner.stop()
	}
	closeOnce.Do(func() { close(killed) })
	select {
	case err := <-oldWait:
		if !errors.Is(err, gateway.ErrEngineMoving) {
			t.Errorf("a wait on the old owner ended with %v, want ErrEngineMoving", err)
		}
	case <-time.After(time.Minute): // a bound against a hang
		t.Errorf("a wait on the old owner did not end when it gave up the bucket")
	}
	var heir *replica
	waitForLong(t, 2*time.Minute, "another replica to serve "+victim, func() bool { heir = c.owner(ns, victim); return heir != nil })
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	ended, s, err := c.waitSession(wctx, ns, victim, id)
	if err != nil {
		t.Fatalf("session %s (heir %s): %v", id, heir.id, err)
	}
	if ended != heir {
		t.Logf("%s moved on from %s to %s before the session ended", victimBucket, heir.id, ended.id)
		heir = ended
	}
	takenAt := time.Now()
	if s.State != sessions.Completed {
		t.Fatalf("session %s on %s: %s %s; its events there:\n%s", id, heir.id, s.State, s.Error, sessionEvents(s))
	}
	r, err := heir.engine.Results().OpenResult(ctx, ns, s.Result)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r)
	if want := "in|a + in|b + in|c"; string(got) != want {
		t.Errorf("result %q, want %q", got, want)
	}
	if n := joins.Load(); n != 1 {
		t.Errorf("join ran %d times, want exactly once", n)
	}
	t.Logf("%s (bucket %s) moved from %s to %s; the session completed %v after the kill; c ran %d times",
		victim, victimBucket, owner.id, heir.id, takenAt.Sub(killedAt).Round(time.Millisecond), cCalls.Load())

	// The child Triggers' counters, as the heir's reconciler writes them.
	for trig, want := range map[string]int64{"to-a": 1, "to-b": 1, "to-c": 1, "join": 1} {
		name := victim + "-" + trig
		waitForLong(t, time.Minute, "Trigger "+name+" firings = 1", func() bool {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("Trigger"))
			if err := c.k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, u); err != nil {
				return false
			}
			n, _, _ := unstructured.NestedInt64(u.Object, "status", "firings")
			if n > want {
				t.Fatalf("Trigger %s fired %d times, want %d", name, n, want)
			}
			return n == want
		})
	}
	// Workflow.status.engine names the replica that serves the workflow
	// now: the heir, or, should the bucket have moved on again (a lease
	// the heir could not renew in time on a loaded machine), its owner
	// then.
	var seen *v1alpha1.WorkflowEngine
	var serving string
	waitForLong(t, time.Minute, victim+"'s status.engine to name the replica serving it (heir "+heir.id+")", func() bool {
		wf := &v1alpha1.Workflow{}
		if err := c.k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: victim}, wf); err != nil || wf.Status.Engine == nil {
			return false
		}
		seen = wf.Status.Engine
		now := c.owner(ns, victim)
		if now == nil {
			return false
		}
		serving = now.id
		return seen.Owner == now.id && seen.Bucket == victimBucket
	})
	if serving != heir.id {
		t.Logf("%s moved on from %s to %s after the takeover; status.engine %+v", victimBucket, heir.id, serving, *seen)
	}

	// The other replicas' sessions never paused: they completed during the
	// failover, none failed, and their buckets never moved.
	waitForLong(t, time.Minute, "another session of the other replicas after the takeover", func() bool {
		loadMu.Lock()
		defer loadMu.Unlock()
		return len(completions) > 0 && completions[len(completions)-1].After(takenAt)
	})
	close(stopLoad)
	loadWg.Wait()
	var during int
	var maxGap time.Duration
	for i, at := range completions {
		if at.After(killedAt) && !at.After(takenAt) {
			during++
		}
		if i > 0 && at.After(killedAt) {
			maxGap = max(maxGap, at.Sub(completions[i-1]))
		}
	}
	t.Logf("other replicas: %d sessions completed between the kill and the victim's completion, longest gap between completions after the kill %v",
		during, maxGap.Round(time.Millisecond))
	if loadErrs > 0 {
		t.Errorf("%d sessions of the other replicas failed, first: %v", loadErrs, firstErrs)
	}
	if during == 0 {
		t.Errorf("no session of the other replicas completed between the kill and the victim's completion")
	}
	for _, r := range others {
		for _, m := range r.movesSince(killedAt) {
			if !m.owned && slices.Contains(before[r], m.bucket) {
				t.Errorf("%s gave up its bucket %s during the failover", r.id, m.bucket)
			}
		}
	}
}
