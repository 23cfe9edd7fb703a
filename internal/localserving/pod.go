package localserving

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ziptrail/ziptrail/internal/netns"
)

// Ports inside every pod, as in a Knative pod.
const (
	UserPort  = 8080 // the function listens here ($PORT)
	QueuePort = 8012 // queue-proxy's serving port, the pod's entry point
)

// podSpec is what a pod runs: queue-proxy plus the function's command.
type podSpec struct {
	namespace, service, revision string
	command                      []string
	workingDir                   string
	env                          []string // user container environment, KEY=VALUE
	containerConcurrency         int64
}

// pod is one running instance: a network namespace, a queue-proxy process
// and a user process, sharing a private shared-memory directory.
type pod struct {
	id     string
	spec   podSpec
	net    *netns.Pod
	shmDir string

	mu      sync.Mutex
	procs   []*proc
	exited  chan struct{} // closed when any process exits
	stopped bool
	ready   bool
}

// proc is one process of a pod; done is closed once it has been reaped.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// IP is the pod's address on the bridge.
func (p *pod) IP() string { return p.net.IP.String() }

// startPod creates the namespace and starts both processes. onExit runs (once)
// when a process exits without Stop having been called.
func (r *Runtime) startPod(ctx context.Context, id string, spec podSpec, onExit func()) (*pod, error) {
	np, err := r.opts.Network.AddPod(ctx, id)
	if err != nil {
		return nil, err
	}
	p := &pod{id: id, spec: spec, net: np, exited: make(chan struct{})}
	p.shmDir = filepath.Join(r.opts.ShmRoot, id)
	if err := os.MkdirAll(filepath.Join(p.shmDir, "objects"), 0o700); err != nil {
		_ = r.opts.Network.DeletePod(ctx, np)
		return nil, err
	}
	logDir := filepath.Join(r.opts.StateDir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		_ = r.opts.Network.DeletePod(ctx, np)
		return nil, err
	}

	// The sidecar and the SDK find each other through the pod's own
	// shared-memory directory, as through /dev/shm in a real pod.
	ziptrailEnv := []string{
		"ZIPTRAIL_SOCKET=" + filepath.Join(p.shmDir, "sidecar.sock"),
		"ZIPTRAIL_SHM_DIR=" + filepath.Join(p.shmDir, "objects"),
	}
	queueEnv := append(os.Environ(), QueueProxyEnv(spec.namespace, spec.service, spec.revision, p.id, p.IP(), spec.containerConcurrency)...)
	// The function's ziptrail settings (workflow, function) reach the
	// sidecar too, as pod annotations do through Knative's pod-info volume.
	for _, e := range spec.env {
		if strings.HasPrefix(e, "ZIPTRAIL_") {
			queueEnv = append(queueEnv, e)
		}
	}
	// The pod's own directory comes after the template's (which names
	// /dev/shm/ziptrail, private in a real pod but shared by every local
	// pod), so it wins: Go keeps the last of duplicate variables.
	queueEnv = append(queueEnv, ziptrailEnv...)
	queueEnv = append(queueEnv, r.opts.SidecarEnv...)
	userEnv := append(os.Environ(), spec.env...)
	userEnv = append(userEnv, ziptrailEnv...)
	userEnv = append(userEnv, "PORT="+strconv.Itoa(UserPort), "K_SERVICE="+spec.service, "K_REVISION="+spec.revision)

	queue := np.Command(context.WithoutCancel(ctx), r.opts.QueueProxy)
	queue.Env = queueEnv
	user := np.Command(context.WithoutCancel(ctx), spec.command[0], spec.command[1:]...)
	user.Env = userEnv
	user.Dir = spec.workingDir
	for _, c := range []struct {
		name string
		cmd  *exec.Cmd
	}{{"queue-proxy", queue}, {"user", user}} {
		name, cmd := c.name, c.cmd
		f, err := os.OpenFile(filepath.Join(logDir, fmt.Sprintf("%s-%s.log", id, name)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			p.Stop(r)
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = f, f
		// Own process group, so stopping the pod also stops what the
		// command spawned (e.g. `go run` and its child).
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			f.Close()
			p.Stop(r)
			return nil, fmt.Errorf("start %s in pod %s: %w", name, id, err)
		}
		pr := &proc{cmd: cmd, done: make(chan struct{})}
		p.mu.Lock()
		p.procs = append(p.procs, pr)
		p.mu.Unlock()
		go func(cmd *exec.Cmd, f *os.File) {
			_ = cmd.Wait()
			f.Close()
			close(pr.done)
			p.mu.Lock()
			first := !p.stopped && !isClosed(p.exited)
			if !isClosed(p.exited) {
				close(p.exited)
			}
			p.mu.Unlock()
			if first && onExit != nil {
				onExit()
			}
		}(cmd, f)
	}
	return p, nil
}

// QueueProxyEnv is the environment Knative's revision reconciler gives the
// queue-proxy container (see knative.dev/serving pkg/queue/sharedmain) of
// pod, at podIP, serving revision of a Service; containerConcurrency 0 is
// unlimited. The user container listens on UserPort.
func QueueProxyEnv(namespace, service, revision, pod, podIP string, containerConcurrency int64) []string {
	probe := fmt.Sprintf(`{"tcpSocket":{"port":%d,"host":"127.0.0.1"},"successThreshold":1}`, UserPort)
	return []string{
		"QUEUE_SERVING_PORT=" + strconv.Itoa(QueuePort),
		"QUEUE_SERVING_TLS_PORT=8112",
		"USER_PORT=" + strconv.Itoa(UserPort),
		"CONTAINER_CONCURRENCY=" + strconv.FormatInt(containerConcurrency, 10),
		"REVISION_TIMEOUT_SECONDS=300",
		"REVISION_RESPONSE_START_TIMEOUT_SECONDS=0",
		"REVISION_IDLE_TIMEOUT_SECONDS=0",
		"SERVING_NAMESPACE=" + namespace,
		"SERVING_SERVICE=" + service,
		"SERVING_CONFIGURATION=" + service,
		"SERVING_REVISION=" + revision,
		"SERVING_POD=" + pod,
		"SERVING_POD_IP=" + podIP,
		"SERVING_LOGGING_CONFIG=",
		"SERVING_LOGGING_LEVEL=info",
		"SERVING_READINESS_PROBE=" + probe,
		"SYSTEM_NAMESPACE=knative-serving",
		"METRICS_DOMAIN=knative.dev/internal/serving",
	}
}

// probe asks queue-proxy whether the user process is ready, the way the
// kubelet and the activator do.
func (p *pod) probe(ctx context.Context, client *http.Client) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(p.IP(), strconv.Itoa(QueuePort))+"/", nil)
	if err != nil {
		return false
	}
	req.Header.Set("K-Network-Probe", "queue")
	req.Header.Set("User-Agent", "Knative-Activator-Probe")
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitReady probes until ready, a process exits, or the timeout passes.
func (p *pod) waitReady(ctx context.Context, timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if p.probe(ctx, client) {
			p.mu.Lock()
			p.ready = true
			p.mu.Unlock()
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("pod %s: a process exited before the pod became ready (logs: <state>/logs/%s-*.log)", p.id, p.id)
		case <-ctx.Done():
			return fmt.Errorf("pod %s: not ready after %s: %w", p.id, timeout, ctx.Err())
		case <-tick.C:
		}
	}
}

// isReady reports whether the pod passed its probe and is still running.
func (p *pod) isReady() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ready && !isClosed(p.exited)
}

// Stop terminates both processes (SIGTERM, then SIGKILL after the grace
// period) and removes the namespace and shared-memory directory.
func (p *pod) Stop(r *Runtime) {
	p.mu.Lock()
	p.stopped = true
	procs := append([]*proc(nil), p.procs...)
	p.mu.Unlock()
	for _, pr := range procs {
		_ = syscall.Kill(-pr.cmd.Process.Pid, syscall.SIGTERM)
	}
	deadline := time.NewTimer(r.opts.TerminationGrace)
	defer deadline.Stop()
	for _, pr := range procs {
		select {
		case <-pr.done:
		case <-deadline.C:
			for _, pr := range procs {
				_ = syscall.Kill(-pr.cmd.Process.Pid, syscall.SIGKILL)
			}
			<-pr.done
		}
	}
	_ = r.opts.Network.DeletePod(context.Background(), p.net)
	_ = os.RemoveAll(p.shmDir)
}

// Kill sends SIGKILL to the pod's user process, for fault tests.
func (p *pod) Kill() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.procs) < 2 {
		return errors.New("pod has no user process")
	}
	return syscall.Kill(-p.procs[1].cmd.Process.Pid, syscall.SIGKILL)
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
