package engine

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestPropertyExactlyOnce drives many sessions of one workflow through
// random interleavings of what functions do — objects (inline, empty or by
// reference) sent with their response or reported later through a sidecar,
// resends of every event, starts and finishes, failures, re-executions —
// with clock jumps and restarts through Snapshot/Restore. It checks that
// every expected firing happened exactly once with the exact objects and
// contents, that nothing fired for a session after it completed, that
// re-executions happen only for late outputs and at most maxAttempts
// times, and that every session's engine state is gone at the end.
//
// A speculating rule (trigger "spec", source smap, speculateAfter 0.5)
// adds copies of stragglers: originals and copies finish in any order, both
// send the same outputs (duplicates), either may fail; the Immediate
// trigger must fire once per output and the DynamicGroup over smap must
// get every piece once.
func TestPropertyExactlyOnce(t *testing.T) {
	copies := 0
	for seed := uint64(1); seed <= 40; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { copies += propertyRun(t, seed) })
	}
	if copies < 10 {
		t.Errorf("only %d speculative copies in 40 runs: the workload does not exercise speculation", copies)
	}
	t.Logf("%d speculative copies", copies)
}

const (
	propRerunTimeout  = time.Second
	propRerunAttempts = 2
)

var propertyTriggers = []TriggerSpec{
	{Name: "imm", Bucket: "a", Primitive: Immediate, Targets: []string{"f"}},
	{Name: "set", Bucket: "b", Primitive: BySet, Keys: []string{"k0", "k1", "k2", "k3"}, Targets: []string{"f"}},
	{Name: "batch", Bucket: "c", Primitive: ByBatchSize, BatchSize: 3, Targets: []string{"f"}},
	{Name: "red", Bucket: "d", Primitive: Redundant, K: 2, N: 4, Targets: []string{"f"}},
	{Name: "grp", Bucket: "g", Primitive: DynamicGroup, Sources: []string{"map"}, Targets: []string{"f"}},
	{Name: "time", Bucket: "t", Primitive: ByTime, Window: time.Second, Targets: []string{"f"}},
	{Name: "join", Bucket: "j", Primitive: DynamicJoin, Sources: []string{"split"}, Targets: []string{"f"}},
	{Name: "rr", Bucket: "r", Primitive: Immediate, Targets: []string{"f"},
		Reruns: []RerunRule{{SourceFunction: "work", Scope: PerObject, Timeout: propRerunTimeout, MaxAttempts: propRerunAttempts}}},
	// Speculation: smap's outputs to sp clear its rule; its pieces to sg
	// are a shuffle over smap.
	{Name: "spec", Bucket: "sp", Primitive: Immediate, Targets: []string{"f"},
		Reruns: []RerunRule{{SourceFunction: "smap", Scope: PerObject, Timeout: propRerunTimeout, MaxAttempts: propRerunAttempts, SpeculateAfter: 0.5}}},
	{Name: "sgrp", Bucket: "sg", Primitive: DynamicGroup, Sources: []string{"smap"}, Targets: []string{"f"}},
	// Function-oriented dependencies as api/v1alpha1 compiles them, fed
	// with return values keyed per invocation as the orchestrator does:
	// Direct from p (Immediate), Periodic from p2 (ByTime), Direct fan-in
	// from p and p3 (DynamicGroup over the sources, one group).
	{Name: "dep-0", Bucket: "dep-0", Primitive: Immediate, Targets: []string{"q"}},
	{Name: "dep-1", Bucket: "dep-1", Primitive: ByTime, Window: time.Second, Targets: []string{"q"}},
	{Name: "dep-2", Bucket: "dep-2", Primitive: DynamicGroup, GroupMetadataKey: "ziptrail.dependency", Sources: []string{"p", "p3"}, Targets: []string{"q"}},
}

// pev is one thing that happens in a session.
type pev struct {
	kind    string // put, start, end
	obj     Object // put
	fn, inv string // start, end
	outputs int    // end: distinct outputs the invocation sent
	failed  bool   // end
	spawn   [][]pev
}

// payload is the deterministic content of an object: by reference, empty
// inline, or inline bytes.
func payload(session, bucket, key string) (ref string, inline []byte) {
	h := fnv.New32a()
	h.Write([]byte(session + "/" + bucket + "/" + key))
	v := h.Sum32()
	switch v % 3 {
	case 0:
		return "zt1." + key, nil
	case 1:
		return "", []byte{}
	default:
		return "", []byte(fmt.Sprintf("%x", v)[:1+v%7])
	}
}

func propObject(session, bucket, key, producer, inv string, meta ...string) Object {
	ref, inline := payload(session, bucket, key)
	o := Object{Bucket: bucket, Key: key, Session: session, Ref: ref, Inline: inline, Size: int64(len(inline)), Producer: producer, Invocation: inv}
	if len(meta) > 0 {
		o.Metadata = map[string]string{}
		for i := 0; i+1 < len(meta); i += 2 {
			o.Metadata[meta[i]] = meta[i+1]
		}
	}
	return o
}

// expectation is what must fire for one session.
type expectation struct {
	imm, batchKeys, timeKeys, dep0, dep1, fanIn map[string]bool
	set, red, fanInFires                        bool
	batches                                     int
	groups                                      map[string]int // group -> objects
	maps, smaps                                 int
	join                                        map[string]bool // nil: must not fire
}

// simSession is a session's pending event chains and observations.
type simSession struct {
	chains    [][]pev
	rerunOut  map[string]bool // work invocation -> its re-executions send output
	delivered map[string]bool // r keys some invocation sent
	reruns    map[string]int  // base work/smap invocation -> re-executions
	completed bool
	// speculation: sp keys and sg pieces some execution sent, smap
	// invocations, and the copies issued
	spDelivered, sgDelivered map[string]bool
	smaps                    int
	copies                   int
}

// smapOutputs are what every execution of smap invocation base sends:
// the same keys whichever runs.
func smapOutputs(session, base, raw string) []Object {
	h := fnv.New32a()
	h.Write([]byte(base))
	return []Object{
		propObject(session, "sp", "sp-"+base, "smap", raw),
		propObject(session, "sg", "piece-"+base, "smap", raw, "group", fmt.Sprintf("h%d", h.Sum32()%2)),
	}
}

func propertyRun(t *testing.T, seed uint64) int {
	rng := rand.New(rand.NewPCG(seed, seed*7919))
	newEngine := func() *Engine {
		e := New(4)
		if err := e.SetWorkflow(WorkflowSpec{Name: wfName, Entry: "entry", OutputBucket: "out", SessionDeadline: 24 * time.Hour, Triggers: propertyTriggers}); err != nil {
			t.Fatal(err)
		}
		return e
	}
	e := newEngine()
	now := t0
	const sessions = 10
	want := map[string]*expectation{}
	sim := map[string]*simSession{}
	var early map[string][]pev
	for i := 0; i < sessions; i++ {
		s := fmt.Sprintf("s%d", i)
		if _, err := e.StartSession(wfName, s, Object{}, now); err != nil {
			t.Fatal(err)
		}
		e.FunctionStarted(wfName, s, "entry", s+".0", nil, now)
		x, rerunOut, chains := workload(rng, s)
		want[s] = x
		sim[s] = &simSession{chains: chains[1:], rerunOut: rerunOut, delivered: map[string]bool{}, reruns: map[string]int{},
			spDelivered: map[string]bool{}, sgDelivered: map[string]bool{}, smaps: x.smaps}
		if early == nil {
			early = map[string][]pev{}
		}
		early[s] = chains[0]
	}

	fired := map[string]map[string][]string{} // session -> trigger -> keys
	groupsFired := map[string]map[string]int{}
	sgFired := map[string]map[string][]string{} // session -> group -> pieces
	arrived := map[string]bool{}                // session/base work invocation whose output the engine has seen
	var record func(acts []Action)
	record = func(acts []Action) {
		for _, a := range acts {
			ss := sim[a.Session]
			switch a.Kind {
			case ActSessionComplete:
				ss.completed = true
				ss.chains = nil
			case ActSessionFailed, ActSessionExpired:
				t.Fatalf("session %s ended %s: %s", a.Session, a.Kind, a.Reason)
			case ActRerun:
				base := BaseInvocation(a.Invocation)
				if arrived[a.Session+"/"+base] {
					t.Fatalf("%s: re-executed %s after its output arrived", a.Session, a.Invocation)
				}
				ss.reruns[base]++
				if ss.reruns[base] > propRerunAttempts || a.Attempt != ss.reruns[base] {
					t.Fatalf("%s: re-execution %s attempt %d, #%d", a.Session, a.Invocation, a.Attempt, ss.reruns[base])
				}
				// The orchestrator starts it; it may send the output.
				chain := []pev{{kind: "start", fn: a.Function, inv: a.Invocation}}
				if a.Function == "smap" {
					if a.Speculative {
						ss.copies++
					}
					// A copy or a late re-execution: it sends the same
					// outputs as its original (which may still run and
					// send them too), or fails — but not the last
					// attempt: when every execution failed the rule gives
					// up and the session's deadline decides its fate.
					if a.Attempt < propRerunAttempts && rng.IntN(4) == 0 {
						chain = append(chain, pev{kind: "end", fn: a.Function, inv: a.Invocation, failed: true})
					} else {
						outs := smapOutputs(a.Session, base, a.Invocation)
						for _, o := range outs {
							chain = append(chain, pev{kind: "put", obj: o})
						}
						chain = resend(rng, append(chain, pev{kind: "end", fn: a.Function, inv: a.Invocation, outputs: len(outs)}))
					}
					ss.chains = append(ss.chains, chain)
					continue
				}
				if a.Speculative {
					t.Fatalf("%s: speculative copy of %s, whose rule does not speculate", a.Session, a.Invocation)
				}
				n := 0
				if ss.rerunOut[base] {
					chain = append(chain, pev{kind: "put", obj: propObject(a.Session, "r", "w-"+base, "work", a.Invocation)})
					n = 1
				}
				ss.chains = append(ss.chains, append(chain, pev{kind: "end", fn: a.Function, inv: a.Invocation, outputs: n}))
			case ActInvoke:
				if ss.completed {
					t.Fatalf("%s fired after session %s completed", a.Trigger, a.Session)
				}
				// As the orchestrator does: started when dispatched, finished later.
				record(e.FunctionStarted(wfName, a.Session, a.Function, a.Invocation, nil, now))
				ss.chains = append(ss.chains, []pev{{kind: "end", fn: a.Function, inv: a.Invocation}})
				if fired[a.Session] == nil {
					fired[a.Session] = map[string][]string{}
					groupsFired[a.Session] = map[string]int{}
				}
				for _, o := range a.Objects {
					ref, inline := payload(a.Session, o.Bucket, o.Key)
					if o.Ref != ref || !bytes.Equal(o.Inline, inline) || (inline == nil) != (o.Inline == nil) {
						t.Fatalf("%s: %s passed %s/%s with ref %q inline %#v, want %q %#v", a.Session, a.Trigger, o.Bucket, o.Key, o.Ref, o.Inline, ref, inline)
					}
					fired[a.Session][a.Trigger] = append(fired[a.Session][a.Trigger], o.Key)
				}
				switch a.Trigger {
				case "sgrp":
					if sgFired[a.Session] == nil {
						sgFired[a.Session] = map[string][]string{}
					}
					for _, o := range a.Objects {
						sgFired[a.Session][a.Group] = append(sgFired[a.Session][a.Group], o.Key)
						if o.Metadata["group"] != a.Group {
							t.Fatalf("%s: piece %s of group %s fired in group %s", a.Session, o.Key, o.Metadata["group"], a.Group)
						}
					}
					fired[a.Session]["sgrp#"] = append(fired[a.Session]["sgrp#"], a.Group)
				case "grp":
					groupsFired[a.Session][a.Group] += len(a.Objects)
				case "set", "red", "batch", "join", "dep-2":
					fired[a.Session][a.Trigger+"#"] = append(fired[a.Session][a.Trigger+"#"], "x")
				}
			}
		}
	}

	restart := func() {
		data, err := e.Snapshot().Marshal()
		if err != nil {
			t.Fatal(err)
		}
		snap, err := UnmarshalSnapshot(data)
		if err != nil {
			t.Fatal(err)
		}
		e = newEngine()
		if err := e.Restore(snap); err != nil {
			t.Fatal(err)
		}
	}

	apply := func(s string, x pev) {
		ss := sim[s]
		switch x.kind {
		case "put":
			switch x.obj.Bucket {
			case "r":
				ss.delivered[x.obj.Key] = true
				arrived[s+"/"+BaseInvocation(x.obj.Invocation)] = true
			case "sp":
				ss.spDelivered[x.obj.Key] = true
				arrived[s+"/"+BaseInvocation(x.obj.Invocation)] = true
			case "sg":
				if !ss.completed {
					ss.sgDelivered[x.obj.Key] = true
				}
			}
			record(e.ObjectReady(wfName, x.obj, now))
		case "start":
			record(e.FunctionStarted(wfName, s, x.fn, x.inv, []byte("args"), now))
		case "end":
			record(e.FunctionEnded(wfName, s, x.fn, x.inv, Finish{Failed: x.failed, Outputs: x.outputs}, now))
		}
		if !ss.completed {
			ss.chains = append(ss.chains, x.spawn...)
		}
	}

	// step runs events until every chain is done, in random order across
	// sessions and chains, with ticks and restarts in between.
	step := func() {
		for {
			var active []string
			for s, ss := range sim {
				if len(ss.chains) > 0 {
					active = append(active, s)
				}
			}
			if len(active) == 0 {
				return
			}
			sort.Strings(active)
			s := active[rng.IntN(len(active))]
			ss := sim[s]
			c := rng.IntN(len(ss.chains))
			x := ss.chains[c][0]
			if ss.chains[c] = ss.chains[c][1:]; len(ss.chains[c]) == 0 {
				ss.chains = append(ss.chains[:c], ss.chains[c+1:]...)
			}
			now = now.Add(time.Duration(rng.IntN(400)) * time.Millisecond)
			apply(s, x)
			if rng.IntN(4) == 0 {
				record(e.Tick(now))
			}
			if rng.IntN(20) == 0 {
				restart()
			}
		}
	}
	for s, starts := range early {
		for _, x := range starts {
			apply(s, x)
		}
	}
	step()
	// Let windows close and late sources be re-executed until nothing is
	// left to do.
	for round := 0; round < 10; round++ {
		now = now.Add(propRerunTimeout + time.Second)
		record(e.Tick(now))
		step()
	}
	for s := range want {
		record(e.ObjectReady(wfName, Object{Bucket: "out", Key: "result", Session: s, Inline: []byte("r")}, now))
		if !sim[s].completed {
			t.Fatalf("session %s did not complete", s)
		}
		record(e.ObjectReady(wfName, propObject(s, "a", "late", "", ""), now))
		record(e.FunctionFinished(wfName, s, "map", s+".m0", false, now))
	}
	record(e.Tick(now.Add(time.Hour)))
	if n := e.Sessions(); n != 0 {
		t.Errorf("%d sessions left after completion", n)
	}
	copies := 0
	for _, ss := range sim {
		copies += ss.copies
	}

	for s, x := range want {
		f := fired[s]
		checkKeys(t, s, "imm", f["imm"], x.imm)
		checkKeys(t, s, "time", f["time"], x.timeKeys)
		if got := len(f["set#"]); (got == 1) != x.set || got > 1 {
			t.Errorf("%s: BySet fired %d times, complete=%v", s, got, x.set)
		}
		if got := len(f["red#"]); (got == 1) != x.red || got > 1 {
			t.Errorf("%s: Redundant fired %d times, want once iff >= 2 objects (%v)", s, got, x.red)
		}
		if got := len(f["batch#"]); got != x.batches {
			t.Errorf("%s: %d batches, want %d", s, got, x.batches)
		}
		if dup := duplicates(f["batch"]); dup != "" {
			t.Errorf("%s: batch key %s fired twice", s, dup)
		}
		for g, n := range x.groups {
			if groupsFired[s][g] != n {
				t.Errorf("%s: group %s fired with %d objects, want %d", s, g, groupsFired[s][g], n)
			}
		}
		if len(groupsFired[s]) != len(x.groups) {
			t.Errorf("%s: %d groups fired, want %d", s, len(groupsFired[s]), len(x.groups))
		}
		if x.join == nil {
			if len(f["join#"]) != 0 {
				t.Errorf("%s: DynamicJoin fired %v with nothing declared", s, f["join"])
			}
		} else {
			if len(f["join#"]) != 1 {
				t.Errorf("%s: DynamicJoin fired %d times, want once", s, len(f["join#"]))
			}
			checkKeys(t, s, "join", f["join"], x.join)
		}
		checkKeys(t, s, "rr", f["rr"], sim[s].delivered)
		checkKeys(t, s, "spec", f["spec"], sim[s].spDelivered)
		var pieces []string
		for _, keys := range sgFired[s] {
			pieces = append(pieces, keys...)
		}
		checkKeys(t, s, "sgrp", pieces, sim[s].sgDelivered)
		if dup := duplicates(f["sgrp#"]); dup != "" {
			t.Errorf("%s: smap's group %s fired twice", s, dup)
		}
		for inv, n := range sim[s].reruns {
			if !arrived[s+"/"+inv] && n != propRerunAttempts {
				t.Errorf("%s: %s never sent its output and was re-executed %d times, want %d", s, inv, n, propRerunAttempts)
			}
		}
		checkKeys(t, s, "dep-0", f["dep-0"], x.dep0)
		checkKeys(t, s, "dep-1", f["dep-1"], x.dep1)
		if got := len(f["dep-2#"]); got > 1 || (got == 1) != x.fanInFires {
			t.Errorf("%s: the fan-in fired %d times, want once iff both sources ran (%v)", s, got, x.fanInFires)
		}
		if x.fanInFires {
			checkKeys(t, s, "dep-2", f["dep-2"], x.fanIn)
		}
	}
	return copies
}

// workload generates one session's events: the entry invocation starts
// every source invocation, each of which sends its outputs (with its
// response, or through its sidecar, reported on their own and possibly
// after its finish) and finishes; other objects come from outside.
func workload(rng *rand.Rand, s string) (*expectation, map[string]bool, [][]pev) {
	x := &expectation{imm: map[string]bool{}, batchKeys: map[string]bool{}, timeKeys: map[string]bool{}, groups: map[string]int{},
		dep0: map[string]bool{}, dep1: map[string]bool{}, fanIn: map[string]bool{}}
	var chains [][]pev
	resend := func(c []pev) []pev { return resend(rng, c) }
	external := func(bucket, key string, meta ...string) {
		chains = append(chains, resend([]pev{{kind: "put", obj: propObject(s, bucket, key, "", "", meta...)}}))
	}
	for j := 0; j < rng.IntN(5); j++ {
		k := fmt.Sprintf("a%d", j)
		x.imm[k] = true
		external("a", k)
	}
	setKeys := rng.IntN(5) // 4 means complete
	for j := 0; j < setKeys; j++ {
		external("b", fmt.Sprintf("k%d", j))
	}
	x.set = setKeys >= 4
	nc := rng.IntN(8)
	for j := 0; j < nc; j++ {
		external("c", fmt.Sprintf("c%d", j))
	}
	x.batches = nc / 3
	nd := rng.IntN(5)
	for j := 0; j < nd; j++ {
		external("d", fmt.Sprintf("d%d", j))
	}
	x.red = nd >= 2
	for j := 0; j < rng.IntN(5); j++ {
		k := fmt.Sprintf("t%d", j)
		x.timeKeys[k] = true
		external("t", k)
	}

	// invocation builds a source invocation started by the entry: its
	// chain (outputs with the response, then its end) and, as separate
	// chains, the outputs reported through its sidecar.
	var entry, early []pev
	invocation := func(fn, inv string, outs []Object, failed bool, atOnce bool) {
		var own []pev
		var side [][]pev
		for _, o := range outs {
			e := pev{kind: "put", obj: o}
			if rng.IntN(2) == 0 {
				own = append(own, e)
			} else {
				side = append(side, resend([]pev{e}))
			}
		}
		own = resend(append(own, pev{kind: "end", fn: fn, inv: inv, outputs: len(outs), failed: failed}))
		if rng.IntN(3) == 0 { // a resent start, anywhere after the first
			side = append(side, []pev{{kind: "start", fn: fn, inv: inv}})
		}
		start := pev{kind: "start", fn: fn, inv: inv, spawn: append(side, own)}
		if atOnce {
			early = append(early, start)
		} else {
			entry = append(entry, start)
		}
	}

	// Mappers of the shuffle.
	x.maps = rng.IntN(4)
	for m := 0; m < x.maps; m++ {
		inv := fmt.Sprintf("%s.m%d", s, m)
		var outs []Object
		for j := 0; j < rng.IntN(4); j++ {
			g := fmt.Sprintf("g%d", rng.IntN(3))
			x.groups[g]++
			outs = append(outs, propObject(s, "g", fmt.Sprintf("g-%d-%d", m, j), "map", inv, "group", g))
		}
		invocation("map", inv, outs, false, false)
	}
	// Splitters declaring a dynamic join's members, which arrive from
	// elsewhere, among strays that are not members. They are dispatched
	// together (a join waits for the declarers it knows of).
	splits := rng.IntN(3)
	if splits > 0 {
		x.join = map[string]bool{}
	}
	for i := 0; i < splits; i++ {
		inv := fmt.Sprintf("%s.sp%d", s, i)
		var keys []string
		for m := 0; m <= rng.IntN(3); m++ {
			k := fmt.Sprintf("j%d-%d", i, m)
			keys = append(keys, k)
			x.join[k] = true
			external("j", k)
		}
		invocation("split", inv, []Object{propObject(s, "j", fmt.Sprintf("plan-%d", i), "split", inv,
			MetaExpectedKeys, strings.Join(keys, ","), MetaDeclareOnly, "true")}, false, true)
	}
	for j := 0; j < rng.IntN(3); j++ {
		external("j", fmt.Sprintf("stray-%d", j))
	}
	// Workers some re-execution rule watches: output in time, late, only
	// from a re-execution, or never; some fail.
	rerunOut := map[string]bool{}
	for w := 0; w < rng.IntN(4); w++ {
		inv := fmt.Sprintf("%s.w%d", s, w)
		var outs []Object
		if rng.IntN(2) == 0 {
			outs = append(outs, propObject(s, "r", "w-"+inv, "work", inv))
		}
		rerunOut[inv] = rng.IntN(2) == 0
		invocation("work", inv, outs, len(outs) == 0 && rng.IntN(3) == 0, false)
	}
	// Speculated mappers: the same outputs whichever execution sends
	// them; some originals fail (a copy or re-execution must do their
	// work), the others finish in any order.
	x.smaps = 2 + rng.IntN(5)
	for m := 0; m < x.smaps; m++ {
		inv := fmt.Sprintf("%s.sm%d", s, m)
		if rng.IntN(5) == 0 {
			invocation("smap", inv, nil, true, false)
		} else {
			invocation("smap", inv, smapOutputs(s, inv, inv), false, false)
		}
	}
	// Return values of the dependencies' sources, one per invocation and
	// dependency bucket, keyed per invocation.
	ret := func(fn string, i int, buckets ...string) {
		inv := fmt.Sprintf("%s.%s%d", s, fn, i)
		var outs []Object
		for _, b := range buckets {
			outs = append(outs, propObject(s, b, fn+"."+inv, fn, inv))
		}
		invocation(fn, inv, outs, false, false)
	}
	nP, nP2, nP3 := rng.IntN(3), rng.IntN(4), rng.IntN(2)
	for i := 0; i < nP; i++ {
		ret("p", i, "dep-0", "dep-2")
		x.dep0[fmt.Sprintf("p.%s.p%d", s, i)] = true
		x.fanIn[fmt.Sprintf("p.%s.p%d", s, i)] = true
	}
	for i := 0; i < nP2; i++ {
		ret("p2", i, "dep-1")
		x.dep1[fmt.Sprintf("p2.%s.p2%d", s, i)] = true
	}
	for i := 0; i < nP3; i++ {
		ret("p3", i, "dep-2")
		x.fanIn[fmt.Sprintf("p3.%s.p3%d", s, i)] = true
	}
	x.fanInFires = nP > 0 && nP3 > 0

	rng.Shuffle(len(entry), func(a, b int) { entry[a], entry[b] = entry[b], entry[a] })
	entry = append(entry, pev{kind: "end", fn: "entry", inv: s + ".0"})
	// The early starts come first, all at once.
	chains = append([][]pev{early}, append(chains, entry)...)
	return x, rerunOut, chains
}

// resend repeats some events of a chain later in that chain (sidecars
// and the control stream deliver at least once).
func resend(rng *rand.Rand, c []pev) []pev {
	for i, n := 0, len(c); i < n; i++ {
		if rng.IntN(4) == 0 {
			d := c[i]
			d.spawn = nil
			c = append(c, d)
		}
	}
	return c
}

func checkKeys(t *testing.T, s, trig string, got []string, want map[string]bool) {
	t.Helper()
	if dup := duplicates(got); dup != "" {
		t.Errorf("%s: %s fired key %s twice", s, trig, dup)
	}
	if len(got) != len(want) {
		t.Errorf("%s: %s fired %v, want keys %v", s, trig, got, want)
	}
	for _, k := range got {
		if !want[k] {
			t.Errorf("%s: %s fired unexpected key %s", s, trig, k)
		}
	}
}

func duplicates(keys []string) string {
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k] {
			return k
		}
		seen[k] = true
	}
	return ""
}
