// Package limits turns a pod's declared resources into the cgroup limits a
// kubelet gives it: per container its memory limit, CPU limit (CFS quota)
// and CPU request (shares); per pod the sums, a limit only when every
// container declares one.
package limits

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/cgroups"
)

// The kubelet's bounds (pkg/kubelet/cm: MinShares, MaxShares, MinQuotaPeriod).
const (
	minShares = 2
	maxShares = 262144
	minQuota  = 1000 // µs
)

// Container is one container's cgroup limits.
func Container(c *corev1.Container) cgroups.Limits {
	l := cgroups.Limits{CPUShares: shares(c.Resources.Requests.Cpu().MilliValue())}
	if m, ok := c.Resources.Limits[corev1.ResourceMemory]; ok && !m.IsZero() {
		l.MemoryBytes = m.Value()
	}
	if q, ok := c.Resources.Limits[corev1.ResourceCPU]; ok && !q.IsZero() {
		l.CPUQuotaMicros = quota(q.MilliValue())
	}
	return l
}

// Pod is the pod's cgroup limits, as the kubelet computes them: the sum of
// the containers' limits — or the largest init container's, when that is
// more, since init containers run one at a time before the others — and
// none for a resource some container has no limit for. The CPU shares sum
// the requests the same way (the minimum for a pod that requests nothing).
func Pod(pod *corev1.Pod) cgroups.Limits {
	mem, memAll := podSum(pod, func(c *corev1.Container) (int64, bool) {
		m, ok := c.Resources.Limits[corev1.ResourceMemory]
		return m.Value(), ok && !m.IsZero()
	})
	cpu, cpuAll := podSum(pod, func(c *corev1.Container) (int64, bool) {
		q, ok := c.Resources.Limits[corev1.ResourceCPU]
		return q.MilliValue(), ok && !q.IsZero()
	})
	req, _ := podSum(pod, func(c *corev1.Container) (int64, bool) {
		return c.Resources.Requests.Cpu().MilliValue(), true
	})
	l := cgroups.Limits{CPUShares: shares(req)}
	if memAll {
		l.MemoryBytes = mem
	}
	if cpuAll {
		l.CPUQuotaMicros = quota(cpu)
	}
	return l
}

// PodMemory is the pod's memory limit in bytes (see Pod); false when some
// container has none.
func PodMemory(pod *corev1.Pod) (int64, bool) {
	l := Pod(pod)
	return l.MemoryBytes, l.MemoryBytes > 0
}

// podSum is max(Σ containers, max init containers) of a value, and
// whether every container (the regular ones decide, as with the kubelet)
// declares it.
func podSum(pod *corev1.Pod, value func(*corev1.Container) (int64, bool)) (int64, bool) {
	var sum int64
	all := len(pod.Spec.Containers) > 0
	for i := range pod.Spec.Containers {
		v, ok := value(&pod.Spec.Containers[i])
		if !ok {
			all = false
		}
		sum += v
	}
	for i := range pod.Spec.InitContainers {
		if v, ok := value(&pod.Spec.InitContainers[i]); ok && v > sum {
			sum = v
		}
	}
	return sum, all
}

// shares is cpu.shares for a CPU request in millicores (kubelet's
// MilliCPUToShares): 1024 per core, at least 2.
func shares(milli int64) uint64 {
	s := milli * 1024 / 1000
	return uint64(min(max(s, minShares), maxShares))
}

// quota is the CFS quota per cgroups.CPUPeriodMicros for a CPU limit in
// millicores (kubelet's MilliCPUToQuota): at least 1 ms.
func quota(milli int64) int64 {
	return max(milli*cgroups.CPUPeriodMicros/1000, minQuota)
}
