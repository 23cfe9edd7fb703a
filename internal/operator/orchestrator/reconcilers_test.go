package orchestrator

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// withReconcilers runs the real reconcilers (envtest: kube-apiserver and
// etcd) with an orchestrator over fns as the Workflow reconciler's sink,
// and creates namespace ns; all of it stops when the test ends.
func withReconcilers(t *testing.T, fns *servers.Functions, ns string) (context.Context, client.Client, *Orchestrator) {
	t.Helper()
	env, err := envtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	k8s, err := client.New(env.Config, client.Options{Scheme: envtest.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	o, err := New(Options{Resolver: fns, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	// Several tests of this package register the same controllers in one
	// process: their names are not unique here.
	skip := true
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: envtest.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: &skip}})
	if err != nil {
		t.Fatal(err)
	}
	if err := controllers.Setup(mgr, controllers.Tiers{}, o); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	mgrDone, orchDone := make(chan error, 1), make(chan error, 1)
	go func() { mgrDone <- mgr.Start(ctx) }()
	go func() { orchDone <- o.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-mgrDone; <-orchDone })
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	return ctx, k8s, o
}

// runReconciled creates wf, plays Knative's part (each function's Service
// becomes ready), starts a session once the workflow takes sessions and
// waits (up to 30 s) for it to end.
func runReconciled(t *testing.T, ctx context.Context, k8s client.Client, o *Orchestrator, wf *v1alpha1.Workflow) (string, sessions.Session) {
	t.Helper()
	if err := k8s.Create(ctx, wf); err != nil {
		t.Fatal(err)
	}
	for _, fn := range wf.Spec.Functions {
		name := wf.Name + "-" + fn.Name
		waitFor(t, "the Knative Service "+name+" to be ready", func() bool {
			svc := &servingv1.Service{}
			if err := k8s.Get(ctx, types.NamespacedName{Namespace: wf.Namespace, Name: name}, svc); err != nil {
				return false
			}
			svc.Status.ObservedGeneration = svc.Generation
			svc.Status.Conditions = duckv1.Conditions{{Type: apis.ConditionReady, Status: corev1.ConditionTrue}}
			return k8s.Status().Update(ctx, svc) == nil
		})
	}
	var id string
	waitFor(t, "the workflow to take sessions", func() bool {
		var err error
		id, err = o.StartSession(ctx, wf.Namespace, wf.Name, []byte("in"))
		return err == nil
	})
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := o.Sessions().Wait(wctx, id)
	if err != nil {
		t.Fatalf("session %s: %v", id, err)
	}
	return id, s
}
