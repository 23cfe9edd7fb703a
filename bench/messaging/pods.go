package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ziptrail/ziptrail/bench/internal/parallel"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// namespace of every bench pod: one tenant.
const namespace = "bench"

// pods starts "pods": real queue-proxy-zl --standalone processes, each
// with its own data-plane port, API socket and shared-memory directory
// (in /dev/shm, a tmpfs as a pod's emptyDir with medium Memory is),
// connected to the operator's control server and its directory.
type pods struct {
	tb  *servers.ProcessTB
	op  *servers.Operator
	bin string
	seq int
	mu  sync.Mutex
	env []string // extra environment of every sidecar (e.g. GOMAXPROCS)
	// nodeDir, when set, is the node directory the pods share (as
	// bench/dataplane -samenode): their members talk over same-node direct
	// channels.
	nodeDir string
	prefix  string // of the pods' names
}

// pod is one running sidecar with the SDK client a function in that pod
// would have.
type pod struct {
	*servers.QueueProxy
	name   string
	socket string
	shm    string
	client *ziptrail.Client
}

// buildSidecar builds queue-proxy-zl once, as sdk/go's tests do.
func buildSidecar(tb *servers.ProcessTB) (string, error) {
	dir := tb.TempDir()
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-o", dir, "./cmd/queue-proxy-zl")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/queue-proxy-zl: %v\n%s", err, out)
	}
	return filepath.Join(dir, "queue-proxy-zl"), nil
}

// repoRoot is the module root (go run runs in the caller's directory).
func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("run from inside the ziptrail module")
	}
	return filepath.Dir(mod), nil
}

// start runs one pod and returns once its sidecar serves.
func (p *pods) start() (*pod, error) {
	p.mu.Lock()
	p.seq++
	name := fmt.Sprintf("%spod-%d", p.prefix, p.seq)
	p.mu.Unlock()
	token := p.op.PodToken(p.tb, namespace, name)
	sockDir, err := os.MkdirTemp("", "zt") // unix socket paths are short
	if err != nil {
		return nil, err
	}
	shmRoot, err := os.MkdirTemp("/dev/shm", "ziptrail-bench-")
	if err != nil {
		return nil, err
	}
	p.tb.Cleanup(func() { os.RemoveAll(sockDir); os.RemoveAll(shmRoot) })
	s := &pod{name: name, socket: filepath.Join(sockDir, "sidecar.sock"), shm: filepath.Join(shmRoot, "objects")}
	s.QueueProxy, err = servers.RunQueueProxy(servers.QueueProxyOptions{Binary: p.bin,
		Upstream: fmt.Sprintf("http://127.0.0.1:%d", servers.FreePort(p.tb)), Stderr: stderrCounter{},
		Env: append([]string{"SERVING_NAMESPACE=" + namespace, "SERVING_POD=" + name, "SERVING_POD_IP=127.0.0.1",
			"ZIPTRAIL_METRICS_PORT=0", "ZIPTRAIL_OPERATOR_ADDR=" + p.op.Addr, "ZIPTRAIL_TOKEN_FILE=" + token,
			"ZIPTRAIL_SOCKET=" + s.socket, "ZIPTRAIL_SHM_DIR=" + s.shm,
			"ZIPTRAIL_MEMORY_LIMIT=" + fmt.Sprint(1<<30)}, // room for a 64 MB message and its echo
			append(p.sameNode(token), p.env...)...)})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p.tb.Cleanup(s.Kill)
	if s.client, err = ziptrail.NewClient(ziptrail.Config{Socket: s.socket, ShmDir: s.shm}); err != nil {
		return nil, err
	}
	p.tb.Cleanup(func() { s.client.Close() })
	return s, nil
}

// sameNode is a pod's node directory environment (none without nodeDir):
// its UID is the one its token is bound to, which the directory announces.
func (p *pods) sameNode(tokenFile string) []string {
	if p.nodeDir == "" {
		return nil
	}
	uid, err := servers.TokenPodUID(tokenFile)
	if err != nil {
		return nil
	}
	return []string{"ZIPTRAIL_NODE_DIR=" + p.nodeDir, "ZIPTRAIL_NODE_NAME=bench-node", "ZIPTRAIL_POD_UID=" + uid}
}

// streamDrops counts the sidecars' "control stream:" errors: each is a
// control stream to the operator that ended and was reconnected (the
// directory takes the pod's members for gone when it ends).
var streamDrops atomic.Int64

// stderrCounter forwards a sidecar's stderr and counts its control-stream
// errors.
type stderrCounter struct{}

func (stderrCounter) Write(b []byte) (int, error) {
	streamDrops.Add(int64(bytes.Count(b, []byte("control stream:"))))
	return os.Stderr.Write(b)
}

// kill ends the process with SIGKILL (a crashed pod) and waits for it.
func (s *pod) kill() { s.Kill() }

func (s *pod) pid() int { return s.Cmd.Process.Pid }

// joinAll joins rank i of group from members[i], concurrently, waiting
// until every rank joined.
func joinAll(ctx context.Context, session, group string, members []*pod) ([]*ziptrail.Group, error) {
	gs := make([]*ziptrail.Group, len(members))
	err := parallel.Do(len(members), func(i int) error {
		var err error
		gs[i], err = members[i].client.Join(ctx, session, group, i, len(members), ziptrail.WithWaitAll(), ziptrail.WithJoinTimeout(time.Minute))
		return err
	})
	return gs, err
}

func leaveAll(gs []*ziptrail.Group) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, g := range gs {
		if g != nil {
			_ = g.Leave(ctx)
		}
	}
}

func hostInfo() map[string]any {
	h, _ := os.Hostname()
	info := map[string]any{"hostname": h, "time": time.Now().UTC().Format(time.RFC3339), "cpus": runtime.NumCPU(), "go": runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				info["cpu"] = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		info["loadavg_at_start"] = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	return info
}
