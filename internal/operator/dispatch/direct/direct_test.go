package direct

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"knative.dev/pkg/apis"
	duckv1 "knative.dev/pkg/apis/duck/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

func endpoint(ip, node string, ready, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: ptr.To(node),
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready), Terminating: ptr.To(terminating)}}
}

func TestReadyPodsAreTheReadyEndpointsAtTheHTTPPort(t *testing.T) {
	slices := []discoveryv1.EndpointSlice{
		{AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8012)}, {Name: ptr.To("https"), Port: ptr.To[int32](8112)}},
			Endpoints: []discoveryv1.Endpoint{
				endpoint("10.0.0.1", "n1", true, false),
				endpoint("10.0.0.2", "n2", false, false), // not ready
				endpoint("10.0.0.3", "n2", true, true),   // terminating
				endpoint("10.0.0.4", "n2", true, false),
			}},
		// The same pod in a second slice (a slice being replaced).
		{AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8012)}},
			Endpoints: []discoveryv1.Endpoint{endpoint("10.0.0.1", "n1", true, false)}},
		// An h2c revision: no "http" port; not ours to send to.
		{AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http2"), Port: ptr.To[int32](8013)}},
			Endpoints: []discoveryv1.Endpoint{endpoint("10.0.0.5", "n1", true, false)}},
		{AddressType: discoveryv1.AddressTypeFQDN, Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8012)}},
			Endpoints: []discoveryv1.Endpoint{endpoint("pod.example", "n1", true, false)}},
	}
	// A slice a tenant wrote with the revision's labels: its address is
	// no pod of the revision.
	slices = append(slices, discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4,
		Ports:     []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8012)}},
		Endpoints: []discoveryv1.Endpoint{endpoint("10.96.0.1", "n1", true, false)}})
	ips := map[string]bool{"10.0.0.1": true, "10.0.0.2": true, "10.0.0.3": true, "10.0.0.4": true, "10.0.0.5": true}
	want := []Pod{{Addr: "10.0.0.1:8012", Node: "n1"}, {Addr: "10.0.0.4:8012", Node: "n2"}}
	if got := ReadyPods(slices, ips); !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadyPods: %v, want %v", got, want)
	}
}

// Only running pods on the pod network vouch for an address.
func TestPodIPsAreTheRunningPodsOnThePodNetwork(t *testing.T) {
	pod := func(ip string, phase corev1.PodPhase, host, deleting bool) corev1.Pod {
		p := corev1.Pod{Spec: corev1.PodSpec{HostNetwork: host}, Status: corev1.PodStatus{Phase: phase, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}}
		if deleting {
			p.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		}
		return p
	}
	dual := pod("10.0.0.6", corev1.PodRunning, false, false)
	dual.Status.PodIPs = append(dual.Status.PodIPs, corev1.PodIP{IP: "fd00::6"})
	got := PodIPs([]corev1.Pod{
		pod("10.0.0.1", corev1.PodRunning, false, false),
		pod("10.0.0.2", corev1.PodPending, false, false),
		pod("192.168.1.10", corev1.PodRunning, true, false), // the node's address
		pod("10.0.0.4", corev1.PodRunning, false, true),
		pod("10.0.0.5", corev1.PodSucceeded, false, false),
		dual,
	})
	if want := map[string]bool{"10.0.0.1": true, "10.0.0.6": true, "fd00::6": true}; !reflect.DeepEqual(got, want) {
		t.Fatalf("PodIPs: %v, want %v", got, want)
	}
}

func TestLabelWorkflowIsTheAPIs(t *testing.T) {
	if labelWorkflow != v1alpha1.LabelWorkflow {
		t.Fatalf("%q, the API says %q", labelWorkflow, v1alpha1.LabelWorkflow)
	}
}

func TestRevisionIsTheOneTakingAllTraffic(t *testing.T) {
	svc := func(ready bool, traffic ...servingv1.TrafficTarget) *servingv1.Service {
		s := &servingv1.Service{}
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		s.Status.Conditions = duckv1.Conditions{{Type: apis.ConditionReady, Status: st}}
		s.Status.ObservedGeneration = s.Generation
		s.Status.Traffic = traffic
		return s
	}
	target := func(rev string, pct int64) servingv1.TrafficTarget {
		return servingv1.TrafficTarget{RevisionName: rev, Percent: ptr.To(pct)}
	}
	for _, tc := range []struct {
		name string
		svc  *servingv1.Service
		want string
	}{
		{"all to one", svc(true, target("f-00002", 100)), "f-00002"},
		{"a tagged target without traffic", svc(true, target("f-00002", 100), target("f-00001", 0)), "f-00002"},
		{"split", svc(true, target("f-00002", 50), target("f-00001", 50)), ""},
		{"not ready", svc(false, target("f-00002", 100)), ""},
		{"no traffic yet", svc(true), ""},
	} {
		if got := Revision(tc.svc); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestARevisionWithAConcurrencyLimitOrARolloutGoesByTheRoute: only the
// Service's latest revision, ready, without a containerConcurrency limit,
// is routed directly.
func TestARevisionWithAConcurrencyLimitOrARolloutGoesByTheRoute(t *testing.T) {
	svc := func(cc *int64, created, ready string) *servingv1.Service {
		s := &servingv1.Service{}
		s.Spec.Template.Spec.ContainerConcurrency = cc
		s.Status.LatestCreatedRevisionName, s.Status.LatestReadyRevisionName = created, ready
		return s
	}
	for _, tc := range []struct {
		name string
		svc  *servingv1.Service
		want bool
	}{
		{"unlimited, settled", svc(ptr.To[int64](0), "f-00002", "f-00002"), true},
		{"a limit", svc(ptr.To[int64](1), "f-00002", "f-00002"), false},
		{"not defaulted", svc(nil, "f-00002", "f-00002"), false},
		{"a new revision not ready yet", svc(ptr.To[int64](0), "f-00003", "f-00002"), false},
	} {
		if got := Unbounded(tc.svc, "f-00002"); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestAPodThatDidNotTakeAnInvocationIsNotPickedAgain: until the next read
// of its EndpointSlices, a pod that was gone or overloaded is left out.
func TestAPodThatDidNotTakeAnInvocationIsNotPickedAgain(t *testing.T) {
	r := &Router{services: map[string]*service{"ns/f": {pods: []Pod{{Addr: "a:8012", Node: "n1"}, {Addr: "b:8012", Node: "n1"}}}}}
	r.forget("ns", "f", "a:8012", time.Time{})
	if got := r.services["ns/f"].pods; !reflect.DeepEqual(got, []Pod{{Addr: "b:8012", Node: "n1"}}) {
		t.Fatalf("pods after forgetting a: %v", got)
	}
}

// TestAnUnreachablePodStaysOutAcrossReads: a pod that took no connection
// is left out of what the next reads find, for UnreachableFor.
func TestAnUnreachablePodStaysOutAcrossReads(t *testing.T) {
	now := time.Unix(1000, 0)
	r := &Router{Now: func() time.Time { return now }, services: map[string]*service{"ns/f": {pods: []Pod{{Addr: "a:8012"}, {Addr: "b:8012"}}}}}
	r.forget("ns", "f", "a:8012", now.Add(UnreachableFor))
	filtered := func() []Pod {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.reachable([]Pod{{Addr: "a:8012"}, {Addr: "b:8012"}}, now)
	}
	if got := filtered(); !reflect.DeepEqual(got, []Pod{{Addr: "b:8012"}}) {
		t.Fatalf("within UnreachableFor: %v", got)
	}
	now = now.Add(UnreachableFor)
	if got := filtered(); len(got) != 2 {
		t.Fatalf("after UnreachableFor: %v", got)
	}
}
