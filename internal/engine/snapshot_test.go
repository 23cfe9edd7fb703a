package engine

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"testing"
	"time"
)

// fullState has every field of State set, nested values included.
func fullState() *State {
	obj := func(k string) Object {
		return Object{Bucket: "b", Key: k, Session: "s", Size: 3, Ref: "r" + k, Inline: []byte("in" + k), Metadata: map[string]string{"group": k},
			Producer: "map", Invocation: "s.m" + k, FiredLocally: []string{"d" + k}}
	}
	return &State{
		Objects:       []Object{obj("1"), {Bucket: "b", Key: "empty", Session: "s", Inline: []byte{}}},
		Keys:          map[string]bool{"k": true},
		Fired:         true,
		WindowEnd:     t0.Add(time.Second),
		Expected:      map[string]bool{"e": true},
		ExpectedCount: 2,
		Groups:        map[string][]Object{"g": {obj("2")}},
		Declarers:     map[string]bool{"f": true},
		Pending:       map[string]*Pending{"s.m1": {Function: "map", Args: []byte("args"), Deadline: t0, Attempts: 1, Rule: 0, Wave: true, Copied: true, Speculate: true}},
		Waves:         map[int]*Wave{0: {Members: 2, Finished: 1, Open: 1, Upstream: []string{"s.0"}}},
		Custom:        json.RawMessage(`{"x":1}`),
	}
}

// The snapshot's copy of a trigger's state is what a round trip through
// its JSON gave before (what a checkpoint saves), and nothing done to the
// engine's state afterwards reaches it.
func TestStateCloneIsADeepCopy(t *testing.T) {
	orig := fullState()
	v := reflect.ValueOf(*orig)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Fatalf("fullState leaves State.%s unset: set it, and copy it in clone", v.Type().Field(i).Name)
		}
	}
	want, _ := json.Marshal(orig)
	var viaJSON State
	if err := json.Unmarshal(want, &viaJSON); err != nil {
		t.Fatal(err)
	}
	c := orig.clone()
	got, _ := json.Marshal(c)
	if !bytes.Equal(got, want) {
		t.Fatalf("clone encodes as\n%s\nwant\n%s", got, want)
	}
	if rt, _ := json.Marshal(&viaJSON); !bytes.Equal(rt, got) {
		t.Fatalf("the round trip encodes as\n%s\nthe clone as\n%s", rt, got)
	}
	if c.Objects[0].FiredLocally != nil || c.Groups["g"][0].FiredLocally != nil {
		t.Errorf("FiredLocally (not saved) copied: %v", c.Objects[0].FiredLocally)
	}
	if c.Objects[1].Inline == nil || len(c.Objects[1].Inline) != 0 {
		t.Errorf("an empty inline object's contents: %#v", c.Objects[1].Inline)
	}
	// change everything the original holds
	orig.Objects[0].Metadata["group"] = "changed"
	orig.Objects[0].Inline[0] = 'X'
	orig.Objects = append(orig.Objects[:1], Object{Key: "new"})
	orig.Keys["k2"] = true
	orig.Expected["e2"] = true
	orig.Declarers["f2"] = true
	orig.Groups["g"][0].Key = "changed"
	orig.Groups["g2"] = nil
	orig.Pending["s.m1"].Attempts = 9
	orig.Pending["s.m1"].Args[0] = 'X'
	orig.Waves[0].Upstream[0] = "changed"
	orig.Waves[0].Open = 9
	orig.Custom[2] = 'y'
	if after, _ := json.Marshal(c); !bytes.Equal(after, want) {
		t.Fatalf("the copy changed with the original:\n%s\nwant\n%s", after, want)
	}
}

// BenchmarkSnapshotShuffle4096 is a checkpoint's engine side with a
// shuffle's 4,096 objects kept in a DynamicGroup: the copy taken under
// the lock, then its encoding.
func BenchmarkSnapshotShuffle4096(b *testing.B) {
	const n = 4096
	e := benchEngine(b, TriggerSpec{Name: "t", Bucket: "shuffle", Primitive: DynamicGroup, Sources: []string{"map"}, Targets: []string{"reduce"}})
	if _, err := e.StartSession(wfName, "s", Object{}, t0); err != nil {
		b.Fatal(err)
	}
	e.FunctionFinished(wfName, "s", "entry", "s.0", false, t0)
	e.FunctionStarted(wfName, "s", "map", "s.m", nil, t0)
	for k := range n {
		e.ObjectReady(wfName, Object{Bucket: "shuffle", Key: strconv.Itoa(k), Session: "s", Invocation: "s.m", Producer: "map", Ref: "ref-" + strconv.Itoa(k),
			Metadata: map[string]string{"group": strconv.Itoa(k % 64), "zt-mapper": "0", "zt-partition": strconv.Itoa(k % 64), "zt-shuffle": "pointer",
				"zt-job": `{"name":"sort","method":"s3","partitions":64,"rounds":1}`}}, t0)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := e.Snapshot().Marshal(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1e3, "ms/checkpoint")
}

// TestEmptyInlineObjectSurvivesACheckpoint: an empty object is an object
// ("inline": ""), nil contents are left out, and a reference keeps no
// contents; all three through the snapshot's encoding and back.
func TestEmptyInlineObjectSurvivesACheckpoint(t *testing.T) {
	in := []Object{
		{Bucket: "b", Key: "empty", Inline: []byte{}},
		{Bucket: "b", Key: "none"},
		{Bucket: "b", Key: "ref", Ref: "zt1.x", Inline: []byte{}},
	}
	data, err := json.Marshal(cloneObjects(in))
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"bucket":"b","key":"empty","session":"","inline":""},{"bucket":"b","key":"none","session":""},{"bucket":"b","key":"ref","session":"","ref":"zt1.x"}]`
	if string(data) != want {
		t.Fatalf("encoded\n%s\nwant\n%s", data, want)
	}
	var out []Object
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	if out[0].Inline == nil || len(out[0].Inline) != 0 || out[1].Inline != nil || out[2].Inline != nil {
		t.Fatalf("decoded inline: %#v %#v %#v", out[0].Inline, out[1].Inline, out[2].Inline)
	}
}
