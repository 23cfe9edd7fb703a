package sidecar

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// FuzzWrap feeds the sidecar's invocation handling arbitrary request
// bodies and function responses. Whatever arrives, the function never
// receives a path (no reference resolves here, so no input file exists),
// the answer is one of the documented statuses, and a 200 with outputs
// carries no inline object over the threshold.
func FuzzWrap(f *testing.F) {
	for _, seed := range []struct{ env, out string }{
		{`{"namespace":"ns","function":"f","session":"s","invocation":"i","objects":[{"bucket":"b","key":"k","inline":"aGk="}]}`,
			`{"objects":[{"bucket":"b","key":"big","inline":"` + string(bytes.Repeat([]byte("QUFB"), 200)) + `"}],"return":"eA=="}`},
		{`{"function":"f","session":"s","invocation":"i","objects":[{"bucket":"b","key":"k","path":"/etc/hostname"}]}`, `ok`},
		{`{"function":"f","session":"s","invocation":"i","objects":[{"bucket":"b","key":"k","path":"in-0123456789abcdef0123456789abcdef"}]}`, ``},
		{`{"function":"f","session":"s","invocation":"i","objects":[{"bucket":"b","key":"k","ref":"zt1.AAAA"}]}`, ``},
		{`{"function":"f","session":"s","invocation":"i","attempt":"x"}`, `{"objects":"x"}`},
		{`{"function":"f","session":"s","invocation":"i"}`, `{"objects":[{"bucket":"b","key":"k"}]}`},
	} {
		f.Add([]byte(seed.env), []byte(seed.out))
	}
	dir := f.TempDir()
	s := New(Config{Namespace: "ns", PodIP: "127.0.0.1", DataplanePort: 1, ShmDir: dir, MemoryLimit: 1 << 20,
		InlineThreshold: 256, ObjectTTL: time.Minute, PutTimeout: time.Millisecond})
	if err := s.setKeys(&controlv1.Keys{ActiveKeyId: "k1", Keys: []*controlv1.Key{{Id: "k1", Secret: bytes.Repeat([]byte{1}, 32)}}}); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body, out []byte) {
		var got []byte
		h := s.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			env, err := invocation.Decode(r.Body)
			if err != nil {
				t.Fatalf("the function got an envelope it cannot decode: %v", err)
			}
			for _, o := range env.Objects {
				if o.Path != "" {
					t.Fatalf("the function got path %q", o.Path)
				}
			}
			got = out
			w.Header().Set("Content-Type", invocation.OutputsContentType)
			w.Write(out)
		}))
		req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		req.Header.Set("Content-Type", invocation.ContentType)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if env := (invocation.Envelope{}); json.Unmarshal(body, &env) == nil {
			s.Store.DropSession(env.Session)
		}
		switch rec.Code {
		case http.StatusBadRequest, http.StatusFailedDependency:
			if got != nil {
				t.Fatalf("%d after the function ran", rec.Code)
			}
		case http.StatusOK:
			outs, err := invocation.DecodeOutputs(rec.Body.Bytes())
			if err != nil {
				t.Fatalf("200 with outputs that do not decode: %v", err)
			}
			for _, o := range outs.Objects {
				if len(o.Inline) > 256 {
					t.Fatalf("a %d-byte object left the pod inline", len(o.Inline))
				}
			}
		case http.StatusBadGateway, http.StatusInsufficientStorage:
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body.Bytes())
		}
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Fatalf("left in the object directory: %s", filepath.Join(dir, left[0].Name()))
		}
	})
}
