package e2e

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/invocation/call"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// routeCounts reads the in-process operator's requests by route
// (ziptrail_invocation_requests_total, docs/dispatch.md).
func routeCounts() map[string]float64 {
	out := map[string]float64{}
	mfs, err := crmetrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, mf := range mfs {
		if mf.GetName() != "ziptrail_invocation_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "route" {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

func since(before map[string]float64) map[string]float64 {
	now := routeCounts()
	for k, v := range before {
		now[k] -= v
	}
	return now
}

// Direct routing (docs/dispatch.md): the operator sends each invocation
// straight to a ready pod's queue-proxy and leaves Knative's activator
// only what needs it (no ready pod). Knative must still scale the
// function: queue-proxy counts the direct requests, the autoscaler reads
// them from it.
var _ = Describe("direct routing with Knative's autoscaler", func() {
	It("a function the operator invokes straight at its pods scales up under load and back to zero, cold-starts through the route, and loses nothing", func() {
		if cluster == nil {
			Skip("reads the in-process operator's metrics")
		}
		Expect(cluster.DirectDispatch()).To(BeTrue(), "direct routing is the local cluster's default, as the chart's")
		// Knative's KPA aims at one request at a time per pod (a soft
		// target: no containerConcurrency limit, which would leave the
		// revision to the activator), at most 5 pods, from zero.
		ns := deploy("direct", v1alpha1.WorkflowSpec{Entry: "work", Functions: []v1alpha1.FunctionSpec{
			scaled(pyFunction("work", `
import time
def handle(inv):
    time.sleep(2)
    return inv.objects[0].bytes()[::-1]`), 0, 5, 0, map[string]string{"autoscaling.knative.dev/target": "1", "autoscaling.knative.dev/window": "6s"}),
		}})
		atZero := func() {
			Eventually(func(g Gomega) {
				all, _, err := podCounts(ns, "direct-work")
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(all).To(BeZero(), "Knative scaled the function to zero")
			}).WithTimeout(10 * time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
		}
		atZero()

		// From zero: no ready pod, so the route's activator holds the
		// request and wakes the revision.
		before := routeCounts()
		out, s := runSession(ns, "direct", "cold")
		Expect(s.State).To(Equal(sessions.Completed))
		Expect(out).To(Equal("dloc"))
		cold := since(before)
		Expect(cold[call.RouteURL]).To(BeNumerically(">=", 1), "the cold start went by the route: %v", cold)

		// Load: a session every 2 s / 30, each 2 s of work, so about 30 in
		// flight, until Knative has 3 ready pods (at most a minute).
		w := watchPods(ns, "direct-work", 3)
		before = routeCounts()
		start := time.Now()
		st := &sessionStream{}
		st.run(ns, "direct", 2*time.Second/30, 900, func(n int) bool {
			return n < 30 || (w.Reached().IsZero() && time.Since(start) < time.Minute)
		})
		runs := st.wait(ns, reversedInput)
		w.Stop()
		load := since(before)
		Expect(w.Max()).To(BeNumerically(">=", 3), "Knative scaled the function up from the direct requests' load (queue-proxy's metrics)")
		Expect(load[call.RouteDirect]).To(BeNumerically(">", load[call.RouteURL]), "most requests went straight to the pods: %v", load)
		fmt.Fprintf(GinkgoWriter, "direct routing: %d sessions under load, 0 failed; ready pods 1 -> %d; load start -> 3rd ready pod %v; requests by route %v\n",
			len(runs), w.Max(), w.Reached().Sub(start).Round(time.Millisecond), load)

		// Back to zero, then the next session cold-starts through the
		// route again.
		atZero()
		before = routeCounts()
		out, s = runSession(ns, "direct", "again")
		Expect(s.State).To(Equal(sessions.Completed))
		Expect(out).To(Equal("niaga"))
		again := since(before)
		Expect(again[call.RouteURL]).To(BeNumerically(">=", 1), "from zero again, by the route: %v", again)
	})
})
