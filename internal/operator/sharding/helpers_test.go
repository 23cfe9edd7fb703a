package sharding

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ziptrail/ziptrail/internal/tools/envtest"
)

// leaseNS is where the tests' Leases live.
const leaseNS = "ziptrail-system"

// leaseAPI starts a real API server (envtest) with the Leases' namespace.
func leaseAPI(t *testing.T) kubernetes.Interface {
	t.Helper()
	env, err := envtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	kc, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kc.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: leaseNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return kc
}
