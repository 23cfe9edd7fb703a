package orchestrator

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// A reference a sidecar reports over its control stream is remembered with
// the reporting pod's node; the invocation that consumes it names, in
// Ziptrail-Producer-Node, the node of its largest referenced object whose
// producer is known, and no node when none is.
func TestDispatchNamesTheProducerNode(t *testing.T) {
	wf := testWorkflow("loc", "split", "split", "map")
	wf.Spec.Triggers = []v1alpha1.NamedTrigger{{Name: "batch", Spec: v1alpha1.TriggerSpec{Bucket: "chunks", Primitive: v1alpha1.ByBatchSize,
		Targets: []string{"map"}, ByBatchSize: &v1alpha1.ByBatchSizeParams{Size: 3}}}}
	type call struct {
		keys  []string
		nodes []string // Ziptrail-Producer-Node values
	}
	splits, maps := make(chan call, 4), make(chan call, 4)
	record := func(calls chan<- call, outputs string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			env, err := invocation.Decode(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			c := call{keys: []string{env.Invocation}, nodes: r.Header.Values(invocation.HeaderProducerNode)}
			if calls == maps {
				c.keys = nil
				for _, ob := range env.Objects {
					c.keys = append(c.keys, ob.Key)
				}
				sort.Strings(c.keys)
			}
			calls <- c
			// What the producer's sidecar adds: the outputs it sent and
			// reports over the control stream.
			w.Header().Set(invocation.HeaderOutputsSent, outputs)
		}
	}
	fns := &servers.Functions{}
	fns.Add(t, "loc-split", record(splits, "6"))
	fns.Add(t, "loc-map", record(maps, "0"))
	o := runWorkflow(t, wf, fns)
	// The same workflow in another namespace, whose pods report one of the
	// references too: that tells nothing of this namespace's.
	other := wf.DeepCopy()
	other.Namespace = "other"
	if err := o.SetWorkflow(other, true, ""); err != nil {
		t.Fatal(err)
	}

	id, err := o.StartSession(context.Background(), "ns", "loc", []byte("in"))
	if err != nil {
		t.Fatal(err)
	}
	var split call
	select {
	case split = <-splits:
	case <-time.After(30 * time.Second):
		t.Fatal("split was not invoked")
	}
	if len(split.nodes) != 0 {
		t.Errorf("the entry invocation (inline input) names producer node %q", split.nodes)
	}
	inv := split.keys[0]
	report := func(ns, node, key, ref string, size int64, inline []byte) {
		t.Helper()
		from := control.Identity{Namespace: ns, Workflow: "loc", Function: "split", Pod: "loc-split-1", Node: node}
		if err := o.ObjectReady(context.Background(), from, &controlv1.ObjectReady{Session: id, Bucket: "chunks", Key: key, Size: size,
			Ref: ref, Inline: inline, ProducerFunction: "split", InvocationId: inv}); err != nil {
			t.Fatal(err)
		}
	}
	// First batch: c is the largest but its producer's node is unknown; a
	// is the largest with a known node.
	report("ns", "node-big", "a", "zt1.a", 1<<20, nil)
	report("ns", "node-small", "b", "zt1.b", 10, nil)
	report("ns", "", "c", "zt1.c", 1<<22, nil)
	// Second batch: no producer node known in this namespace.
	report("other", "node-other", "d", "zt1.d", 5, nil)
	report("ns", "", "d", "zt1.d", 5, nil)
	report("ns", "node-inline", "e", "", 1, []byte("e"))
	report("ns", "", "f", "zt1.f", 7, nil)

	want := map[string]string{"a,b,c": "[node-big]", "d,e,f": "[]"}
	for range want {
		select {
		case c := <-maps:
			k := strings.Join(c.keys, ",")
			if w, ok := want[k]; !ok {
				t.Errorf("map invoked with %s", k)
			} else if got := fmt.Sprint(c.nodes); got != w {
				t.Errorf("map invoked with %s: %s %s, want %s", k, invocation.HeaderProducerNode, got, w)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("map was not invoked for both batches")
		}
	}
}

func TestProducerNodesAreBounded(t *testing.T) {
	p := newProducerNodes(3)
	p.remember("ns", "r1", "n1")
	p.remember("ns", "r2", "n2")
	p.remember("ns", "r3", "n3")
	p.remember("ns", "r1", "n1b") // known: updated, nothing evicted
	if n, ok := p.node("ns", "r1"); !ok || n != "n1b" || p.len() != 3 {
		t.Fatalf("r1 -> %q %v, %d entries", n, ok, p.len())
	}
	p.remember("ns", "r4", "n4") // full: the oldest (r1) goes
	p.remember("ns", "r5", "n5") // then r2
	for ref, want := range map[string]string{"r1": "", "r2": "", "r3": "n3", "r4": "n4", "r5": "n5"} {
		if n, _ := p.node("ns", ref); n != want {
			t.Errorf("%s -> %q, want %q", ref, n, want)
		}
	}
	if p.len() != 3 {
		t.Errorf("%d entries, want at most 3", p.len())
	}
	// Other namespaces' references, and what no node is called, are not
	// this namespace's.
	p.remember("ns", "r6", "Not_A_Node\r\n")
	p.remember("ns", "", "n7")
	if _, ok := p.node("other", "r5"); ok {
		t.Error("r5 of ns is known in namespace other")
	}
	if _, ok := p.node("ns", "r6"); ok {
		t.Error("an invalid node name was remembered")
	}
	if n, _ := p.node("ns", "r3"); n != "n3" {
		t.Error("ignored entries evicted r3")
	}

	// Concurrent use never grows past the bound.
	p = newProducerNodes(100)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				ref := fmt.Sprintf("g%d-%d", g, i)
				p.remember("ns", ref, "node-1")
				p.largest(&invocation.Envelope{Namespace: "ns", Objects: []invocation.Object{{Ref: ref, Size: 1}}})
			}
		}()
	}
	wg.Wait()
	if p.len() != 100 || len(p.order) != 100 {
		t.Errorf("%d entries, %d in order, want 100", p.len(), len(p.order))
	}
}

func TestLargestKnownProducer(t *testing.T) {
	p := newProducerNodes(0)
	p.remember("ns", "small", "node-s")
	p.remember("ns", "big", "node-b")
	env := func(objs ...invocation.Object) *invocation.Envelope {
		return &invocation.Envelope{Namespace: "ns", Objects: objs}
	}
	for _, tc := range []struct {
		name string
		env  *invocation.Envelope
		want string
	}{
		{"largest known", env(invocation.Object{Ref: "small", Size: 5}, invocation.Object{Ref: "big", Size: 50}, invocation.Object{Ref: "unknown", Size: 500}), "node-b"},
		{"inline objects do not count", env(invocation.Object{Ref: "small", Size: 5}, invocation.Object{Inline: []byte("x"), Size: 1 << 20}), "node-s"},
		{"none known", env(invocation.Object{Ref: "unknown", Size: 5}), ""},
		{"no objects", env(), ""},
	} {
		if got := p.largest(tc.env); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
