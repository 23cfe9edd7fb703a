package ziptrail

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

// FuzzFunctionHandler feeds the function server arbitrary envelopes, as
// from a caller straight to the user container's port. It answers 200 or
// 400 (never crashes), and the only file it ever reads is the one input
// the sidecar placed; another file of the object directory, a file
// outside it and a symlink to it stay unread.
func FuzzFunctionHandler(f *testing.F) {
	dir := filepath.Join(f.TempDir(), "objects")
	outside := filepath.Join(f.TempDir(), "token")
	placed := invocation.NewInputName()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.Fatal(err)
	}
	for path, data := range map[string]string{filepath.Join(dir, placed): "PLACED-INPUT", filepath.Join(dir, "put-1"): "SECRET-IN-DIR",
		outside: "SECRET-OUTSIDE"} {
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(dir, "in-0123456789abcdef0123456789abcdef")); err != nil {
		f.Fatal(err)
	}
	f.Setenv("ZIPTRAIL_SHM_DIR", dir)
	for _, seed := range []string{
		`{"function":"f","session":"s","invocation":"i","objects":[{"bucket":"b","key":"k","path":"` + placed + `"}]}`,
		`{"function":"f","session":"s","invocation":"i","objects":[{"bucket":"b","key":"k","path":"in-0123456789abcdef0123456789abcdef"}]}`,
		`{"function":"f","session":"s","invocation":"i","objects":[{"bucket":"b","key":"k","path":"put-1"}]}`,
		`{"function":"f","session":"s","invocation":"i","objects":[{"bucket":"b","key":"k","path":"` + outside + `"}]}`,
		`{"function":"f","session":"s","invocation":"i","objects":[{"bucket":"b","key":"k","path":"../objects/put-1"}]}`,
		`{"function":"f","session":"s","invocation":"i","objects":[{"bucket":"b","key":"k","inline":"aGk=","path":"` + placed + `"}]}`,
		`{"function":"f","session":"s","invocation":"i","objects":[{"bucket":"b","key":"k","ref":"zt1.x"}]}`,
		`{"function":"f","session":"s","invocation":"i","attempt":"x","objects":[1]}`,
		`{"function":"f","session":"s","invocation":"i","objects":[{"bucket":"b","key":"k","size":"x","inline":"!"}]}`,
		`[`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		// A handler per input: one that saw an earlier input with the same
		// idempotency key would answer from its record (records_test.go).
		h := FunctionHandler(echoInputs)
		req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusBadRequest:
		case http.StatusOK:
			// What the function may have seen: inline bytes, and the
			// placed input for its name; nothing else.
			env, err := invocation.Decode(bytes.NewReader(body))
			if err != nil {
				t.Fatalf("200 for an envelope that does not decode: %v", err)
			}
			var want []byte
			for _, o := range env.Objects {
				switch {
				case o.Inline != nil:
					want = append(want, o.Inline...)
				case o.Path == placed:
					want = append(want, "PLACED-INPUT"...)
				default:
					t.Fatalf("200 for object %+v", o)
				}
			}
			if !bytes.Equal(rec.Body.Bytes(), want) {
				t.Fatalf("the function read %q, want %q", rec.Body.Bytes(), want)
			}
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body.Bytes())
		}
	})
}
