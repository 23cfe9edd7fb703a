package invocation

import (
	"bytes"
	"encoding/json"
	"testing"
)

// A re-execution gets everything its original carried: its DynamicGroup
// group, trigger and arguments, and its objects with their contents — an
// empty object included (issue 15, items 7 and 9).
func TestRerunEnvelopeKeepsTheOriginal(t *testing.T) {
	orig := &Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-reduce", Session: "s", Invocation: "s.4", Trigger: "grp", Group: "g1",
		Args: []byte("a"), Objects: []Object{{Bucket: "b", Key: "empty", Inline: []byte{}}, {Bucket: "b", Key: "big", Size: 9, Ref: "zt1.x"}}}
	args, err := RerunArgs(orig)
	if err != nil {
		t.Fatal(err)
	}
	got, err := RerunEnvelope(Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-reduce", Session: "s", Invocation: "s.4.r1", Attempt: 1}, args)
	if err != nil {
		t.Fatal(err)
	}
	if got.Group != "g1" || got.Trigger != "grp" || string(got.Args) != "a" || got.Invocation != "s.4.r1" || got.Attempt != 1 {
		t.Errorf("re-execution envelope %+v", got)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("re-execution envelope is invalid: %v (args %s)", err, args)
	}
	if len(got.Objects) != 2 || got.Objects[0].Inline == nil || len(got.Objects[0].Inline) != 0 || got.Objects[1].Ref != "zt1.x" {
		t.Errorf("objects %+v", got.Objects)
	}
}

// Arguments checkpointed by the previous version (the objects alone) still
// re-execute.
func TestRerunEnvelopeFromOldArguments(t *testing.T) {
	old, _ := json.Marshal([]map[string]any{{"bucket": "b", "key": "k", "session": "s", "inline": []byte("x")}})
	got, err := RerunEnvelope(Envelope{Function: "f", Session: "s", Invocation: "s.1.r1", Attempt: 1}, old)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Objects) != 1 || !bytes.Equal(got.Objects[0].Inline, []byte("x")) || got.Validate() != nil {
		t.Errorf("%+v", got)
	}
	if _, err := RerunEnvelope(Envelope{Invocation: "s.1.r1"}, []byte("{broken")); err == nil {
		t.Error("corrupt arguments were accepted")
	}
}
