package e2e

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/podwebhook"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// sidecarCounter sums a queue-proxy-zl counter (by its result label) over
// the pods given, from their data-plane metrics port (9193).
func sidecarCounter(pods []corev1.Pod, name, result string) float64 {
	var sum float64
	hc := &http.Client{Timeout: 10 * time.Second}
	for _, p := range pods {
		resp, err := hc.Get("http://" + net.JoinHostPort(p.Status.PodIP, "9193") + "/metrics")
		Expect(err).NotTo(HaveOccurred(), "metrics of %s", p.Name)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		prefix := fmt.Sprintf(`%s{result=%q} `, name, result)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), prefix); ok {
				f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
				Expect(err).NotTo(HaveOccurred())
				sum += f
			}
		}
		resp.Body.Close()
	}
	return sum
}

func functionPods(ns, fn string) []corev1.Pod {
	var list corev1.PodList
	Expect(k8s.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelFunction: fn})).To(Succeed())
	var running []corev1.Pod
	for _, p := range list.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			running = append(running, p)
		}
	}
	return running
}

var _ = Describe("same-node data plane (sealed memfds between pods on one node)", func() {
	It("hands an object over as a memfd on the producer's node and pulls it over TCP from the other", func() {
		// The local cluster registers the pod webhook itself; on kind the
		// chart does with sameNode.enabled=true.
		ns := deploy("samenode", v1alpha1.WorkflowSpec{Entry: "produce",
			Functions: []v1alpha1.FunctionSpec{
				pyFunction("produce", pyBlob+`
def handle(inv):
    ziptrail.send_object("big", "blob", blob("blob"))
    return b""`),
				pyFunction("consume", pyDigest+`
def handle(inv):
    ziptrail.send_object("output", "digest", digest(inv.objects[0]))
    return b""`),
			},
			Triggers: []v1alpha1.NamedTrigger{trig("consume-blob", "big", v1alpha1.TriggerSpec{Primitive: v1alpha1.Immediate, Targets: []string{"consume"}})},
		})
		// Two pods per function (min-scale 2) on the two nodes.
		var producers, consumers []corev1.Pod
		Eventually(func() int {
			producers, consumers = functionPods(ns, "produce"), functionPods(ns, "consume")
			return min(len(producers), len(consumers))
		}, 5*time.Minute, time.Second).Should(BeNumerically(">=", 2))
		nodes := map[string]bool{}
		for _, p := range append(append([]corev1.Pod{}, producers...), consumers...) {
			nodes[p.Spec.NodeName] = true
			// The webhook mounted the node directory into queue-proxy only.
			for _, c := range p.Spec.Containers {
				mounted := false
				for _, m := range c.VolumeMounts {
					mounted = mounted || m.Name == podwebhook.VolumeName
				}
				Expect(mounted).To(Equal(c.Name == podwebhook.QueueProxy), "pod %s container %s", p.Name, c.Name)
			}
		}
		Expect(nodes).To(HaveLen(2), "the functions' pods should be on both nodes")

		// Each session's consumer lands on one of the consumer pods. The
		// operator's direct routing (docs/dispatch.md) prefers a consumer
		// pod on the producer's node: run sessions until one got the
		// object as a memfd. Then, through the route (Knative's activator
		// spreads the consumers over both nodes), until one was on the
		// other node (bounded, not timed).
		const okName, tcpName = "ziptrail_dataplane_samenode_gets_total", "ziptrail_dataplane_pulls_total"
		memfd0, far0, tcp0 := sidecarCounter(consumers, okName, "ok"), sidecarCounter(consumers, okName, "not_applicable"), sidecarCounter(consumers, tcpName, "ok")
		var memfd, far, tcp float64
		run := func(done func() bool) {
			for i := 0; i < 60; i++ {
				result, s := runSession(ns, "samenode", "go")
				Expect(s.State).To(Equal(sessions.Completed))
				Expect(result).To(Equal(expectedDigest("blob")))
				memfd, far, tcp = sidecarCounter(consumers, okName, "ok")-memfd0, sidecarCounter(consumers, okName, "not_applicable")-far0, sidecarCounter(consumers, tcpName, "ok")-tcp0
				if done() {
					return
				}
			}
		}
		run(func() bool { return memfd > 0 })
		GinkgoWriter.Printf("direct routing: same-node memfd gets %v, cross-node gets %v\n", memfd, far)
		if cluster == nil {
			// The chart's operator routes directly; its switch is the
			// chart's engine.directDispatch.
			Expect(memfd).To(BeNumerically(">", 0), "no consumer got the object as a memfd from a producer on its node")
			return
		}
		cluster.SetDirectDispatch(false)
		DeferCleanup(func() { cluster.SetDirectDispatch(true) })
		run(func() bool { return memfd > 0 && far > 0 })
		GinkgoWriter.Printf("same-node memfd gets %v, cross-node gets %v, TCP pulls %v\n", memfd, far, tcp)
		Expect(memfd).To(BeNumerically(">", 0), "no consumer got the object as a memfd from a producer on its node")
		Expect(far).To(BeNumerically(">", 0), "no consumer was on the other node")
		// Every cross-node get was a TCP pull; same-node gets were not.
		Expect(tcp).To(Equal(far))
	})
})
