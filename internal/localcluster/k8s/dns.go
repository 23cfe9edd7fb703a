package k8s

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/ziptrail/ziptrail/internal/tools/paths"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// Cluster DNS is CoreDNS as a process on the host, listening on HostIP:1053,
// behind the Service kube-system/kube-dns (ClusterIP: the service range's
// 10th address, port 53) whose EndpointSlice this package writes, since the
// Service has no selector. A host process rather than a pod: DNS is up
// before any node is, it does not depend on the node agent or its image
// catalog, and its endpoint never changes.
const dnsPort = 1053

// managedBy marks the objects this package writes.
const managedBy = "k8s.ziptrail.dev"

// bootstrap creates the RBAC bindings of the node agent and CoreDNS and the
// kube-dns Service with its EndpointSlice.
func (c *Cluster) bootstrap(ctx context.Context, _ *http.Client, _ func(string, ...any)) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	objs := []func() error{
		func() error {
			// The node agent is a kubelet for several nodes at once, so it
			// cannot use the Node authorizer (one identity per node); it gets
			// the kubelet's RBAC role.
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: meta("ziptrail:node-agent"),
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node"},
				Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "Group", Name: "system:nodes"}},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
				ObjectMeta: meta("ziptrail:coredns"),
				Rules: []rbacv1.PolicyRule{
					{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
					{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
				},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: meta("ziptrail:coredns"),
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "ziptrail:coredns"},
				Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "system:ziptrail:coredns"}},
			}, metav1.CreateOptions{})
			return err
		},
		func() error { return createDNSService(ctx, cs, c.State.DNSIP, c.State.HostIP) },
	}
	for _, create := range objs {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("bootstrap objects: %w", err)
		}
	}
	return nil
}

func meta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/managed-by": managedBy}}
}

func createDNSService(ctx context.Context, cs kubernetes.Interface, clusterIP, hostIP string) error {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system", Labels: map[string]string{
			"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS", "app.kubernetes.io/managed-by": managedBy,
		}},
		Spec: corev1.ServiceSpec{
			ClusterIP: clusterIP,
			Ports: []corev1.ServicePort{
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(dnsPort)},
				{Name: "dns-tcp", Protocol: corev1.ProtocolTCP, Port: 53, TargetPort: intstr.FromInt32(dnsPort)},
			},
		},
	}
	if _, err := cs.CoreV1().Services("kube-system").Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns-host", Namespace: "kube-system", Labels: map[string]string{
			discoveryv1.LabelServiceName: "kube-dns", discoveryv1.LabelManagedBy: managedBy,
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{hostIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
		}},
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("dns"), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(int32(dnsPort))},
			{Name: ptr.To("dns-tcp"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(dnsPort))},
		},
	}
	_, err := cs.DiscoveryV1().EndpointSlices("kube-system").Create(ctx, slice, metav1.CreateOptions{})
	return err
}

// coreDNS writes the Corefile and returns the CoreDNS component.
func (c *Cluster) coreDNS() (*Component, error) {
	hp, err := freePort("127.0.0.1")
	if err != nil {
		return nil, err
	}
	rp, err := freePort("127.0.0.1")
	if err != nil {
		return nil, err
	}
	d := c.opts.ClusterDomain
	corefile := fmt.Sprintf(`.:%d {
    bind %s
    errors
    health %s
    ready %s
    kubernetes %s in-addr.arpa ip6.arpa {
        kubeconfig %s ziptrail-local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    forward . /etc/resolv.conf
    cache 5
    loop
    loadbalance
}
`, dnsPort, c.State.HostIP, hostPort("127.0.0.1", hp), hostPort("127.0.0.1", rp), d, c.dir("coredns.kubeconfig"))
	path := c.dir("Corefile")
	if err := os.WriteFile(path, []byte(corefile), 0o644); err != nil {
		return nil, err
	}
	// /ready answers once the kubernetes plugin has synced its caches.
	return c.component("coredns", c.opts.CoreDNS, []string{"-conf", path}, "http://"+hostPort("127.0.0.1", rp)+"/ready"), nil
}

func repoRoot() string { return paths.RepoRoot() }

// WaitDefaultServiceAccount waits until the namespace's default
// ServiceAccount exists: the ServiceAccount admission plugin rejects pods
// until the controller-manager has created it.
func WaitDefaultServiceAccount(ctx context.Context, cs kubernetes.Interface, namespace string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := cs.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("namespace %s has no default ServiceAccount after 30s (is kube-controller-manager running?): %w", namespace, err)
		case <-tick.C:
		}
	}
}
