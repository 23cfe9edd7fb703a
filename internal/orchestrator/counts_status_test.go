package orchestrator

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"knative.dev/pkg/apis"
	duckv1 "knative.dev/pkg/apis/duck/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/controllers"
	"github.com/ziptrail/ziptrail/internal/controlplane"
	"github.com/ziptrail/ziptrail/internal/sessions"
	"github.com/ziptrail/ziptrail/internal/testservers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// TestTriggerCountsInTriggerStatus runs the real reconcilers (envtest:
// kube-apiserver and etcd) with the orchestrator as the Workflow
// reconciler's sink: after a session in which trigger "each" fired three
// times and trigger "join" fired once and re-executed a late source once,
// the child Triggers' status shows those numbers (they used to stay 0),
// next to the Trigger reconciler's conditions.
func TestTriggerCountsInTriggerStatus(t *testing.T) {
	env, err := controlplane.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	k8s, err := client.New(env.Config, client.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		t.Fatal(err)
	}

	release := make(chan struct{})
	fns := &testservers.Functions{}
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

	o, err := New(Options{Resolver: fns, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	// TestFailedSessionInWorkflowStatus registers the same controllers in
	// this process: their names are not unique here.
	skip := true
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: controlplane.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: &skip}})
	if err != nil {
		t.Fatal(err)
	}
	if err := controllers.Setup(mgr, controllers.Tiers{}, o); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgrDone, orchDone := make(chan error, 1), make(chan error, 1)
	go func() { mgrDone <- mgr.Start(ctx) }()
	go func() { orchDone <- o.Run(ctx) }()
	defer func() { cancel(); <-mgrDone; <-orchDone }()

	ns := "counts-test"
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
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
	if err := k8s.Create(ctx, wf); err != nil {
		t.Fatal(err)
	}
	// Knative's part: the functions' Services become ready.
	for _, fn := range []string{"split", "work", "finish"} {
		waitFor(t, "the Knative Service of "+fn+" to be ready", func() bool {
			svc := &servingv1.Service{}
			if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "fires-" + fn}, svc); err != nil {
				return false
			}
			svc.Status.ObservedGeneration = svc.Generation
			svc.Status.Conditions = duckv1.Conditions{{Type: apis.ConditionReady, Status: corev1.ConditionTrue}}
			return k8s.Status().Update(ctx, svc) == nil
		})
	}
	var id string
	waitFor(t, "the workflow to take sessions", func() bool {
		id, err = o.StartSession(ctx, ns, "fires", []byte("in"))
		return err == nil
	})
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	s, err := o.Sessions().Wait(wctx, id)
	if err != nil || s.State != sessions.Completed {
		t.Fatalf("session %s: %s %s %v", id, s.State, s.Error, err)
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
