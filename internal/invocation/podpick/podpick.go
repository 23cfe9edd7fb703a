// Package podpick chooses a ready pod of a revision for one request, as
// Knative's activator does: on the producer's node first, else the less
// loaded of two picked at random, by the chooser's own requests in flight
// per pod. Only revisions without a concurrency limit are routed directly
// (direct.Unbounded), so no pod is ever full. The
// operator's Router (package direct) and a producer's sidecar firing a
// delegated trigger share it. It imports no Kubernetes package:
// queue-proxy-zl links it.
package podpick

import (
	"math/rand/v2"
	"sync"
)

// Pod is a ready pod of a revision: its queue-proxy's address (host:port)
// and its node.
type Pod struct{ Addr, Node string }

// Inflight counts requests in flight per pod address. The zero value is
// ready; safe for concurrent use.
type Inflight struct {
	mu sync.Mutex
	n  map[string]int
}

// Pick chooses among pods — the least loaded on node when one is, else
// the less loaded of two random choices — counts a request in flight to
// it and returns its address and done, to be called once when the
// request ended; "" and nil when pods is empty (the route takes the
// request).
func (f *Inflight) Pick(pods []Pod, node string) (string, func()) {
	if len(pods) == 0 {
		return "", nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	addr := pick(pods, node, f.n)
	if f.n == nil {
		f.n = map[string]int{}
	}
	f.n[addr]++
	var once sync.Once
	return addr, func() { once.Do(func() { f.release(addr) }) }
}

func (f *Inflight) release(addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[addr] <= 1 {
		delete(f.n, addr)
	} else {
		f.n[addr]--
	}
}

func pick(pods []Pod, node string, inflight map[string]int) string {
	if node != "" {
		best, load := "", -1
		for _, p := range pods {
			if p.Node == node && (load < 0 || inflight[p.Addr] < load) {
				best, load = p.Addr, inflight[p.Addr]
			}
		}
		if best != "" {
			return best
		}
	}
	a, b := pods[rand.IntN(len(pods))], pods[rand.IntN(len(pods))]
	if inflight[b.Addr] < inflight[a.Addr] {
		return b.Addr
	}
	return a.Addr
}

// Without returns pods without addr (a copy).
func Without(pods []Pod, addr string) []Pod {
	out := make([]Pod, 0, len(pods))
	for _, p := range pods {
		if p.Addr != addr {
			out = append(out, p)
		}
	}
	return out
}
