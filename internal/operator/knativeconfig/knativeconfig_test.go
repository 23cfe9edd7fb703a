package knativeconfig

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// knative-config twice (install, upgrade with other values), then
// knative-restore: Knative's objects are as before, and values that
// existed before the install (an audience of the user's) survive.
func TestKnativeConfigRestore(t *testing.T) {
	ctx := context.Background()
	ns := "knative-serving"
	dep := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "config-deployment"},
		Data: map[string]string{"queue-sidecar-image": "knative/queue:v1", "queue-sidecar-token-audiences": "other", "_example": "x"}}
	feat := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "config-features"}, Data: map[string]string{"kubernetes.podspec-affinity": "enabled"}}
	act := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "activator"}, Spec: appsv1.DeploymentSpec{
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "activator", Image: "knative/activator:v1", Env: []corev1.EnvVar{{Name: "GOGC", Value: "500"}}}},
			Volumes:    []corev1.Volume{{Name: "own"}},
		}}}}
	cs := fake.NewSimpleClientset(dep.DeepCopy(), feat.DeepCopy(), act.DeepCopy())

	c := knativeConfig{namespace: ns, queueProxy: true, queueImage: "zt/queue-proxy-zl:1", tokenAudience: "control.ziptrail.dev",
		activator: true, deployment: "activator", activatorImage: "zt/activator-ext:1",
		activatorEnv: []corev1.EnvVar{{Name: "ZIPTRAIL_KEEPALIVE_INTERVAL", Value: "5s"}}}
	configure := func(c knativeConfig) {
		t.Helper()
		if err := applyKnativeConfig(ctx, cs, c); err != nil {
			t.Fatal(err)
		}
	}
	configure(c)
	c.queueImage, c.activatorImage = "zt/queue-proxy-zl:2", "zt/activator-ext:2" // helm upgrade
	configure(c)

	got, _ := cs.CoreV1().ConfigMaps(ns).Get(ctx, "config-deployment", metav1.GetOptions{})
	if got.Data["queue-sidecar-image"] != "zt/queue-proxy-zl:2" || got.Data["queue-sidecar-token-audiences"] != "other,control.ziptrail.dev" {
		t.Fatalf("config-deployment after the upgrade: %v", got.Data)
	}
	gotF, _ := cs.CoreV1().ConfigMaps(ns).Get(ctx, "config-features", metav1.GetOptions{})
	if gotF.Data["queueproxy.mount-podinfo"] != "enabled" {
		t.Fatalf("config-features: %v", gotF.Data)
	}
	gotA, _ := cs.AppsV1().Deployments(ns).Get(ctx, "activator", metav1.GetOptions{})
	ctr := gotA.Spec.Template.Spec.Containers[0]
	if ctr.Image != "zt/activator-ext:2" || len(ctr.Env) != 2 || len(ctr.VolumeMounts) != 1 || len(gotA.Spec.Template.Spec.Volumes) != 2 {
		t.Fatalf("activator after two swaps (env, mounts and volumes must not pile up): %+v, volumes %v", ctr, gotA.Spec.Template.Spec.Volumes)
	}

	if err := restoreKnative(ctx, cs, ns, "activator"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []*corev1.ConfigMap{dep, feat} {
		got, _ := cs.CoreV1().ConfigMaps(ns).Get(ctx, want.Name, metav1.GetOptions{})
		if !equality.Semantic.DeepEqual(got.Data, want.Data) || len(got.Annotations) != 0 {
			t.Errorf("%s after restore: %v %v, want %v", want.Name, got.Data, got.Annotations, want.Data)
		}
	}
	gotA, _ = cs.AppsV1().Deployments(ns).Get(ctx, "activator", metav1.GetOptions{})
	if !equality.Semantic.DeepEqual(gotA.Spec, act.Spec) || len(gotA.Annotations) != 0 {
		t.Errorf("activator after restore: %+v %v", gotA.Spec.Template.Spec, gotA.Annotations)
	}
	// A second restore (nothing saved) changes nothing.
	if err := restoreKnative(ctx, cs, ns, "activator"); err != nil {
		t.Fatal(err)
	}
	again, _ := cs.AppsV1().Deployments(ns).Get(ctx, "activator", metav1.GetOptions{})
	if !equality.Semantic.DeepEqual(again.Spec, act.Spec) {
		t.Errorf("a second restore changed the activator: %+v", again.Spec.Template.Spec)
	}

	// An upgrade that turns activatorExt off restores Knative's activator
	// and keeps queue-proxy-zl.
	configure(c)
	c.activator = false
	configure(c)
	gotA, _ = cs.AppsV1().Deployments(ns).Get(ctx, "activator", metav1.GetOptions{})
	if !equality.Semantic.DeepEqual(gotA.Spec, act.Spec) {
		t.Errorf("activatorExt turned off: %+v", gotA.Spec.Template.Spec)
	}
	got, _ = cs.CoreV1().ConfigMaps(ns).Get(ctx, "config-deployment", metav1.GetOptions{})
	if got.Data["queue-sidecar-image"] != "zt/queue-proxy-zl:2" {
		t.Errorf("activatorExt turned off: config-deployment %v", got.Data)
	}
}
