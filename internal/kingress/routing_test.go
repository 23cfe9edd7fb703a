package kingress

import (
	"net/http"
	"testing"

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
