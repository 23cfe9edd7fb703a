package engine

import (
	"strings"
	"testing"
	"time"
)

// Speculative copies of stragglers (RerunRule.SpeculateAfter, Locus §3.5).

func specRule(x float64, attempts int) RerunRule {
	return RerunRule{SourceFunction: "map", Scope: PerObject, Timeout: 10 * time.Second, MaxAttempts: attempts, SpeculateAfter: x}
}

func TestSpeculation(t *testing.T) {
	imm := func(x float64, attempts int) TriggerSpec {
		return TriggerSpec{Name: "t", Bucket: "b", Primitive: Immediate, Targets: []string{"next"}, Reruns: []RerunRule{specRule(x, attempts)}}
	}
	toMap := TriggerSpec{Name: "to-map", Bucket: "chunks", Primitive: Immediate, Targets: []string{"map"}}
	ms := time.Millisecond
	runTable(t, []tableCase{
		{"once x of the wave finished, each straggler gets one copy; the first output wins", []TriggerSpec{imm(0.75, 2)}, []step{
			{do: start("s1")},
			{do: began("s1", "map", "s1.1")},
			{do: began("s1", "map", "s1.2")},
			{do: began("s1", "map", "s1.3")},
			{do: began("s1", "map", "s1.4")},
			{at: 10 * ms, do: putFrom("s1", "b", "k1", "map", "s1.1"), want: []string{"next[k1]"}},
			{at: 20 * ms, do: putFrom("s1", "b", "k2", "map", "s1.2"), want: []string{"next[k2]"}},
			// 3 of 4 = 0.75: the copy is due with the third output.
			{at: 30 * ms, do: putFrom("s1", "b", "k3", "map", "s1.3"), want: []string{"next[k3]", "copy:map#1"}},
			{at: 31 * ms, do: tick()}, // issued once
			{at: 40 * ms, do: began("s1", "map", "s1.4.r1")},
			{at: 50 * ms, do: putFrom("s1", "b", "k4", "map", "s1.4.r1"), want: []string{"next[k4]"}},
			{at: 60 * ms, do: putFrom("s1", "b", "k4", "map", "s1.4")}, // the straggler's duplicate
			{at: time.Minute, do: tick()},                              // nothing late, no more copies
		}},
		{"before x of the wave finished, no copy; the timeout still re-executes", []TriggerSpec{imm(0.75, 2)}, []step{
			{do: start("s1")},
			{do: began("s1", "map", "s1.1")},
			{do: began("s1", "map", "s1.2")},
			{at: 10 * ms, do: putFrom("s1", "b", "k1", "map", "s1.1"), want: []string{"next[k1]"}}, // 1 of 2 < 0.75
			{at: 5 * time.Second, do: tick()},
			{at: 10 * time.Second, do: tick(), want: []string{"rerun:map#1"}},
		}},
		{"one copy per straggler, even as more of the wave finishes", []TriggerSpec{imm(0.5, 3)}, []step{
			{do: start("s1")},
			{do: began("s1", "map", "s1.1")},
			{do: began("s1", "map", "s1.2")},
			{do: began("s1", "map", "s1.3")},
			{do: began("s1", "map", "s1.4")},
			{at: 10 * ms, do: putFrom("s1", "b", "k1", "map", "s1.1"), want: []string{"next[k1]"}},
			{at: 20 * ms, do: putFrom("s1", "b", "k2", "map", "s1.2"), want: []string{"next[k2]", "copy:map#1", "copy:map#1"}},
			{at: 30 * ms, do: putFrom("s1", "b", "k3", "map", "s1.3.r1"), want: []string{"next[k3]"}},
			// The copy restarted the timeout: the last straggler is
			// re-executed 10 s after its copy, as attempt 2.
			{at: 10*time.Second + 19*ms, do: tick()},
			{at: 10*time.Second + 20*ms, do: tick(), want: []string{"rerun:map#2"}},
		}},
		{"a copy counts against maxAttempts: none when they are used up", []TriggerSpec{imm(0.5, 1)}, []step{
			{do: start("s1")},
			{do: began("s1", "map", "s1.1")},
			{at: 5 * time.Second, do: began("s1", "map", "s1.2")},
			{at: 10 * time.Second, do: tick(), want: []string{"rerun:map#1"}}, // s1.1 late: its one attempt
			{at: 11 * time.Second, do: putFrom("s1", "b", "k2", "map", "s1.2"), want: []string{"next[k2]"}},
			{at: 12 * time.Second, do: putFrom("s1", "b", "k1", "map", "s1.1.r1"), want: []string{"next[k1]"}},
		}},
		{"waves: invocations started after the last one finished form a new wave", []TriggerSpec{imm(0.5, 2)}, []step{
			{do: start("s1")},
			{do: began("s1", "map", "s1.1")},
			{do: began("s1", "map", "s1.2")},
			{at: 10 * ms, do: putFrom("s1", "b", "k1", "map", "s1.1"), want: []string{"next[k1]", "copy:map#1"}},
			{at: 20 * ms, do: putFrom("s1", "b", "k2", "map", "s1.2"), want: []string{"next[k2]"}},
			// Wave two: 1 of 3 finished < 0.5; then 2 of 3.
			{at: 30 * ms, do: began("s1", "map", "s1.3")},
			{at: 30 * ms, do: began("s1", "map", "s1.4")},
			{at: 30 * ms, do: began("s1", "map", "s1.5")},
			{at: 40 * ms, do: putFrom("s1", "b", "k3", "map", "s1.3"), want: []string{"next[k3]"}},
			{at: 50 * ms, do: putFrom("s1", "b", "k4", "map", "s1.4"), want: []string{"next[k4]", "copy:map#1"}},
		}},
		// A splitter still sending chunks when its first mapper already
		// finished (a loaded machine): the wave has no member outstanding
		// for a moment, yet the splitter's later chunks join it. Before,
		// they opened a new wave of 3 that never reached 0.75 (2 of 3),
		// and the straggler got no copy (CI: the orchestrator's
		// TestSpeculativeCopyOvertakesStraggler expired).
		{"members fed by the same upstream invocation stay one wave across a gap", []TriggerSpec{toMap, imm(0.75, 2)}, []step{
			{do: start("s1")},
			{do: putFrom("s1", "chunks", "c1", "entry", "s1.0"), want: []string{"map[c1]"}},
			{do: began("s1", "map", "s1.1")},
			{at: 10 * ms, do: putFrom("s1", "b", "k1", "map", "s1.1"), want: []string{"next[k1]"}}, // none outstanding
			{at: 20 * ms, do: putFrom("s1", "chunks", "c2", "entry", "s1.0"), want: []string{"map[c2]"}},
			{at: 20 * ms, do: putFrom("s1", "chunks", "c3", "entry", "s1.0"), want: []string{"map[c3]"}},
			{at: 20 * ms, do: putFrom("s1", "chunks", "c4", "entry", "s1.0"), want: []string{"map[c4]"}},
			{at: 20 * ms, do: began("s1", "map", "s1.3")},
			{at: 20 * ms, do: began("s1", "map", "s1.4")},
			{at: 20 * ms, do: began("s1", "map", "s1.5")},
			{at: 30 * ms, do: putFrom("s1", "b", "k2", "map", "s1.3"), want: []string{"next[k2]"}},
			// 3 of the wave's 4: the straggler's copy is due.
			{at: 40 * ms, do: putFrom("s1", "b", "k3", "map", "s1.4"), want: []string{"next[k3]", "copy:map#1"}},
		}},
		{"members fed by another upstream invocation after a gap open a new wave", []TriggerSpec{toMap, imm(0.5, 2)}, []step{
			{do: start("s1")},
			{do: putFrom("s1", "chunks", "c1", "entry", "s1.0"), want: []string{"map[c1]"}},
			{do: began("s1", "map", "s1.1")},
			{at: 10 * ms, do: putFrom("s1", "b", "k1", "map", "s1.1"), want: []string{"next[k1]"}},
			// Iteration two, fed by next's invocation s1.2: 1 of 3 < 0.5.
			{at: 20 * ms, do: putFrom("s1", "chunks", "c2", "next", "s1.2"), want: []string{"map[c2]"}},
			{at: 20 * ms, do: putFrom("s1", "chunks", "c3", "next", "s1.2"), want: []string{"map[c3]"}},
			{at: 20 * ms, do: putFrom("s1", "chunks", "c4", "next", "s1.2"), want: []string{"map[c4]"}},
			{at: 20 * ms, do: began("s1", "map", "s1.3")},
			{at: 20 * ms, do: began("s1", "map", "s1.4")},
			{at: 20 * ms, do: began("s1", "map", "s1.5")},
			{at: 30 * ms, do: putFrom("s1", "b", "k2", "map", "s1.3"), want: []string{"next[k2]"}},
			{at: 40 * ms, do: putFrom("s1", "b", "k3", "map", "s1.4"), want: []string{"next[k3]", "copy:map#1"}},
		}},
		{"a wave's members given up leave it: the next start opens a new wave", []TriggerSpec{imm(0.5, 1)}, []step{
			{do: start("s1")},
			{do: began("s1", "map", "s1.1")},
			{at: 10 * time.Second, do: tick(), want: []string{"rerun:map#1"}},
			{at: 20 * time.Second, do: tick()}, // given up
			{at: 21 * time.Second, do: began("s1", "map", "s1.2")},
			{at: 21 * time.Second, do: began("s1", "map", "s1.3")},
			{at: 22 * time.Second, do: putFrom("s1", "b", "k2", "map", "s1.2"), want: []string{"next[k2]", "copy:map#1"}},
		}},
		{"only the rule's source function: other functions neither join nor get copies", []TriggerSpec{imm(0.5, 2)}, []step{
			{do: start("s1")},
			{do: began("s1", "map", "s1.1")},
			{do: began("s1", "other", "s1.2")},
			{at: 10 * ms, do: putFrom("s1", "b", "k1", "map", "s1.1"), want: []string{"next[k1]"}},
		}},
	})
}

// TestSpeculativeCopyOvertakesStraggler is the shuffle's case: four mappers
// feed a DynamicGroup; their completion markers go to a ledger trigger
// (as ziptrail.shuffle.done does) that carries the speculating rule. One
// mapper straggles; its copy finishes first, the groups fire at once with
// every object, exactly once, and nothing the straggler sends later fires
// anything. Variants: the straggler wins after all (before its copy
// starts), and the copy fails while the straggler runs.
func TestSpeculativeCopyOvertakesStraggler(t *testing.T) {
	grp := TriggerSpec{Name: "grp", Bucket: "g", Primitive: DynamicGroup, Sources: []string{"entry"}, Targets: []string{"reduce"}}
	ledger := TriggerSpec{Name: "ledger", Bucket: "l", Primitive: DynamicJoin, Targets: []string{"never"},
		Reruns: []RerunRule{specRule(0.75, 2)}}
	ledger1 := ledger
	ledger1.Reruns = []RerunRule{specRule(0.75, 1)}
	ms := time.Millisecond
	// mapper m sends its piece of group g<m%2> and its marker, then ends.
	// onMarker fires when its marker arrives, onEnd when it ends.
	mapper := func(at time.Duration, m, inv string, group string, onMarker, onEnd []string) []step {
		return []step{
			{at: at, do: putFrom("s1", "g", "piece-"+m, "map", inv, "group", group)},
			{at: at, do: putFrom("s1", "l", "done."+inv, "map", inv), want: onMarker},
			{at: at, do: endedWith("s1", "map", inv, 2), want: onEnd},
		}
	}
	prefix := []step{
		{do: start("s1")},
		{do: began("s1", "entry", "s1.0")},
		{do: began("s1", "map", "s1.1")},
		{do: began("s1", "map", "s1.2")},
		{do: began("s1", "map", "s1.3")},
		{do: began("s1", "map", "s1.4")},
		{do: ended("s1", "entry", "s1.0", false)},
	}
	prefix = append(prefix, mapper(100*ms, "1", "s1.1", "g1", nil, nil)...)
	prefix = append(prefix, mapper(110*ms, "2", "s1.2", "g0", nil, nil)...)
	prefix = append(prefix, mapper(120*ms, "3", "s1.3", "g1", []string{"copy:map#1"}, nil)...)
	fired := []string{"reduce{g0}[piece-2 piece-4]", "reduce{g1}[piece-1 piece-3]"}
	steps := func(s ...[]step) []step {
		out := append([]step(nil), prefix...)
		for _, x := range s {
			out = append(out, x...)
		}
		return out
	}
	copyWins := steps(
		[]step{{at: 130 * ms, do: began("s1", "map", "s1.4.r1")}},
		[]step{
			{at: 200 * ms, do: putFrom("s1", "g", "piece-4", "map", "s1.4.r1", "group", "g0")},
			{at: 200 * ms, do: putFrom("s1", "l", "done.s1.4.r1", "map", "s1.4.r1")},
			{at: 200 * ms, do: endedWith("s1", "map", "s1.4.r1", 2), want: fired},
		},
		// The straggler, 10 s late: its piece is a duplicate, its marker
		// has a key of its own but nothing waits for it, its end is the
		// slower execution's.
		[]step{
			{at: 10 * time.Second, do: putFrom("s1", "g", "piece-4", "map", "s1.4", "group", "g0")},
			{at: 10 * time.Second, do: putFrom("s1", "l", "done.s1.4", "map", "s1.4")},
			{at: 10 * time.Second, do: endedWith("s1", "map", "s1.4", 2)},
			{at: time.Minute, do: tick()},
		},
	)
	// The straggler finishes before its copy starts: the copy's start must
	// not reopen it (else the groups would wait for the copy too).
	stragglerWins := steps(
		mapper(125*ms, "4", "s1.4", "g0", nil, fired),
		[]step{
			{at: 130 * ms, do: began("s1", "map", "s1.4.r1")},
			{at: 200 * ms, do: putFrom("s1", "g", "piece-4", "map", "s1.4.r1", "group", "g0")},
			{at: 200 * ms, do: putFrom("s1", "l", "done.s1.4.r1", "map", "s1.4.r1")},
			{at: 200 * ms, do: endedWith("s1", "map", "s1.4.r1", 2)},
			{at: time.Minute, do: tick()},
		},
	)
	copyFails := steps(
		[]step{
			{at: 130 * ms, do: began("s1", "map", "s1.4.r1")},
			// The copy's failure is not the invocation's: the straggler
			// still runs, and nothing fails or fires.
			{at: 140 * ms, do: ended("s1", "map", "s1.4.r1", true)},
		},
		mapper(3*time.Second, "4", "s1.4", "g0", nil, fired),
		[]step{{at: time.Minute, do: tick()}},
	)
	// With one attempt, the rule gives up 10 s after the copy: the
	// straggler, still running, must keep the groups open.
	copyFailsGivenUp := steps(
		[]step{
			{at: 130 * ms, do: began("s1", "map", "s1.4.r1")},
			{at: 140 * ms, do: ended("s1", "map", "s1.4.r1", true)},
			{at: 11 * time.Second, do: tick()},
			// Another function's end makes the groups look again.
			{at: 12 * time.Second, do: began("s1", "other", "s1.9")},
			{at: 12 * time.Second, do: ended("s1", "other", "s1.9", false)},
		},
		mapper(15*time.Second, "4", "s1.4", "g0", nil, fired),
	)
	originalFails := steps(
		[]step{
			{at: 130 * ms, do: began("s1", "map", "s1.4.r1")},
			{at: 140 * ms, do: ended("s1", "map", "s1.4", true)}, // the straggler dies; its copy runs on
			{at: 150 * ms, do: tick()},
		},
		mapper(300*ms, "4", "s1.4.r1", "g0", nil, fired),
	)
	bothFail := steps(
		[]step{
			{at: 130 * ms, do: began("s1", "map", "s1.4.r1")},
			{at: 140 * ms, do: ended("s1", "map", "s1.4.r1", true)},
			{at: 150 * ms, do: ended("s1", "map", "s1.4", true)},
			// Both failed: the rule's timeout (10 s after the copy)
			// re-executes it with its last attempt.
			{at: 10*time.Second + 119*ms, do: tick()},
			{at: 10*time.Second + 120*ms, do: tick(), want: []string{"rerun:map#2"}},
			{at: 10*time.Second + 130*ms, do: began("s1", "map", "s1.4.r2")},
		},
		mapper(11*time.Second, "4", "s1.4.r2", "g0", nil, fired),
	)
	runTable(t, []tableCase{
		{"the copy overtakes the straggler", []TriggerSpec{grp, ledger}, copyWins},
		{"the straggler wins before its copy starts", []TriggerSpec{grp, ledger}, stragglerWins},
		{"the copy fails while the straggler runs", []TriggerSpec{grp, ledger}, copyFails},
		{"the copy fails while the straggler runs, and the rule gives up", []TriggerSpec{grp, ledger1}, copyFailsGivenUp},
		{"the straggler fails while its copy runs", []TriggerSpec{grp, ledger}, originalFails},
		{"both fail: the timeout re-executes", []TriggerSpec{grp, ledger}, bothFail},
	})
}

// TestSpeculationTwoStragglers: with x = 0.5 two of four mappers get
// copies. One straggler finishes before its copy starts (the copy's start
// must not reopen it), the other is overtaken by its copy: the groups fire
// when that copy finishes, not when the first straggler's copy does.
func TestSpeculationTwoStragglers(t *testing.T) {
	grp := TriggerSpec{Name: "grp", Bucket: "g", Primitive: DynamicGroup, Sources: []string{"entry"}, Targets: []string{"reduce"}}
	ledger := TriggerSpec{Name: "ledger", Bucket: "l", Primitive: DynamicJoin, Targets: []string{"never"},
		Reruns: []RerunRule{specRule(0.5, 2)}}
	ms := time.Millisecond
	done := func(at time.Duration, m, inv string, onMarker, onEnd []string) []step {
		return []step{
			{at: at, do: putFrom("s1", "g", "piece-"+m, "map", inv, "group", "g")},
			{at: at, do: putFrom("s1", "l", "done."+inv, "map", inv), want: onMarker},
			{at: at, do: endedWith("s1", "map", inv, 2), want: onEnd},
		}
	}
	steps := []step{
		{do: start("s1")},
		{do: began("s1", "entry", "s1.0")},
		{do: began("s1", "map", "s1.1")},
		{do: began("s1", "map", "s1.2")},
		{do: began("s1", "map", "s1.3")},
		{do: began("s1", "map", "s1.4")},
		{do: ended("s1", "entry", "s1.0", false)},
	}
	steps = append(steps, done(10*ms, "1", "s1.1", nil, nil)...)
	steps = append(steps, done(20*ms, "2", "s1.2", []string{"copy:map#1", "copy:map#1"}, nil)...)
	steps = append(steps, done(30*ms, "3", "s1.3", nil, nil)...) // the first straggler wins
	steps = append(steps,
		step{at: 40 * ms, do: began("s1", "map", "s1.3.r1")}, // its copy starts late
		step{at: 50 * ms, do: began("s1", "map", "s1.4.r1")},
	)
	steps = append(steps, done(60*ms, "4", "s1.4.r1", nil, []string{"reduce{g}[piece-1 piece-2 piece-3 piece-4]"})...)
	steps = append(steps, done(5*time.Second, "3", "s1.3.r1", nil, nil)...)
	steps = append(steps, done(6*time.Second, "4", "s1.4", nil, nil)...)
	runTable(t, []tableCase{{"two stragglers", []TriggerSpec{grp, ledger}, steps}})
}

// TestSpeculativeCopyAction checks what the caller gets: the original's
// arguments, a re-execution id, the attempt and the Speculative flag; and
// that a snapshot taken with a copy in flight restores its race.
func TestSpeculativeCopyAction(t *testing.T) {
	e := single(t, TriggerSpec{Name: "t", Bucket: "b", Primitive: Immediate, Targets: []string{"n"}, Reruns: []RerunRule{specRule(0.5, 2)}})
	start("s1")(e, t0)
	e.FunctionStarted(wfName, "s1", "map", "s1.1", []byte("args one"), t0)
	e.FunctionStarted(wfName, "s1", "map", "s1.2", []byte("args two"), t0)
	acts := e.ObjectReady(wfName, Object{Bucket: "b", Key: "k1", Session: "s1", Producer: "map", Invocation: "s1.1"}, t0.Add(time.Second))
	var copy *Action
	for i := range acts {
		if acts[i].Kind == ActRerun {
			copy = &acts[i]
		}
	}
	if copy == nil || !copy.Speculative || copy.Invocation != "s1.2.r1" || copy.Attempt != 1 || string(copy.Args) != "args two" || copy.Trigger != "t" {
		t.Fatalf("%+v", acts)
	}
	e.FunctionStarted(wfName, "s1", "map", "s1.2.r1", nil, t0.Add(time.Second))
	// Restart with the copy in flight: its failure is still not the
	// invocation's, and the original's output still fires once.
	snap, err := e.Snapshot().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(snap), `"reruns":{"s1.2.r1":true},"copies":["s1.2.r1"]`) {
		t.Errorf("snapshot has no copy in flight: %s", snap)
	}
	s, err := UnmarshalSnapshot(snap)
	if err != nil {
		t.Fatal(err)
	}
	e = single(t, TriggerSpec{Name: "t", Bucket: "b", Primitive: Immediate, Targets: []string{"n"}, Reruns: []RerunRule{specRule(0.5, 2)}})
	if err := e.Restore(s); err != nil {
		t.Fatal(err)
	}
	if acts := e.FunctionFinished(wfName, "s1", "map", "s1.2.r1", true, t0.Add(2*time.Second)); len(acts) != 0 {
		t.Fatalf("the copy's failure did something: %v", acts)
	}
	got := describe(e.ObjectReady(wfName, Object{Bucket: "b", Key: "k2", Session: "s1", Producer: "map", Invocation: "s1.2"}, t0.Add(3*time.Second)))
	if strings.Join(got, ";") != "n[k2]" {
		t.Fatalf("fired %q", got)
	}
}

func TestSpeculationValidation(t *testing.T) {
	for _, tc := range []struct {
		rule RerunRule
		err  string
	}{
		{RerunRule{SourceFunction: "map", Scope: PerObject, Timeout: time.Second, MaxAttempts: 1, SpeculateAfter: 1}, "not a fraction"},
		{RerunRule{SourceFunction: "map", Scope: PerObject, Timeout: time.Second, MaxAttempts: 1, SpeculateAfter: -0.1}, "not a fraction"},
		{RerunRule{SourceFunction: "map", Scope: PerSession, Timeout: time.Second, MaxAttempts: 1, SpeculateAfter: 0.9}, "need scope PerObject"},
	} {
		spec := WorkflowSpec{Name: wfName, Entry: "e", OutputBucket: "out", SessionDeadline: time.Hour,
			Triggers: []TriggerSpec{{Name: "t", Bucket: "b", Primitive: Immediate, Targets: []string{"n"}, Reruns: []RerunRule{tc.rule}}}}
		if err := spec.Validate(); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%+v: %v, want %q", tc.rule, err, tc.err)
		}
	}
}

// Re-executions that are not speculative share the bookkeeping that makes
// the first success win and keeps an invocation open while one of its
// executions may still send output.
func TestReexecutionRaces(t *testing.T) {
	grp := TriggerSpec{Name: "grp", Bucket: "g", Primitive: DynamicGroup, Sources: []string{"entry"}, Targets: []string{"reduce"}}
	ledger := TriggerSpec{Name: "ledger", Bucket: "l", Primitive: DynamicJoin, Targets: []string{"never"},
		Reruns: []RerunRule{{SourceFunction: "map", Scope: PerObject, Timeout: 10 * time.Second, MaxAttempts: 1}}}
	prefix := []step{
		{do: start("s1")},
		{do: began("s1", "entry", "s1.0")},
		{do: began("s1", "map", "s1.1")},
		{do: ended("s1", "entry", "s1.0", false)},
		{at: 10 * time.Second, do: tick(), want: []string{"rerun:map#1"}},
	}
	runTable(t, []tableCase{
		{"a re-execution failing after its original succeeded leaves the success standing", []TriggerSpec{grp, ledger}, append(append([]step(nil), prefix...),
			step{at: 11 * time.Second, do: putFrom("s1", "l", "done.s1.1", "map", "s1.1")},
			step{at: 11 * time.Second, do: endedWith("s1", "map", "s1.1", 2)}, // its piece is still on its way
			step{at: 12 * time.Second, do: began("s1", "map", "s1.1.r1")},
			step{at: 13 * time.Second, do: ended("s1", "map", "s1.1.r1", true)},
			step{at: 14 * time.Second, do: putFrom("s1", "g", "piece-1", "map", "s1.1", "group", "g"), want: []string{"reduce{g}[piece-1]"}},
		)},
		{"the rule giving up does not close an invocation whose re-execution may still run", []TriggerSpec{grp, ledger}, append(append([]step(nil), prefix[:4]...),
			step{at: 5 * time.Second, do: ended("s1", "map", "s1.1", true)},
			step{at: 10 * time.Second, do: tick(), want: []string{"rerun:map#1"}},
			step{at: 20 * time.Second, do: tick()}, // given up; the re-execution has not even started
			step{at: 21 * time.Second, do: began("s1", "other", "s1.9")},
			step{at: 21 * time.Second, do: ended("s1", "other", "s1.9", false)},
			step{at: 22 * time.Second, do: began("s1", "map", "s1.1.r1")},
			step{at: 23 * time.Second, do: putFrom("s1", "g", "piece-1", "map", "s1.1.r1", "group", "g")},
			step{at: 23 * time.Second, do: endedWith("s1", "map", "s1.1.r1", 1), want: []string{"reduce{g}[piece-1]"}},
		)},
		{"a resent start of a re-execution that ended does not reopen its invocation", []TriggerSpec{grp, ledger}, []step{
			{do: start("s1")},
			{do: began("s1", "entry", "s1.0")},
			{do: began("s1", "map", "s1.1")},
			{do: began("s1", "map", "s1.2")},
			{do: ended("s1", "entry", "s1.0", false)},
			{at: 5 * time.Second, do: ended("s1", "map", "s1.1", true)},
			{at: 10 * time.Second, do: tick(), want: []string{"rerun:map#1", "rerun:map#1"}},
			{at: 12 * time.Second, do: began("s1", "map", "s1.1.r1")},
			{at: 13 * time.Second, do: putFrom("s1", "g", "piece-1", "map", "s1.1.r1", "group", "g")},
			{at: 13 * time.Second, do: endedWith("s1", "map", "s1.1.r1", 1)},
			{at: 14 * time.Second, do: began("s1", "map", "s1.1.r1")}, // resent after its end
			{at: 15 * time.Second, do: putFrom("s1", "g", "piece-2", "map", "s1.2", "group", "g")},
			{at: 15 * time.Second, do: endedWith("s1", "map", "s1.2", 1), want: []string{"reduce{g}[piece-1 piece-2]"}},
		}},
	})
}
