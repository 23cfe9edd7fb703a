package kingress

import (
	"context"
	"fmt"
	"net"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// Advertise makes the Services named by PublicService and PrivateService
// (name.namespace.svc…) point at this process's listeners, for a gateway
// that runs outside the cluster's pods (the local cluster runs it on the
// host): selectorless Services with their own EndpointSlice.
type Advertise struct {
	// IP is the address pods and the host reach the listeners at.
	IP string
	// PublicType is the public Service's type (ClusterIP when empty;
	// NodePort lets clients outside reach it through --ingressendpoint).
	PublicType corev1.ServiceType
}

// managedBy marks the EndpointSlices this gateway writes.
const managedBy = "ziptrail-ingress"

type servicePort struct {
	name   string
	port   int32
	target int
}

// advertise creates or updates the gateway Services and their EndpointSlices.
func advertise(ctx context.Context, cs kubernetes.Interface, a *Advertise, o *Options) error {
	if net.ParseIP(a.IP) == nil {
		return fmt.Errorf("advertise: %q is not an IP address", a.IP)
	}
	port := func(l net.Listener) int { return l.Addr().(*net.TCPAddr).Port }
	public := []servicePort{{"http2", 80, port(o.External)}}
	if o.HTTPS != nil {
		public = append(public, servicePort{"https", 443, port(o.HTTPS)})
	}
	for _, s := range []struct {
		host  string
		typ   corev1.ServiceType
		ports []servicePort
	}{
		{o.PublicService, a.PublicType, public},
		{o.PrivateService, corev1.ServiceTypeClusterIP, []servicePort{{"http2", 80, port(o.Local)}}},
	} {
		name, ns, ok := clusterServiceName(s.host)
		if !ok {
			return fmt.Errorf("advertise: %q is not a Service host name (name.namespace.svc…)", s.host)
		}
		if err := ensureService(ctx, cs, ns, name, s.typ, a.IP, s.ports); err != nil {
			return fmt.Errorf("advertise %s/%s: %w", ns, name, err)
		}
	}
	return nil
}

func ensureService(ctx context.Context, cs kubernetes.Interface, ns, name string, typ corev1.ServiceType, ip string, ports []servicePort) error {
	if typ == "" {
		typ = corev1.ServiceTypeClusterIP
	}
	want := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app.kubernetes.io/managed-by": managedBy}},
		Spec:       corev1.ServiceSpec{Type: typ},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-gateway", Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: managedBy}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(true)}}},
	}
	if net.ParseIP(ip).To4() == nil {
		slice.AddressType = discoveryv1.AddressTypeIPv6
	}
	for _, p := range ports {
		want.Spec.Ports = append(want.Spec.Ports, corev1.ServicePort{Name: p.name, Port: p.port, TargetPort: intstr.FromInt(p.target)})
		slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{Name: ptrTo(p.name), Port: ptrTo(int32(p.target))})
	}
	svcs := cs.CoreV1().Services(ns)
	cur, err := svcs.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err := svcs.Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return err
		}
	case err != nil:
		return err
	default:
		if len(cur.Spec.Selector) > 0 {
			return fmt.Errorf("the Service exists with a selector; it is not this gateway's to manage")
		}
		// Keep allocated node ports across restarts.
		for i := range want.Spec.Ports {
			for _, cp := range cur.Spec.Ports {
				if cp.Name == want.Spec.Ports[i].Name {
					want.Spec.Ports[i].NodePort = cp.NodePort
				}
			}
		}
		if typ == corev1.ServiceTypeClusterIP {
			for i := range want.Spec.Ports {
				want.Spec.Ports[i].NodePort = 0
			}
		}
		cur.Spec.Type, cur.Spec.Ports = want.Spec.Type, want.Spec.Ports
		if _, err := svcs.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	slices := cs.DiscoveryV1().EndpointSlices(ns)
	old, err := slices.Get(ctx, slice.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = slices.Create(ctx, slice, metav1.CreateOptions{})
	case err == nil:
		slice.ResourceVersion = old.ResourceVersion
		_, err = slices.Update(ctx, slice, metav1.UpdateOptions{})
	}
	return err
}

func ptrTo[T any](v T) *T { return &v }
