// Package podwebhook is the operator's mutating admission webhook that
// gives queue-proxy-zl the node directory of the same-node data plane
// (internal/dataplane/samenode): Knative builds queue-proxy's container
// itself and gives it only its own mounts, so the finished Pod is the one
// place ziptrail can add one.
//
// For a pod of a ziptrail function's revision (labels
// serving.knative.dev/revision and ziptrail.dev/workflow; the chart's
// MutatingWebhookConfiguration selects the same, so other pods never
// reach the webhook, and Handle checks again) it adds:
//
//   - a hostPath volume of the node directory (DirectoryOrCreate),
//   - its mount in the queue-proxy container only — never in the user
//     container, whose code must not reach other pods' sockets,
//   - on queue-proxy, the downward-API variables the sidecar needs:
//     its node's name (spec.nodeName) and its pod's UID (metadata.uid),
//     and the directory.
//
// Nothing else changes; a pod that already has the volume (a reinvoked
// webhook) or has no queue-proxy is left alone. The configuration's
// failurePolicy is Ignore: without the webhook a pod still starts and
// its sidecar uses the TCP data plane only. Pod Security Admission's
// baseline and restricted levels refuse hostPath volumes, so the chart's
// namespaceSelector leaves namespaces enforcing them out (their pods use
// TCP; docs/samenode.md discusses a CSI ephemeral volume for them).
package podwebhook

import (
	"context"
	"encoding/json"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

const (
	// Path the webhook is served at (the chart's configuration names it).
	Path = "/mutate-pods"
	// VolumeName of the node directory's volume.
	VolumeName = "ziptrail-node"
	// DefaultHostDir is the node directory (samenode.DefaultDir; a test
	// keeps them equal without this package importing the data plane).
	DefaultHostDir = "/var/run/ziptrail/node"
	// QueueProxy is Knative's name of the queue-proxy container.
	QueueProxy = "queue-proxy"

	labelRevision = "serving.knative.dev/revision"
	labelWorkflow = "ziptrail.dev/workflow"

	envDir    = "ZIPTRAIL_NODE_DIR"
	envNode   = "ZIPTRAIL_NODE_NAME"
	envPodUID = "ZIPTRAIL_POD_UID"
)

// Mutator adds the node directory to ziptrail revision pods.
type Mutator struct {
	// HostDir is the node directory (default DefaultHostDir).
	HostDir string
}

func (m *Mutator) dir() string {
	if m.HostDir != "" {
		return m.HostDir
	}
	return DefaultHostDir
}

// Handle implements admission.Handler.
func (m *Mutator) Handle(_ context.Context, req admission.Request) admission.Response {
	return handle(req, m.Mutate)
}

// handle decodes the pod of req, mutates it and answers the patch.
func handle(req admission.Request, mutate func(*corev1.Pod) bool) admission.Response {
	if req.Kind.Kind != "Pod" || req.Kind.Group != "" {
		return admission.Allowed("not a pod")
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if !mutate(&pod) {
		return admission.Allowed("unchanged")
	}
	out, err := json.Marshal(&pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, out)
}

// Mutate changes pod in place and reports whether it did.
func (m *Mutator) Mutate(pod *corev1.Pod) bool {
	if pod.Labels[labelRevision] == "" || pod.Labels[labelWorkflow] == "" {
		return false
	}
	qp := -1
	for i, c := range pod.Spec.Containers {
		if c.Name == QueueProxy {
			qp = i
		}
	}
	if qp < 0 {
		return false
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == VolumeName {
			return false
		}
	}
	hostType := corev1.HostPathDirectoryOrCreate
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: VolumeName,
		VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: m.dir(), Type: &hostType}}})
	c := &pod.Spec.Containers[qp]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: VolumeName, MountPath: m.dir()})
	setEnv(c, corev1.EnvVar{Name: envDir, Value: m.dir()})
	setEnv(c, corev1.EnvVar{Name: envNode, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}})
	setEnv(c, corev1.EnvVar{Name: envPodUID, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"}}})
	return true
}

// setEnv sets (replacing any earlier value) one variable.
func setEnv(c *corev1.Container, v corev1.EnvVar) {
	for i := range c.Env {
		if c.Env[i].Name == v.Name {
			c.Env[i] = v
			return
		}
	}
	c.Env = append(c.Env, v)
}
