package invocation

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	good := Envelope{Namespace: "ns", Function: "f", Session: "s", Invocation: "i",
		Objects: []Object{{Bucket: "b", Key: "k", Ref: "zt1.abc"}, {Bucket: "b", Key: "small", Inline: []byte("hi")}}}
	data, _ := json.Marshal(good)
	got, err := Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if refs := got.Refs(); len(refs) != 1 || refs[0] != "zt1.abc" || string(got.Objects[1].Inline) != "hi" {
		t.Errorf("round trip: %+v", got)
	}
	for name, tc := range map[string]struct{ body, err string }{
		"not json":       {`{"session":`, "malformed envelope"},
		"no session":     {`{"function":"f","invocation":"i"}`, "session, function and invocation id are required"},
		"object no key":  {`{"function":"f","session":"s","invocation":"i","objects":[{"bucket":"b","ref":"x"}]}`, "bucket and key are required"},
		"object no data": {`{"function":"f","session":"s","invocation":"i","objects":[{"bucket":"b","key":"k"}]}`, "neither a reference nor inline bytes"},
		"too large":      {strings.Repeat(" ", MaxEnvelopeBytes+1), "exceeds"},
	} {
		if _, err := Decode(strings.NewReader(tc.body)); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: got %v, want error containing %q", name, err, tc.err)
		}
	}
}

// An empty object is a valid object: it survives encoding and decoding.
func TestEmptyInlineObjectRoundTrip(t *testing.T) {
	env := Envelope{Function: "f", Session: "s", Invocation: "i", Objects: []Object{{Bucket: "b", Key: "k", Inline: []byte{}}}}
	body, err := json.Marshal(&env)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	if o := got.Objects[0]; o.Inline == nil || len(o.Inline) != 0 {
		t.Fatalf("empty object came back as %#v", o)
	}
}
