package kingress

import (
	"context"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"knative.dev/networking/pkg/apis/networking/v1alpha1"
)

func path(p string, splits ...v1alpha1.IngressBackendSplit) v1alpha1.HTTPIngressPath {
	return v1alpha1.HTTPIngressPath{Path: p, Splits: splits}
}

// TestHostRouting: each host reaches its own Service; an unknown host is 404.
func TestHostRouting(t *testing.T) {
	ns := namespace(t)
	a, b := newBackend(t, "a", nil), newBackend(t, "b", nil)
	publish(t, ns, "svc-a", true, a.addr)
	publish(t, ns, "svc-b", true, b.addr)
	createIngress(t, ns, "hosts",
		rule(v1alpha1.IngressVisibilityExternalIP, []string{"a.example.com"}, path("", splitTo(ns, "svc-a", 100, nil))),
		rule(v1alpha1.IngressVisibilityExternalIP, []string{"b.example.com"}, path("", splitTo(ns, "svc-b", 100, nil))),
	)
	ing := waitReady(t, ns, "hosts")
	if lb := ing.Status.PublicLoadBalancer; lb == nil || len(lb.Ingress) != 1 || lb.Ingress[0].DomainInternal != "ziptrail-ingress.knative-serving.svc.cluster.local" {
		t.Errorf("public load balancer = %+v", lb)
	}
	if lb := ing.Status.PrivateLoadBalancer; lb == nil || len(lb.Ingress) != 1 || lb.Ingress[0].DomainInternal != "ziptrail-ingress-internal.knative-serving.svc.cluster.local" {
		t.Errorf("private load balancer = %+v", lb)
	}
	for _, tc := range []struct{ host, want string }{{"a.example.com", "a"}, {"b.example.com", "b"}, {"A.Example.COM:80", "a"}} {
		code, e, body := get(t, extAddr, tc.host, "/x", nil)
		if code != http.StatusOK || e.Name != tc.want {
			t.Errorf("Host %s: %d %q, want 200 from %s", tc.host, code, body, tc.want)
		}
		if e.Host != tc.host {
			t.Errorf("Host %s reached the backend as %q", tc.host, e.Host)
		}
	}
	code, _, body := get(t, extAddr, "unknown.example.com", "/", nil)
	if code != http.StatusNotFound {
		t.Errorf("unknown host: %d %q, want 404", code, body)
	}
}

// TestPathRouting: the longest matching path prefix wins.
func TestPathRouting(t *testing.T) {
	ns := namespace(t)
	a, b, c := newBackend(t, "a", nil), newBackend(t, "b", nil), newBackend(t, "c", nil)
	publish(t, ns, "svc-a", true, a.addr)
	publish(t, ns, "svc-b", true, b.addr)
	publish(t, ns, "svc-c", true, c.addr)
	createIngress(t, ns, "paths", rule(v1alpha1.IngressVisibilityExternalIP, []string{"paths.example.com"},
		path("/", splitTo(ns, "svc-c", 100, nil)),
		path("/foo", splitTo(ns, "svc-a", 100, nil)),
		path("/foo/bar", splitTo(ns, "svc-b", 100, nil)),
	))
	waitReady(t, ns, "paths")
	for p, want := range map[string]string{"/foo": "a", "/foo/x": "a", "/foo/bar/baz": "b", "/": "c", "/other": "c"} {
		code, e, body := get(t, extAddr, "paths.example.com", p, nil)
		if code != http.StatusOK || e.Name != want || e.Path != p {
			t.Errorf("%s: %d %q, want 200 from %s with the path unchanged", p, code, body, want)
		}
	}
}

// TestSplit9010: a 90/10 split is observed within ±5 % over 1000 requests.
func TestSplit9010(t *testing.T) {
	ns := namespace(t)
	a, b := newBackend(t, "a", nil), newBackend(t, "b", nil)
	publish(t, ns, "svc-a", true, a.addr)
	publish(t, ns, "svc-b", true, b.addr)
	createIngress(t, ns, "split", rule(v1alpha1.IngressVisibilityExternalIP, []string{"split.example.com"},
		path("", splitTo(ns, "svc-a", 90, map[string]string{"X-Split": "a"}), splitTo(ns, "svc-b", 10, map[string]string{"X-Split": "b"}))))
	waitReady(t, ns, "split")
	const n = 1000
	counts := map[string]int{}
	for range n {
		code, e, body := get(t, extAddr, "split.example.com", "/", nil)
		if code != http.StatusOK {
			t.Fatalf("%d %q", code, body)
		}
		if got := e.Headers.Get("X-Split"); got != e.Name {
			t.Fatalf("split %s got the appended header of split %q", e.Name, got)
		}
		counts[e.Name]++
	}
	share := float64(counts["a"]) / n
	t.Logf("90/10 split over %d requests: a=%d b=%d (%.1f %%)", n, counts["a"], counts["b"], 100*share)
	if share < 0.85 || share > 0.95 {
		t.Errorf("a got %.1f %% of %d requests, want 90 ± 5 %%", 100*share, n)
	}
}

// TestTagHeaderRouting: a path matching Knative-Serving-Tag reaches the
// tagged revision, the default path everything else.
func TestTagHeaderRouting(t *testing.T) {
	ns := namespace(t)
	a, b := newBackend(t, "a", nil), newBackend(t, "b", nil)
	publish(t, ns, "svc-a", true, a.addr)
	publish(t, ns, "svc-b", true, b.addr)
	tagged := path("", splitTo(ns, "svc-b", 100, nil))
	tagged.Headers = map[string]v1alpha1.HeaderMatch{"Knative-Serving-Tag": {Exact: "candidate"}}
	tagged.AppendHeaders = map[string]string{"Knative-Serving-Tag": "candidate"}
	createIngress(t, ns, "tags", rule(v1alpha1.IngressVisibilityExternalIP, []string{"tags.example.com"},
		tagged, path("", splitTo(ns, "svc-a", 100, nil))))
	waitReady(t, ns, "tags")
	for _, tc := range []struct {
		tag, want string
	}{{"candidate", "b"}, {"", "a"}, {"other", "a"}} {
		h := map[string]string{}
		if tc.tag != "" {
			h["Knative-Serving-Tag"] = tc.tag
		}
		code, e, body := get(t, extAddr, "tags.example.com", "/", h)
		if code != http.StatusOK || e.Name != tc.want {
			t.Errorf("tag %q: %d %q, want 200 from %s", tc.tag, code, body, tc.want)
		}
	}
}

// TestAppendHeadersAndRewriteHost: the rule's and the split's appendHeaders
// overwrite what the client sent; rewriteHost replaces the Host header.
func TestAppendHeadersAndRewriteHost(t *testing.T) {
	ns := namespace(t)
	a := newBackend(t, "a", nil)
	publish(t, ns, "svc-a", true, a.addr)
	p := path("", splitTo(ns, "svc-a", 100, map[string]string{"X-Split-Header": "split"}))
	p.AppendHeaders = map[string]string{"X-Route-Header": "route"}
	rw := path("/rewrite", splitTo(ns, "svc-a", 100, nil))
	rw.RewriteHost = "rewritten.ns.svc.cluster.local"
	createIngress(t, ns, "headers", rule(v1alpha1.IngressVisibilityExternalIP, []string{"headers.example.com"}, rw, p))
	waitReady(t, ns, "headers")
	code, e, body := get(t, extAddr, "headers.example.com", "/", map[string]string{"X-Route-Header": "forged", "X-Client": "kept"})
	if code != http.StatusOK {
		t.Fatalf("%d %q", code, body)
	}
	if got := e.Headers.Values("X-Route-Header"); len(got) != 1 || got[0] != "route" {
		t.Errorf("X-Route-Header = %q, want only \"route\"", got)
	}
	if got := e.Headers.Get("X-Split-Header"); got != "split" {
		t.Errorf("X-Split-Header = %q", got)
	}
	if got := e.Headers.Get("X-Client"); got != "kept" {
		t.Errorf("X-Client = %q, want the client's header passed on", got)
	}
	if got := e.Headers.Get("X-Forwarded-For"); got == "" {
		t.Errorf("no X-Forwarded-For")
	}
	code, e, body = get(t, extAddr, "headers.example.com", "/rewrite", nil)
	if code != http.StatusOK || e.Host != "rewritten.ns.svc.cluster.local" {
		t.Errorf("rewriteHost: %d %q, want Host rewritten.ns.svc.cluster.local", code, body)
	}
}

// TestVisibility: ClusterLocal hosts answer only on the cluster-local
// listener (also by their short names); ExternalIP hosts on both.
func TestVisibility(t *testing.T) {
	ns := namespace(t)
	a, b := newBackend(t, "a", nil), newBackend(t, "b", nil)
	publish(t, ns, "svc-a", true, a.addr)
	publish(t, ns, "svc-b", true, b.addr)
	local := "hello." + ns + ".svc.cluster.local"
	createIngress(t, ns, "vis",
		rule(v1alpha1.IngressVisibilityClusterLocal, []string{local}, path("", splitTo(ns, "svc-a", 100, nil))),
		rule(v1alpha1.IngressVisibilityExternalIP, []string{"hello.example.com"}, path("", splitTo(ns, "svc-b", 100, nil))),
	)
	waitReady(t, ns, "vis")
	for _, h := range []string{local, "hello." + ns + ".svc", "hello." + ns} {
		if code, e, body := get(t, locAddr, h, "/", nil); code != http.StatusOK || e.Name != "a" {
			t.Errorf("cluster-local listener, Host %s: %d %q, want a", h, code, body)
		}
		if code, _, body := get(t, extAddr, h, "/", nil); code != http.StatusNotFound {
			t.Errorf("external listener, cluster-local Host %s: %d %q, want 404", h, code, body)
		}
	}
	for _, addr := range []string{extAddr, locAddr} {
		if code, e, body := get(t, addr, "hello.example.com", "/", nil); code != http.StatusOK || e.Name != "b" {
			t.Errorf("%s, external host: %d %q, want b", addr, code, body)
		}
	}
}

// TestExternalNameToClusterService: a split to an ExternalName Service that
// names an in-cluster Service (as Knative's host-rewrite and route
// placeholder Services do) reaches that Service's endpoints without cluster
// DNS, and follows their changes.
func TestExternalNameToClusterService(t *testing.T) {
	ns := namespace(t)
	a, b := newBackend(t, "a", nil), newBackend(t, "b", nil)
	publish(t, ns, "svc-a", true, a.addr)
	ext := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ext"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "svc-a." + ns + ".svc.cluster.local",
			Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}
	if _, err := kube.CoreV1().Services(ns).Create(context.Background(), ext, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := path("", splitTo(ns, "ext", 100, nil))
	p.RewriteHost = "svc-a." + ns + ".svc.cluster.local"
	createIngress(t, ns, "extname", rule(v1alpha1.IngressVisibilityExternalIP, []string{"vanity.example.com"}, p))
	waitReady(t, ns, "extname")
	if code, e, body := get(t, extAddr, "vanity.example.com", "/", nil); code != http.StatusOK || e.Name != "a" || e.Host != p.RewriteHost {
		t.Fatalf("through the ExternalName Service: %d %q, want a with Host %s", code, body, p.RewriteHost)
	}
	setEndpoints(t, ns, "svc-a", true, b.addr)
	NewWithT(t).Eventually(func() string { _, e, _ := get(t, extAddr, "vanity.example.com", "/", nil); return e.Name }).
		WithTimeout(30 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal("b"))
}
