package e2e

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// Pods with real limits (the node agent's cgroups, docs/local-cluster.md
// "Resource limits"): what a user sees when a function outgrows its memory
// or its bucket's.
var _ = Describe("memory limits", func() {
	It("ends a session whose function outgrows its container's memory limit, and shows the pod OOMKilled", func() {
		// 64Mi of its own; the pod webhook adds the objects volume (512Mi
		// with the default bucket) to the limit: 1 GiB is past it.
		ns := deploy("hog", v1alpha1.WorkflowSpec{Entry: "hog", Functions: []v1alpha1.FunctionSpec{
			withMemoryLimit(pyFunction("hog", `
def handle(inv):
    b = b"x" * (1 << 30)
    return b[:1]`), "64Mi")}})
		s := waitFailed(ns, startSession(ns, "hog", "go"), 3*time.Minute)
		Expect(s.Error).To(ContainSubstring("exited before answering"), "%+v", s)

		var pods corev1.PodList
		Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelFunction: "hog"})).To(Succeed())
		Expect(pods.Items).NotTo(BeEmpty())
		oom := false
		for _, p := range pods.Items {
			for _, c := range p.Status.ContainerStatuses {
				if t := c.LastTerminationState.Terminated; t != nil && t.Reason == "OOMKilled" && c.RestartCount > 0 {
					oom = true
				}
			}
		}
		Expect(oom).To(BeTrue(), "no container of the function's pods shows OOMKilled: %+v", pods.Items[0].Status.ContainerStatuses)
	})

	It("fails a send_object over its bucket's memoryLimitPerPod with an error naming the bucket and the limit", func() {
		q := resource.MustParse("16Mi")
		ns := deploy("overcap", v1alpha1.WorkflowSpec{Entry: "produce",
			// A pod has one object store, capped by the largest
			// memoryLimitPerPod of the workflow's buckets: all are small.
			Buckets: []v1alpha1.NamedBucket{{Name: "small", Spec: v1alpha1.BucketSpec{MemoryLimitPerPod: &q}},
				{Name: "output", Spec: v1alpha1.BucketSpec{MemoryLimitPerPod: &q}}},
			Functions: []v1alpha1.FunctionSpec{pyFunction("produce", `
def handle(inv):
    ziptrail.send_object("small", "blob", b"x" * (32 << 20), session=inv.session)
    return b""`)}})
		s := waitFailed(ns, startSession(ns, "overcap", "go"), 2*time.Minute)
		Expect(s.Error).To(And(ContainSubstring("bucket small"), ContainSubstring("memoryLimitPerPod"), ContainSubstring(fmt.Sprint(32<<20))), "%+v", s)
	})
})

// waitFailed waits for a session to fail and returns it.
func waitFailed(ns, id string, timeout time.Duration) sessions.Session {
	var s sessions.Session
	Eventually(func(g Gomega) {
		s = getSession(g, ns, id)
		g.Expect(s.State).To(Equal(sessions.Failed))
	}, timeout, time.Second).Should(Succeed())
	return s
}

// withMemoryLimit sets a function container's memory limit (and request).
func withMemoryLimit(f v1alpha1.FunctionSpec, limit string) v1alpha1.FunctionSpec {
	q := resource.MustParse(limit)
	f.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: q},
		Requests: corev1.ResourceList{corev1.ResourceMemory: q}}
	return f
}
