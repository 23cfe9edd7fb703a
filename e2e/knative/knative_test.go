package knative

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	netv1alpha1 "knative.dev/networking/pkg/apis/networking/v1alpha1"
	"knative.dev/pkg/apis"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"

	"github.com/ziptrail/ziptrail/internal/operator/dispatch/direct"
)

const echoImage = "ziptrail.dev/e2e/echo:latest"

// service is a Knative Service manifest of the echo image.
func service(name string, annotations map[string]string, extra string) string {
	var ann strings.Builder
	for k, v := range annotations {
		fmt.Fprintf(&ann, "\n        %s: %q", k, v)
	}
	annBlock := ""
	if ann.Len() > 0 {
		annBlock = "\n      annotations:" + ann.String()
	}
	return fmt.Sprintf(`apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: %s
spec:
  template:
    metadata:%s
      labels: {e2e: knative}
    spec:
      containers:
        - image: %s
%s`, name, annBlock, echoImage, extra)
}

// waitReady waits for the Service's Ready condition at its latest
// generation and returns it.
func waitReady(ns, name string) *servingv1.Service {
	var svc *servingv1.Service
	Eventually(func(g Gomega) {
		var err error
		svc, err = serving.ServingV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(svc.Status.ObservedGeneration).To(Equal(svc.Generation))
		c := svc.Status.GetCondition(apis.ConditionReady)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(corev1.ConditionTrue), "Ready: %s %s", c.Reason, c.Message)
	}).Should(Succeed())
	return svc
}

// readyPods counts the revision's pods that are Ready.
func readyPods(ns, revision string) int {
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "serving.knative.dev/revision=" + revision})
	Expect(err).NotTo(HaveOccurred())
	n := 0
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				n++
			}
		}
	}
	return n
}

func pods(ns, revision string) int {
	list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "serving.knative.dev/revision=" + revision})
	Expect(err).NotTo(HaveOccurred())
	return len(list.Items)
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s)-1) * p)
	return s[i]
}

var _ = Describe("a plain Knative Service", func() {
	It("is created with kubectl apply and becomes Ready through Knative's controller, and serves through the KIngress", func() {
		ns := newNamespace("kn-hello")
		start := time.Now()
		out, err := kubectlApply(ns, service("hello", nil, ""))
		Expect(err).NotTo(HaveOccurred(), out)
		svc := waitReady(ns, "hello")
		AddReportEntry("Knative Service create → Ready", time.Since(start).String())
		Expect(svc.Status.URL).NotTo(BeNil())
		Expect(svc.Status.URL.Host).To(Equal(host("hello", ns)))
		Expect(svc.Status.LatestReadyRevisionName).To(Equal("hello-00001"))

		code, body, err := get(host("hello", ns), "/")
		Expect(err).NotTo(HaveOccurred())
		Expect(code).To(Equal(200), body)
		Expect(body).To(ContainSubstring("echo from hello-00001-deployment-"))

		// Knative's controller made the KIngress of our class, and the
		// ingress reported it ready after probing.
		ing, err := netcs.NetworkingV1alpha1().Ingresses(ns).Get(ctx, "hello", metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(ing.Annotations).To(HaveKeyWithValue("networking.knative.dev/ingress.class", "ziptrail.ingress.networking.knative.dev"))
		Expect(ing.IsReady()).To(BeTrue())
		// The user container and queue-proxy-zl, configured by Knative.
		list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "serving.knative.dev/revision=hello-00001"})
		Expect(err).NotTo(HaveOccurred())
		Expect(list.Items).To(HaveLen(1))
		var images []string
		for _, c := range list.Items[0].Spec.Containers {
			images = append(images, c.Name+"="+c.Image)
		}
		Expect(images).To(ConsistOf("user-container="+echoImage, "queue-proxy=ghcr.io/ziptrail/queue-proxy-zl:latest"))
	})

	It("is rejected by Knative's webhook with Knative's own message when invalid", func() {
		ns := newNamespace("kn-invalid")
		out, err := kubectlApply(ns, service("bad", nil, "      containerConcurrency: -1\n"))
		Expect(err).To(HaveOccurred(), out)
		Expect(out).To(ContainSubstring(`admission webhook "validation.webhook.serving.knative.dev" denied the request`))
		Expect(out).To(ContainSubstring("spec.template.spec.containerConcurrency"))

		out, err = kubectlApply(ns, service("bad", map[string]string{"autoscaling.knative.dev/min-scale": "-1"}, ""))
		Expect(err).To(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("denied the request"))
		Expect(out).To(ContainSubstring("autoscaling.knative.dev/min-scale"))
		_, err = serving.ServingV1().Services(ns).Get(ctx, "bad", metav1.GetOptions{})
		Expect(err).To(HaveOccurred(), "nothing was created")
	})
})

var _ = Describe("Knative's autoscaler", Ordered, func() {
	var ns string
	const name = "load"
	rev := name + "-00001"

	BeforeAll(func() {
		ns = newNamespace("kn-kpa")
		// Target one concurrent request per pod; with no burst capacity
		// the activator leaves the path once pods are up, so the KPA
		// decides on the metrics it scrapes from the pods' queue-proxy.
		out, err := kubectlApply(ns, service(name, map[string]string{
			"autoscaling.knative.dev/target":                "1",
			"autoscaling.knative.dev/target-burst-capacity": "0",
			"autoscaling.knative.dev/max-scale":             "5",
		}, ""))
		Expect(err).NotTo(HaveOccurred(), out)
		waitReady(ns, name)
	})

	It("scales a Service from 1 to at least 3 pods under load, from queue-proxy's metrics", func() {
		Eventually(func() int { return readyPods(ns, rev) }).Should(Equal(1))
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var ok, failed atomic.Int64
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					code, _, err := get(host(name, ns), "/hook?name=load&sleep=400ms")
					if err == nil && code == 200 {
						ok.Add(1)
					} else {
						failed.Add(1)
					}
				}
			}()
		}
		start := time.Now()
		defer func() { close(stop); wg.Wait() }()

		var decided time.Duration
		Eventually(func(g Gomega) {
			pa, err := serving.AutoscalingV1alpha1().PodAutoscalers(ns).Get(ctx, rev, metav1.GetOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			if decided == 0 && pa.Status.DesiredScale != nil && *pa.Status.DesiredScale >= 3 {
				decided = time.Since(start)
			}
			g.Expect(decided).NotTo(BeZero())
		}).Should(Succeed())
		Eventually(func() int { return readyPods(ns, rev) }).Should(BeNumerically(">=", 3))
		AddReportEntry("KPA reaction to a load step (desired scale ≥ 3)", decided.String())
		AddReportEntry("load step → 3 ready pods", time.Since(start).String())
		// The activator is out of the path: traffic goes straight to the
		// pods, whose queue-proxy reports the concurrency.
		sks, err := netcs.NetworkingV1alpha1().ServerlessServices(ns).Get(ctx, rev, metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(sks.Spec.Mode).To(Equal(netv1alpha1.SKSOperationModeServe))
		Expect(ok.Load()).To(BeNumerically(">", 0))
		Expect(failed.Load()).To(BeZero(), "no request failed while scaling")
	})

	It("scales it to zero after the load", func() {
		Eventually(func() int { return pods(ns, rev) }).Should(BeZero())
		sks, err := netcs.NetworkingV1alpha1().ServerlessServices(ns).Get(ctx, rev, metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(sks.Spec.Mode).To(Equal(netv1alpha1.SKSOperationModeProxy), "the activator is in the path")
	})

	It("holds the next request in the activator, scales from zero and answers it", func() {
		start := time.Now()
		code, body, err := get(host(name, ns), "/")
		Expect(err).NotTo(HaveOccurred())
		Expect(code).To(Equal(200), body)
		Expect(body).To(ContainSubstring("echo from " + rev))
		AddReportEntry("request from zero (activator, cold start)", time.Since(start).String())
		// The activator probes the new pod itself; the node agent's status
		// (readiness probe) may follow a moment later.
		Eventually(func() int { return readyPods(ns, rev) }).Should(BeNumerically(">=", 1))
	})
})

var _ = Describe("scale from zero", func() {
	It("answers the first request of each of 20 Services at zero (latencies reported)", func() {
		ns := newNamespace("kn-cold")
		const n = 21 // the first warms the node agent's image build and is not counted
		for i := range n {
			out, err := kubectlApply(ns, service(fmt.Sprintf("cold-%02d", i), map[string]string{"autoscaling.knative.dev/initial-scale": "0"}, ""))
			Expect(err).NotTo(HaveOccurred(), out)
		}
		for i := range n {
			waitReady(ns, fmt.Sprintf("cold-%02d", i))
		}
		var lat []time.Duration
		for i := range n {
			name := fmt.Sprintf("cold-%02d", i)
			Expect(pods(ns, name+"-00001")).To(BeZero(), "%s starts at zero", name)
			start := time.Now()
			code, body, err := get(host(name, ns), "/")
			d := time.Since(start)
			Expect(err).NotTo(HaveOccurred())
			Expect(code).To(Equal(200), body)
			if i > 0 {
				lat = append(lat, d)
			}
		}
		AddReportEntry("scale from zero (20 Services)", fmt.Sprintf("p50 %s p95 %s max %s",
			percentile(lat, 0.5).Round(time.Millisecond), percentile(lat, 0.95).Round(time.Millisecond), percentile(lat, 1).Round(time.Millisecond)))
	})
})

var _ = Describe("traffic between revisions", Ordered, func() {
	var ns string
	const name = "split"

	BeforeAll(func() {
		ns = newNamespace("kn-split")
		rev := func(tmpl, msg string, traffic string) string {
			return fmt.Sprintf(`apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: %s
spec:
  template:
    metadata:
      name: %s
      annotations: {autoscaling.knative.dev/min-scale: "1"}
    spec:
      containers:
        - image: %s
          env: [{name: MSG, value: %s}]
%s`, name, tmpl, echoImage, msg, traffic)
		}
		out, err := kubectlApply(ns, rev("split-one", "one", ""))
		Expect(err).NotTo(HaveOccurred(), out)
		waitReady(ns, name)
		out, err = kubectlApply(ns, rev("split-two", "two", `  traffic:
    - {revisionName: split-one, percent: 90}
    - {revisionName: split-two, percent: 10, tag: canary}
`))
		Expect(err).NotTo(HaveOccurred(), out)
		svc := waitReady(ns, name)
		Expect(svc.Status.Traffic).To(HaveLen(2))
		// A split is Knative's to make: direct routing leaves it to the
		// route (internal/operator/dispatch/direct).
		Expect(direct.Revision(svc)).To(BeEmpty())
	})

	It("splits 90/10 between two revisions within ±5 % over 500 requests", func() {
		const total = 500
		counts := map[string]int{}
		for range total {
			code, body, err := get(host(name, ns), "/env?name=MSG")
			Expect(err).NotTo(HaveOccurred())
			Expect(code).To(Equal(200), body)
			counts[strings.TrimSpace(body)]++
		}
		AddReportEntry("90/10 split over 500 requests", fmt.Sprintf("one=%d two=%d", counts["one"], counts["two"]))
		Expect(counts["one"] + counts["two"]).To(Equal(total))
		Expect(float64(counts["two"]) / total).To(BeNumerically("~", 0.10, 0.05))
	})

	It("routes a tag to its revision", func() {
		for range 20 {
			code, body, err := get(host("canary-"+name, ns), "/env?name=MSG")
			Expect(err).NotTo(HaveOccurred())
			Expect(code).To(Equal(200), body)
			Expect(strings.TrimSpace(body)).To(Equal("two"))
		}
	})
})
