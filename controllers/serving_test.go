package controllers

import (
	"testing"

	"knative.dev/pkg/apis"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
)

// A Service rolling out a new revision is not Ready, but its Route still
// sends requests to the previous ready revision: the Workflow keeps
// admitting sessions (servesTraffic), while a Service that never served
// does not.
func TestServesTraffic(t *testing.T) {
	pct := func(p int64) *int64 { return &p }
	url := &apis.URL{Scheme: "http", Host: "roll-first.ns.svc.cluster.local"}
	rollingOut := &servingv1.Service{}
	rollingOut.Status.URL = url
	rollingOut.Status.LatestReadyRevisionName = "roll-first-00001"
	rollingOut.Status.LatestCreatedRevisionName = "roll-first-00002"
	rollingOut.Status.Traffic = []servingv1.TrafficTarget{{RevisionName: "roll-first-00001", Percent: pct(100), LatestRevision: new(true)}}
	if !servesTraffic(rollingOut) {
		t.Error("a Service rolling out a new revision still serves the previous one")
	}

	fresh := &servingv1.Service{}
	fresh.Status.LatestCreatedRevisionName = "roll-first-00001"
	if servesTraffic(fresh) {
		t.Error("a Service without a ready revision serves nothing")
	}

	tagOnly := rollingOut.DeepCopy()
	tagOnly.Status.Traffic = []servingv1.TrafficTarget{{RevisionName: "roll-first-00001", Tag: "old", Percent: nil}}
	if servesTraffic(tagOnly) {
		t.Error("a tag-only target carries no share of the Service's traffic")
	}

	noURL := rollingOut.DeepCopy()
	noURL.Status.URL = nil
	if servesTraffic(noURL) {
		t.Error("a Service without a URL is not routed")
	}
}
