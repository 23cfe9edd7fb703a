package knativeconfig

import (
	"context"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ziptrail/ziptrail/internal/operator/app"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
)

// TestRestoreDeletesEngineLeases: the chart's post-delete hook deletes
// the operator's leader Lease and the sharded engine's bucket Leases it
// is given, and nothing else.
func TestRestoreDeletesEngineLeases(t *testing.T) {
	env, err := envtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	kubeconfig, err := env.Kubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kubeconfig)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const ns = "ziptrail-system"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	names := []string{app.LeaderElectionID, "ziptrail-engine.00-of-02", "ziptrail-engine.01-of-02", "someone-else"}
	for _, n := range names {
		if _, err := cs.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := runKnativeRestore([]string{"--knative=false", "--lease-namespace=" + ns,
		"--engine-leases=ziptrail-engine.00-of-02,ziptrail-engine.01-of-02"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		_, err := cs.CoordinationV1().Leases(ns).Get(ctx, n, metav1.GetOptions{})
		if gone := apierrors.IsNotFound(err); gone != (n != "someone-else") {
			t.Errorf("Lease %s: deleted %v (%v)", n, gone, err)
		}
	}
}
