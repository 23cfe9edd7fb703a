package orchestrator

import (
	"context"
	"crypto/sha256"
	"sort"
	"sync"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

// DefaultProducerNodes bounds how many references' producer nodes the
// orchestrator remembers.
const DefaultProducerNodes = 1 << 16

// producerNodes remembers the node of the pod that produced each reference
// reported over the control stream, so the dispatcher can name it to
// activator-ext (invocation.HeaderProducerNode). It holds at most max
// entries, forgetting the oldest first: a forgotten reference only loses
// its locality preference. Entries are keyed by a digest of namespace and
// reference, so their size does not depend on what a sidecar sends. Safe
// for concurrent use.
type producerNodes struct {
	mu    sync.Mutex
	max   int
	nodes map[[32]byte]string
	order [][32]byte // keys in insertion order, a ring once full
	next  int        // the oldest key's index once full
}

func newProducerNodes(max int) *producerNodes {
	if max <= 0 {
		max = DefaultProducerNodes
	}
	return &producerNodes{max: max, nodes: map[[32]byte]string{}}
}

func producerKey(namespace, ref string) [32]byte {
	return sha256.Sum256([]byte(namespace + "\x00" + ref))
}

// remember notes that namespace's ref was produced on node. A node that is
// not a valid node name is ignored (it can only be a Hello's hint).
func (p *producerNodes) remember(namespace, ref, node string) {
	if ref == "" || node == "" || len(validation.IsDNS1123Subdomain(node)) > 0 {
		return
	}
	k := producerKey(namespace, ref)
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.nodes[k]; ok {
		p.nodes[k] = node // keeps its place in line: every key is in order once
		return
	}
	if len(p.order) < p.max {
		p.order = append(p.order, k)
	} else {
		delete(p.nodes, p.order[p.next])
		p.order[p.next] = k
		p.next = (p.next + 1) % p.max
	}
	p.nodes[k] = node
}

func (p *producerNodes) node(namespace, ref string) (string, bool) {
	k := producerKey(namespace, ref)
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.nodes[k]
	return n, ok
}

func (p *producerNodes) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.nodes)
}

// largest is the node of the producer of env's largest (Size) referenced
// object whose producer is known, "" when none is.
func (p *producerNodes) largest(env *invocation.Envelope) string {
	node, size := "", int64(-1)
	for _, ob := range env.Objects {
		if ob.Ref == "" {
			continue
		}
		if n, ok := p.node(env.Namespace, ob.Ref); ok && ob.Size > size {
			node, size = n, ob.Size
		}
	}
	return node
}

// producerNode is the dispatcher's Ziptrail-Producer-Node for env: the
// node of the producer of its largest referenced object whose node is
// known. A reference reported over the control stream (ObjectReady) was
// remembered with its pod's node; one that came back in a function's HTTP
// response (the usual path of a function's outputs) names its producer's
// data-plane address, sealed in it, and the node is that of the connected
// sidecar of the namespace serving that address (remembered from then on).
func (o *Orchestrator) producerNode(env *invocation.Envelope) string {
	objs := make([]invocation.Object, 0, len(env.Objects))
	for _, ob := range env.Objects {
		if ob.Ref != "" {
			objs = append(objs, ob)
		}
	}
	sort.SliceStable(objs, func(i, j int) bool { return objs[i].Size > objs[j].Size })
	for _, ob := range objs {
		if n, ok := o.producers.node(env.Namespace, ob.Ref); ok {
			return n
		}
		if n := o.nodeOfAddr(env.Namespace, ob.Ref); n != "" {
			o.producers.remember(env.Namespace, ob.Ref, n)
			return n
		}
	}
	return ""
}

// nodeOfAddr opens ref with its namespace's keys (its sealed expiry does
// not matter for a routing hint) and returns the node of the connected
// sidecar whose data-plane address it names, "" when none.
func (o *Orchestrator) nodeOfAddr(namespace, r string) string {
	ctl := o.opts.Control
	if ctl == nil || o.keys == nil || o.keys.src == nil {
		return ""
	}
	nk, err := o.keys.get(context.Background(), namespace)
	if err != nil {
		return ""
	}
	rec, err := nk.kr.OpenExpired(r)
	if err != nil {
		return ""
	}
	for _, id := range ctl.Sidecars(namespace) {
		if id.DataplaneAddr == rec.Addr && id.Node != "" {
			return id.Node
		}
	}
	return ""
}
