package controllers

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

// The objects volume is sized from the buckets (objectsVolumeSize) and the
// pod webhook adds it to the pod's memory: a bucket's memoryLimitPerPod
// larger than any node can hold leaves the function's pods Pending for
// ever, with nothing but the scheduler's "Insufficient memory" to say why.
// podFit says why, with the numbers, on the Workflow's ServicesReady
// condition while its Services are not ready.

// nodeMemoryTTL is how long the largest node's allocatable memory is
// reused before the nodes are listed again.
const nodeMemoryTTL = time.Minute

// nodeMemory reads the largest allocatable memory of the cluster's
// schedulable nodes, listing them at most once per nodeMemoryTTL (never
// under its lock: the list is a network call).
type nodeMemory struct {
	reader client.Reader

	mu      sync.Mutex
	at      time.Time
	largest int64 // bytes; 0: no schedulable node known
	node    string
}

// largestNode is the name and allocatable memory of the schedulable node
// with the most; ok is false when it is not known (no reader, the list
// failed, or no node reports its memory).
func (m *nodeMemory) largestNode(ctx context.Context) (name string, bytes int64, ok bool) {
	if m == nil || m.reader == nil {
		return "", 0, false
	}
	m.mu.Lock()
	if time.Since(m.at) < nodeMemoryTTL {
		name, bytes = m.node, m.largest
		m.mu.Unlock()
		return name, bytes, bytes > 0
	}
	m.mu.Unlock()
	var nodes corev1.NodeList
	if err := m.reader.List(ctx, &nodes); err != nil {
		return "", 0, false
	}
	for _, n := range nodes.Items {
		if n.Spec.Unschedulable {
			continue
		}
		if q, found := n.Status.Allocatable[corev1.ResourceMemory]; found && q.Value() > bytes {
			name, bytes = n.Name, q.Value()
		}
	}
	if bytes > 0 {
		// Kept for a while; no node yet (a cluster coming up) is not.
		m.mu.Lock()
		m.at, m.node, m.largest = time.Now(), name, bytes
		m.mu.Unlock()
	}
	return name, bytes, bytes > 0
}

// podMemory is the memory a function's pod asks the scheduler for, as the
// pod webhook makes it from the desired Service's revision template: the
// objects volume (v1alpha1.AnnotationObjectsVolume) plus the containers'
// own memory requests (a container's limit when it sets no request, as
// Kubernetes defaults it).
func podMemory(svc *servingv1.Service) (total, volume, containers int64) {
	tmpl := &svc.Spec.Template
	volume, _ = strconv.ParseInt(tmpl.Annotations[v1alpha1.AnnotationObjectsVolume], 10, 64)
	for _, c := range tmpl.Spec.Containers {
		if q, ok := c.Resources.Requests[corev1.ResourceMemory]; ok {
			containers += q.Value()
		} else if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
			containers += q.Value()
		}
	}
	return volume + containers, volume, containers
}

// fitProblems names the functions of services whose pods need more memory
// than the largest schedulable node allocates, with the numbers; nil when
// all fit or the nodes are not known.
func (r *WorkflowReconciler) fitProblems(ctx context.Context, services []*servingv1.Service) []string {
	r.nodesOnce.Do(func() { r.nodes = &nodeMemory{reader: r.Nodes} })
	node, largest, ok := r.nodes.largestNode(ctx)
	if !ok {
		return nil
	}
	var problems []string
	for _, svc := range services {
		total, volume, containers := podMemory(svc)
		if total <= largest {
			continue
		}
		msg := fmt.Sprintf("function %s: its pods need %s of memory: an objects volume of %s (twice the largest memoryLimitPerPod of the workflow's buckets)",
			svc.Labels[v1alpha1.LabelFunction], quantity(total), quantity(volume))
		if containers > 0 {
			msg += fmt.Sprintf(" and the container's %s", quantity(containers))
		}
		msg += fmt.Sprintf("; the largest schedulable node, %s, allocates %s: lower memoryLimitPerPod or add a larger node", node, quantity(largest))
		problems = append(problems, msg)
	}
	return problems
}

// quantity prints bytes as Kubernetes does (Mi, Gi) where exact.
func quantity(bytes int64) string {
	return resource.NewQuantity(bytes, resource.BinarySI).String()
}
