package kingress

import (
	"context"
	"net"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestAdvertise: the gateway Services named by the status host names point
// at the listeners (ports 80/443 → listener ports, an EndpointSlice with
// the advertised IP); a second run keeps the allocated node ports; a
// Service with a selector is not taken over.
func TestAdvertise(t *testing.T) {
	ns := namespace(t)
	var ls []net.Listener
	for range 3 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ls = append(ls, l)
	}
	o := &Options{External: ls[0], Local: ls[1], HTTPS: ls[2],
		PublicService: "gw." + ns + ".svc.cluster.local", PrivateService: "gw-internal." + ns + ".svc.cluster.local"}
	a := &Advertise{IP: hostIP, PublicType: corev1.ServiceTypeNodePort}
	ctx := context.Background()
	if err := advertise(ctx, kube, a, o); err != nil {
		t.Fatal(err)
	}
	pub, err := kube.CoreV1().Services(ns).Get(ctx, "gw", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	port := func(l net.Listener) int32 { return int32(l.Addr().(*net.TCPAddr).Port) }
	if pub.Spec.Type != corev1.ServiceTypeNodePort || len(pub.Spec.Ports) != 2 ||
		pub.Spec.Ports[0].Port != 80 || pub.Spec.Ports[0].TargetPort.IntVal != port(ls[0]) || pub.Spec.Ports[0].NodePort == 0 ||
		pub.Spec.Ports[1].Port != 443 || pub.Spec.Ports[1].TargetPort.IntVal != port(ls[2]) {
		t.Fatalf("public service: %+v", pub.Spec)
	}
	slice, err := kube.DiscoveryV1().EndpointSlices(ns).Get(ctx, "gw-internal-gateway", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(slice.Endpoints) != 1 || slice.Endpoints[0].Addresses[0] != hostIP || *slice.Ports[0].Port != port(ls[1]) {
		t.Fatalf("private endpointslice: %+v", slice)
	}
	if err := advertise(ctx, kube, a, o); err != nil {
		t.Fatalf("second run: %v", err)
	}
	again, _ := kube.CoreV1().Services(ns).Get(ctx, "gw", metav1.GetOptions{})
	if again.Spec.Ports[0].NodePort != pub.Spec.Ports[0].NodePort {
		t.Errorf("node port changed across runs: %d → %d", pub.Spec.Ports[0].NodePort, again.Spec.Ports[0].NodePort)
	}

	if _, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "taken"},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": "x"}, Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	o.PublicService = "taken." + ns + ".svc.cluster.local"
	if err := advertise(ctx, kube, a, o); err == nil || !strings.Contains(err.Error(), "selector") {
		t.Errorf("a Service with a selector: %v, want a refusal", err)
	}
	o.PublicService = "not-a-service-name"
	if err := advertise(ctx, kube, a, o); err == nil || !strings.Contains(err.Error(), "not a Service host name") {
		t.Errorf("bad host name: %v", err)
	}
}
