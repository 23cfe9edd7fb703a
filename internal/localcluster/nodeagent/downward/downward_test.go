package downward

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestField(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u1",
			Labels: map[string]string{"app": "x"}, Annotations: map[string]string{"a/b": "v", "z": "line\nbreak"}},
		Spec: corev1.PodSpec{NodeName: "n0", ServiceAccountName: "sa"},
	}
	ips := IPs{PodIP: "10.0.0.5", HostIP: "10.0.0.1"}
	for path, want := range map[string]string{
		"metadata.name": "p", "metadata.namespace": "ns", "metadata.uid": "u1",
		"metadata.labels['app']": "x", "metadata.annotations['a/b']": "v", `metadata.annotations["z"]`: "line\nbreak",
		"metadata.annotations['missing']": "", "spec.nodeName": "n0", "spec.serviceAccountName": "sa",
		"status.podIP": "10.0.0.5", "status.hostIP": "10.0.0.1",
		"metadata.annotations": "a/b=\"v\"\nz=\"line\\nbreak\"",
	} {
		if got, err := Field(pod, ips, path); err != nil || got != want {
			t.Errorf("Field(%s) = %q, %v; want %q", path, got, err, want)
		}
	}
	for _, bad := range []string{"spec.containers", "metadata.labels[app]", "status.phase", ""} {
		if _, err := Field(pod, ips, bad); err == nil {
			t.Errorf("Field(%q) must fail", bad)
		}
	}
}

func TestResource(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi"), corev1.ResourceCPU: resource.MustParse("1500m")},
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")},
	}}}}}
	alloc := corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}
	for _, tc := range []struct {
		res, divisor, want string
	}{
		{"limits.memory", "1Mi", "64"},
		{"limits.cpu", "", "2"}, // rounded up, as the kubelet does
		{"limits.cpu", "1m", "1500"},
		{"requests.cpu", "1m", "250"},
		{"requests.memory", "", "0"},
	} {
		ref := &corev1.ResourceFieldSelector{Resource: tc.res}
		if tc.divisor != "" {
			ref.Divisor = resource.MustParse(tc.divisor)
		}
		if got, err := Resource(pod, "c", ref, alloc); err != nil || got != tc.want {
			t.Errorf("%s/%s = %q, %v; want %s", tc.res, tc.divisor, got, err, tc.want)
		}
	}
	pod.Spec.Containers[0].Resources.Limits = nil
	if got, _ := Resource(pod, "c", &corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Gi")}, alloc); got != "1" {
		t.Errorf("no limit: want the node's allocatable, got %s", got)
	}
}
