package activatorext

import (
	"context"
	"net"
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Throttler is the activator's throttler as its handler calls it (the same
// method set as knative.dev/serving/pkg/activator/handler.Throttler).
type Throttler interface {
	Try(ctx context.Context, revID types.NamespacedName, fn func(dest string, isClusterIP bool) error) error
}

// PodIndex answers which pods of a revision are ready on a node.
type PodIndex interface {
	// ReadyPodsOnNode returns the IPs of the revision's ready pods on node.
	ReadyPodsOnNode(revID types.NamespacedName, node string) ([]string, error)
	// NodeOf returns the node of the revision's pod with that IP ("" when unknown).
	NodeOf(revID types.NamespacedName, ip string) (string, error)
}

// LocalityThrottler wraps the activator's throttler. Knative's throttler
// still admits the request (revision capacity, queueing during a cold
// start) and picks a pod; when the request names a producer node and
// Knative's pod is elsewhere, the request goes to a ready pod of the
// revision on the producer's node instead, so the consumer pulls its
// largest object without crossing nodes. It falls back to Knative's choice
// when Knative routes through the ClusterIP, no local pod is ready, or every
// local pod already has ContainerConcurrency requests sent there by us.
type LocalityThrottler struct {
	Next Throttler
	Pods PodIndex
	// Concurrency returns the revision's container concurrency for the
	// request (0: unbounded). Nil means unbounded.
	Concurrency func(ctx context.Context) int
	Metrics     *Metrics

	mu       sync.Mutex
	inflight map[string]int // pod IP -> requests we redirected there, in flight
}

// Try implements Throttler.
func (t *LocalityThrottler) Try(ctx context.Context, revID types.NamespacedName, fn func(dest string, isClusterIP bool) error) error {
	zr := RequestFrom(ctx)
	if zr == nil {
		return t.Next.Try(ctx, revID, fn)
	}
	return t.Next.Try(ctx, revID, func(dest string, isClusterIP bool) error {
		zr.Dispatched(ctx)
		chosen, decision := t.choose(ctx, revID, zr.ProducerNode, dest, isClusterIP)
		t.Metrics.decision(ctx, decision)
		if chosen == dest {
			return fn(dest, isClusterIP)
		}
		host, _, _ := net.SplitHostPort(chosen)
		defer t.release(host)
		return fn(chosen, isClusterIP)
	})
}

// choose returns the destination for the request and why; a redirected
// destination's slot is taken (release it when the request ends).
func (t *LocalityThrottler) choose(ctx context.Context, revID types.NamespacedName, node, dest string, isClusterIP bool) (string, string) {
	if node == "" {
		return dest, DecisionNoProducerNode
	}
	if isClusterIP {
		return dest, DecisionClusterIP
	}
	host, port, err := net.SplitHostPort(dest)
	if err != nil {
		return dest, DecisionUnknownDest
	}
	if n, err := t.Pods.NodeOf(revID, host); err == nil && n == node {
		return dest, DecisionAlreadyLocal
	}
	local, err := t.Pods.ReadyPodsOnNode(revID, node)
	if err != nil || len(local) == 0 {
		return dest, DecisionNoLocalPod
	}
	cc := 0
	if t.Concurrency != nil {
		cc = t.Concurrency(ctx)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ip, ok := leastLoaded(local, t.inflight, cc)
	if !ok {
		return dest, DecisionLocalPodsBusy
	}
	if t.inflight == nil {
		t.inflight = map[string]int{}
	}
	t.inflight[ip]++
	return net.JoinHostPort(ip, port), DecisionLocal
}

func (t *LocalityThrottler) release(ip string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.inflight[ip] <= 1 {
		delete(t.inflight, ip)
	} else {
		t.inflight[ip]--
	}
}

// leastLoaded picks the candidate with the fewest requests in flight (ties:
// the lowest IP, for stable choices), skipping those at cc (cc 0: no limit).
func leastLoaded(candidates []string, inflight map[string]int, cc int) (string, bool) {
	sorted := append([]string(nil), candidates...)
	sort.Strings(sorted)
	best, bestLoad := "", -1
	for _, ip := range sorted {
		load := inflight[ip]
		if cc > 0 && load >= cc {
			continue
		}
		if bestLoad < 0 || load < bestLoad {
			best, bestLoad = ip, load
		}
	}
	return best, bestLoad >= 0
}

// EndpointsIndex is a PodIndex over the Endpoints of the revisions' private
// Services (the ones Knative's throttler watches): ready addresses carry
// their pod's node.
type EndpointsIndex struct {
	// List returns the private-service Endpoints of a revision.
	List func(revID types.NamespacedName) ([]*corev1.Endpoints, error)
}

// ReadyPodsOnNode implements PodIndex.
func (e EndpointsIndex) ReadyPodsOnNode(revID types.NamespacedName, node string) ([]string, error) {
	eps, err := e.List(revID)
	if err != nil {
		return nil, err
	}
	return ReadyIPsOnNode(eps, node), nil
}

// NodeOf implements PodIndex.
func (e EndpointsIndex) NodeOf(revID types.NamespacedName, ip string) (string, error) {
	eps, err := e.List(revID)
	if err != nil {
		return "", err
	}
	for _, ep := range eps {
		for _, ss := range ep.Subsets {
			for _, a := range ss.Addresses {
				if a.IP == ip && a.NodeName != nil {
					return *a.NodeName, nil
				}
			}
		}
	}
	return "", nil
}

// ReadyIPsOnNode returns the distinct ready addresses on node.
func ReadyIPsOnNode(eps []*corev1.Endpoints, node string) []string {
	var ips []string
	seen := map[string]bool{}
	for _, ep := range eps {
		for _, ss := range ep.Subsets {
			for _, a := range ss.Addresses {
				if a.NodeName != nil && *a.NodeName == node && !seen[a.IP] {
					seen[a.IP] = true
					ips = append(ips, a.IP)
				}
			}
		}
	}
	sort.Strings(ips)
	return ips
}
