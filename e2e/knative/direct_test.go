package knative

import (
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/dispatch/direct"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
)

// What the operator's direct routing (internal/operator/dispatch/direct) relies on
// of Knative, pinned against the real thing: a Knative upgrade that
// changes it fails here, not in production.
var _ = Describe("direct routing's view of Knative", Ordered, func() {
	var ns string
	var reader client.Client
	const name = "pin"
	rev := name + "-00001"
	pick := func() string {
		// A new Router each time: nothing kept from an earlier read.
		addr, done := (&direct.Router{Reader: reader}).Pick(&invocation.Envelope{Namespace: ns, Function: name}, "")
		if done != nil {
			done(0)
		}
		return addr
	}

	BeforeAll(func() {
		ns = newNamespace("kn-direct")
		var err error
		reader, err = client.New(cluster.Config, client.Options{Scheme: envtest.Scheme()})
		Expect(err).NotTo(HaveOccurred())
		out, err := kubectlApply(ns, service(name, map[string]string{"autoscaling.knative.dev/min-scale": "1"}, ""))
		Expect(err).NotTo(HaveOccurred(), out)
		waitReady(ns, name)
	})

	It("finds a ready pod in the revision's private EndpointSlices, whose queue-proxy serves at the \"http\" port", func() {
		Eventually(func() int { return readyPods(ns, rev) }).Should(Equal(1))
		// Knative's webhook writes the default containerConcurrency (0)
		// into the template: direct routing takes only such revisions.
		ksvc, err := serving.ServingV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(ksvc.Spec.Template.Spec.ContainerConcurrency).NotTo(BeNil())
		Expect(*ksvc.Spec.Template.Spec.ContainerConcurrency).To(BeZero())
		Expect(direct.Unbounded(ksvc, rev)).To(BeTrue())
		// The private Service's EndpointSlices carry the revision's and
		// the service type's labels, and queue-proxy's port as "http".
		var slices discoveryv1.EndpointSliceList
		Expect(reader.List(ctx, &slices, client.InNamespace(ns), client.MatchingLabels(direct.SliceLabels(rev)))).To(Succeed())
		Expect(slices.Items).NotTo(BeEmpty(), "EndpointSlices labelled %v", direct.SliceLabels(rev))
		Expect(slices.Items[0].Labels).To(HaveKeyWithValue(discoveryv1.LabelServiceName, rev+"-private"))
		Expect(direct.CacheOptions()).To(HaveKey(BeAssignableToTypeOf(&discoveryv1.EndpointSlice{})))
		for obj, sel := range direct.CacheOptions() {
			if _, ok := obj.(*discoveryv1.EndpointSlice); ok {
				Expect(sel.Label.Matches(labels.Set(slices.Items[0].Labels))).To(BeTrue(), "the operator's cache selects the slices")
			}
		}
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "serving.knative.dev/revision=" + rev})
		Expect(err).NotTo(HaveOccurred())
		addr := ""
		Eventually(func() string { addr = pick(); return addr }).ShouldNot(BeEmpty())
		host, port, err := net.SplitHostPort(addr)
		Expect(err).NotTo(HaveOccurred())
		Expect(port).To(Equal("8012"), "queue-proxy's serving port")
		Expect(host).To(Equal(pods.Items[0].Status.PodIP))
		// Straight to it, no Host header to route by: queue-proxy serves.
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + addr + "/")
		Expect(err).NotTo(HaveOccurred())
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		Expect(resp.StatusCode).To(Equal(200), string(body))
		Expect(string(body)).To(ContainSubstring("echo from " + rev))
	})

	// As a tenant who may write EndpointSlices in its namespace: one with
	// the revision's labels, pointing at an address of its choosing (here
	// the cluster's kubernetes Service, as an attacker would aim the
	// operator's requests and their bearer at the control plane). The
	// router takes only addresses of the revision's running pods.
	It("never sends to an address a forged EndpointSlice names", func() {
		kube, err := cs.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		decoy := kube.Spec.ClusterIP
		forged := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: rev + "-private-forged", Namespace: ns, Labels: direct.SliceLabels(rev)},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(direct.PortName), Port: ptr.To[int32](8012)}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{decoy}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}}}
		Expect(reader.Create(ctx, forged)).To(Succeed())
		DeferCleanup(func() { _ = reader.Delete(ctx, forged) })
		var slices discoveryv1.EndpointSliceList
		Expect(reader.List(ctx, &slices, client.InNamespace(ns), client.MatchingLabels(direct.SliceLabels(rev)))).To(Succeed())
		Expect(len(slices.Items)).To(BeNumerically(">=", 2), "the forged slice is listed with the revision's")
		picked := map[string]int{}
		for range 50 {
			picked[pick()]++
		}
		Expect(picked).NotTo(HaveKey(ContainSubstring(decoy)))
		Expect(picked).To(HaveLen(1), "the revision's one pod, every time: %v", picked)
	})

	It("leaves a revision scaled to zero to the route", func() {
		out, err := kubectlApply(ns, service(name, map[string]string{"autoscaling.knative.dev/min-scale": "0",
			"autoscaling.knative.dev/initial-scale": "0"}, ""))
		Expect(err).NotTo(HaveOccurred(), out)
		// The new template is a new revision; the old one goes to zero.
		svc := waitReady(ns, name)
		Eventually(func() int { return pods(ns, svc.Status.LatestReadyRevisionName) }).Should(BeZero())
		Eventually(func() int { return pods(ns, rev) }).Should(BeZero())
		Expect(pick()).To(BeEmpty(), "no ready pod: the route (activator) takes it")
		// The route cold-starts it; then it is picked directly again.
		code, body, err := get(host(name, ns), "/")
		Expect(err).NotTo(HaveOccurred())
		Expect(code).To(Equal(200), body)
		Eventually(pick).Should(ContainSubstring(":8012"))
		Expect(strings.Contains(body, "echo from "+svc.Status.LatestReadyRevisionName)).To(BeTrue(), body)
	})
})
