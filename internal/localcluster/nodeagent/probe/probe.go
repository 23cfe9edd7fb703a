// Package probe runs Kubernetes container probes (HTTP GET, TCP socket,
// exec) and lifecycle handlers the way the kubelet does: HTTP probes send
// the probe's headers and `User-Agent: kube-probe/<major>.<minor>`, succeed
// on 200-399 and do not follow redirects to other hosts; TCP probes succeed
// on connect; exec probes succeed on exit status 0. A Worker applies the
// timing of a probe (initial delay, period, timeout, success and failure
// thresholds) and reports each change of its result.
package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// UserAgent is what the kubelet 1.36 sends.
const UserAgent = "kube-probe/1.36"

// Target is what a probe needs to know about its container.
type Target struct {
	PodIP string
	Ports []corev1.ContainerPort
	// Exec returns a command running argv in the container's namespaces.
	Exec func(argv []string) (*exec.Cmd, error)
}

// Handler is a probe or lifecycle action.
type Handler struct {
	HTTPGet   *corev1.HTTPGetAction
	TCPSocket *corev1.TCPSocketAction
	Exec      *corev1.ExecAction
	Sleep     *corev1.SleepAction
}

// FromProbe returns a probe's action.
func FromProbe(p *corev1.Probe) Handler {
	return Handler{HTTPGet: p.HTTPGet, TCPSocket: p.TCPSocket, Exec: p.Exec}
}

// FromLifecycle returns a lifecycle hook's action.
func FromLifecycle(h *corev1.LifecycleHandler) Handler {
	return Handler{HTTPGet: h.HTTPGet, TCPSocket: h.TCPSocket, Exec: h.Exec, Sleep: h.Sleep}
}

// Run performs the action once; a nil error is success. The message
// describes a failure as the kubelet's events do.
func Run(ctx context.Context, h Handler, t Target) error {
	switch {
	case h.HTTPGet != nil:
		return runHTTP(ctx, h.HTTPGet, t)
	case h.TCPSocket != nil:
		port, err := resolvePort(h.TCPSocket.Port, t.Ports)
		if err != nil {
			return err
		}
		host := h.TCPSocket.Host
		if host == "" {
			host = t.PodIP
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return fmt.Errorf("dial tcp %s: %w", net.JoinHostPort(host, strconv.Itoa(port)), err)
		}
		return c.Close()
	case h.Exec != nil:
		if len(h.Exec.Command) == 0 {
			return errors.New("exec action has no command")
		}
		cmd, err := t.Exec(h.Exec.Command)
		if err != nil {
			return err
		}
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			return err
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("command %q exited: %v: %s", strings.Join(h.Exec.Command, " "), err, strings.TrimSpace(out.String()))
			}
			return nil
		case <-ctx.Done():
			if cmd.Process != nil {
				_ = killGroup(cmd.Process.Pid)
			}
			<-done
			return fmt.Errorf("command %q timed out", strings.Join(h.Exec.Command, " "))
		}
	case h.Sleep != nil:
		select {
		case <-time.After(time.Duration(h.Sleep.Seconds) * time.Second):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return errors.New("the probe or hook has no action")
}

func runHTTP(ctx context.Context, g *corev1.HTTPGetAction, t Target) error {
	port, err := resolvePort(g.Port, t.Ports)
	if err != nil {
		return err
	}
	host := g.Host
	if host == "" {
		host = t.PodIP
	}
	scheme := strings.ToLower(string(g.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	path := g.Path
	if path == "" || path[0] != '/' {
		path = "/" + path
	}
	u, err := url.Parse(fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(host, strconv.Itoa(port)), path))
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", UserAgent)
	req.Header.Set("Accept", "*/*")
	for _, h := range g.HTTPHeaders {
		if strings.EqualFold(h.Name, "host") {
			req.Host = h.Value
			continue
		}
		req.Header.Add(h.Name, h.Value)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("Get %q: %w", u.String(), err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 10*1024))
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("HTTP probe failed with statuscode: %d", resp.StatusCode)
	}
	_ = body
	return nil
}

var client = &http.Client{
	Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: insecureTLS(), Proxy: nil},
	CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) >= 10 || req.URL.Host != via[0].URL.Host {
			return http.ErrUseLastResponse // the kubelet treats off-host redirects as success
		}
		return nil
	},
}

func resolvePort(p intstr.IntOrString, ports []corev1.ContainerPort) (int, error) {
	if p.Type == intstr.Int {
		if p.IntVal <= 0 || p.IntVal > 65535 {
			return 0, fmt.Errorf("invalid port %d", p.IntVal)
		}
		return int(p.IntVal), nil
	}
	for _, cp := range ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("port %q is not a named port of the container", p.StrVal)
}
