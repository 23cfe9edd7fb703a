// Package downward resolves the Kubernetes downward API (fieldRef and
// resourceFieldRef) for env variables and downwardAPI volumes, as the kubelet
// does, including status.podIP and status.hostIP: the node agent resolves
// them after the pod's sandbox has its address.
package downward

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// IPs are the addresses known once the sandbox exists.
type IPs struct {
	PodIP  string
	HostIP string
}

// Field returns the value of a fieldRef path.
func Field(pod *corev1.Pod, ips IPs, path string) (string, error) {
	if k, ok := subscript(path, "metadata.labels"); ok {
		return pod.Labels[k], nil
	}
	if k, ok := subscript(path, "metadata.annotations"); ok {
		return pod.Annotations[k], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return FormatMap(pod.Labels), nil
	case "metadata.annotations":
		return FormatMap(pod.Annotations), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP":
		return ips.PodIP, nil
	case "status.podIPs":
		return ips.PodIP, nil
	case "status.hostIP":
		return ips.HostIP, nil
	case "status.hostIPs":
		return ips.HostIP, nil
	}
	return "", fmt.Errorf("unsupported downward API fieldPath %q", path)
}

// subscript parses `prefix['key']`.
func subscript(path, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(path, prefix+"[")
	if !ok || !strings.HasSuffix(rest, "]") {
		return "", false
	}
	rest = strings.TrimSuffix(rest, "]")
	if len(rest) >= 2 && (rest[0] == '\'' || rest[0] == '"') && rest[len(rest)-1] == rest[0] {
		return rest[1 : len(rest)-1], true
	}
	return "", false
}

// FormatMap is the kubelet's format for labels and annotations: sorted
// `key="quoted value"` lines.
func FormatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	lines := make([]string, len(keys))
	for i, k := range keys {
		lines[i] = fmt.Sprintf("%s=%q", k, m[k])
	}
	return strings.Join(lines, "\n")
}

// Resource returns the value of a resourceFieldRef for a container: its
// limit (the node's allocatable amount when unset) or request, divided by
// the divisor and rounded up, as the kubelet does.
func Resource(pod *corev1.Pod, containerName string, ref *corev1.ResourceFieldSelector, allocatable corev1.ResourceList) (string, error) {
	name := ref.ContainerName
	if name == "" {
		name = containerName
	}
	var c *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			c = &pod.Spec.Containers[i]
		}
	}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			c = &pod.Spec.InitContainers[i]
		}
	}
	if c == nil {
		return "", fmt.Errorf("resourceFieldRef: no container %q", name)
	}
	kind, res, ok := strings.Cut(ref.Resource, ".")
	if !ok {
		return "", fmt.Errorf("unsupported resourceFieldRef %q", ref.Resource)
	}
	list := c.Resources.Limits
	if kind == "requests" {
		list = c.Resources.Requests
	}
	q, ok := list[corev1.ResourceName(res)]
	if !ok {
		if kind == "requests" {
			return "0", nil
		}
		q, ok = allocatable[corev1.ResourceName(res)]
		if !ok {
			return "0", nil
		}
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	if res == "cpu" {
		v := math.Ceil(float64(q.MilliValue()) / float64(divisor.MilliValue()))
		return strconv.FormatInt(int64(v), 10), nil
	}
	v := math.Ceil(float64(q.Value()) / float64(divisor.Value()))
	return strconv.FormatInt(int64(v), 10), nil
}
