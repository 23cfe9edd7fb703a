package engine

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// TestPropertyDelegated is the property test's delegated arm: producers'
// sidecars fire Immediate and ByName triggers themselves (or fail to, at
// random) and report it on the object's ObjectReady; reports and the
// consumers' own FunctionStarted under the derived id arrive in any order
// with engine ticks between, reports are duplicated, carry forged ids, or
// are lost (then the producer is re-executed by its rule, and the
// re-execution does not fire locally). Every firing must be recorded by
// the engine exactly once (one ActInvoke per trigger, target and object,
// marked Delegated or sent), a Delegated one only when some sidecar really
// made it, no firing lost (each made by a sidecar or sent), a non-delegable
// trigger never delegated, and an invocation made twice only when a report
// of its object was lost. Snapshot/Restore happens at random points.
func TestPropertyDelegated(t *testing.T) {
	stats := map[string]int{}
	for seed := uint64(1); seed <= 60; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { delegatedRun(t, seed, stats) })
	}
	t.Logf("%v", stats)
	for _, k := range []string{"local", "sent", "startFirst", "lost", "rerun", "forged", "dupReport", "restore"} {
		if stats[k] == 0 {
			t.Errorf("no %s case in 60 runs: the workload does not exercise it (%v)", k, stats)
		}
	}
}

const delWF = "ns/del"

var delTriggers = []TriggerSpec{
	{Name: "imm", Bucket: "a", Primitive: Immediate, Targets: []string{"f", "g"}},
	{Name: "nm", Bucket: "n", Primitive: ByName, Key: "k1", Targets: []string{"h"}},
	{Name: "tw", Bucket: "w", Primitive: Immediate, Targets: []string{"work"}},
	{Name: "rr", Bucket: "r", Primitive: Immediate, Targets: []string{"f"},
		Reruns: []RerunRule{{SourceFunction: "work", Scope: PerObject, Timeout: time.Second, MaxAttempts: 3}}},
	{Name: "set", Bucket: "b", Primitive: BySet, Keys: []string{"k0", "k1"}, Targets: []string{"f"}},
}

type delSim struct {
	t        *testing.T
	rng      *rand.Rand
	e        *Engine
	now      time.Time
	queue    []func()        // events in flight, delivered in random order
	fired    map[string]int  // trigger/target/bucket/key -> ActInvoke recorded
	made     map[string]int  // invocation id -> times some sidecar or the dispatcher made it
	risky    map[string]bool // bucket/key -> a report of it was lost, or its producer ran twice
	produced map[string]int  // producing invocation (base) -> executions
	stats    map[string]int
}

func delegatedRun(t *testing.T, seed uint64, stats map[string]int) {
	sim := &delSim{t: t, rng: rand.New(rand.NewPCG(seed, 7)), now: t0, fired: map[string]int{}, made: map[string]int{},
		risky: map[string]bool{}, produced: map[string]int{}, stats: stats}
	sim.e = sim.newEngine()
	sessions := []string{"s1", "s2", "s3"}
	for _, s := range sessions {
		acts, err := sim.e.StartSession(delWF, s, Object{}, sim.now)
		if err != nil {
			t.Fatal(err)
		}
		sim.apply(acts)
	}
	for round := 0; round < 20 && len(sim.queue) > 0 || round < 5; round++ {
		for len(sim.queue) > 0 {
			switch r := sim.rng.IntN(20); {
			case r == 0:
				sim.now = sim.now.Add(time.Duration(sim.rng.IntN(700)) * time.Millisecond)
				sim.apply(sim.e.Tick(sim.now))
			case r == 1:
				sim.restore()
			default:
				i := sim.rng.IntN(len(sim.queue))
				ev := sim.queue[i]
				sim.queue = append(sim.queue[:i], sim.queue[i+1:]...)
				ev()
			}
		}
		sim.now = sim.now.Add(1100 * time.Millisecond) // due re-executions
		sim.apply(sim.e.Tick(sim.now))
	}
	for _, s := range sessions {
		sim.check(s)
		acts := sim.e.ObjectReady(delWF, Object{Bucket: "out", Key: "done", Session: s, Inline: []byte("x")}, sim.now)
		if len(acts) == 0 || acts[0].Kind != ActSessionComplete {
			t.Fatalf("session %s did not complete: %v", s, acts)
		}
	}
	if n := sim.e.Sessions(); n != 0 {
		t.Fatalf("%d sessions left", n)
	}
}

func (sim *delSim) newEngine() *Engine {
	e := New(4)
	if err := e.SetWorkflow(WorkflowSpec{Name: delWF, Entry: "entry", OutputBucket: "out", SessionDeadline: time.Hour,
		Triggers: delTriggers, Delegate: true}); err != nil {
		sim.t.Fatal(err)
	}
	return e
}

// restore moves the state to a fresh engine through a JSON snapshot, as
// an operator restart or a bucket's new owner does.
func (sim *delSim) restore() {
	b, err := json.Marshal(sim.e.Snapshot())
	if err != nil {
		sim.t.Fatal(err)
	}
	var snap Snapshot
	if err := json.Unmarshal(b, &snap); err != nil {
		sim.t.Fatal(err)
	}
	sim.e = sim.newEngine()
	if err := sim.e.Restore(&snap); err != nil {
		sim.t.Fatal(err)
	}
	sim.stats["restore"]++
}

func (sim *delSim) later(f func()) { sim.queue = append(sim.queue, f) }

// apply is the orchestrator: it records every invocation's start with its
// arguments, and sends those not Delegated.
func (sim *delSim) apply(acts []Action) {
	for _, a := range acts {
		switch a.Kind {
		case ActInvoke:
			args := []byte{}
			if a.Delegated && a.Trigger == "set" {
				sim.t.Fatalf("non-delegable trigger delegated: %v", a)
			}
			if a.Delegated && sim.made[a.Invocation] == 0 {
				sim.t.Fatalf("%v marked Delegated but no sidecar made it: a lost firing", a)
			}
			if len(a.Objects) == 1 {
				o := a.Objects[0]
				args = []byte(o.Bucket + "/" + o.Key)
				sim.fired[a.Session+":"+a.Trigger+"/"+a.Function+"/"+o.Bucket+"/"+o.Key]++
			}
			sim.apply(sim.e.FunctionStarted(delWF, a.Session, a.Function, a.Invocation, args, sim.now))
			if !a.Delegated {
				sim.stats["sent"]++
				sim.run(a.Session, a.Function, a.Invocation, a.Objects)
			}
		case ActRerun:
			sim.stats["rerun"]++
			b, k, _ := strings.Cut(string(a.Args), "/")
			sim.run(a.Session, a.Function, a.Invocation, []Object{{Bucket: b, Key: k, Session: a.Session}})
		}
	}
}

// run is one execution of an invocation (its id raw): entry sends the
// session's objects, work one object to r; the others send nothing.
func (sim *delSim) run(session, fn, raw string, in []Object) {
	sim.made[raw]++
	base := BaseInvocation(raw)
	sim.produced[base]++
	var outs []Object
	switch fn {
	case "entry":
		for _, b := range []string{"a", "n", "w", "b"} {
			for _, k := range []string{"k0", "k1", "k2"} {
				if b == "b" && k == "k2" {
					continue
				}
				outs = append(outs, Object{Bucket: b, Key: k})
			}
		}
	case "work":
		outs = append(outs, Object{Bucket: "r", Key: "r-" + in[0].Key})
	}
	for _, o := range outs {
		o.Session, o.Producer, o.Invocation, o.Inline = session, fn, raw, []byte(o.Key)
		if sim.produced[base] > 1 {
			sim.risky[o.Bucket+"/"+o.Key] = true
		}
		sim.produce(o, raw != base)
	}
}

// produce is the producer's sidecar: unless the execution is a
// re-execution it invokes the delegable triggers' targets itself (each
// may fail), then reports the object with what it fired.
func (sim *delSim) produce(o Object, rerun bool) {
	for _, t := range delTriggers {
		if t.Bucket != o.Bucket || !Delegable(t) || !Matches(t, o.Key) || rerun {
			continue
		}
		for _, target := range t.Targets {
			if sim.rng.IntN(10) < 3 {
				continue // the route was not ready: nothing fired
			}
			id := DelegatedInvocation(o.Session, t.Name, target, o.Bucket, o.Key)
			sim.stats["local"]++
			sim.made[id]++
			o.FiredLocally = append(o.FiredLocally, id)
			session, in := o.Session, []Object{o}
			if sim.rng.IntN(3) > 0 { // the consumer's sidecar reports its start
				sim.later(func() {
					if sim.e.shard(session).sessions[session] != nil && sim.e.shard(session).sessions[session].invocations[id] == nil {
						sim.stats["startFirst"]++
					}
					args := []byte(o.Bucket + "/" + o.Key)
					sim.apply(sim.e.FunctionStarted(delWF, session, target, id, args, sim.now))
				})
			}
			sim.later(func() { sim.execute(session, target, id, in) })
		}
	}
	if sim.rng.IntN(5) == 0 {
		sim.stats["forged"]++
		o.FiredLocally = append(o.FiredLocally, DelegatedInvocation(o.Session, "imm", "evil", o.Bucket, o.Key), o.Session+".d0")
	}
	if o.Bucket == "r" && !rerun && sim.rng.IntN(3) == 0 {
		sim.stats["lost"]++ // the pod died before its report left: its rule re-executes it
		sim.risky[o.Bucket+"/"+o.Key] = true
		return
	}
	report := func() { sim.apply(sim.e.ObjectReady(delWF, o, sim.now)) }
	sim.later(report)
	if sim.rng.IntN(4) == 0 {
		sim.stats["dupReport"]++
		sim.later(report)
	}
}

// execute is a locally fired invocation running in its consumer's pod.
func (sim *delSim) execute(session, fn, id string, in []Object) {
	if fn == "work" {
		sim.made[id]-- // run counts it again
		sim.run(session, fn, id, in)
	}
}

// check: every firing recorded once, none lost, none made twice unless
// a report of its object was lost or its producer ran twice.
func (sim *delSim) check(s string) {
	want := map[string]bool{"set/f/b/k1": true}
	for _, k := range []string{"k0", "k1", "k2"} {
		want["imm/f/a/"+k], want["imm/g/a/"+k] = true, true
		want["tw/work/w/"+k] = true
		want["rr/f/r/r-"+k] = true
	}
	want["nm/h/n/k1"] = true
	for k := range want {
		parts := strings.SplitN(k, "/", 4)
		if parts[0] == "set" {
			continue // BySet fires with both keys: counted below
		}
		if n := sim.fired[s+":"+k]; n != 1 {
			sim.t.Fatalf("session %s: %s recorded %d times, want 1", s, k, n)
		}
		id := DelegatedInvocation(s, parts[0], parts[1], parts[2], parts[3])
		if sim.made[id] < 1 {
			sim.t.Fatalf("session %s: %s (%s) never made: a lost firing", s, k, id)
		}
		if sim.made[id] > 1 && !sim.risky[parts[2]+"/"+parts[3]] {
			sim.t.Fatalf("session %s: %s (%s) made %d times with no report lost", s, k, id, sim.made[id])
		}
	}
	for k, n := range sim.fired {
		if strings.HasPrefix(k, s+":nm/") && k != s+":nm/h/n/k1" && n > 0 {
			sim.t.Fatalf("ByName fired for another key: %s", k)
		}
	}
}
