package kingress

import (
	"context"
	"encoding/hex"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"knative.dev/networking/pkg/apis/networking/v1alpha1"
	"knative.dev/networking/pkg/ingress"
)

// specHash is the hash the prober expects for the stored Ingress.
func specHash(t *testing.T, ing *v1alpha1.Ingress) string {
	t.Helper()
	c := ing.DeepCopy()
	c.SetDefaults(context.Background())
	h, err := ingress.ComputeHash(c)
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h[:])
}

// TestReadyOnlyOnceServed changes the route of a Ready Ingress to a new
// backend that refuses probes: the Ingress must not be Ready for the new
// generation while probes carrying the new spec's hash fail, and goes Ready
// once the new route answers them; then the new backend serves.
func TestReadyOnlyOnceServed(t *testing.T) {
	g := NewWithT(t)
	ns := namespace(t)
	a, b := newBackend(t, "a", nil), newBackend(t, "b", nil)
	b.probeHold = make(chan struct{})
	publish(t, ns, "svc-a", true, a.addr)
	publish(t, ns, "svc-b", true, b.addr)
	createIngress(t, ns, "gen", rule(v1alpha1.IngressVisibilityExternalIP, []string{"gen.example.com"}, path("", splitTo(ns, "svc-a", 100, nil))))
	ing := waitReady(t, ns, "gen")
	if code, e, _ := get(t, extAddr, "gen.example.com", "/", nil); code != http.StatusOK || e.Name != "a" {
		t.Fatalf("generation 1 not served by a: %d %+v", code, e)
	}
	gen1 := specHash(t, ing)
	ing.Spec.Rules[0].HTTP.Paths[0].Splits[0].ServiceName = "svc-b"
	ing, err := netcs.NetworkingV1alpha1().Ingresses(ns).Update(context.Background(), ing, metav1.UpdateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	want := specHash(t, ing)
	// Two refused probes with the new hash: the prober retried at least once.
	g.Eventually(func() int {
		n := 0
		for _, h := range b.probes() {
			if h == want {
				n++
			}
		}
		return n
	}).WithTimeout(60 * time.Second).WithPolling(20 * time.Millisecond).Should(BeNumerically(">=", 2))
	cur, err := netcs.NetworkingV1alpha1().Ingresses(ns).Get(context.Background(), "gen", metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	if cur.IsReady() {
		t.Fatalf("generation %d is Ready although no probe of its hash succeeded: %+v", cur.Generation, cur.Status)
	}
	close(b.probeHold)
	ready := waitReady(t, ns, "gen")
	g.Expect(ready.Status.ObservedGeneration).To(Equal(ing.Generation))
	if code, e, body := get(t, extAddr, "gen.example.com", "/", nil); code != http.StatusOK || e.Name != "b" {
		t.Fatalf("Ready generation %d not served by b: %d %q", ready.Generation, code, body)
	}
	if !slices.Contains(a.probes(), gen1) {
		t.Errorf("generation 1 went Ready without a probe carrying its hash reaching a")
	}
}

// TestNoReadyEndpoints: a backend without ready endpoints answers 503 with
// the reason, the Ingress stays not Ready, and it goes Ready when an
// endpoint turns ready (EndpointSlice updates reach the proxy).
func TestNoReadyEndpoints(t *testing.T) {
	ns := namespace(t)
	a := newBackend(t, "a", nil)
	publish(t, ns, "svc-a", false, a.addr)
	createIngress(t, ns, "unready",
		rule(v1alpha1.IngressVisibilityExternalIP, []string{"unready.example.com"}, path("", splitTo(ns, "svc-a", 100, nil))),
		rule(v1alpha1.IngressVisibilityExternalIP, []string{"missing.example.com"}, path("", splitTo(ns, "nonexistent", 100, nil))),
	)
	g := NewWithT(t)
	g.Eventually(func() string {
		code, _, body := get(t, extAddr, "unready.example.com", "/", nil)
		if code != http.StatusServiceUnavailable {
			return ""
		}
		return body
	}).WithTimeout(30 * time.Second).WithPolling(20 * time.Millisecond).Should(ContainSubstring("service " + ns + "/svc-a port 80 has no ready endpoints"))
	code, _, body := get(t, extAddr, "missing.example.com", "/", nil)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "service "+ns+"/nonexistent does not exist") {
		t.Errorf("missing service: %d %q", code, body)
	}
	cur, err := netcs.NetworkingV1alpha1().Ingresses(ns).Get(context.Background(), "unready", metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	if cur.IsReady() {
		t.Errorf("Ready with no endpoint behind it: %+v", cur.Status)
	}
	setEndpoints(t, ns, "svc-a", true, a.addr)
	g.Eventually(func() int { c, _, _ := get(t, extAddr, "unready.example.com", "/", nil); return c }).
		WithTimeout(30 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal(http.StatusOK))
}

// TestIngressClass: Ingresses of another class, or without one, are left
// exactly as created (no status, no finalizer); a host claimed twice is a
// DomainConflict for the second Ingress; deletion removes the routes.
func TestIngressClassConflictAndDeletion(t *testing.T) {
	g := NewWithT(t)
	ns := namespace(t)
	a := newBackend(t, "a", nil)
	publish(t, ns, "svc-a", true, a.addr)
	spec := v1alpha1.IngressSpec{Rules: []v1alpha1.IngressRule{rule(v1alpha1.IngressVisibilityExternalIP, []string{"class.example.com"}, path("", splitTo(ns, "svc-a", 100, nil)))}}
	for name, ann := range map[string]map[string]string{
		"other-class": {"networking.knative.dev/ingress.class": "istio.ingress.networking.knative.dev"},
		"no-class":    nil,
		"empty-class": {"networking.knative.dev/ingress.class": ""},
	} {
		_, err := netcs.NetworkingV1alpha1().Ingresses(ns).Create(context.Background(), &v1alpha1.Ingress{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann}, Spec: spec}, metav1.CreateOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		deleteAtEnd(t, ns, name)
	}
	createIngress(t, ns, "first", spec.Rules...)
	waitReady(t, ns, "first")
	createIngress(t, ns, "second", spec.Rules...)
	g.Eventually(func(g Gomega) {
		cur, err := netcs.NetworkingV1alpha1().Ingresses(ns).Get(context.Background(), "second", metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		c := cur.Status.GetCondition(v1alpha1.IngressConditionLoadBalancerReady)
		g.Expect(c).NotTo(BeNil())
		g.Expect(string(c.Reason)).To(Equal("DomainConflict"))
		g.Expect(c.Message).To(ContainSubstring(ns + "/first"))
	}).WithTimeout(30 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
	for _, name := range []string{"other-class", "no-class", "empty-class"} {
		cur, err := netcs.NetworkingV1alpha1().Ingresses(ns).Get(context.Background(), name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		if len(cur.Finalizers) != 0 || len(cur.Status.Conditions) != 0 || cur.Status.ObservedGeneration != 0 {
			t.Errorf("ingress %s of another class was touched: finalizers %v, status %+v", name, cur.Finalizers, cur.Status)
		}
	}
	// When the holder goes, the refused Ingress takes the host over.
	g.Expect(netcs.NetworkingV1alpha1().Ingresses(ns).Delete(context.Background(), "first", metav1.DeleteOptions{})).To(Succeed())
	waitReady(t, ns, "second")
	if code, e, body := get(t, extAddr, "class.example.com", "/", nil); code != http.StatusOK || e.Name != "a" {
		t.Errorf("after the holder's deletion: %d %q", code, body)
	}
	g.Expect(netcs.NetworkingV1alpha1().Ingresses(ns).Delete(context.Background(), "second", metav1.DeleteOptions{})).To(Succeed())
	g.Eventually(func() int { c, _, _ := get(t, extAddr, "class.example.com", "/", nil); return c }).
		WithTimeout(30 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal(http.StatusNotFound))
}
