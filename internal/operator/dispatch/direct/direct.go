// Package direct picks, for each invocation the operator's dispatcher
// sends, a ready pod of the function's Knative revision, so that the
// request goes straight to that pod's queue-proxy instead of through
// Knative's ingress and activator — as Knative's activator itself picks a
// pod once a revision has some (docs/dispatch.md, "Direct routing").
//
// What it relies on of Knative, pinned against the real Knative by
// e2e/knative/direct_test.go: a revision's private Service (the
// ServerlessService's, `<revision>-private`) selects the revision's pods;
// its EndpointSlices carry the revision's and the service type's labels
// (serving.knative.dev/revision, networking.internal.knative.dev/serviceType
// = Private) and a port named "http" that is queue-proxy's serving port;
// an endpoint is ready when queue-proxy's readiness probe passes. A
// Service whose traffic is split or rolling out, a revision with no ready
// pod (scaled to zero, cold), an h2c revision (no "http" port) and a
// revision with a containerConcurrency limit (Unbounded) are all sent by
// the route, so scale-from-zero, Knative's buffering, traffic splits and
// hard concurrency limits stay Knative's. Queue-proxy
// counts the requests it serves, so the autoscaler sees the direct load
// as it sees the activator's.
package direct

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	netapi "knative.dev/networking/pkg/apis/networking"
	"knative.dev/serving/pkg/apis/serving"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	"knative.dev/serving/pkg/networking"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/invocation/call"
	"github.com/ziptrail/ziptrail/internal/invocation/podpick"
)

// DefaultTTL is how long a Service's revision and that revision's ready
// pods are kept before they are read again (from the manager's cache).
const DefaultTTL = 500 * time.Millisecond

// PortName is the name of queue-proxy's HTTP/1 serving port on a
// revision's private Service (networking.ServicePortNameHTTP1).
const PortName = netapi.ServicePortNameHTTP1

// Router is a call.Router over a Kubernetes client (the operator's
// cache): Knative Services for their revision, the revisions' private
// EndpointSlices for their ready pods. The zero value is not usable; set
// Reader.
type Router struct {
	Reader client.Reader
	TTL    time.Duration    // default DefaultTTL
	Now    func() time.Time // default time.Now

	mu       sync.Mutex
	services map[string]*service // namespace/service
	inflight podpick.Inflight    // requests sent straight to each pod and not ended
	// unreachable: pods that took no connection, until when they are
	// left out whatever their EndpointSlices say (a NetworkPolicy that
	// drops the operator's packets would otherwise cost a dial timeout
	// at every read).
	unreachable map[string]time.Time
}

// UnreachableFor is how long a pod that took no connection is left out.
const UnreachableFor = 10 * time.Second

// service is what one Knative Service routes to, read at most every TTL.
type service struct {
	read time.Time
	pods []Pod // its ready pods
	// refreshing: a read is under way; others use what is known.
	refreshing bool
}

// Pod is a ready pod of a revision: its queue-proxy's address and its node.
type Pod = podpick.Pod

var _ call.Router = (*Router)(nil)

// Pick implements call.Router: a ready pod with room on node when there
// is one, else the less loaded of two picked at random among those with
// room (podpick); "" when none (the route takes it).
func (r *Router) Pick(env *invocation.Envelope, node string) (string, func(call.Verdict)) {
	svc := r.service(env.Namespace, env.Function)
	if svc == nil || len(svc.pods) == 0 {
		return "", nil
	}
	addr, done := r.inflight.Pick(svc.pods, node)
	if addr == "" {
		return "", nil
	}
	return addr, func(v call.Verdict) {
		done()
		switch v {
		case call.Overloaded:
			// Not this pod, until the next read says otherwise.
			r.forget(env.Namespace, env.Function, addr, time.Time{})
		case call.Unreached:
			r.forget(env.Namespace, env.Function, addr, r.now().Add(UnreachableFor))
		}
	}
}

// Ready returns the ready pods of the revision a Knative Service's
// traffic all goes to (none: the route).
func (r *Router) Ready(namespace, service string) []Pod {
	svc := r.service(namespace, service)
	if svc == nil {
		return nil
	}
	return svc.pods
}

// forget drops addr from a Service's pods, and from what later reads
// find until until (zero: the next read may find it again).
func (r *Router) forget(namespace, name, addr string, until time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !until.IsZero() {
		if r.unreachable == nil {
			r.unreachable = map[string]time.Time{}
		}
		r.unreachable[addr] = until
	}
	svc := r.services[namespace+"/"+name]
	if svc == nil {
		return
	}
	cp := *svc
	cp.pods = podpick.Without(svc.pods, addr)
	r.services[namespace+"/"+name] = &cp
}

// service returns what namespace/name routes to, reading it again when
// it is older than the TTL (one reader at a time; the others use the old
// one, or the route when there is none yet).
func (r *Router) service(namespace, name string) *service {
	now := r.now()
	key := namespace + "/" + name
	r.mu.Lock()
	svc := r.services[key]
	fresh := svc != nil && now.Sub(svc.read) < r.ttl()
	if fresh || (svc != nil && svc.refreshing) {
		r.mu.Unlock()
		return svc
	}
	if r.services == nil {
		r.services = map[string]*service{}
	}
	if svc != nil {
		// Stale: this request goes where the last read said, and the
		// next ones where a read in the background says.
		cp := *svc
		cp.refreshing = true
		r.services[key] = &cp
		r.mu.Unlock()
		go r.refresh(namespace, name, now)
		return svc
	}
	r.services[key] = &service{refreshing: true}
	r.mu.Unlock()
	return r.refresh(namespace, name, now)
}

// refresh reads namespace/name and keeps what it read.
func (r *Router) refresh(namespace, name string, now time.Time) *service {
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	read := r.read(ctx, namespace, name)
	read.read = now
	r.mu.Lock()
	read.pods = r.reachable(read.pods, now)
	if len(r.services) >= maxServices {
		// Bounded: Services not invoked for a minute (deleted ones
		// among them) are read again when they are.
		for k, v := range r.services {
			if !v.refreshing && now.Sub(v.read) > time.Minute {
				delete(r.services, k)
			}
		}
	}
	r.services[namespace+"/"+name] = read
	r.mu.Unlock()
	return read
}

// maxServices is the number of Services kept before old ones are dropped.
const maxServices = 4096

// reachable is pods without those left out as unreachable at now (under
// the lock); it forgets what has expired.
func (r *Router) reachable(pods []Pod, now time.Time) []Pod {
	for addr, until := range r.unreachable {
		if !now.Before(until) {
			delete(r.unreachable, addr)
		} else {
			pods = podpick.Without(pods, addr)
		}
	}
	return pods
}

// readTimeout bounds one read of the cache (its first read of
// EndpointSlices waits for the informer's sync).
const readTimeout = 2 * time.Second

// read reads a Service's revision and its ready pods; on any failure, a
// service with none (the route is used until the next read).
func (r *Router) read(ctx context.Context, namespace, name string) *service {
	out := &service{}
	var ksvc servingv1.Service
	if err := r.Reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &ksvc); err != nil {
		return out
	}
	rev := Revision(&ksvc)
	if rev == "" || !Unbounded(&ksvc, rev) {
		return out
	}
	var slices discoveryv1.EndpointSliceList
	if err := r.Reader.List(ctx, &slices, client.InNamespace(namespace), client.MatchingLabels(SliceLabels(rev))); err != nil {
		return out
	}
	var pods corev1.PodList
	if err := r.Reader.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabels{serving.RevisionLabelKey: rev}); err != nil {
		return out
	}
	out.pods = ReadyPods(slices.Items, PodIPs(pods.Items))
	return out
}

// PodIPs are the addresses a revision's EndpointSlices may send the
// operator to: those of its running pods (listed by the revision's
// label, in the slices' namespace) on the pod network. EndpointSlices
// are the namespace's to write — a tenant allowed to create one could
// otherwise point the operator's requests, and the bearer of its
// invocations, at any address (another tenant's pod, a node, a service
// of the control plane). A pod's IP comes from the network plugin, not
// from its namespace, so the worst a forged pod or slice does is send a
// tenant's invocations to its own pod. Pods on the host's network
// (their IP is the node's) are left out.
func PodIPs(pods []corev1.Pod) map[string]bool {
	ips := map[string]bool{}
	for i := range pods {
		p := &pods[i]
		if p.Spec.HostNetwork || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		for _, ip := range p.Status.PodIPs {
			ips[ip.IP] = true
		}
		if p.Status.PodIP != "" {
			ips[p.Status.PodIP] = true
		}
	}
	return ips
}

// Unbounded reports whether revision, the one all of ksvc's traffic goes
// to, takes any number of requests at once (containerConcurrency 0, as
// Knative's webhook writes it into the template from config-defaults),
// and is the Service's latest (its template says so; not during a
// rollout). A revision with a hard limit is left to the route: Knative's
// activator then counts every request to its pods against the limit, and
// a second balancer counting apart from it (this operator, each of its
// replicas, each sidecar firing delegated triggers) would send a pod more
// than it takes; queue-proxy would queue the excess behind the running
// requests — a group of members that wait for each other (a collective)
// would never start.
func Unbounded(ksvc *servingv1.Service, revision string) bool {
	cc := ksvc.Spec.Template.Spec.ContainerConcurrency
	return cc != nil && *cc == 0 && ksvc.Status.LatestCreatedRevisionName == revision && ksvc.Status.LatestReadyRevisionName == revision
}

// Revision is the revision that all of a Knative Service's traffic goes
// to, "" when its traffic is split or not ready: such a Service is sent
// by the route.
func Revision(ksvc *servingv1.Service) string {
	if !ksvc.IsReady() {
		return ""
	}
	rev := ""
	for _, t := range ksvc.Status.Traffic {
		if t.Percent == nil || *t.Percent == 0 {
			continue
		}
		if *t.Percent != 100 || rev != "" {
			return ""
		}
		rev = t.RevisionName
	}
	return rev
}

// SliceLabels select a revision's private-Service EndpointSlices.
func SliceLabels(revision string) map[string]string {
	return map[string]string{serving.RevisionLabelKey: revision, networking.ServiceTypeKey: string(networking.ServiceTypePrivate)}
}

// ReadyPods are the ready, not terminating endpoints of the slices at their
// "http" port whose address is one of ips (PodIPs), each once, ordered by
// address.
func ReadyPods(list []discoveryv1.EndpointSlice, ips map[string]bool) []Pod {
	var pods []Pod
	seen := map[string]bool{}
	for i := range list {
		s := &list[i]
		port := int32(0)
		for _, p := range s.Ports {
			if p.Name != nil && *p.Name == PortName && p.Port != nil {
				port = *p.Port
			}
		}
		if port == 0 || (s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6) {
			continue
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready == nil || !*e.Conditions.Ready || (e.Conditions.Terminating != nil && *e.Conditions.Terminating) ||
				len(e.Addresses) == 0 || !ips[e.Addresses[0]] {
				continue
			}
			addr := net.JoinHostPort(e.Addresses[0], strconv.Itoa(int(port)))
			if seen[addr] {
				continue
			}
			seen[addr] = true
			node := ""
			if e.NodeName != nil {
				node = *e.NodeName
			}
			pods = append(pods, Pod{Addr: addr, Node: node})
		}
	}
	// In a stable order: the operator compares what it sends sidecars
	// with what it sent (the cache lists slices in no particular order).
	slices.SortFunc(pods, func(a, b Pod) int { return strings.Compare(a.Addr, b.Addr) })
	return pods
}

func (r *Router) ttl() time.Duration {
	if r.TTL > 0 {
		return r.TTL
	}
	return DefaultTTL
}

func (r *Router) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// CacheOptions restrict a manager's cache of EndpointSlices to Knative's
// private ones and of Pods to ziptrail functions' revision pods (the
// Router reads no other), so that the operator does not hold every
// EndpointSlice and Pod of the cluster; of a Pod the cache keeps only what
// PodIPs reads (slimPod).
func CacheOptions() map[client.Object]cache.ByObject {
	revisionPods, err := labels.Parse(serving.RevisionLabelKey + "," + labelWorkflow)
	if err != nil {
		panic(err) // constant
	}
	return map[client.Object]cache.ByObject{
		&discoveryv1.EndpointSlice{}: {Label: labels.SelectorFromSet(labels.Set{networking.ServiceTypeKey: string(networking.ServiceTypePrivate)})},
		&corev1.Pod{}:                {Label: revisionPods, Transform: slimPod},
	}
}

// labelWorkflow is on every pod of a ziptrail function (v1alpha1.LabelWorkflow;
// a test keeps them equal without this package importing the API).
const labelWorkflow = "ziptrail.dev/workflow"

// slimPod keeps of a cached Pod its identity, labels and what PodIPs reads.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			Labels: p.Labels, DeletionTimestamp: p.DeletionTimestamp},
		Spec:   corev1.PodSpec{HostNetwork: p.Spec.HostNetwork, NodeName: p.Spec.NodeName},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs},
	}, nil
}
