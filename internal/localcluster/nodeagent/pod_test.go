package nodeagent_test

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Both nodes register Ready, with a podCIDR, an InternalIP and kubelet
// port, NetworkUnavailable=False, no taints, and keep a Lease.
func TestNodesRegister(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	for _, ns := range nodes {
		n, err := client.CoreV1().Nodes().Get(ctx, ns.Name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(n.Spec.PodCIDR).To(Equal(ns.PodCIDR.String()))
		// No taint of the agent's; only the not-ready taint the API server's
		// TaintNodesByCondition admission adds (kube-controller-manager's
		// node lifecycle controller removes it; none runs in this test).
		for _, taint := range n.Spec.Taints {
			g.Expect(taint.Key).To(Equal("node.kubernetes.io/not-ready"))
		}
		conds := map[corev1.NodeConditionType]corev1.ConditionStatus{}
		for _, c := range n.Status.Conditions {
			conds[c.Type] = c.Status
		}
		g.Expect(conds).To(HaveKeyWithValue(corev1.NodeReady, corev1.ConditionTrue))
		g.Expect(conds).To(HaveKeyWithValue(corev1.NodeNetworkUnavailable, corev1.ConditionFalse))
		g.Expect(n.Status.DaemonEndpoints.KubeletEndpoint.Port).To(Equal(int32(kubeletPort)))
		var internal string
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				internal = a.Address
			}
		}
		g.Expect(internal).To(Equal(ns.PodCIDR.Addr().Next().String()))
		g.Expect(n.Status.Allocatable.Pods().Value()).To(BeNumerically(">", 100))
		g.Eventually(func() error {
			_, err := client.CoordinationV1().Leases("kube-node-lease").Get(ctx, ns.Name, metav1.GetOptions{})
			return err
		}, 30*time.Second, 200*time.Millisecond).Should(Succeed())
	}
	var lease *coordinationv1.Lease
	lease, err := client.CoordinationV1().Leases("kube-node-lease").Get(ctx, nodes[0].Name, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(*lease.Spec.HolderIdentity).To(Equal(nodes[0].Name))
}

// A pod runs in its own network namespace with an IP from its node's
// podCIDR, becomes Ready through its readiness probe, and gets
// status.podIP/status.hostIP env vars, the cluster's resolv.conf, a hosts
// file and a /dev/shm tmpfs.
func TestPodRunsReadyWithIP(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	for i, node := range nodes {
		name := "echo-" + string(rune('a'+i))
		create(t, echoPod(ns, name, node.Name))
		pod := waitReady(t, ns, name)
		ip := netip.MustParseAddr(pod.Status.PodIP)
		g.Expect(node.PodCIDR.Contains(ip)).To(BeTrue(), "pod IP %s not in %s", ip, node.PodCIDR)
		g.Expect(pod.Status.HostIP).To(Equal(node.PodCIDR.Addr().Next().String()))
		g.Expect(pod.Status.ContainerStatuses).To(HaveLen(1))
		cs := pod.Status.ContainerStatuses[0]
		g.Expect(cs.Ready).To(BeTrue())
		g.Expect(*cs.Started).To(BeTrue())
		g.Expect(cs.State.Running).NotTo(BeNil())
		g.Expect(cs.ContainerID).To(HavePrefix("ziptrail://"))
		g.Expect(cs.Image).To(Equal(echoImage))

		g.Expect(httpGet(echoURL(pod, "/env?name=POD_IP"))).To(Equal(pod.Status.PodIP))
		g.Expect(httpGet(echoURL(pod, "/env?name=HOST_IP"))).To(Equal(pod.Status.HostIP))
		g.Expect(httpGet(echoURL(pod, "/env?name=POD_NAME"))).To(Equal(name))
		g.Expect(readFile(pod, "/proc/sys/kernel/hostname")).To(Equal(name + "\n"))
		g.Expect(readFile(pod, "/etc/resolv.conf")).To(Equal(
			"nameserver 10.0.0.10\nsearch " + ns + ".svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"))
		g.Expect(readFile(pod, "/etc/hosts")).To(ContainSubstring(pod.Status.PodIP + "\t" + name))
		mounts, err := readFile(pod, "/proc/self/mounts")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(mounts).To(MatchRegexp(`(?m)^shm /dev/shm tmpfs `))
		g.Eventually(func(g Gomega) {
			ev := events(g, pod)
			g.Expect(containsLine(ev, "Created: Created container: echo")).To(BeTrue(), "%v", ev)
			g.Expect(containsLine(ev, "Started: Started container echo")).To(BeTrue(), "%v", ev)
		}, 10*time.Second, 200*time.Millisecond).Should(Succeed())
	}
	// The host's /etc is untouched by the pods' bind mounts.
	g.Expect(readHostFile("/etc/resolv.conf")).NotTo(ContainSubstring("10.0.0.10"))
}

func readHostFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// A pod on a node of another kind (hostNetwork) fails with a clear reason.
func TestHostNetworkPodFails(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pod := echoPod(ns, "hostnet", nodes[0].Name)
	pod.Spec.HostNetwork = true
	create(t, pod)
	g.Eventually(func(g Gomega) {
		p := getPod(g, ns, "hostnet")
		g.Expect(p.Status.Phase).To(Equal(corev1.PodFailed))
		g.Expect(p.Status.Reason).To(Equal("HostNetworkUnsupported"))
		g.Expect(p.Status.Message).To(ContainSubstring("hostNetwork"))
	}, 30*time.Second, 200*time.Millisecond).Should(Succeed())
}

// An image the catalog does not list leaves the container waiting with
// ErrImagePull/ImagePullBackOff and a message naming the catalog, and
// emits a Failed event.
func TestUnknownImage(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pod := echoPod(ns, "unknown", nodes[1].Name)
	pod.Spec.Containers[0].Image = "registry.example/no/such-image:v1"
	p := create(t, pod)
	g.Eventually(func(g Gomega) {
		p := getPod(g, ns, "unknown")
		g.Expect(p.Status.Phase).To(Equal(corev1.PodPending))
		g.Expect(p.Status.ContainerStatuses).To(HaveLen(1))
		w := p.Status.ContainerStatuses[0].State.Waiting
		g.Expect(w).NotTo(BeNil())
		g.Expect(w.Reason).To(BeElementOf("ErrImagePull", "ImagePullBackOff"))
		g.Expect(w.Message).To(ContainSubstring(`"registry.example/no/such-image:v1" is not listed in`))
		g.Expect(w.Message).To(ContainSubstring("images.yaml"))
	}, 30*time.Second, 200*time.Millisecond).Should(Succeed())
	g.Eventually(func(g Gomega) {
		ev := events(g, p)
		g.Expect(containsLine(ev, `Failed: Failed to pull image "registry.example/no/such-image:v1"`)).To(BeTrue(), "%v", ev)
	}, 10*time.Second, 200*time.Millisecond).Should(Succeed())
}
