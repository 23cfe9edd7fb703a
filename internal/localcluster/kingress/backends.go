package kingress

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
)

// backendKey names a Service port as an Ingress split does.
type backendKey struct {
	namespace, name string
	port            intstr.IntOrString
}

func (k backendKey) String() string {
	return fmt.Sprintf("%s/%s:%s", k.namespace, k.name, k.port.String())
}

// endpoints is a resolved backend: the ready endpoint addresses (ip:port) of
// the Service port, or why there are none.
type endpoints struct {
	addrs []string
	h2c   bool
	// problem explains an empty addrs to the client (503 body).
	problem string
	// via are the in-cluster Services (namespace/name) an ExternalName
	// Service led to: their changes re-resolve this backend too.
	via []string
}

// Backend is one Service port that routes send to. Its endpoints are
// re-resolved whenever the Service or its EndpointSlices change, so routes
// keep pointing at the same Backend while pods come and go.
type Backend struct {
	key   backendKey
	state atomic.Pointer[endpoints]
	// next spreads requests over the endpoints.
	next atomic.Uint32
}

// current returns the endpoints in effect.
func (b *Backend) current() *endpoints { return b.state.Load() }

// Backends resolves Service ports to the ready addresses of their
// EndpointSlices, from informer caches.
type Backends struct {
	services corelisters.ServiceLister
	slices   discoverylisters.EndpointSliceLister

	mu sync.Mutex
	m  map[backendKey]*Backend
}

// NewBackends returns a registry reading the given listers.
func NewBackends(services corelisters.ServiceLister, slices discoverylisters.EndpointSliceLister) *Backends {
	return &Backends{services: services, slices: slices, m: map[backendKey]*Backend{}}
}

// get returns the Backend of a Service port, resolving it on first use.
func (bs *Backends) get(namespace, name string, port intstr.IntOrString) *Backend {
	k := backendKey{namespace: namespace, name: name, port: port}
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if b, ok := bs.m[k]; ok {
		return b
	}
	b := &Backend{key: k}
	b.state.Store(bs.resolve(k))
	bs.m[k] = b
	return b
}

// Refresh re-resolves every Backend of the Service namespace/name.
func (bs *Backends) Refresh(namespace, name string) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	nn := namespace + "/" + name
	for k, b := range bs.m {
		if (k.namespace == namespace && k.name == name) || slices.Contains(b.current().via, nn) {
			b.state.Store(bs.resolve(k))
		}
	}
}

// retain drops the Backends no route uses any more.
func (bs *Backends) retain(used map[*Backend]bool) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for k, b := range bs.m {
		if !used[b] {
			delete(bs.m, k)
		}
	}
}

// resolve reads the Service and its EndpointSlices: the Service port named
// by k.port gives the port name, the EndpointSlices' port of that name gives
// the number, and every ready endpoint address is used.
func (bs *Backends) resolve(k backendKey) *endpoints {
	return bs.resolveDepth(k, 0)
}

// maxExternalNameHops bounds chains of ExternalName Services.
const maxExternalNameHops = 4

func (bs *Backends) resolveDepth(k backendKey, depth int) *endpoints {
	svc, err := bs.services.Services(k.namespace).Get(k.name)
	if apierrors.IsNotFound(err) {
		return &endpoints{problem: fmt.Sprintf("service %s/%s does not exist", k.namespace, k.name)}
	} else if err != nil {
		return &endpoints{problem: fmt.Sprintf("service %s/%s: %v", k.namespace, k.name, err)}
	}
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		if (k.port.Type == intstr.Int && p.Port == k.port.IntVal) || (k.port.Type == intstr.String && p.Name == k.port.StrVal) {
			sp = p
			break
		}
	}
	if sp == nil {
		return &endpoints{problem: fmt.Sprintf("service %s/%s has no port %s", k.namespace, k.name, k.port.String())}
	}
	ep := &endpoints{h2c: isH2C(sp)}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		// An in-cluster name (name.ns.svc[.domain]) is resolved from the
		// API, as this gateway may not use the cluster's DNS; any other
		// name is dialled as is.
		if name, ns, ok := clusterServiceName(svc.Spec.ExternalName); ok {
			if depth >= maxExternalNameHops {
				return &endpoints{problem: fmt.Sprintf("service %s/%s: too many ExternalName hops", k.namespace, k.name)}
			}
			inner := bs.resolveDepth(backendKey{namespace: ns, name: name, port: intstr.FromInt32(sp.Port)}, depth+1)
			out := *inner
			out.via = append([]string{ns + "/" + name}, inner.via...)
			return &out
		}
		ep.addrs = []string{net.JoinHostPort(svc.Spec.ExternalName, strconv.Itoa(int(sp.Port)))}
		return ep
	}
	slices, err := bs.slices.EndpointSlices(k.namespace).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: k.name}))
	if err != nil {
		ep.problem = fmt.Sprintf("endpointslices of service %s/%s: %v", k.namespace, k.name, err)
		return ep
	}
	seen := map[string]bool{}
	for _, s := range slices {
		if s.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		for _, p := range s.Ports {
			if p.Port == nil || derefName(p.Name) != sp.Name {
				continue
			}
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && !*e.Conditions.Ready {
					continue
				}
				for _, a := range e.Addresses {
					addr := net.JoinHostPort(a, strconv.Itoa(int(*p.Port)))
					if !seen[addr] {
						seen[addr] = true
						ep.addrs = append(ep.addrs, addr)
					}
				}
			}
		}
	}
	if len(ep.addrs) == 0 {
		ep.problem = fmt.Sprintf("service %s/%s port %s has no ready endpoints", k.namespace, k.name, k.port.String())
	}
	return ep
}

// clusterServiceName splits an in-cluster Service host name
// (name.namespace.svc, optionally followed by the cluster domain).
func clusterServiceName(host string) (name, namespace string, ok bool) {
	parts := strings.Split(strings.TrimSuffix(strings.ToLower(host), "."), ".")
	if len(parts) < 3 || parts[2] != "svc" || parts[0] == "" || parts[1] == "" {
		return "", "", false
	}
	return parts[0], parts[1], true
}

func derefName(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// isH2C reports whether a Service port speaks cleartext HTTP/2, by the port
// name Knative gives it (http2, h2c) or its appProtocol.
func isH2C(p *corev1.ServicePort) bool {
	if p.Name == "http2" || p.Name == "h2c" {
		return true
	}
	return p.AppProtocol != nil && *p.AppProtocol == "kubernetes.io/h2c"
}
