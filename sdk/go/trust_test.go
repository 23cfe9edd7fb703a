package ziptrail

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

// echoInputs answers with the contents of every input: if the function
// server ever opened a file it must not, the contents show in the answer.
func echoInputs(ctx context.Context, inv *Invocation) ([]byte, error) {
	var out []byte
	for _, o := range inv.Objects {
		out = append(out, o.Bytes()...)
	}
	return out, nil
}

// secrets places what an attacker is after: another session's input in
// the pod's object directory (not placed for this invocation), a file
// outside it (the service-account token, /etc/hostname), and symlinks to
// it from inside the directory.
func secrets(t *testing.T, dir string) (paths map[string]string, contents []string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "token")
	sidecarName := "in-0123456789abcdef0123456789abcdef" // the form of names the sidecar gives
	for path, data := range map[string]string{
		outside:                             "SERVICE-ACCOUNT-TOKEN",
		filepath.Join(dir, "put-other"):     "OTHER-SESSION-INPUT",
		filepath.Join(dir, sidecarName+"0"): "NOT-FOR-THIS-CALL",
	} {
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, sidecarName)); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "in-fedcba9876543210fedcba9876543210"), 0o755); err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"file outside the directory":       outside,
		"/etc/hostname":                    "/etc/hostname",
		"service account token":            "/var/run/secrets/kubernetes.io/serviceaccount/token",
		"dot-dot out of the directory":     "../" + filepath.Base(filepath.Dir(outside)) + "/token",
		"another file in the directory":    "put-other",
		"absolute path in the directory":   filepath.Join(dir, "put-other"),
		"symlink in the directory":         "link",
		"symlink with a sidecar-like name": sidecarName,
		"name with a separator":            sidecarName + "/x",
		"directory with a sidecar name":    "in-fedcba9876543210fedcba9876543210",
		"sidecar-like name, wrong length":  sidecarName + "0",
		"missing file with a sidecar name": "in-00000000000000000000000000000000",
		"dot":                              ".",
		"dot-dot":                          "..",
	}, []string{"SERVICE-ACCOUNT-TOKEN", "OTHER-SESSION-INPUT", "NOT-FOR-THIS-CALL"}
}

func postRaw(t *testing.T, url, contentType string, env invocation.Envelope) (int, string) {
	t.Helper()
	data, err := json.Marshal(&env)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url, contentType, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func checkRefused(t *testing.T, where string, code int, body string, leaks []string) {
	t.Helper()
	for _, s := range leaks {
		if strings.Contains(body, s) {
			t.Errorf("%s: LEAKED %q: %d %q", where, s, code, body)
		}
	}
	if code != http.StatusBadRequest {
		t.Errorf("%s: %d %q, want 400", where, code, body)
	}
}

// TestFunctionRefusesPathsFromOutside: a request straight to the user
// container's port (no sidecar in between) cannot make the function read
// any file: only bare names of files in the object directory, not
// symlinks, and an envelope cannot put a path ahead of inline bytes.
func TestFunctionRefusesPathsFromOutside(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "objects")
	paths, leaks := secrets(t, dir)
	t.Setenv("ZIPTRAIL_SHM_DIR", dir)
	fn := httptest.NewServer(FunctionHandler(echoInputs))
	defer fn.Close()
	for name, path := range paths {
		for _, ct := range []string{invocation.ContentType, "text/plain"} {
			code, body := postRaw(t, fn.URL, ct, invocation.Envelope{Function: "f", Session: "s", Invocation: "i",
				Objects: []invocation.Object{{Bucket: "b", Key: "k", Path: path}}})
			checkRefused(t, name+" ("+ct+")", code, body, leaks)
		}
	}
	code, body := postRaw(t, fn.URL, invocation.ContentType, invocation.Envelope{Function: "f", Session: "s", Invocation: "i",
		Objects: []invocation.Object{{Bucket: "b", Key: "k", Path: "put-other", Inline: []byte("inline")}}})
	checkRefused(t, "path next to inline bytes", code, body, leaks)
}

// TestPathsRefusedThroughTheSidecar: the same attack through a real
// queue-proxy-zl in front of the function (with ziptrail's content type,
// which the sidecar refuses, and without it, which passes to the
// function), while a real invocation whose object the sidecar resolved
// still reaches the function.
func TestPathsRefusedThroughTheSidecar(t *testing.T) {
	keys := keyFile(t, "k1", 8)
	shm := functionShm(t)
	paths, leaks := secrets(t, shm)
	fn := httptest.NewServer(FunctionHandler(echoInputs))
	defer fn.Close()
	a, b := startSidecar(t, sidecarOpts{keys: keys}), startSidecar(t, sidecarOpts{keys: keys, upstream: fn.URL, shm: shm})
	for name, path := range paths {
		for _, ct := range []string{invocation.ContentType, "text/plain"} {
			code, body := postRaw(t, b.url(), ct, invocation.Envelope{Namespace: "ns", Function: "f", Session: "s", Invocation: "i",
				Objects: []invocation.Object{{Bucket: "b", Key: "k", Path: path}}})
			checkRefused(t, fmt.Sprintf("%s via the sidecar (%s)", name, ct), code, body, leaks)
		}
	}
	obj := random(t, 1<<20)
	resp, err := a.client.Invoke(context.Background(), b.url(), obj)
	if err != nil || resp.StatusCode != 200 || !bytes.Equal(resp.Body, obj) {
		t.Fatalf("a resolved invocation: %v %+v", err, resp)
	}
}
