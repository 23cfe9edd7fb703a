package main

// When a sort's functions ran: the session's Invoked events, collected
// while it runs, per function (map, merge, next, final, collect). The
// model predicts phases; these say where each measured phase began, so
// that the next run's report can set the model's terms against each
// phase's measured time instead of only the total.

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// FunctionTimes is one function's invocations in a session: how many, and
// the first and the last, in seconds after the session started. A phase
// of the sort runs from its function's first invocation to the next
// phase's first (merge is invoked per partition once its pieces are all
// written; collect once every partition's output is).
type FunctionTimes struct {
	Function    string  `json:"function"`
	Invocations int     `json:"invocations"`
	First       float64 `json:"first"`
	Last        float64 `json:"last"`
}

// invocationLog collects the Invoked events of a session's snapshots
// (GET /sessions/ID, polled while it runs). The session keeps its last
// 256 events; a poll that comes too late to see some counts them as
// missed.
type invocationLog struct {
	mu      sync.Mutex
	next    int // sequence number of the next event not yet seen
	started time.Time
	by      map[string]*FunctionTimes
	missed  int
}

func newInvocationLog() *invocationLog { return &invocationLog{by: map[string]*FunctionTimes{}} }

// add reads a snapshot's events not seen before.
func (l *invocationLog) add(st sessions.Session) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started.IsZero() {
		l.started = st.Started
	}
	if st.FirstEvent > l.next {
		l.missed += st.FirstEvent - l.next
		l.next = st.FirstEvent
	}
	for i := l.next - st.FirstEvent; i < len(st.Events); i++ {
		e := st.Events[i]
		if e.Kind != "Invoked" {
			continue
		}
		// "<function> with <n> objects (trigger <t>)"
		fn, _, _ := strings.Cut(e.Message, " ")
		at := e.Time.Sub(l.started).Seconds()
		f := l.by[fn]
		if f == nil {
			f = &FunctionTimes{Function: fn, First: at, Last: at}
			l.by[fn] = f
		}
		f.Invocations++
		f.First, f.Last = min(f.First, at), max(f.Last, at)
	}
	l.next = max(l.next, st.FirstEvent+len(st.Events))
}

// times returns every function's invocations, by first invocation, and
// the number of events the polls missed.
func (l *invocationLog) times() ([]FunctionTimes, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]FunctionTimes, 0, len(l.by))
	for _, f := range l.by {
		out = append(out, *f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].First < out[j].First })
	return out, l.missed
}

// printPhases lists, for each run that recorded them, when its functions
// ran (each one's window: its first invocation to the next function's
// first, the last to the end of the sort) next to the model's predicted
// phases.
func printPhases(w io.Writer, rep *Report) {
	header := false
	for _, r := range rep.Runs {
		if r.System != "ziptrail" || len(r.Functions) == 0 {
			continue
		}
		if !header {
			fmt.Fprintln(w, "\n| size | method | measured: function (invocations) from–to | predicted phases |")
			fmt.Fprintln(w, "|---|---|---|---|")
			header = true
		}
		var got, want []string
		for i, f := range r.Functions {
			end := r.SortSeconds
			if i+1 < len(r.Functions) {
				end = r.Functions[i+1].First
			}
			got = append(got, fmt.Sprintf("%s (%d) %.0f–%.0f s", f.Function, f.Invocations, f.First, end))
		}
		if r.Prediction != nil {
			for _, ph := range r.Prediction.Phases {
				want = append(want, fmt.Sprintf("%s %d × %s", ph.Name, ph.Count, fmtSec(ph.Seconds)))
			}
		}
		missed := ""
		if r.MissedEvents > 0 {
			missed = fmt.Sprintf(" (%d events missed)", r.MissedEvents)
		}
		fmt.Fprintf(w, "| %s | %s | %s%s | %s |\n", human(r.Bytes), r.Method, strings.Join(got, "; "), missed, strings.Join(want, "; "))
	}
}
