package orchestrator

import (
	"context"
	"errors"
	"strings"
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
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/controllers"
	"github.com/ziptrail/ziptrail/internal/controlplane"
	"github.com/ziptrail/ziptrail/internal/sessions"
	"github.com/ziptrail/ziptrail/internal/testservers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// TestFailedSessionInWorkflowStatus runs the real Workflow reconciler
// (envtest: kube-apiserver and etcd) with the orchestrator as its sink: a
// session whose function fails with no re-execution rule shows up in the
// Workflow's status with its reason (issue 15, item 8).
func TestFailedSessionInWorkflowStatus(t *testing.T) {
	env, err := controlplane.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	k8s, err := client.New(env.Config, client.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		t.Fatal(err)
	}

	fns := &testservers.Functions{}
	fns.Add(t, "status-boom", ziptrail.FunctionHandler(func(context.Context, *ziptrail.Invocation) ([]byte, error) {
		return nil, errors.New("disk on fire")
	}))
	o, err := New(Options{Resolver: fns, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: controlplane.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"}})
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

	ns := "status-test"
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "status"},
		Spec: v1alpha1.WorkflowSpec{Entry: "boom", Functions: []v1alpha1.FunctionSpec{{Name: "boom", Image: "example.com/boom"}}}}
	if err := k8s.Create(ctx, wf); err != nil {
		t.Fatal(err)
	}
	// Knative's part: the function's Service becomes ready.
	waitFor(t, "the function's Knative Service to be ready", func() bool {
		svc := &servingv1.Service{}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "status-boom"}, svc); err != nil {
			return false
		}
		svc.Status.ObservedGeneration = svc.Generation
		svc.Status.Conditions = duckv1.Conditions{{Type: apis.ConditionReady, Status: corev1.ConditionTrue}}
		return k8s.Status().Update(ctx, svc) == nil
	})
	var id string
	waitFor(t, "the workflow to take sessions", func() bool {
		id, err = o.StartSession(ctx, ns, "status", []byte("in"))
		return err == nil
	})
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	s, err := o.Sessions().Wait(wctx, id)
	if err != nil || s.State != sessions.Failed {
		t.Fatalf("session %s: %s %v", id, s.State, err)
	}

	// The status as kubectl sees it.
	var reason, session string
	var failed int64
	waitFor(t, "the failure in the Workflow's status", func() bool {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("Workflow"))
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(wf), u); err != nil {
			return false
		}
		failed, _, _ = unstructured.NestedInt64(u.Object, "status", "sessions", "failed")
		session, _, _ = unstructured.NestedString(u.Object, "status", "sessions", "lastFailure", "session")
		reason, _, _ = unstructured.NestedString(u.Object, "status", "sessions", "lastFailure", "reason")
		return failed == 1 && reason != ""
	})
	if session != id || !strings.Contains(reason, "boom") || !strings.Contains(reason, "disk on fire") {
		t.Errorf("status.sessions.lastFailure: session %q reason %q, want %s failing in boom with its error", session, reason, id)
	}
}
