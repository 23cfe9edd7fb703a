package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

// The workload: four shapes of session, each a Workflow of Python
// functions (the image catalog's generic Python with the SDK). Every
// invocation appends its record — function, invocation id, attempt and
// idempotency key — to what it returns or sends, and writes the same
// record as one line to the effects file (its user-visible side effect,
// outside ziptrail): the checker reads both.

// pythonImage is the image catalog's generic Python 3 with the SDK.
const pythonImage = "ghcr.io/ziptrail/python:3"

// pyPrelude is every function's. Its handle works for a while (a sleep of
// up to WORK seconds, uniform: faults then find invocations in flight),
// runs the function's body with the invocation's record
// "fn:id:attempt:key", and records the invocation's effect — one O_APPEND
// write of one line "<session> <record>" — last, just before it returns:
// an invocation killed before it completed has no effect. The key is read
// defensively: the SDK exposes it from issue 32 on (inv.idempotency_key);
// before, it is "".
const pyPrelude = `
import os, random, time, ziptrail
EFFECTS = %q
WORK = %f
FN = %q
def handle(inv):
    time.sleep(random.uniform(0, WORK))
    key = str(getattr(inv, "idempotency_key", "") or "")
    for c in " |@;:\n":
        key = key.replace(c, "_")
    rec = "%%s:%%s:%%s:%%s" %% (FN, inv.id, inv.attempt, key)
    out = body(inv, rec)
    fd = os.open(EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, ("%%s %%s\n" %% (inv.session, rec)).encode())
    finally:
        os.close(fd)
    return out
`

// shape is one kind of session: its Workflow and the check of a result.
type shape struct {
	name  string
	spec  func(w work) v1alpha1.WorkflowSpec
	check func(input, result string) error
}

var shapes = []shape{
	{name: "chain", spec: chainSpec, check: checkChain},
	{name: "fan", spec: fanSpec, check: checkFan},
	{name: "vote", spec: voteSpec, check: checkVote},
	{name: "window", spec: windowSpec, check: checkWindow},
}

// work is what every function of a run shares: the effects file and the
// longest work (sleep) of an invocation.
type work struct {
	effects string
	max     time.Duration
}

func pyFn(w work, name, body string) v1alpha1.FunctionSpec {
	src := fmt.Sprintf(pyPrelude, w.effects, w.max.Seconds(), name) + body + "\nziptrail.serve(handle)\n"
	one := int32(1)
	// One warm pod each: the run measures faults, not cold starts.
	return v1alpha1.FunctionSpec{Name: name, Image: pythonImage, Command: []string{"python3", "-c", src}, MinScale: &one}
}

func trigger(name, bucket string, spec v1alpha1.TriggerSpec) v1alpha1.NamedTrigger {
	spec.Bucket = bucket
	return v1alpha1.NamedTrigger{Name: name, Spec: spec}
}

func buckets(names ...string) []v1alpha1.NamedBucket {
	var bs []v1alpha1.NamedBucket
	for _, n := range names {
		bs = append(bs, v1alpha1.NamedBucket{Name: n})
	}
	return bs
}

// record is one invocation's "fn:id:attempt:key".
type record struct{ fn, id, attempt, key string }

func parseRecord(s string) (record, error) {
	parts := strings.SplitN(s, ":", 4)
	if len(parts) != 4 || parts[0] == "" || parts[1] == "" {
		return record{}, fmt.Errorf("not a record %q", s)
	}
	return record{parts[0], parts[1], parts[2], parts[3]}, nil
}

// chain: c1 -> c2 -> c3 (function-oriented: dependencies edges); each
// returns its input with its record appended. Result:
// "<input>|<c1 record>|<c2 record>|<c3 record>".
func chainSpec(w work) v1alpha1.WorkflowSpec {
	step := func(name string) v1alpha1.FunctionSpec {
		return pyFn(w, name, `
def body(inv, rec):
    return inv.objects[0].bytes() + b"|" + rec.encode()`)
	}
	return v1alpha1.WorkflowSpec{Entry: "c1", Functions: []v1alpha1.FunctionSpec{step("c1"), step("c2"), step("c3")},
		Dependencies: []v1alpha1.Dependency{{From: []string{"c1"}, To: []string{"c2"}}, {From: []string{"c2"}, To: []string{"c3"}}}}
}

func checkChain(input, result string) error {
	parts := strings.Split(result, "|")
	if len(parts) != 4 || parts[0] != input {
		return fmt.Errorf("want %q and 3 records, got %q", input, result)
	}
	for i, p := range parts[1:] {
		r, err := parseRecord(p)
		if err != nil {
			return err
		}
		if want := fmt.Sprintf("c%d", i+1); r.fn != want {
			return fmt.Errorf("step %d ran %s, want %s: %q", i+1, r.fn, want, result)
		}
	}
	return nil
}

// fanKeys are the objects the fan's entry sends, and fanGroup their group.
var fanKeys = []string{"k0", "k1", "k2", "k3", "k4", "k5"}

func fanGroup(i int) string { return fmt.Sprintf("g%d", i%3) }

// fan: entry sends 6 objects in 3 groups (metadata g) to "shuffle"; a
// DynamicGroup (sources: entry) invokes reduce once per group, which sends
// "<input>:<group>=<keys>@<records>" to "groups" (3 expected); a
// DynamicJoin invokes collect once, which sends the sorted groups and its
// record as the result.
func fanSpec(w work) v1alpha1.WorkflowSpec {
	entry := pyFn(w, "entry", `
def body(inv, rec):
    data = inv.objects[0].bytes().decode()
    for i in range(6):
        ziptrail.send_object("shuffle", "k%d" % i, "%s@%s" % (data, rec), metadata={"g": "g%d" % (i % 3)})
    return b""`)
	reduce := pyFn(w, "reduce", `
def body(inv, rec):
    keys = ",".join(sorted(o.key for o in inv.objects))
    inputs = sorted(set(o.bytes().decode() for o in inv.objects))
    ziptrail.send_object("groups", inv.group, "%s=%s@%s@%s" % (inv.group, keys, rec, "+".join(inputs)),
                         metadata={"ziptrail.expected-count": "3"})
    return b""`)
	collect := pyFn(w, "collect", `
def body(inv, rec):
    ziptrail.send_object("output", "result", ";".join(sorted(o.bytes().decode() for o in inv.objects)) + "|" + rec)
    return b""`)
	return v1alpha1.WorkflowSpec{Entry: "entry", Functions: []v1alpha1.FunctionSpec{entry, reduce, collect},
		Buckets: buckets("shuffle", "groups", "output"),
		Triggers: []v1alpha1.NamedTrigger{
			trigger("by-group", "shuffle", v1alpha1.TriggerSpec{Primitive: v1alpha1.DynamicGroup,
				DynamicGroup: &v1alpha1.DynamicGroupParams{GroupMetadataKey: "g", Sources: []string{"entry"}}, Targets: []string{"reduce"}}),
			trigger("gather", "groups", v1alpha1.TriggerSpec{Primitive: v1alpha1.DynamicJoin,
				DynamicJoin: &v1alpha1.DynamicJoinParams{}, Targets: []string{"collect"}}),
		}}
}

func checkFan(input, result string) error {
	body, last, ok := strings.Cut(result, "|")
	if !ok {
		return fmt.Errorf("no collect record: %q", result)
	}
	if r, err := parseRecord(last); err != nil || r.fn != "collect" {
		return fmt.Errorf("last record %q is not collect's", last)
	}
	groups := strings.Split(body, ";")
	if len(groups) != 3 {
		return fmt.Errorf("want 3 groups, got %d: %q", len(groups), result)
	}
	entries := map[string]bool{}
	for i, g := range groups {
		parts := strings.Split(g, "@")
		// <group>=<keys> @ <reduce record> @ <input>@<entry record>[+...]
		if len(parts) != 4 {
			return fmt.Errorf("group %q is not <group>=<keys>@<record>@<input>@<record>", g)
		}
		var want []string
		for j, k := range fanKeys {
			if fanGroup(j) == fmt.Sprintf("g%d", i) {
				want = append(want, k)
			}
		}
		if parts[0] != fmt.Sprintf("g%d=%s", i, strings.Join(want, ",")) {
			return fmt.Errorf("group %d is %q, want g%d=%s", i, parts[0], i, strings.Join(want, ","))
		}
		if r, err := parseRecord(parts[1]); err != nil || r.fn != "reduce" {
			return fmt.Errorf("group %d: %q is not reduce's record", i, parts[1])
		}
		if parts[2] != input {
			return fmt.Errorf("group %d holds input %q, want %q", i, parts[2], input)
		}
		entries[parts[3]] = true
	}
	if len(entries) != 1 {
		return fmt.Errorf("the groups hold objects of %d entry invocations (want 1): %v", len(entries), entries)
	}
	return nil
}

// vote: entry sends 3 objects to "work"; an Immediate trigger invokes
// worker for each, which sends its vote r<i> to "votes"; a Redundant
// trigger (2 of 3) invokes decide once, which sends the sorted votes it got
// and its record as the result.
func voteSpec(w work) v1alpha1.WorkflowSpec {
	entry := pyFn(w, "entry", `
def body(inv, rec):
    data = inv.objects[0].bytes()
    for i in range(1, 4):
        ziptrail.send_object("work", "w%d" % i, data)
    return b""`)
	worker := pyFn(w, "worker", `
def body(inv, rec):
    o = inv.objects[0]
    ziptrail.send_object("votes", "r" + o.key[1:], "%s:%s@%s" % (o.bytes().decode(), "r" + o.key[1:], rec))
    return b""`)
	decide := pyFn(w, "decide", `
def body(inv, rec):
    ziptrail.send_object("output", "result", ";".join(sorted(o.bytes().decode() for o in inv.objects)) + "|" + rec)
    return b""`)
	return v1alpha1.WorkflowSpec{Entry: "entry", Functions: []v1alpha1.FunctionSpec{entry, worker, decide},
		Buckets: buckets("work", "votes", "output"),
		Triggers: []v1alpha1.NamedTrigger{
			trigger("each", "work", v1alpha1.TriggerSpec{Primitive: v1alpha1.Immediate, Targets: []string{"worker"}}),
			trigger("two-of-three", "votes", v1alpha1.TriggerSpec{Primitive: v1alpha1.Redundant,
				Redundant: &v1alpha1.RedundantParams{K: 2, N: 3}, Targets: []string{"decide"}}),
		}}
}

func checkVote(input, result string) error {
	body, last, ok := strings.Cut(result, "|")
	if !ok {
		return fmt.Errorf("no decide record: %q", result)
	}
	if r, err := parseRecord(last); err != nil || r.fn != "decide" {
		return fmt.Errorf("last record %q is not decide's", last)
	}
	votes := strings.Split(body, ";")
	if len(votes) != 2 {
		return fmt.Errorf("want 2 of 3 votes, got %d: %q", len(votes), result)
	}
	seen := map[string]bool{}
	for _, v := range votes {
		head, rec, ok := strings.Cut(v, "@")
		in, name, ok2 := strings.Cut(head, ":")
		if !ok || !ok2 || in != input || !slices.Contains([]string{"r1", "r2", "r3"}, name) {
			return fmt.Errorf("vote %q is not %s:r<1..3>@<record>", v, input)
		}
		if r, err := parseRecord(rec); err != nil || r.fn != "worker" {
			return fmt.Errorf("vote %q: not a worker's record", v)
		}
		seen[name] = true
	}
	if len(seen) != 2 {
		return fmt.Errorf("the same vote twice: %q", result)
	}
	return nil
}

// windowMS is the window's ByTime length.
const windowMS = 500

// window: entry sends e1, e2, e3 to "events" at once; a ByTime window
// invokes agg once with all three, which sends them and its record.
func windowSpec(w work) v1alpha1.WorkflowSpec {
	entry := pyFn(w, "entry", `
def body(inv, rec):
    data = inv.objects[0].bytes()
    for k in ("e1", "e2", "e3"):
        ziptrail.send_object("events", k, data)
    return b""`)
	agg := pyFn(w, "agg", `
def body(inv, rec):
    keys = sorted(o.key for o in inv.objects)
    inputs = sorted(set(o.bytes().decode() for o in inv.objects))
    ziptrail.send_object("output", "result", "%s:%d:%s|%s" % ("+".join(inputs), len(keys), ",".join(keys), rec))
    return b""`)
	return v1alpha1.WorkflowSpec{Entry: "entry", Functions: []v1alpha1.FunctionSpec{entry, agg},
		Buckets: buckets("events", "output"),
		Triggers: []v1alpha1.NamedTrigger{trigger("window", "events", v1alpha1.TriggerSpec{Primitive: v1alpha1.ByTime,
			ByTime: &v1alpha1.ByTimeParams{Window: metav1.Duration{Duration: windowMS * time.Millisecond}}, Targets: []string{"agg"}})}}
}

func checkWindow(input, result string) error {
	body, last, ok := strings.Cut(result, "|")
	if !ok {
		return fmt.Errorf("no agg record: %q", result)
	}
	if r, err := parseRecord(last); err != nil || r.fn != "agg" {
		return fmt.Errorf("last record %q is not agg's", last)
	}
	if want := input + ":3:e1,e2,e3"; body != want {
		return fmt.Errorf("window %q, want %q", body, want)
	}
	return nil
}
