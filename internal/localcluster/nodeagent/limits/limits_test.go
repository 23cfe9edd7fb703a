package limits_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/cgroups"
	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/limits"
)

func ctr(reqCPU, limCPU, limMem string) corev1.Container {
	c := corev1.Container{Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}}
	if reqCPU != "" {
		c.Resources.Requests[corev1.ResourceCPU] = resource.MustParse(reqCPU)
	}
	if limCPU != "" {
		c.Resources.Limits[corev1.ResourceCPU] = resource.MustParse(limCPU)
	}
	if limMem != "" {
		c.Resources.Limits[corev1.ResourceMemory] = resource.MustParse(limMem)
	}
	return c
}

func TestContainer(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    corev1.Container
		want cgroups.Limits
	}{
		{"best effort", ctr("", "", ""), cgroups.Limits{CPUShares: 2}},
		{"limits", ctr("250m", "200m", "64Mi"), cgroups.Limits{MemoryBytes: 64 << 20, CPUQuotaMicros: 20000, CPUShares: 256}},
		{"whole cores", ctr("2", "1", ""), cgroups.Limits{CPUQuotaMicros: 100000, CPUShares: 2048}},
		{"tiny cpu limit keeps the 1 ms minimum", ctr("1m", "1m", ""), cgroups.Limits{CPUQuotaMicros: 1000, CPUShares: 2}},
	} {
		if got := limits.Container(&tc.c); got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestPod(t *testing.T) {
	pod := func(inits []corev1.Container, ctrs ...corev1.Container) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{InitContainers: inits, Containers: ctrs}}
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want cgroups.Limits
	}{
		{"sums when every container has limits", pod(nil, ctr("100m", "500m", "64Mi"), ctr("25m", "1", "32Mi")),
			cgroups.Limits{MemoryBytes: 96 << 20, CPUQuotaMicros: 150000, CPUShares: 128}},
		{"no memory limit when one container has none", pod(nil, ctr("", "500m", "64Mi"), ctr("", "1", "")),
			cgroups.Limits{CPUQuotaMicros: 150000, CPUShares: 2}},
		{"a larger init container raises the pod's limit", pod([]corev1.Container{ctr("", "2", "1Gi")}, ctr("", "500m", "64Mi")),
			cgroups.Limits{MemoryBytes: 1 << 30, CPUQuotaMicros: 200000, CPUShares: 2}},
		{"best effort", pod(nil, ctr("", "", "")), cgroups.Limits{CPUShares: 2}},
	} {
		if got := limits.Pod(tc.pod); got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if m, ok := limits.PodMemory(pod(nil, ctr("", "", "64Mi"), ctr("", "", "1Mi"))); !ok || m != 65<<20 {
		t.Errorf("PodMemory %d %v", m, ok)
	}
	if _, ok := limits.PodMemory(pod(nil, ctr("", "", "64Mi"), ctr("", "", ""))); ok {
		t.Error("PodMemory with a container without a limit")
	}
}
