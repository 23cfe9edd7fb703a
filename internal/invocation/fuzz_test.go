package invocation

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"testing"
)

// FuzzDecode: no body makes Decode panic; what it accepts is valid (every
// object has contents, a path only in the sidecar's form and never next to
// inline bytes) and has one canonical encoding that decodes to itself.
func FuzzDecode(f *testing.F) {
	for _, seed := range []string{
		`{"namespace":"ns","function":"f","session":"s","invocation":"i","attempt":2,"args":"eA==",` +
			`"objects":[{"bucket":"b","key":"k","size":3,"ref":"zt1.abc"},{"bucket":"b","key":"e","inline":""},` +
			`{"bucket":"b","key":"m","inline":"aGk=","metadata":{"group":"g"}}]}`,
		`{"function":"f","session":"s","invocation":"i","objects":[{"bucket":"b","key":"k","path":"in-0123456789abcdef0123456789abcdef","ref":"zt1.x"}]}`,
		`{"function":"f","session":"s","invocation":"i","objects":[{"bucket":"b","key":"k","path":"/etc/hostname"}]}`,
		`{"function":"f","session":"s","invocation":"i","objects":[{"bucket":"b","key":"k","path":"../x","inline":"eA=="}]}`,
		`{"function":"f","session":"s","invocation":"i","attempt":"x","objects":"x"}`,
		`{"function":"f","session":"s","invocation":"i","objects":[1,{"bucket":"b","key":"k","size":"x"}]}`,
		`{"function":"f","session":"s","invocation":"i","objects":[{"bucket":"b","key":"k","inline":"not base64!"}]}`,
		`{"function":"f","session":"s","invocation":"i","objects":null,"args":null,"attempt":null}`,
		`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[`, `null`, ``, `{}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		env, err := Decode(bytes.NewReader(body))
		if err != nil {
			return
		}
		for _, o := range env.Objects {
			if o.Ref == "" && o.Inline == nil && o.Path == "" {
				t.Fatalf("accepted an object without contents: %+v", o)
			}
			if o.Path != "" && (o.Inline != nil || !IsInputName(o.Path)) {
				t.Fatalf("accepted path %q (inline %v)", o.Path, o.Inline != nil)
			}
			if o.Path != "" {
				if p, err := InDir("/objects", o.Path); err != nil || filepath.Dir(p) != "/objects" {
					t.Fatalf("accepted path %q resolves to %q, %v", o.Path, p, err)
				}
			}
		}
		if err := env.RefusePaths(); (err == nil) == hasPath(env) {
			t.Fatalf("RefusePaths: %v for %+v", err, env)
		}
		canon, err := json.Marshal(env)
		if err != nil {
			t.Fatalf("encode an accepted envelope: %v", err)
		}
		again, err := Decode(bytes.NewReader(canon))
		if err != nil {
			t.Fatalf("the encoding %s of an accepted envelope is refused: %v", canon, err)
		}
		if canon2, _ := json.Marshal(again); !bytes.Equal(canon, canon2) {
			t.Fatalf("encoding changes in a round trip:\n%s\n%s", canon, canon2)
		}
		for i, o := range again.Objects {
			if (o.Inline == nil) != (env.Objects[i].Inline == nil) {
				t.Fatalf("object %d: inline bytes lost or made up in a round trip", i)
			}
		}
	})
}

func hasPath(env *Envelope) bool {
	for _, o := range env.Objects {
		if o.Path != "" {
			return true
		}
	}
	return false
}

// FuzzDecodeOutputs: no function response makes DecodeOutputs panic, and
// every object it accepts has contents and a name.
func FuzzDecodeOutputs(f *testing.F) {
	for _, seed := range []string{
		`{"objects":[{"bucket":"b","key":"k","inline":"aGk="},{"bucket":"b","key":"r","ref":"zt1.x","size":9}],"return":"eA=="}`,
		`{"objects":[{"bucket":"b","key":"k"}]}`, `{"objects":[{"bucket":"","key":"k"}]}`, `{"objects":"x"}`, `[]`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		outs, err := DecodeOutputs(body)
		if err != nil {
			return
		}
		for _, o := range outs.Objects {
			if o.Bucket == "" || o.Key == "" || (o.Ref == "" && o.Inline == nil) {
				t.Fatalf("accepted output %+v", o)
			}
		}
	})
}

// FuzzInDir: whatever the name, a path InDir accepts is directly inside
// the directory, and OpenInput accepts only the sidecar's names.
func FuzzInDir(f *testing.F) {
	for _, seed := range []string{"x", "../x", "/objects/x", "/objects/../etc/passwd", "a/b", ".", "..", "", "/objects",
		"in-0123456789abcdef0123456789abcdef", "in-0123456789ABCDEF0123456789abcdef", "/objects//x/"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if p, err := InDir("/objects", name); err == nil && (filepath.Dir(p) != "/objects" || p == "/objects") {
			t.Fatalf("InDir(%q) = %q, outside the directory", name, p)
		}
		if IsInputName(name) {
			if p, err := InDir("/objects", name); err != nil || p != "/objects/"+name {
				t.Fatalf("input name %q: %q, %v", name, p, err)
			}
		}
	})
}
