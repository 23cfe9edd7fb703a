package main

import (
	"fmt"
	"os"
	"time"

	dto "github.com/prometheus/client_model/go"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// counters is a snapshot of the in-process operator's metrics (the local
// cluster's operator runs in this process) that say where a block's time
// went: the dispatcher's requests (sent to answered, the function's pod
// and the path to it), the control messages the sidecars sent, the
// engine's checkpoint saves.
type counters struct {
	dispatched    float64 // invocations answered
	dispatchSecs  float64 // their time from sent to answered
	events        map[string]float64
	saves         float64
	saveSecs      float64
	direct, route float64 // requests by route
}

func snapshot() counters {
	c := counters{events: map[string]float64{}}
	mfs, err := crmetrics.Registry.Gather()
	if err != nil {
		return c
	}
	label := func(m *dto.Metric, name string) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "ziptrail_invocation_duration_seconds":
				c.dispatched += float64(m.GetHistogram().GetSampleCount())
				c.dispatchSecs += m.GetHistogram().GetSampleSum()
			case "ziptrail_control_events_total":
				c.events[label(m, "kind")] += m.GetCounter().GetValue()
			case "ziptrail_engine_checkpoint_seconds":
				c.saves += float64(m.GetHistogram().GetSampleCount())
				c.saveSecs += m.GetHistogram().GetSampleSum()
			case "ziptrail_invocation_requests_total":
				switch label(m, "route") {
				case "direct":
					c.direct += m.GetCounter().GetValue()
				default:
					c.route += m.GetCounter().GetValue()
				}
			}
		}
	}
	return c
}

// printBreakdown writes to stderr, per session of a block, what the
// operator saw between before and after: the invocations it sent and
// their mean time from sent to answered (against the per-step p50, the
// rest is the operator's: applying the answer, deciding, the next
// request), the control messages by kind, the saves.
func printBreakdown(block string, sessions, steps int, perStep time.Duration, before, after counters) {
	if sessions == 0 {
		return
	}
	n := float64(sessions)
	d := after.dispatched - before.dispatched
	mean := time.Duration(0)
	if d > 0 {
		mean = time.Duration((after.dispatchSecs - before.dispatchSecs) / d * float64(time.Second))
	}
	ev := ""
	// events: messages that carried several of the others (Events).
	for _, k := range []string{"object_ready", "function_started", "function_finished", "events"} {
		ev += fmt.Sprintf(" %s %.1f", k, (after.events[k]-before.events[k])/n)
	}
	saves := after.saves - before.saves
	saveMean := time.Duration(0)
	if saves > 0 {
		saveMean = time.Duration((after.saveSecs - before.saveSecs) / saves * float64(time.Second))
	}
	fmt.Fprintf(os.Stderr, "%s: a session: %.1f invocations answered (mean %s sent to answered; a step's p50 %s), requests direct %.1f route %.1f;"+
		" control messages:%s; saves %.1f (mean %s)\n", block, d/n, mean.Round(time.Microsecond), perStep.Round(time.Microsecond),
		(after.direct-before.direct)/n, (after.route-before.route)/n, ev, saves/n, saveMean.Round(time.Microsecond))
}
