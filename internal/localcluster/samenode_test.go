package localcluster

import (
	"context"
	"fmt"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/ziptrail/ziptrail/internal/operator/podwebhook"
)

// TestPodWebhookRegistration: the local cluster's webhook, served from
// this process and registered by URL with its own CA, is called by a real
// API server for a ziptrail revision pod, and registering twice (a second
// Up on the same API server) updates rather than fails.
func TestPodWebhookRegistration(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `eval \"$(hack/install-deps.sh --env)\"` first")
	}
	env := &envtest.Environment{}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	c := &Cluster{Clientset: cs}
	if err := c.startPodWebhook(ctx); err != nil {
		t.Fatal(err)
	}
	_ = c.stopPodWebhook()
	c = &Cluster{Clientset: cs}
	if err := c.startPodWebhook(ctx); err != nil {
		t.Fatalf("registering again: %v", err)
	}
	t.Cleanup(func() { _ = c.stopPodWebhook() })
	labels := map[string]string{"serving.knative.dev/revision": "fn-00001", "ziptrail.dev/workflow": "wf"}
	for i := 0; ; i++ { // failurePolicy Ignore: until the server answers
		p, err := cs.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "user-container", Image: "x"}, {Name: podwebhook.QueueProxy, Image: "y"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Spec.Volumes) == 1 && p.Spec.Volumes[0].Name == podwebhook.VolumeName {
			if len(p.Spec.Containers[0].VolumeMounts) != 0 || len(p.Spec.Containers[1].VolumeMounts) != 1 {
				t.Fatalf("mounts: user %+v, queue-proxy %+v", p.Spec.Containers[0].VolumeMounts, p.Spec.Containers[1].VolumeMounts)
			}
			return
		}
		if i > 3000 {
			t.Fatal("the API server never called the local pod webhook")
		}
	}
}
