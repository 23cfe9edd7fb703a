package shuffle_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
	"github.com/ziptrail/ziptrail/sdk/go/shuffle"
)

// The library is tested against real queue-proxy-zl processes in
// standalone mode (built once per test binary, or $ZIPTRAIL_QUEUE_PROXY),
// a real redis-server and MinIO, as sdk/go's own tests are.

var sidecarBin struct {
	once      sync.Once
	dir, path string
	err       error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if sidecarBin.dir != "" {
		os.RemoveAll(sidecarBin.dir)
	}
	os.Exit(code)
}

func repoRoot() string {
	root, _ := filepath.Abs(filepath.Join("..", "..", ".."))
	return root
}

func sidecarBinary(t testing.TB) string {
	t.Helper()
	sidecarBin.once.Do(func() {
		// A prebuilt binary, as the Python tests accept it.
		if bin := os.Getenv("ZIPTRAIL_QUEUE_PROXY"); bin != "" {
			sidecarBin.path = bin
			return
		}
		if sidecarBin.dir, sidecarBin.err = os.MkdirTemp("", "zt-shuffle-bin"); sidecarBin.err != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", sidecarBin.dir, "./cmd/queue-proxy-zl")
		cmd.Dir = repoRoot()
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

// tiers is the storage every pod of a test reaches: redis-server and MinIO.
type tiers struct {
	env  []string // the sidecars' tier variables
	keys string   // the namespace's key file
}

func startTiers(t *testing.T) *tiers {
	t.Helper()
	r := servers.StartRedis(t)
	s3 := servers.StartMinIO(t)
	s3.Bucket(t, "ziptrail")
	keys := filepath.Join(t.TempDir(), "keys.json")
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{5}, 32))
	if err := os.WriteFile(keys, []byte(`{"active":"k1","keys":{"k1":"`+key+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return &tiers{keys: keys, env: []string{"ZIPTRAIL_REDIS_ADDR=" + r.Addr, "ZIPTRAIL_S3_ENDPOINT=" + s3.Endpoint,
		"ZIPTRAIL_S3_ACCESS_KEY=" + s3.AccessKey, "ZIPTRAIL_S3_SECRET_KEY=" + s3.SecretKey}}
}

// pod is one queue-proxy-zl process with an SDK client on its socket, as
// a function container of its pod has.
type pod struct {
	url    string   // invocations
	env    []string // ZIPTRAIL_SOCKET and ZIPTRAIL_SHM_DIR, for the pod's containers
	shm    string
	client *ziptrail.Client
}

// startPod runs a sidecar whose user container listens at upstream (empty:
// none) with shm as its object directory (empty: a new one).
func (tr *tiers) startPod(t *testing.T, upstream, shm string) *pod {
	t.Helper()
	if upstream == "" {
		upstream = fmt.Sprintf("http://127.0.0.1:%d", servers.FreePort(t))
	}
	if shm == "" {
		shm = filepath.Join(t.TempDir(), "objects")
	}
	sockDir, err := os.MkdirTemp("", "zt") // unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	socket := filepath.Join(sockDir, "sidecar.sock")
	p := &pod{shm: shm, env: []string{"ZIPTRAIL_SOCKET=" + socket, "ZIPTRAIL_SHM_DIR=" + shm}}
	q := servers.StartQueueProxy(t, servers.QueueProxyOptions{Binary: sidecarBinary(t), Upstream: upstream,
		Env: append([]string{"SERVING_NAMESPACE=ns", "SERVING_POD_IP=127.0.0.1", "ZIPTRAIL_METRICS_PORT=0",
			"ZIPTRAIL_KEY_FILE=" + tr.keys, "ZIPTRAIL_INLINE_THRESHOLD=4096"}, append(p.env, tr.env...)...)})
	p.url = q.URL()
	if p.client, err = ziptrail.NewClient(ziptrail.Config{Socket: socket, ShmDir: shm, InlineThreshold: 4096}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.client.Close() })
	return p
}

// entries are the envelope entries the trigger engine would send for
// objects a pod sent: large ones by reference, small ones inline (read
// back from the producer here; the engine got them with the object-ready
// event), with their metadata.
func (p *pod) entries(t *testing.T, session string, sent ...*shuffle.Sent) []invocation.Object {
	t.Helper()
	var out []invocation.Object
	for _, s := range sent {
		e := invocation.Object{Bucket: s.Bucket, Key: s.Key, Size: s.Size, Ref: s.Ref, Metadata: s.Metadata}
		if s.Ref == "" {
			obj, err := p.client.GetObject(context.Background(), s.Bucket, s.Key, ziptrail.WithSession(session))
			if err != nil {
				t.Fatal(err)
			}
			e.Inline = bytes.Clone(obj.Bytes())
			if e.Inline == nil {
				e.Inline = []byte{}
			}
			obj.Close()
		}
		out = append(out, e)
	}
	return out
}

// invoke sends an invocation through a reducer pod's sidecar (which pulls
// references) as the trigger engine does, and returns the answer.
func invoke(t *testing.T, reducer *pod, session, group, id string, objects []invocation.Object, args any) []byte {
	t.Helper()
	env := invocation.Envelope{Namespace: "ns", Function: "reduce", Session: session, Invocation: id, Group: group, Objects: objects}
	if args != nil {
		env.Args, _ = json.Marshal(args)
	}
	body, _ := json.Marshal(env)
	resp, err := http.Post(reducer.url, invocation.ContentType, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("invoke %s: %d %s", id, resp.StatusCode, out)
	}
	return out
}

// piece is mapper m's distinct, recognizable piece of partition p.
func piece(rnd, m, p, size int) []byte {
	seed := sha256.Sum256(fmt.Appendf(nil, "%d/%d/%d", rnd, m, p))
	out := bytes.Repeat(seed[:], size/len(seed)+1)
	return out[:size]
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}
