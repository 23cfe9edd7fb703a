package k8s

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Component is one process of the cluster as recorded in the state file, so
// that `down` and `status` work without the process that started it.
type Component struct {
	Name   string   `json:"name"`
	Binary string   `json:"binary"`
	Args   []string `json:"args"`
	PID    int      `json:"pid"`
	Log    string   `json:"log"`
	// Health is the URL that answers 200 when the component is healthy.
	Health string `json:"health"`

	done chan struct{} // closed when the process exits (only in the starting process)
	err  error         // its exit status, once done is closed
}

// start launches the component in its own process group (so that a Ctrl-C
// meant for `ziptrail local up` reaches it only through an orderly stop)
// with its output in its log file.
func (c *Component) start(env []string) error {
	logf, err := os.OpenFile(c.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(c.Binary, c.Args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", c.Name, err)
	}
	c.PID = cmd.Process.Pid
	c.done = make(chan struct{})
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	return nil
}

// waitHealthy polls the component's health URL until it answers 200, the
// process exits, or timeout passes; errors carry the end of its log.
func (c *Component) waitHealthy(ctx context.Context, hc *http.Client, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if last = c.check(ctx, hc); last == nil {
			return nil
		}
		select {
		case <-c.done:
			return fmt.Errorf("%s exited (%v) before it was healthy; end of %s:\n%s", c.Name, c.err, c.Log, tail(c.Log, 2048))
		case <-ctx.Done():
			return fmt.Errorf("%s not healthy after %s (%v); end of %s:\n%s", c.Name, timeout, last, c.Log, tail(c.Log, 2048))
		case <-tick.C:
		}
	}
}

// check asks the health URL once.
func (c *Component) check(ctx context.Context, hc *http.Client) error {
	if c.Health == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Health, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s %s", c.Health, resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

// alive reports whether the recorded pid still runs the recorded binary
// (a reused pid is never taken for the component).
func (c *Component) alive() bool {
	if c.PID <= 0 {
		return false
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", c.PID))
	if err != nil {
		return false
	}
	want, _ := filepath.EvalSymlinks(c.Binary)
	return exe == c.Binary || exe == want || exe == want+" (deleted)" || exe == c.Binary+" (deleted)"
}

// stop sends SIGTERM to the component's process group, waits up to grace,
// then SIGKILLs it.
func (c *Component) stop(grace time.Duration) {
	if c.done == nil { // recorded by another process
		if !c.alive() {
			return
		}
		_ = syscall.Kill(-c.PID, syscall.SIGTERM)
		if !waitExit(c.PID, grace) {
			_ = syscall.Kill(-c.PID, syscall.SIGKILL)
			waitExit(c.PID, 5*time.Second)
		}
		return
	}
	select {
	case <-c.done:
		return
	default:
	}
	_ = syscall.Kill(-c.PID, syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(grace):
		_ = syscall.Kill(-c.PID, syscall.SIGKILL)
		<-c.done
	}
	// Children of the component (none expected) go with its group.
	_ = syscall.Kill(-c.PID, syscall.SIGKILL)
}

// waitExit waits until process pid exits (through a pidfd, which becomes
// readable then) or timeout passes, and reports whether it exited.
func waitExit(pid int, timeout time.Duration) bool {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return errors.Is(err, unix.ESRCH) // already gone
	}
	defer unix.Close(fd)
	deadline := time.Now().Add(timeout)
	for {
		ms := int(time.Until(deadline).Milliseconds())
		if ms <= 0 {
			return false
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, ms)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0
	}
}

// healthClient trusts the cluster CA (the components' serving certificates)
// and nothing else.
func healthClient(caPEM []byte) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		Proxy:           nil,
	}}
}

// freePort returns a TCP port that is free on host right now.
func freePort(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

// tail returns the last n bytes of a file.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// run runs a command to completion and returns its combined output in the error.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %v: %w: %s", name, args, err, bytes.TrimSpace(out))
	}
	return nil
}

var errNotRoot = errors.New("the local Kubernetes cluster needs root (network namespaces, iptables, mounts)")
