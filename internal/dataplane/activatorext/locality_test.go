package activatorext

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

var rev = types.NamespacedName{Namespace: testNS, Name: "consumer-00001"}

func node(n string) *string { return &n }

// privateEndpoints is a revision's private-service Endpoints as Kubernetes
// writes them: ready addresses with their node, and a not-ready one.
func privateEndpoints() []*corev1.Endpoints {
	return []*corev1.Endpoints{{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "consumer-00001-private"},
		Subsets: []corev1.EndpointSubset{{
			Addresses: []corev1.EndpointAddress{
				{IP: "10.0.1.5", NodeName: node("node-1")},
				{IP: "10.0.2.7", NodeName: node("node-2")},
				{IP: "10.0.2.3", NodeName: node("node-2")},
				{IP: "10.0.4.1"}, // no node recorded
			},
			NotReadyAddresses: []corev1.EndpointAddress{{IP: "10.0.3.9", NodeName: node("node-3")}},
			Ports:             []corev1.EndpointPort{{Name: "http", Port: 8012}},
		}},
	}}
}

func index(eps []*corev1.Endpoints, err error) EndpointsIndex {
	return EndpointsIndex{List: func(id types.NamespacedName) ([]*corev1.Endpoints, error) {
		if id != rev {
			return nil, nil
		}
		return eps, err
	}}
}

// knative is the part of Knative's throttler the wrapper relies on: it
// admits the request and calls fn with its own choice.
type knative struct {
	dest      string
	clusterIP bool
}

func (k knative) Try(_ context.Context, _ types.NamespacedName, fn func(string, bool) error) error {
	return fn(k.dest, k.clusterIP)
}

func TestLocalityChoice(t *testing.T) {
	for _, tc := range []struct {
		name         string
		producerNode string
		knDest       string
		clusterIP    bool
		cc           int
		inflight     map[string]int
		pods         PodIndex
		want         string
		decision     string
	}{
		{name: "no producer node keeps Knative's pod", knDest: "10.0.1.5:8012", want: "10.0.1.5:8012", decision: DecisionNoProducerNode},
		{name: "Knative's pod already on the node", producerNode: "node-1", knDest: "10.0.1.5:8012", want: "10.0.1.5:8012", decision: DecisionAlreadyLocal},
		{name: "redirect to the producer's node, lowest IP on ties", producerNode: "node-2", knDest: "10.0.1.5:8012", want: "10.0.2.3:8012", decision: DecisionLocal},
		{name: "least loaded local pod", producerNode: "node-2", knDest: "10.0.1.5:8012", inflight: map[string]int{"10.0.2.3": 2, "10.0.2.7": 1}, want: "10.0.2.7:8012", decision: DecisionLocal},
		{name: "local pods at container concurrency", producerNode: "node-2", knDest: "10.0.1.5:8012", cc: 1, inflight: map[string]int{"10.0.2.3": 1, "10.0.2.7": 1}, want: "10.0.1.5:8012", decision: DecisionLocalPodsBusy},
		{name: "one local pod below container concurrency", producerNode: "node-2", knDest: "10.0.1.5:8012", cc: 2, inflight: map[string]int{"10.0.2.3": 2, "10.0.2.7": 1}, want: "10.0.2.7:8012", decision: DecisionLocal},
		{name: "only a not-ready pod on the node", producerNode: "node-3", knDest: "10.0.1.5:8012", want: "10.0.1.5:8012", decision: DecisionNoLocalPod},
		{name: "unknown node", producerNode: "node-9", knDest: "10.0.1.5:8012", want: "10.0.1.5:8012", decision: DecisionNoLocalPod},
		{name: "cluster IP routing is left alone", producerNode: "node-2", knDest: "10.96.0.10:80", clusterIP: true, want: "10.96.0.10:80", decision: DecisionClusterIP},
		{name: "unparsable destination", producerNode: "node-2", knDest: "consumer", want: "consumer", decision: DecisionUnknownDest},
		{name: "endpoints lister fails", producerNode: "node-2", knDest: "10.0.1.5:8012", pods: index(nil, errors.New("informer not synced")), want: "10.0.1.5:8012", decision: DecisionNoLocalPod},
		{name: "IPv6 pods keep the port", producerNode: "node-6", knDest: "[fd00::1]:8012", pods: index([]*corev1.Endpoints{{Subsets: []corev1.EndpointSubset{{Addresses: []corev1.EndpointAddress{{IP: "fd00::1", NodeName: node("node-5")}, {IP: "fd00::2", NodeName: node("node-6")}}}}}}, nil), want: "[fd00::2]:8012", decision: DecisionLocal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pods := tc.pods
			if pods == nil {
				pods = index(privateEndpoints(), nil)
			}
			m, count := testMetrics(t)
			lt := &LocalityThrottler{Next: knative{tc.knDest, tc.clusterIP}, Pods: pods, Metrics: m,
				Concurrency: func(context.Context) int { return tc.cc }}
			for ip, n := range tc.inflight {
				if lt.inflight == nil {
					lt.inflight = map[string]int{}
				}
				lt.inflight[ip] = n
			}
			zr := &Request{ProducerNode: tc.producerNode, now: time.Now}
			ctx := context.WithValue(context.Background(), requestKey{}, zr)
			var got string
			var gotClusterIP bool
			if err := lt.Try(ctx, rev, func(dest string, isClusterIP bool) error {
				got, gotClusterIP = dest, isClusterIP
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if got != tc.want || gotClusterIP != tc.clusterIP {
				t.Errorf("dest %q (clusterIP %v), want %q", got, gotClusterIP, tc.want)
			}
			if n := count("ziptrail.activator.locality.decisions", "decision", tc.decision); n != 1 {
				t.Errorf("decision %q counted %d times, want 1", tc.decision, n)
			}
			for ip, n := range tc.inflight { // our slot was released when fn returned
				if lt.inflight[ip] != n {
					t.Errorf("in flight at %s = %d after the request, want %d", ip, lt.inflight[ip], n)
				}
			}
		})
	}
}

func TestLocalityCountsRequestsInFlight(t *testing.T) {
	lt := &LocalityThrottler{Next: knative{dest: "10.0.1.5:8012"}, Pods: index(privateEndpoints(), nil),
		Concurrency: func(context.Context) int { return 1 }}
	ctx := context.WithValue(context.Background(), requestKey{}, &Request{ProducerNode: "node-2", now: time.Now})
	var dests []string
	// Three nested requests: the first two fill node-2's pods (cc 1), the
	// third falls back to Knative's pod.
	var try func(depth int) error
	try = func(depth int) error {
		return lt.Try(ctx, rev, func(dest string, _ bool) error {
			dests = append(dests, dest)
			if depth < 3 {
				return try(depth + 1)
			}
			return nil
		})
	}
	if err := try(1); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(dests, " "); got != "10.0.2.3:8012 10.0.2.7:8012 10.0.1.5:8012" {
		t.Errorf("destinations %s", got)
	}
	if len(lt.inflight) != 0 {
		t.Errorf("slots leaked: %v", lt.inflight)
	}
	// Requests without ziptrail headers are not touched.
	if err := lt.Try(context.Background(), rev, func(dest string, _ bool) error {
		if dest != "10.0.1.5:8012" {
			t.Errorf("plain request redirected to %s", dest)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestReadyIPsOnNode(t *testing.T) {
	eps := privateEndpoints()
	eps = append(eps, &corev1.Endpoints{Subsets: []corev1.EndpointSubset{{Addresses: []corev1.EndpointAddress{{IP: "10.0.2.7", NodeName: node("node-2")}}}}})
	for n, want := range map[string]string{"node-1": "10.0.1.5", "node-2": "10.0.2.3 10.0.2.7", "node-3": "", "": ""} {
		if got := strings.Join(ReadyIPsOnNode(eps, n), " "); got != want {
			t.Errorf("%q: %q, want %q", n, got, want)
		}
	}
}

// coldStart is a throttler whose revision has no pod yet: Try blocks until
// the test brings a pod up, as Knative's does during a cold start.
type coldStart struct {
	waiting chan struct{} // closed when a request waits
	ready   chan string   // receives the pod that came up
	once    sync.Once
}

func (c *coldStart) Try(ctx context.Context, _ types.NamespacedName, fn func(string, bool) error) error {
	c.once.Do(func() { close(c.waiting) })
	select {
	case dest := <-c.ready:
		return fn(dest, false)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestColdStartKeepsObjectsAliveAndPrefersTheProducersNode runs the
// ziptrail layer as activator-ext composes it, behind a real HTTP server:
// the referenced object stays alive at its (real, loopback) producer while
// the request waits for the cold start, the keep-alive ends when the pod
// is there, and the request goes to the pod on the producer's node.
func TestColdStartKeepsObjectsAliveAndPrefersTheProducersNode(t *testing.T) {
	p := startProducer(t)
	t0 := time.Now().Truncate(time.Millisecond)
	r := p.put(t, "big", t0.Add(time.Second))
	sec := &secrets{}
	sec.set(testNS, p.keys, "k1")
	dp := &DataPlaneExtender{Keys: sec.get}
	defer dp.Close()
	extend, calls := recording(dp.Extend)
	clk, tk := &clock{now: t0}, newTicker()
	m, count := testMetrics(t)

	cs := &coldStart{waiting: make(chan struct{}), ready: make(chan string)}
	lt := &LocalityThrottler{Next: cs, Pods: index(privateEndpoints(), nil), Metrics: m}
	var proxiedTo string
	proxy := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		// The activator's handler: try the throttler, proxy to its dest.
		err := lt.Try(req.Context(), rev, func(dest string, _ bool) error {
			proxiedTo = dest
			_, err := io.WriteString(w, "proxied to "+dest)
			return err
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	})
	h := &Handler{Next: proxy, Metrics: m, Now: clk.Now,
		KeepAlive: &Periodic{Extend: extend, Interval: 5 * time.Second, Extension: 30 * time.Second, Now: clk.Now, Tick: tk.Tick, Metrics: m},
		Namespace: func(*http.Request) string { return testNS }}
	srv := httptest.NewServer(h)
	defer srv.Close()

	type result struct {
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
		req.Header.Set(HeaderRefs, r)
		req.Header.Set(HeaderProducerNode, "node-2")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		done <- result{string(b), err}
	}()

	<-cs.waiting
	if err := <-calls; err != nil {
		t.Fatalf("keep-alive while waiting: %v", err)
	}
	// The object's own TTL (t0+1s) would have run out during a long cold start.
	for i := 1; i <= 3; i++ {
		clk.Set(t0.Add(time.Duration(i) * 5 * time.Second))
		tk.c <- clk.Now()
		if err := <-calls; err != nil {
			t.Fatalf("keep-alive round %d: %v", i, err)
		}
	}
	if got, want := p.expires(t, "big"), t0.Add(45*time.Second); !got.Equal(want) {
		t.Errorf("object expires at %v, want %v", got, want)
	}

	clk.Set(t0.Add(17 * time.Second))
	cs.ready <- "10.0.1.5:8012" // Knative's pick: the pod on node-1
	res := <-done
	if res.err != nil || res.body != "proxied to 10.0.2.3:8012" || proxiedTo != "10.0.2.3:8012" {
		t.Errorf("response %q, %v; want it proxied to the pod on node-2", res.body, res.err)
	}
	if !tk.isStopped() {
		t.Error("keep-alive still running after the request was dispatched")
	}
	if n := count("ziptrail.activator.keepalive.requests", "", ""); n != 1 {
		t.Errorf("keepalive.requests = %d", n)
	}
	if n := count("ziptrail.activator.keepalive.wait", "", ""); n != 1 {
		t.Errorf("keepalive.wait observations = %d", n)
	}
	if n := count("ziptrail.activator.locality.decisions", "decision", DecisionLocal); n != 1 {
		t.Errorf("preferred-local decisions = %d", n)
	}

	// A stock request (no ziptrail headers) passes through: no keep-alive.
	go func() { cs.ready <- "10.0.1.5:8012" }()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "proxied to 10.0.1.5:8012" {
		t.Errorf("stock request: %q", b)
	}
	select {
	case err := <-calls:
		t.Errorf("a stock request started a keep-alive: %v", err)
	default:
	}
	if n := count("ziptrail.activator.keepalive.requests", "", ""); n != 1 {
		t.Errorf("after a stock request keepalive.requests = %d, want still 1", n)
	}
}
