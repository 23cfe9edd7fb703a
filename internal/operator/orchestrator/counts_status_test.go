package orchestrator

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// TestTriggerCountsInTriggerStatus runs the real reconcilers (envtest:
// kube-apiserver and etcd) with the orchestrator as the Workflow
// reconciler's sink: after a session in which trigger "each" fired three
// times and trigger "join" fired once and re-executed a late source once,
// the child Triggers' status shows those numbers (they used to stay 0),
// next to the Trigger reconciler's conditions.
func TestTriggerCountsInTriggerStatus(t *testing.T) {
	release := make(chan struct{})
	fns := &servers.Functions{}
	fns.Add(t, "fires-split", ziptrail.FunctionHandler(func(ctx context.Context, _ *ziptrail.Invocation) ([]byte, error) {
		return nil, sendAll(ctx, "items", "k0", "k0", "items", "k1", "k1", "items", "k2", "k2")
	}))
	fns.Add(t, "fires-work", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		k := string(inv.Objects[0].Bytes())
		if k == "k1" && inv.Attempt == 0 {
			select { // late: the join's rule re-executes it
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil, ziptrail.SendObject(ctx, "done", k, []byte(k), nil)
	}))
	fns.Add(t, "fires-finish", ziptrail.FunctionHandler(func(ctx context.Context, _ *ziptrail.Invocation) ([]byte, error) {
		return nil, ziptrail.SendObject(ctx, "output", "result", []byte("done"), nil)
	}))
	t.Cleanup(func() { close(release) }) // before the servers close

	const ns = "counts-test"
	ctx, k8s, o := withReconcilers(t, fns, ns)
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fires"},
		Spec: v1alpha1.WorkflowSpec{Entry: "split", SessionDeadline: &metav1.Duration{Duration: 30 * time.Second},
			Functions: []v1alpha1.FunctionSpec{{Name: "split", Image: "example.com/split"}, {Name: "work", Image: "example.com/work"}, {Name: "finish", Image: "example.com/finish"}},
			Triggers: []v1alpha1.NamedTrigger{
				{Name: "each", Spec: v1alpha1.TriggerSpec{Bucket: "items", Primitive: v1alpha1.Immediate, Targets: []string{"work"}}},
				{Name: "join", Spec: v1alpha1.TriggerSpec{Bucket: "done", Primitive: v1alpha1.BySet, BySet: &v1alpha1.BySetParams{Keys: []string{"k0", "k1", "k2"}},
					Targets: []string{"finish"},
					Reexecution: []v1alpha1.ReexecutionRule{{SourceFunction: "work", Scope: v1alpha1.RerunPerObject,
						Timeout: metav1.Duration{Duration: 300 * time.Millisecond}, MaxAttempts: 2}}}},
			},
			Buckets: []v1alpha1.NamedBucket{{Name: "items"}, {Name: "done"}},
		}}
	id, s := runReconciled(t, ctx, k8s, o, wf)
	if s.State != sessions.Completed {
		t.Fatalf("session %s: %s %s", id, s.State, s.Error)
	}

	// The status as kubectl sees it.
	type counts struct{ firings, reexecutions, speculative int64 }
	status := func(name string) (c counts, fired bool, conds []any) {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("Trigger"))
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, u); err != nil {
			return c, false, nil
		}
		c.firings, _, _ = unstructured.NestedInt64(u.Object, "status", "firings")
		c.reexecutions, _, _ = unstructured.NestedInt64(u.Object, "status", "reexecutions")
		c.speculative, _, _ = unstructured.NestedInt64(u.Object, "status", "speculativeCopies")
		last, _, _ := unstructured.NestedString(u.Object, "status", "lastFiredTime")
		conds, _, _ = unstructured.NestedSlice(u.Object, "status", "conditions")
		return c, last != "", conds
	}
	for name, want := range map[string]counts{"fires-each": {3, 0, 0}, "fires-join": {1, 1, 0}} {
		var got counts
		var fired bool
		var conds []any
		deadline := time.Now().Add(30 * time.Second)
		for got, fired, conds = status(name); got != want || !fired || len(conds) == 0; got, fired, conds = status(name) {
			if time.Now().After(deadline) {
				t.Fatalf("Trigger %s: status counts %+v (lastFiredTime set: %v, %d conditions), want %+v, lastFiredTime and the Trigger reconciler's conditions",
					name, got, fired, len(conds), want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
