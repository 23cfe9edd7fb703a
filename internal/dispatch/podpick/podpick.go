// Package podpick chooses a ready pod of a revision for one request, as
// Knative's activator does: on the producer's node first, else the less
// loaded of two picked at random, counting the chooser's own requests in
// flight per pod against the revision's containerConcurrency. The
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

// Pick chooses among pods one with room (cc 0: no limit) — on node when
// one is, else the less loaded of two random choices, else any with room
// — counts a request in flight to it and returns its address and done,
// to be called once when the request ended; "" and nil when no pod has
// room (the route takes the request: the activator holds it, as it would
// for a pod at its concurrency).
func (f *Inflight) Pick(pods []Pod, cc int, node string) (string, func()) {
	if len(pods) == 0 {
		return "", nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	addr := pick(pods, cc, node, f.n)
	if addr == "" {
		return "", nil
	}
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

func pick(pods []Pod, cc int, node string, inflight map[string]int) string {
	room := func(p Pod) bool { return cc <= 0 || inflight[p.Addr] < cc }
	if node != "" {
		best, load := "", -1
		for _, p := range pods {
			if p.Node == node && room(p) && (load < 0 || inflight[p.Addr] < load) {
				best, load = p.Addr, inflight[p.Addr]
			}
		}
		if best != "" {
			return best
		}
	}
	a, b := pods[rand.IntN(len(pods))], pods[rand.IntN(len(pods))]
	if inflight[b.Addr] < inflight[a.Addr] {
		a, b = b, a
	}
	for _, p := range []Pod{a, b} {
		if room(p) {
			return p.Addr
		}
	}
	start := rand.IntN(len(pods))
	for i := range pods {
		if p := pods[(start+i)%len(pods)]; room(p) {
			return p.Addr
		}
	}
	return ""
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
