package nodeagent_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent"
)

// TestStatusWritesKeepLabelsSetMeanwhile: virtual-kubelet writes a pod's
// status as UpdateStatus of the provider's whole copy with the current
// resourceVersion forced in. Against the real API server, that removes a
// label another client set since the copy was taken (the operator's leader
// label); through nodeagent.StatusOnly the label stays and the status is
// written. The pod is bound to no node of the agent: only the writes count.
func TestStatusWritesKeepLabelsSetMeanwhile(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	pods := client.CoreV1().Pods(ns)
	for _, via := range []string{"virtual-kubelet's write", "StatusOnly"} {
		created, err := pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "status-", Labels: map[string]string{"app": "x"}},
			Spec: corev1.PodSpec{NodeName: "nowhere", Containers: []corev1.Container{{Name: "c", Image: "example.com/c"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		stale := created.DeepCopy() // the provider's copy
		patched, err := pods.Patch(ctx, created.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"ziptrail.dev/leader":"true"}}}`), metav1.PatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		stale.ResourceVersion = patched.ResourceVersion // as virtual-kubelet does
		stale.Status.Phase = corev1.PodRunning
		stale.Status.PodIP = "10.221.9.9"
		if via == "StatusOnly" {
			_, err = nodeagent.StatusOnly(client).CoreV1().Pods(ns).UpdateStatus(ctx, stale, metav1.UpdateOptions{})
		} else {
			_, err = pods.UpdateStatus(ctx, stale, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
		got, err := pods.Get(ctx, created.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Phase != corev1.PodRunning || got.Status.PodIP != "10.221.9.9" {
			t.Errorf("%s: status %s %s not written", via, got.Status.Phase, got.Status.PodIP)
		}
		_, kept := got.Labels["ziptrail.dev/leader"]
		switch {
		case via == "StatusOnly" && !kept:
			t.Errorf("StatusOnly removed the label set meanwhile: %v", got.Labels)
		case via != "StatusOnly" && kept:
			// The API server changed: the wrapper may no longer be needed.
			t.Logf("the plain status write kept the label (the API server no longer takes labels from pods/status)")
		}
	}
}
