package invocation

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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

// TestOpenInDir: only regular files directly inside the directory open;
// symlinks, FIFOs, subdirectories and paths elsewhere are refused without
// being followed (or blocking), and inputs need the sidecar's names.
func TestOpenInDir(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	name := NewInputName()
	for path, data := range map[string]string{filepath.Join(dir, name): "input", filepath.Join(dir, "put-1"): "put",
		filepath.Join(outside, "secret"): "secret"} {
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, ok := range []string{name, filepath.Join(dir, name), "put-1", filepath.Join(dir, "put-1")} {
		f, st, err := OpenInDir(dir, ok)
		if err != nil || !st.Mode().IsRegular() {
			t.Errorf("OpenInDir(%q): %v", ok, err)
			continue
		}
		f.Close()
	}
	for _, bad := range []string{"link", "fifo", "sub", "../" + filepath.Base(outside) + "/secret", filepath.Join(outside, "secret"),
		"sub/../../" + filepath.Base(outside) + "/secret", ".", "..", "", "missing", dir} {
		if f, _, err := OpenInDir(dir, bad); err == nil || !errors.Is(err, ErrBadPath) {
			t.Errorf("OpenInDir(%q) = %v, want ErrBadPath", bad, err)
			if f != nil {
				f.Close()
			}
		}
	}
	if _, _, err := OpenInput(dir, "put-1"); !errors.Is(err, ErrBadPath) {
		t.Errorf("OpenInput of a file the sidecar did not name: %v", err)
	}
	if f, _, err := OpenInput(dir, name); err != nil {
		t.Errorf("OpenInput(%q): %v", name, err)
	} else {
		f.Close()
	}
	if a, b := NewInputName(), NewInputName(); a == b || !IsInputName(a) || IsInputName(a+"0") || IsInputName("in-"+strings.Repeat("G", 32)) {
		t.Errorf("input names %q %q", a, b)
	}
}

func TestMediaTypes(t *testing.T) {
	for ct, want := range map[string]bool{ContentType: true, ContentType + "; charset=utf-8": true, " " + strings.ToUpper(ContentType): true,
		ContentType + "x": false, "application/json": false, "": false, OutputsContentType: false} {
		if IsEnvelope(ct) != want {
			t.Errorf("IsEnvelope(%q) != %v", ct, want)
		}
	}
	if !IsOutputs(OutputsContentType) || IsOutputs(ContentType) {
		t.Error("IsOutputs")
	}
}

// A path is valid only in the sidecar's form and never next to inline
// bytes; envelopes from outside may carry none.
func TestPathRules(t *testing.T) {
	name := NewInputName()
	for path, valid := range map[string]bool{name: true, "/etc/hostname": false, "../" + name: false, name + "/x": false} {
		env := Envelope{Function: "f", Session: "s", Invocation: "i", Objects: []Object{{Bucket: "b", Key: "k", Path: path}}}
		if err := env.Validate(); (err == nil) != valid {
			t.Errorf("Validate with path %q: %v", path, err)
		}
		if err := env.RefusePaths(); !errors.Is(err, ErrPathFromOutside) {
			t.Errorf("RefusePaths with path %q: %v", path, err)
		}
	}
	env := Envelope{Function: "f", Session: "s", Invocation: "i", Objects: []Object{{Bucket: "b", Key: "k", Path: name, Inline: []byte{}}}}
	if err := env.Validate(); err == nil || !strings.Contains(err.Error(), "both inline bytes and a path") {
		t.Errorf("path next to inline bytes: %v", err)
	}
}
