package servers

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// QueueProxy is a running `queue-proxy-zl --standalone` process: a pod's
// sidecar on loopback, for tests and benchmark commands.
//
// It binds its ports itself (port 0) and announces them on stderr once
// every listener is open, so no port picked beforehand can be taken by
// another process in between (a free port checked and released is only
// free "a moment ago"; CI saw that race).
type QueueProxy struct {
	Listen        string // invocations (Knative's queue-proxy port), host:port
	DataplanePort int    // pulls and message streams
	Cmd           *exec.Cmd

	exited chan error
	once   sync.Once
}

// QueueProxyOptions configure StartQueueProxy.
type QueueProxyOptions struct {
	Binary   string    // the queue-proxy-zl binary
	Upstream string    // the user container's URL
	Env      []string  // the pod's environment, added to this process's
	Stderr   io.Writer // where the process's stderr goes (default os.Stderr)
	// Listen and DataplanePort, when set, are the ports to bind (a sidecar
	// restarted in the place of one that died: QueueProxy.Listen and
	// DataplanePort of that one); by default the process picks free ones.
	Listen        string
	DataplanePort int
}

// ready is the line standalone mode prints once it listens on everything.
var ready = regexp.MustCompile(`standalone, invocations on (\S+), data plane on port (\d+),`)

// StartQueueProxy runs the sidecar and returns once it serves; it is
// killed (SIGKILL) when tb's cleanups run.
func StartQueueProxy(tb TB, o QueueProxyOptions) *QueueProxy {
	tb.Helper()
	q, err := RunQueueProxy(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(q.Kill)
	return q
}

// RunQueueProxy is StartQueueProxy for callers without a TB: it returns
// the start's error, and the caller kills the process.
func RunQueueProxy(o QueueProxyOptions) (*QueueProxy, error) {
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:0"
	}
	cmd := exec.Command(o.Binary, "--standalone", "--listen", o.Listen, "--upstream", o.Upstream)
	// The data plane port comes last so that it wins over o.Env's.
	cmd.Env = append(append(os.Environ(), o.Env...), "ZIPTRAIL_DATAPLANE_PORT="+strconv.Itoa(o.DataplanePort))
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	q := &QueueProxy{Cmd: cmd, exited: make(chan error, 1)}
	go func() {
		err := cmd.Wait()
		pw.Close()
		q.exited <- err
	}()
	found := make(chan []string, 1)
	go func() {
		// Forwards every line; the first ready line is reported.
		sc := bufio.NewScanner(pr)
		announced := false
		for sc.Scan() {
			line := sc.Text()
			if m := ready.FindStringSubmatch(line); m != nil && !announced {
				found <- m
				announced = true
			}
			fmt.Fprintln(o.Stderr, line)
		}
		_, _ = io.Copy(o.Stderr, pr) // a line too long for the scanner
	}()
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	select {
	case m := <-found:
		q.Listen = m[1]
		q.DataplanePort, _ = strconv.Atoi(m[2])
		return q, nil
	case err := <-q.exited:
		q.exited <- err
		return nil, fmt.Errorf("queue-proxy-zl exited at start: %v", err)
	case <-timeout.C:
		q.Kill()
		return nil, fmt.Errorf("queue-proxy-zl did not listen within 30 s")
	}
}

// URL is the invocation address as a URL.
func (q *QueueProxy) URL() string { return "http://" + q.Listen }

// Exited waits for the process to end and returns its exit error (to
// every caller).
func (q *QueueProxy) Exited() error {
	err := <-q.exited
	q.exited <- err
	return err
}

// Kill ends the process with SIGKILL (a crashed pod) and waits for it.
func (q *QueueProxy) Kill() {
	q.once.Do(func() {
		_ = q.Cmd.Process.Signal(syscall.SIGKILL)
		_ = q.Exited()
	})
}
