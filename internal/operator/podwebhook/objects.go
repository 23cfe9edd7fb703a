package podwebhook

import (
	"context"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

// The objects volume. A function pod keeps its objects in memory shared
// by its containers: the SDK writes what a function puts, queue-proxy-zl
// stores, serves and pulls into the same directory
// (v1alpha1.ObjectsDir). Left to the container runtime that directory
// is on the pod's /dev/shm, 64 MiB on containerd and CRI-O, so any object
// path over 64 MiB a pod fails with ENOSPC. Knative gives queue-proxy
// none of the template's volumes, so the finished Pod is again the one
// place a volume shared with it can be added.
//
// For a revision pod of a ziptrail function whose template carries the
// Workflow controller's v1alpha1.AnnotationObjectsVolume (its size,
// derived from the workflow's buckets), ObjectsMutator adds:
//
//   - an emptyDir volume, medium Memory, sizeLimit the annotation's size;
//   - its mount at v1alpha1.ObjectsDir in every container, queue-proxy's
//     included: all of them or none, so the SDK and the sidecar always
//     see the same directory (a pod the webhook missed uses /dev/shm in
//     all of them, as before);
//   - the size to the memory the pod declares, since the kernel charges
//     a memory-backed volume's pages to the container that wrote them:
//     to the user container's memory limit and request, where set (its
//     SDK writes the objects a function puts), and to queue-proxy's limit,
//     where set (it pulls inputs into the volume). Without a limit a
//     container is bounded by the volume's sizeLimit alone.
//
// A pod that already has the volume (a reinvoked webhook) or mounts
// something of its own at ObjectsDir is left alone.
type ObjectsMutator struct{}

const (
	// ObjectsPath is the path the objects webhook is served at.
	ObjectsPath = "/mutate-pods-objects"
	// ObjectsVolumeName is the objects volume's name in the pod.
	ObjectsVolumeName = "ziptrail-objects"
	// maxObjectsVolume bounds the annotation's value (1 PiB): larger is
	// not a size but a typo, and is left alone.
	maxObjectsVolume = 1 << 50
)

// Handle implements admission.Handler.
func (m ObjectsMutator) Handle(_ context.Context, req admission.Request) admission.Response {
	return handle(req, m.Mutate)
}

// Mutate changes pod in place and reports whether it did.
func (ObjectsMutator) Mutate(pod *corev1.Pod) bool {
	if pod.Labels[labelRevision] == "" || pod.Labels[labelWorkflow] == "" {
		return false
	}
	size, err := strconv.ParseInt(pod.Annotations[v1alpha1.AnnotationObjectsVolume], 10, 64)
	if err != nil || size <= 0 || size > maxObjectsVolume {
		return false
	}
	qp, user := -1, -1
	for i, c := range pod.Spec.Containers {
		if c.Name == QueueProxy {
			qp = i
		} else if user < 0 {
			user = i
		}
		for _, m := range c.VolumeMounts {
			if m.MountPath == v1alpha1.ObjectsDir {
				return false // the pod's own, or a reinvocation
			}
		}
	}
	if qp < 0 || user < 0 {
		return false
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == ObjectsVolumeName {
			return false
		}
	}
	q := resource.NewQuantity(size, resource.BinarySI)
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: ObjectsVolumeName,
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: q}}})
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: ObjectsVolumeName, MountPath: v1alpha1.ObjectsDir})
	}
	addMemory(pod.Spec.Containers[user].Resources.Limits, q)
	addMemory(pod.Spec.Containers[user].Resources.Requests, q)
	addMemory(pod.Spec.Containers[qp].Resources.Limits, q)
	// queue-proxy-zl's node (Knative gives it none), with or without the
	// same-node data plane: a producer's sidecar prefers the consumer's
	// pods on its own node when it fires a trigger itself (delegated
	// firing), and names its node to activator-ext.
	setEnv(&pod.Spec.Containers[qp], corev1.EnvVar{Name: envNode, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}})
	return true
}

// addMemory adds q to the memory of l, if l sets one.
func addMemory(l corev1.ResourceList, q *resource.Quantity) {
	if m, ok := l[corev1.ResourceMemory]; ok {
		m.Add(*q)
		l[corev1.ResourceMemory] = m
	}
}
