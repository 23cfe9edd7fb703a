package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/ziptrail/ziptrail/internal/localcluster/netns"
)

// Ports inside every pod, as in a Knative pod.
const (
	userPort  = 8080 // the user container ($PORT)
	queuePort = 8012 // queue-proxy's serving port
)

// knativeQueueEnv is the environment Knative Serving's revision
// reconciler gives queue-proxy (pkg/reconciler/revision/resources/queue.go),
// for a revision with one user container on userPort.
func knativeQueueEnv(namespace, service, revision, pod, podIP string) []string {
	probe := fmt.Sprintf(`{"tcpSocket":{"port":%d,"host":"127.0.0.1"},"successThreshold":1}`, userPort)
	return []string{
		"QUEUE_SERVING_PORT=" + strconv.Itoa(queuePort),
		"QUEUE_SERVING_TLS_PORT=8112",
		"USER_PORT=" + strconv.Itoa(userPort),
		"CONTAINER_CONCURRENCY=0",
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

// pod is one queue-proxy and its user container in their own network
// namespace: queue-proxy binds fixed ports (8012, 8022, 9090, 9091), so two
// of them cannot share one.
type pod struct {
	network *netns.Network
	net     *netns.Pod
	procs   []*exec.Cmd
	exited  chan struct{} // closed when any process exits
	once    sync.Once
	reaped  sync.WaitGroup // all processes waited for
	logPath string         // output of both processes, quoted in errors
}

// startPod starts the user container (this binary in -upstream mode) and
// then queue-proxy from binary, and waits until queue-proxy reports ready.
// On error everything started so far is stopped again.
func startPod(ctx context.Context, network *netns.Network, id, binary, dir string) (p *pod, err error) {
	np, err := network.AddPod(ctx, id)
	if err != nil {
		return nil, err
	}
	p = &pod{network: network, net: np, exited: make(chan struct{}), logPath: filepath.Join(dir, id+".log")}
	defer func() {
		if err != nil {
			p.stop()
			p = nil
		}
	}()
	self, err := os.Executable()
	if err != nil {
		return p, err
	}
	logFile, err := os.Create(p.logPath)
	if err != nil {
		return p, err
	}
	defer logFile.Close() // the children hold their own descriptors
	// The data plane's shared-memory directory, private per pod as
	// /dev/shm is in a real pod.
	if err := os.MkdirAll(filepath.Join(shmDir(dir, id), "objects"), 0o700); err != nil {
		return p, err
	}

	if err := evictPageCache(binary); err != nil {
		return p, err
	}
	user := np.Command(ctx, self, "-upstream", net.JoinHostPort("0.0.0.0", strconv.Itoa(userPort)))
	queue := np.Command(ctx, binary)
	queue.Env = append(os.Environ(), queueProxyEnv(np, id, dir)...)
	for _, cmd := range []*exec.Cmd{user, queue} {
		cmd.Stdout, cmd.Stderr = logFile, logFile
		// Own process group so stop reaches everything; the parent-death
		// signal keeps an interrupted benchmark from leaking processes
		// (`ip netns exec` execs the command, so it applies to it).
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return p, fmt.Errorf("start %s in %s: %w", cmd.Args[4], np.Name, err)
		}
		p.procs = append(p.procs, cmd)
		p.reaped.Go(func() {
			_ = cmd.Wait()
			p.closeExited()
		})
	}
	if err := p.waitReady(ctx, 30*time.Second); err != nil {
		return p, p.withLog(err)
	}
	return p, nil
}

// withLog adds the end of the pod's output to err: the temporary
// directory holding the log is gone once the benchmark exits.
func (p *pod) withLog(err error) error {
	data, _ := os.ReadFile(p.logPath)
	const max = 2000
	if len(data) > max {
		data = data[len(data)-max:]
	}
	return fmt.Errorf("%w; end of the pod's output:\n%s", err, data)
}

// pid is queue-proxy's process id: `ip netns exec` replaces itself with
// the command, so the id of the started process is queue-proxy's own.
func (p *pod) pid() int { return p.procs[len(p.procs)-1].Process.Pid }

// url is queue-proxy's serving address, reached from the host over the bridge.
func (p *pod) url() string {
	return "http://" + net.JoinHostPort(p.net.IP.String(), strconv.Itoa(queuePort)) + "/"
}

// userURL is the user container's address, reached from the host over
// the bridge: the floor under queue-proxy.
func (p *pod) userURL() string {
	return "http://" + net.JoinHostPort(p.net.IP.String(), strconv.Itoa(userPort)) + "/"
}

func (p *pod) closeExited() { p.once.Do(func() { close(p.exited) }) }

// alive reports whether neither process has exited, so a crashed
// queue-proxy is not measured as a small one.
func (p *pod) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop kills both processes (memory is measured, not shutdown, so no
// graceful drain) and removes the namespace.
func (p *pod) stop() {
	for _, cmd := range p.procs {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	p.reaped.Wait() // SIGKILL cannot be ignored, so this does not hang
	_ = p.network.DeletePod(context.Background(), p.net)
}

// waitReady probes as the kubelet and the activator do (as
// Knative's activator does) until queue-proxy answers 200.
func (p *pod) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url(), nil)
		if err != nil {
			return err
		}
		req.Header.Set("K-Network-Probe", "queue")
		req.Header.Set("User-Agent", "Knative-Activator-Probe")
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				client.CloseIdleConnections()
				return nil
			}
		}
		select {
		case <-p.exited:
			return fmt.Errorf("pod %s: a process exited before it became ready", p.net.Name)
		case <-ctx.Done():
			return fmt.Errorf("pod %s: not ready after %s", p.net.Name, timeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// queueProxyEnv is the local runtime's queue-proxy environment plus the
// ziptrail variables a local pod gets. Both binaries get the same
// environment; stock queue-proxy ignores ZIPTRAIL_*. The data plane gets a
// key file, as after the operator sent the keys, so its pull-stream server
// is listening as in a running pod.
func queueProxyEnv(np *netns.Pod, id, dir string) []string {
	shm := shmDir(dir, id)
	return append(knativeQueueEnv("bench", "echo", "echo-00001", id, np.IP.String()),
		"ZIPTRAIL_SOCKET="+filepath.Join(shm, "sidecar.sock"),
		"ZIPTRAIL_SHM_DIR="+filepath.Join(shm, "objects"),
		"ZIPTRAIL_KEY_FILE="+filepath.Join(dir, "keys.json"),
	)
}

// shmDir stands in for the pod's /dev/shm/ziptrail.
func shmDir(dir, id string) string { return filepath.Join(dir, id+"-shm") }
