package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// TestOperatorRestartMidSession stops the orchestrator while one branch of a
// fan-in is still running (its response is lost with the old operator), and
// starts a new one from the Redis checkpoint: the re-execution rule recovers
// the lost branch, the fan-in fires exactly once, the session completes.
func TestOperatorRestartMidSession(t *testing.T) {
	redis := servers.StartRedis(t)
	store := &checkpoint.Store{Client: redis.Client, Key: "ziptrail:test:engine"}

	imm := func(name, bucket, target string) v1alpha1.NamedTrigger {
		return v1alpha1.NamedTrigger{Name: name, Spec: v1alpha1.TriggerSpec{Bucket: bucket, Primitive: v1alpha1.Immediate, Targets: []string{target}}}
	}
	join := v1alpha1.NamedTrigger{Name: "join", Spec: v1alpha1.TriggerSpec{Bucket: "parts", Primitive: v1alpha1.BySet,
		BySet: &v1alpha1.BySetParams{Keys: []string{"a", "b", "c"}}, Targets: []string{"join"},
		// c's output must arrive within 300ms of c starting, or c runs again.
		Reexecution: []v1alpha1.ReexecutionRule{{SourceFunction: "c", Timeout: metav1.Duration{Duration: 300 * time.Millisecond}, MaxAttempts: 2}}}}
	wf := &v1alpha1.Workflow{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "fan"},
		Spec: v1alpha1.WorkflowSpec{
			Entry:     "split",
			Functions: []v1alpha1.FunctionSpec{{Name: "split"}, {Name: "a"}, {Name: "b"}, {Name: "c"}, {Name: "join"}},
			Triggers:  []v1alpha1.NamedTrigger{imm("to-a", "to-a", "a"), imm("to-b", "to-b", "b"), imm("to-c", "to-c", "c"), join},
		},
	}

	fns := &servers.Functions{}
	var joins, cCalls atomic.Int32
	releaseC := make(chan struct{})
	cStarted := make(chan struct{}, 4)
	part := func(name string) ziptrail.Handler {
		return func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
			if name == "c" && cCalls.Add(1) == 1 {
				cStarted <- struct{}{}
				<-releaseC // the first c outlives the first operator
			}
			return nil, ziptrail.SendObject(ctx, "parts", name, append(append([]byte{}, inv.Objects[0].Bytes()...), "|"+name...), nil)
		}
	}
	fns.Add(t, "fan-split", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		for _, b := range []string{"to-a", "to-b", "to-c"} {
			if err := ziptrail.SendObject(ctx, b, "x", []byte("in"), nil); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}))
	for _, n := range []string{"a", "b", "c"} {
		fns.Add(t, "fan-"+n, ziptrail.FunctionHandler(part(n)))
	}
	fns.Add(t, "fan-join", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		joins.Add(1)
		parts := make([]string, len(inv.Objects))
		for i, o := range inv.Objects {
			parts[i] = string(o.Bytes())
		}
		sort.Strings(parts)
		return nil, ziptrail.SendObject(ctx, "output", "result", []byte(strings.Join(parts, " + ")), nil)
	}))
	defer close(releaseC)

	start := func() (*Orchestrator, context.CancelFunc, chan error) {
		o, err := New(Options{Resolver: fns, Checkpoint: store, CheckpointInterval: 20 * time.Millisecond, Log: logr.Discard()})
		if err != nil {
			t.Fatal(err)
		}
		// As the Workflow reconciler does once the workflow is ready.
		if err := o.SetWorkflow(wf, true, ""); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- o.Run(ctx) }()
		return o, cancel, done
	}

	first, stop, done := start()
	id, err := first.StartSession(context.Background(), "ns", "fan", []byte("in"))
	if err != nil {
		t.Fatal(err)
	}
	<-cStarted
	// a and b are done (3 fan-out objects + 2 parts); wait for a checkpoint
	// taken after that (saves write only what changed), then stop.
	waitFor(t, "a and b", func() bool { s, _ := first.Sessions().Get(id); return s.Objects >= 5 })
	waitFor(t, "a checkpoint with a and b", func() bool {
		data, _, _, _ := store.Load(context.Background())
		var st state
		_ = json.Unmarshal(data, &st)
		for _, s := range st.Sessions {
			if s.ID == id && s.Objects >= 5 {
				return true
			}
		}
		return false
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	second, stop2, done2 := start()
	defer func() { stop2(); <-done2 }()
	// Seen once in 6 runs under load (2026-12-06): not restored within
	// 30 s, cause unknown; what the second operator had is said if again.
	var last string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s, err := second.Sessions().Get(id)
		if err == nil && s.State == sessions.Running {
			break
		}
		last = fmt.Sprintf("session %v %s %s", err, s.State, s.Error)
		select {
		case err := <-done2:
			t.Fatalf("the second operator's Run ended before it restored the session: %v (%s)", err, last)
		default:
		}
		if time.Now().After(deadline) {
			data, gen, _, lerr := store.Load(context.Background())
			var failing error
			if p := second.failing.Load(); p != nil {
				failing = *p
			}
			t.Fatalf("the session was not restored within 30 s: %s; the checkpoint: generation %d, %d bytes, %v; the second operator's saves: %v",
				last, gen, len(data), lerr, failing)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := second.Sessions().Wait(ctx, id)
	if err != nil {
		t.Fatalf("session did not end: %v (%+v)", err, s)
	}
	if s.State != sessions.Completed {
		t.Fatalf("session %s: %s %s", id, s.State, s.Error)
	}
	r, err := Results{}.OpenResult(ctx, "ns", s.Result)
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
	if n := cCalls.Load(); n != 2 {
		t.Errorf("c ran %d times, want 2 (the lost one and its re-execution)", n)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
