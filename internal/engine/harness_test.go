package engine

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"
)

// The table tests drive the engine through steps and compare what fired.

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type step struct {
	at   time.Duration // clock offset from t0
	do   func(e *Engine, now time.Time) []Action
	want []string // firings of this step, formatted by describe
}

// describe formats the actions that matter to a table: trigger firings as
// "fn[keys]" or "fn{group}[keys]", re-executions as "rerun:fn#attempt"
// (speculative copies as "copy:fn#attempt"),
// session endings as "complete" / "expired" / "failed" (a failure's object
// drop as "drop").
func describe(acts []Action) []string {
	var out []string
	for _, a := range acts {
		switch a.Kind {
		case ActInvoke:
			if a.Trigger == "" {
				continue // the entry invocation of StartSession
			}
			keys := make([]string, len(a.Objects))
			for i, o := range a.Objects {
				keys[i] = o.Key
			}
			sort.Strings(keys)
			g := ""
			if a.Group != "" {
				g = "{" + a.Group + "}"
			}
			out = append(out, fmt.Sprintf("%s%s[%s]", a.Function, g, strings.Join(keys, " ")))
		case ActRerun:
			kind := "rerun"
			if a.Speculative {
				kind = "copy"
			}
			out = append(out, fmt.Sprintf("%s:%s#%d", kind, a.Function, a.Attempt))
		case ActSessionComplete:
			out = append(out, "complete")
		case ActSessionExpired:
			out = append(out, "expired")
		case ActSessionFailed:
			out = append(out, "failed")
		case ActDropObjects:
			if len(out) > 0 && out[len(out)-1] == "failed" { // completions and expiries leave it implicit
				out = append(out, "drop")
			}
		}
	}
	return out
}

const wfName = "ns/wf"

// single builds an engine with one workflow holding the given triggers.
func single(t *testing.T, triggers ...TriggerSpec) *Engine {
	t.Helper()
	e := New(8)
	if err := e.SetWorkflow(WorkflowSpec{Name: wfName, Entry: "entry", OutputBucket: "out", SessionDeadline: time.Hour, Triggers: triggers}); err != nil {
		t.Fatal(err)
	}
	return e
}

func start(session string) func(*Engine, time.Time) []Action {
	return func(e *Engine, now time.Time) []Action {
		acts, err := e.StartSession(wfName, session, Object{Inline: []byte("in")}, now)
		if err != nil {
			panic(err)
		}
		return acts
	}
}

func put(session, bucket, key string, meta ...string) func(*Engine, time.Time) []Action {
	return putFrom(session, bucket, key, "", "", meta...)
}

func putFrom(session, bucket, key, producer, inv string, meta ...string) func(*Engine, time.Time) []Action {
	return func(e *Engine, now time.Time) []Action {
		md := map[string]string{}
		for i := 0; i+1 < len(meta); i += 2 {
			md[meta[i]] = meta[i+1]
		}
		return e.ObjectReady(wfName, Object{Bucket: bucket, Key: key, Session: session, Metadata: md, Producer: producer, Invocation: inv}, now)
	}
}

func began(session, fn, inv string) func(*Engine, time.Time) []Action {
	return func(e *Engine, now time.Time) []Action {
		return e.FunctionStarted(wfName, session, fn, inv, []byte("args-of-"+inv), now)
	}
}

func ended(session, fn, inv string, failed bool) func(*Engine, time.Time) []Action {
	return func(e *Engine, now time.Time) []Action {
		return e.FunctionFinished(wfName, session, fn, inv, failed, now)
	}
}

// endedWith ends an invocation that sent outputs objects.
func endedWith(session, fn, inv string, outputs int) func(*Engine, time.Time) []Action {
	return func(e *Engine, now time.Time) []Action {
		return e.FunctionEnded(wfName, session, fn, inv, Finish{Outputs: outputs}, now)
	}
}

func tick() func(*Engine, time.Time) []Action {
	return func(e *Engine, now time.Time) []Action { return e.Tick(now) }
}

type tableCase struct {
	name     string
	triggers []TriggerSpec
	steps    []step
}

func runTable(t *testing.T, cases []tableCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := single(t, tc.triggers...)
			for i, s := range tc.steps {
				got := describe(s.do(e, t0.Add(s.at)))
				if strings.Join(got, ";") != strings.Join(s.want, ";") {
					t.Fatalf("step %d: fired %q, want %q", i, got, s.want)
				}
			}
		})
	}
}
