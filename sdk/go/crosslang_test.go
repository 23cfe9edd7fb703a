package ziptrail

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// python returns a command line for the Python of the repository's test
// environment with the working tree's sdk/python first on its path (so
// the test exercises these sources, not an older installed copy). Its
// dependencies (grpcio, protobuf) come from the environment; when they are
// missing the test installs sdk/python with them, and fails with a clear
// message if that is impossible: this test must not be skipped.
func python(t *testing.T) (bin string, env []string) {
	t.Helper()
	bin = filepath.Join(os.Getenv("ZIPTRAIL_CACHE"), "venv", "bin", "python3")
	if os.Getenv("ZIPTRAIL_CACHE") == "" {
		home, _ := os.UserHomeDir()
		bin = filepath.Join(home, ".cache", "ziptrail", "venv", "bin", "python3")
	}
	if _, err := os.Stat(bin); err != nil {
		if bin, err = exec.LookPath("python3"); err != nil {
			t.Fatal("no python3: run `eval \"$(hack/install-deps.sh --env)\"` (make test does)")
		}
	}
	sdk := filepath.Join(repoRoot(t), "sdk", "python")
	env = append(os.Environ(), "PYTHONPATH="+sdk, "PYTHONDONTWRITEBYTECODE=1")
	check := func() ([]byte, error) {
		cmd := exec.Command(bin, "-c", "import grpc, ziptrail; ziptrail.put; ziptrail.get; ziptrail.ExhaustedError")
		cmd.Env = env
		return cmd.CombinedOutput()
	}
	if _, err := check(); err != nil {
		install := exec.Command(bin, "-m", "pip", "install", "-q", sdk)
		out, ierr := install.CombinedOutput()
		if ierr != nil {
			t.Fatalf("the Python SDK's dependencies are missing and `%s -m pip install %s` failed: %v\n%s", bin, sdk, ierr, out)
		}
		if out, err := check(); err != nil {
			t.Fatalf("python cannot import the ziptrail SDK from %s (put, get, ExhaustedError): %v\n%s", sdk, err, out)
		}
	}
	return bin, env
}

// runPython runs a script as a function container of the sidecar's pod
// would, and returns what it printed.
func runPython(t *testing.T, s *sidecar, script string, args ...string) string {
	t.Helper()
	bin, env := python(t)
	cmd := exec.Command(bin, append([]string{"-c", script}, args...)...)
	cmd.Env = append(env, s.env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	return strings.TrimSpace(string(out))
}

const pyProducer = `
import hashlib, os, ziptrail
data = os.urandom(100 << 20)
ref = ziptrail.put(data, 1)
print(ref, hashlib.sha256(data).hexdigest())
`

const pyConsumer = `
import hashlib, sys, ziptrail
obj = ziptrail.get(sys.argv[1])
digest = hashlib.sha256(obj).hexdigest()
kind = type(obj).__name__
size = len(obj)
obj.close()
try:
    ziptrail.get(sys.argv[1])
    again = "readable"
except ziptrail.ExhaustedError:
    again = "exhausted"
print(size, digest, kind, again)
`

// TestCrossLanguage: a Python producer and a Go consumer exchange a
// 100 MB object through two sidecars, and the reverse; the bytes are the
// same (sha256), the Python side gets a mapping (no copy), and a second
// read fails as exhausted in Python as well.
func TestCrossLanguage(t *testing.T) {
	keys := keyFile(t, "k1", 9)
	goPod, pyPod := startSidecar(t, sidecarOpts{keys: keys}), startSidecar(t, sidecarOpts{keys: keys})
	ctx := context.Background()

	t.Run("python to go", func(t *testing.T) {
		ref, want, _ := strings.Cut(runPython(t, pyPod, pyProducer), " ")
		obj, err := goPod.client.Get(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		defer obj.Close()
		if got := sum(obj.Bytes()); got != want || obj.Size != 100<<20 || !obj.Mapped() {
			t.Fatalf("go read %d bytes (mapped %t), sha256 %s; python put sha256 %s", obj.Size, obj.Mapped(), got, want)
		}
	})

	t.Run("go to python", func(t *testing.T) {
		data := random(t, 100<<20)
		ref, err := goPod.client.Put(ctx, data, 1)
		if err != nil {
			t.Fatal(err)
		}
		got := runPython(t, pyPod, pyConsumer, ref)
		if want := "104857600 " + sum(data) + " MappedObject exhausted"; got != want {
			t.Fatalf("python printed %q, want %q", got, want)
		}
	})
}
