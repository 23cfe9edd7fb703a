package engine

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// TestPropertyExactlyOnce drives many sessions through random arrival
// orders, duplicates, clock jumps and restarts through Snapshot/Restore, and
// checks that every expected firing happened exactly once and that nothing
// fired for a session after it completed.
func TestPropertyExactlyOnce(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { propertyRun(t, seed) })
	}
}

var propertyTriggers = []TriggerSpec{
	{Name: "imm", Bucket: "a", Primitive: Immediate, Targets: []string{"f"}},
	{Name: "set", Bucket: "b", Primitive: BySet, Keys: []string{"k0", "k1", "k2", "k3"}, Targets: []string{"f"}},
	{Name: "batch", Bucket: "c", Primitive: ByBatchSize, BatchSize: 3, Targets: []string{"f"}},
	{Name: "red", Bucket: "d", Primitive: Redundant, K: 2, N: 4, Targets: []string{"f"}},
	{Name: "grp", Bucket: "g", Primitive: DynamicGroup, Sources: []string{"map"}, Targets: []string{"f"}},
	{Name: "time", Bucket: "t", Primitive: ByTime, Window: time.Second, Targets: []string{"f"}},
}

type ev struct {
	kind   string // put, end, out
	bucket string
	key    string
	group  string
}

func newPropertyEngine(t *testing.T) *Engine {
	e := New(4)
	if err := e.SetWorkflow(WorkflowSpec{Name: wfName, Entry: "entry", OutputBucket: "out", SessionDeadline: 24 * time.Hour, Triggers: propertyTriggers}); err != nil {
		t.Fatal(err)
	}
	return e
}

func propertyRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed*7919))
	e := newPropertyEngine(t)
	now := t0
	const sessions = 12
	type expect struct {
		imm, batchKeys, timeKeys map[string]bool
		set, red                 bool
		groups                   map[string]int // group -> objects
		batches                  int
	}
	want := map[string]*expect{}
	queues := map[string][]ev{}
	for i := 0; i < sessions; i++ {
		s := fmt.Sprintf("s%d", i)
		if _, err := e.StartSession(wfName, s, Object{}, now); err != nil {
			t.Fatal(err)
		}
		e.FunctionStarted(wfName, s, "map", s+".m", nil, now)
		x := &expect{imm: map[string]bool{}, batchKeys: map[string]bool{}, timeKeys: map[string]bool{}, groups: map[string]int{}}
		var q []ev
		for j := 0; j < rng.IntN(5); j++ {
			k := fmt.Sprintf("a%d", j)
			x.imm[k] = true
			q = append(q, ev{kind: "put", bucket: "a", key: k})
		}
		setKeys := rng.IntN(5) // 4 means complete
		for j := 0; j < setKeys; j++ {
			q = append(q, ev{kind: "put", bucket: "b", key: fmt.Sprintf("k%d", j)})
		}
		x.set = setKeys >= 4
		nc := rng.IntN(8)
		for j := 0; j < nc; j++ {
			q = append(q, ev{kind: "put", bucket: "c", key: fmt.Sprintf("c%d", j)})
		}
		x.batches = nc / 3
		nd := rng.IntN(5)
		for j := 0; j < nd; j++ {
			q = append(q, ev{kind: "put", bucket: "d", key: fmt.Sprintf("d%d", j)})
		}
		x.red = nd >= 2
		for j := 0; j < rng.IntN(6); j++ {
			g := fmt.Sprintf("g%d", rng.IntN(3))
			x.groups[g]++
			q = append(q, ev{kind: "put", bucket: "g", key: fmt.Sprintf("g-%d", j), group: g})
		}
		for j := 0; j < rng.IntN(5); j++ {
			k := fmt.Sprintf("t%d", j)
			x.timeKeys[k] = true
			q = append(q, ev{kind: "put", bucket: "t", key: k})
		}
		// Duplicates (sidecar resends) anywhere.
		for j := 0; j < len(q)/2; j++ {
			q = append(q, q[rng.IntN(len(q))])
		}
		rng.Shuffle(len(q), func(a, b int) { q[a], q[b] = q[b], q[a] })
		// Ordering the protocol guarantees: a mapper's outputs precede its finish.
		q = append(q, ev{kind: "end"}, ev{kind: "end"}) // a duplicate finish too
		want[s] = x
		queues[s] = q
	}

	fired := map[string]map[string][]string{} // session -> trigger -> keys
	groupsFired := map[string]map[string]int{}
	completed := map[string]bool{}
	record := func(acts []Action) {
		for _, a := range acts {
			if a.Kind == ActSessionComplete {
				completed[a.Session] = true
			}
			if a.Kind != ActInvoke || a.Trigger == "" {
				continue
			}
			if completed[a.Session] {
				t.Fatalf("%s fired after session %s completed", a.Trigger, a.Session)
			}
			if fired[a.Session] == nil {
				fired[a.Session] = map[string][]string{}
				groupsFired[a.Session] = map[string]int{}
			}
			for _, o := range a.Objects {
				fired[a.Session][a.Trigger] = append(fired[a.Session][a.Trigger], o.Key)
			}
			if a.Trigger == "grp" {
				groupsFired[a.Session][a.Group] += len(a.Objects)
			}
			if a.Trigger == "set" || a.Trigger == "red" || a.Trigger == "batch" {
				fired[a.Session][a.Trigger+"#"] = append(fired[a.Session][a.Trigger+"#"], "x")
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
		e = newPropertyEngine(t)
		if err := e.Restore(snap); err != nil {
			t.Fatal(err)
		}
	}

	active := make([]string, 0, sessions)
	for s := range queues {
		active = append(active, s)
	}
	sort.Strings(active)
	for len(active) > 0 {
		i := rng.IntN(len(active))
		s := active[i]
		q := queues[s]
		x := q[0]
		queues[s] = q[1:]
		now = now.Add(time.Duration(rng.IntN(400)) * time.Millisecond)
		switch x.kind {
		case "put":
			md := map[string]string{}
			if x.group != "" {
				md["group"] = x.group
			}
			record(e.ObjectReady(wfName, Object{Bucket: x.bucket, Key: x.key, Session: s, Metadata: md, Producer: "map", Invocation: s + ".m"}, now))
		case "end":
			record(e.FunctionFinished(wfName, s, "map", s+".m", false, now))
		}
		if rng.IntN(4) == 0 {
			record(e.Tick(now))
		}
		if rng.IntN(20) == 0 {
			restart()
		}
		if len(queues[s]) == 0 {
			active = append(active[:i], active[i+1:]...)
		}
	}
	// Let every ByTime window close, then complete each session and check
	// that late traffic fires nothing.
	now = now.Add(2 * time.Second)
	record(e.Tick(now))
	for s := range want {
		record(e.ObjectReady(wfName, Object{Bucket: "out", Key: "result", Session: s}, now))
		if !completed[s] {
			t.Fatalf("session %s did not complete", s)
		}
		record(e.ObjectReady(wfName, Object{Bucket: "a", Key: "late", Session: s}, now))
		record(e.FunctionFinished(wfName, s, "map", s+".m", false, now))
	}
	record(e.Tick(now.Add(time.Hour)))
	if n := e.Sessions(); n != 0 {
		t.Errorf("%d sessions left after completion", n)
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
	}
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
