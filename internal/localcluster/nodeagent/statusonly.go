package nodeagent

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// StatusOnly returns c with one change: a pod's UpdateStatus writes the
// status it is given under the pod's metadata as the API server has it
// now, never the caller's.
//
// virtual-kubelet (node/pod.go, updatePodStatus) writes a pod's status with
// UpdateStatus of the provider's whole copy of the pod, after setting its
// resourceVersion to the one its informer has; the pods/status endpoint
// takes metadata.labels and annotations from the request. So a label
// another client set since the provider last saw the pod is removed again
// by the next status write — the chart-installed operator's leader label
// (internal/operator/app/leader.go), set as its pod turns Ready, was lost that way
// and the gateway and control Services had no endpoint (a chaos-short run
// that stopped at "the chain workflow does not work without faults").
// The kubelet patches status only; this does the equivalent: it reads the
// pod and sends the status with the server's metadata, so a change made
// in between fails with a conflict (virtual-kubelet retries) instead of
// being overwritten.
func StatusOnly(c kubernetes.Interface) kubernetes.Interface { return statusOnly{c} }

type statusOnly struct{ kubernetes.Interface }

func (c statusOnly) CoreV1() corev1client.CoreV1Interface {
	return statusOnlyCore{c.Interface.CoreV1()}
}

type statusOnlyCore struct{ corev1client.CoreV1Interface }

func (c statusOnlyCore) Pods(namespace string) corev1client.PodInterface {
	return statusOnlyPods{c.CoreV1Interface.Pods(namespace)}
}

type statusOnlyPods struct{ corev1client.PodInterface }

func (p statusOnlyPods) UpdateStatus(ctx context.Context, pod *corev1.Pod, opts metav1.UpdateOptions) (*corev1.Pod, error) {
	cur, err := p.Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	out := cur.DeepCopy()
	out.Status = pod.Status
	return p.PodInterface.UpdateStatus(ctx, out, opts)
}
