package call

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

// fakeRouter picks addr (every time, or "" for none) and records verdicts.
type fakeRouter struct {
	addr     string
	mu       sync.Mutex
	picks    int
	nodes    []string
	verdicts []Verdict
}

func (f *fakeRouter) Pick(env *invocation.Envelope, node string) (string, func(Verdict)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.picks++
	f.nodes = append(f.nodes, node)
	if f.addr == "" {
		return "", nil
	}
	return f.addr, func(v Verdict) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.verdicts = append(f.verdicts, v)
	}
}

// server counts its requests and answers with handle (default: the
// request's idempotency key echoed, 200 "ok").
type server struct {
	*httptest.Server
	n atomic.Int32
}

func newServer(t *testing.T, handle func(n int32, w http.ResponseWriter, r *http.Request)) *server {
	s := &server{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := s.n.Add(1)
		if handle != nil {
			handle(n, w, r)
			return
		}
		w.Header().Set(invocation.HeaderIdempotencyKey, r.Header.Get(invocation.HeaderIdempotencyKey))
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(s.Close)
	return s
}

func routedOptions(route *server, r Router) (*Options, *[]string) {
	var routes []string
	var mu sync.Mutex
	opts := &Options{Router: r, MaxTries: 3, BaseBackoff: 1, Receivers: &Receivers{},
		URL:          func(context.Context, *invocation.Envelope) (string, error) { return route.URL, nil },
		ProducerNode: func(*invocation.Envelope) string { return "node-a" },
		OnRoute: func(r string) {
			mu.Lock()
			defer mu.Unlock()
			routes = append(routes, r)
		}}
	opts.Defaults()
	return opts, &routes
}

func testEnvelope(id string) *invocation.Envelope {
	return &invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-f", Session: "s", Invocation: id, Attempt: 1}
}

// TestARoutedInvocationGoesStraightToThePod: a pod the Router picks gets
// the request; the route does not; the Router learns the pod answered and
// is asked with the producer's node.
func TestARoutedInvocationGoesStraightToThePod(t *testing.T) {
	pod, route := newServer(t, nil), newServer(t, nil)
	r := &fakeRouter{addr: strings.TrimPrefix(pod.URL, "http://")}
	opts, routes := routedOptions(route, r)
	res := Send(context.Background(), opts, testEnvelope("s.1"))
	if res.Err != nil || string(res.Body) != "ok" || res.Tries != 1 {
		t.Fatalf("result: %+v", res)
	}
	if pod.n.Load() != 1 || route.n.Load() != 0 {
		t.Fatalf("the pod got %d requests, the route %d; want 1 and 0", pod.n.Load(), route.n.Load())
	}
	if len(r.verdicts) != 1 || r.verdicts[0] != Answered || r.nodes[0] != "node-a" {
		t.Fatalf("verdicts %v, nodes %v", r.verdicts, r.nodes)
	}
	if strings.Join(*routes, ",") != RouteDirect {
		t.Fatalf("routes %v", *routes)
	}
}

// TestAPodThatDidNotTakeTheInvocationFallsBackToTheRouteAtOnce: a pod
// that is gone (nothing listens) or overloaded (queue-proxy's 503, without
// the key's echo) did not run the function: the same try goes by the
// route, without a retry's backoff, and Wrote hears of the route's write
// only.
func TestAPodThatDidNotTakeTheInvocationFallsBackToTheRouteAtOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close()
	overloaded := newServer(t, func(_ int32, w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "pending request queue full", http.StatusServiceUnavailable)
	})
	for _, tc := range []struct {
		name string
		addr string
		want Verdict
	}{{"gone", gone, Unreached}, {"overloaded", strings.TrimPrefix(overloaded.URL, "http://"), Overloaded}} {
		t.Run(tc.name, func(t *testing.T) {
			route := newServer(t, nil)
			r := &fakeRouter{addr: tc.addr}
			opts, routes := routedOptions(route, r)
			var wrote []bool
			opts.Wrote = func(ok bool) { wrote = append(wrote, ok) }
			retried := 0
			opts.OnRetry = func(string) { retried++ }
			res := Send(context.Background(), opts, testEnvelope("s."+tc.name))
			if res.Err != nil || string(res.Body) != "ok" || res.Tries != 1 || retried != 0 {
				t.Fatalf("result: %+v (retries %d)", res, retried)
			}
			if route.n.Load() != 1 {
				t.Fatalf("the route got %d requests, want 1", route.n.Load())
			}
			if len(r.verdicts) != 1 || r.verdicts[0] != tc.want {
				t.Fatalf("verdicts %v, want [%v]", r.verdicts, tc.want)
			}
			if strings.Join(*routes, ",") != RouteFallback+","+RouteURL {
				t.Fatalf("routes %v", *routes)
			}
			if len(wrote) != 1 || !wrote[0] {
				t.Fatalf("Wrote heard %v, want [true] once", wrote)
			}
		})
	}
}

// TestALostAnswerIsAskedOfTheSamePodAgain: the pod's sidecar has the
// key's record, another pod (or the route's pick) has not: a lost answer
// from a pod that honours keys is sent again to that pod, not picked anew.
func TestALostAnswerIsAskedOfTheSamePodAgain(t *testing.T) {
	var keys sync.Map
	pod := newServer(t, func(n int32, w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(invocation.HeaderIdempotencyKey)
		keys.Store(n, key)
		if n == 2 { // the answer to s.lost's first delivery is lost
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		w.Header().Set(invocation.HeaderIdempotencyKey, key)
		_, _ = w.Write([]byte("ok"))
	})
	route := newServer(t, nil)
	r := &fakeRouter{addr: strings.TrimPrefix(pod.URL, "http://")}
	opts, _ := routedOptions(route, r)
	// The pod's answers echo the key: its service honours keys.
	if res := Send(context.Background(), opts, testEnvelope("s.first")); res.Err != nil {
		t.Fatal(res.Err)
	}
	res := Send(context.Background(), opts, testEnvelope("s.lost"))
	if res.Err != nil || string(res.Body) != "ok" || res.Tries != 2 {
		t.Fatalf("result: %+v", res)
	}
	k2, _ := keys.Load(int32(2))
	k3, _ := keys.Load(int32(3))
	if pod.n.Load() != 3 || route.n.Load() != 0 || k2 != k3 {
		t.Fatalf("the pod got %d requests (keys %v, %v), the route %d; want the lost delivery's key twice at the pod", pod.n.Load(), k2, k3, route.n.Load())
	}
	if r.picks != 2 {
		t.Fatalf("the router was asked %d times, want 2 (once a Send; the lost answer's retry goes to the same pod)", r.picks)
	}
	if len(r.verdicts) != 2 || r.verdicts[1] != Lost {
		t.Fatalf("verdicts %v", r.verdicts)
	}
}

// TestNoPodPickedGoesByTheRoute: a Router without a pod (cold, scaled to
// zero, split traffic) leaves the invocation to the route.
func TestNoPodPickedGoesByTheRoute(t *testing.T) {
	route := newServer(t, nil)
	r := &fakeRouter{}
	opts, routes := routedOptions(route, r)
	if res := Send(context.Background(), opts, testEnvelope("s.1")); res.Err != nil || route.n.Load() != 1 {
		t.Fatalf("result %+v, the route got %d", res, route.n.Load())
	}
	if strings.Join(*routes, ",") != RouteURL {
		t.Fatalf("routes %v", *routes)
	}
}
