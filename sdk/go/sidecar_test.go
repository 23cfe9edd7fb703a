package ziptrail

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// The SDK is tested against real queue-proxy-zl processes in standalone
// mode (the data plane and local API without Knative's queue-proxy), built
// once per test binary from this repository.
var sidecarBin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if sidecarBin.dir != "" {
		os.RemoveAll(sidecarBin.dir)
	}
	os.Exit(code)
}

func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func sidecarBinary(t testing.TB) string {
	t.Helper()
	sidecarBin.once.Do(func() {
		if sidecarBin.dir, sidecarBin.err = os.MkdirTemp("", "zt-sdk-bin"); sidecarBin.err != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", sidecarBin.dir, "./cmd/queue-proxy-zl")
		cmd.Dir = repoRoot(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			sidecarBin.err = fmt.Errorf("go build ./cmd/queue-proxy-zl: %v\n%s", err, out)
			return
		}
		sidecarBin.path = filepath.Join(sidecarBin.dir, "queue-proxy-zl")
	})
	if sidecarBin.err != nil {
		t.Fatal(sidecarBin.err)
	}
	return sidecarBin.path
}

// keyFile writes a namespace keyring file with one key (id, 32 x fill).
func keyFile(t testing.TB, id string, fill byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys.json")
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{fill}, 32))
	if err := os.WriteFile(path, []byte(`{"active":"`+id+`","keys":{"`+id+`":"`+key+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// sidecar is one running queue-proxy-zl process, with an SDK client on
// its socket as a function container in its pod would have.
type sidecar struct {
	*servers.QueueProxy
	socket string
	shm    string
	env    []string // ZIPTRAIL_SOCKET and ZIPTRAIL_SHM_DIR, for other processes of the pod
	client *Client
}

func (s *sidecar) url() string { return s.URL() }

// kill ends the process (SIGKILL: a crashed pod) and waits for it.
func (s *sidecar) kill() { s.Kill() }

type sidecarOpts struct {
	namespace string // default "ns"
	keys      string // key file; required
	upstream  string // the user container; default a closed port
	shm       string // the pod's object directory; default a new one
	env       []string
	// in: the sidecar this one restarts in the place of (same invocation
	// and data plane ports), after it was killed.
	in *sidecar
}

// functionShm makes the object directory of a pod whose function runs in
// this test process (FunctionHandler): it points ZIPTRAIL_SHM_DIR there
// for the handlers made afterwards; pass it to startSidecar as shm.
func functionShm(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "objects")
	t.Setenv("ZIPTRAIL_SHM_DIR", dir)
	return dir
}

// startSidecar runs a sidecar and returns once it serves; it is killed at
// the end of the test.
func startSidecar(t testing.TB, o sidecarOpts) *sidecar {
	t.Helper()
	if o.namespace == "" {
		o.namespace = "ns"
	}
	if o.upstream == "" {
		o.upstream = fmt.Sprintf("http://127.0.0.1:%d", servers.FreePort(t))
	}
	if o.shm == "" {
		o.shm = filepath.Join(t.TempDir(), "objects")
	}
	sockDir, err := os.MkdirTemp("", "zt") // unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	s := &sidecar{socket: filepath.Join(sockDir, "sidecar.sock"), shm: o.shm}
	s.env = []string{"ZIPTRAIL_SOCKET=" + s.socket, "ZIPTRAIL_SHM_DIR=" + s.shm}
	var listen string
	var dataplane int
	if o.in != nil {
		listen, dataplane = o.in.Listen, o.in.DataplanePort
	}
	s.QueueProxy = servers.StartQueueProxy(t, servers.QueueProxyOptions{Binary: sidecarBinary(t), Upstream: o.upstream,
		Listen: listen, DataplanePort: dataplane,
		Env: append([]string{"SERVING_NAMESPACE=" + o.namespace, "SERVING_POD_IP=127.0.0.1", "ZIPTRAIL_METRICS_PORT=0",
			"ZIPTRAIL_KEY_FILE=" + o.keys, "ZIPTRAIL_INLINE_THRESHOLD=4096"}, append(s.env, o.env...)...)})
	if s.client, err = NewClient(Config{Socket: s.socket, ShmDir: s.shm, InlineThreshold: 4096}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.client.Close() })
	return s
}

// leftBeyondPool lists what is left in the shared-memory directory
// besides the files the sidecar keeps to fill again (its pool: get-*, at
// most 64 MiB in all) and the files the client's sends got back to write
// its next messages into (put-*, at most maxPut: the client keeps 16).
func (s *sidecar) leftBeyondPool(t *testing.T, maxPut int) []string {
	t.Helper()
	entries, err := os.ReadDir(s.shm)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	var pooled int64
	puts := 0
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		switch {
		case strings.HasPrefix(e.Name(), "get-"):
			pooled += info.Size()
		case strings.HasPrefix(e.Name(), "put-") && puts < maxPut:
			puts++
		default:
			left = append(left, e.Name())
		}
	}
	if pooled > 64<<20 {
		left = append(left, fmt.Sprintf("%d bytes of get-* files (the pool keeps at most 64 MiB)", pooled))
	}
	return left
}

// shmFiles lists what is left in the shared-memory directory.
func (s *sidecar) shmFiles(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(s.shm)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
