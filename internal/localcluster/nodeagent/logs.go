package nodeagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	utilexec "k8s.io/client-go/util/exec"
)

// followPoll is how often `kubectl logs -f` looks for new output.
const followPoll = 200 * time.Millisecond

// logs returns a container's output: the current run's log file (or the
// previous run's), its last Tail lines, at most LimitBytes, and with Follow
// the output as it is written until the run ends. Timestamps and since*
// are not supported (the files hold the raw output).
func (pr *podRuntime) logs(ctx context.Context, name string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	pr.mu.Lock()
	c, err := pr.container(name)
	if err != nil {
		pr.mu.Unlock()
		return nil, errdefs.InvalidInput(err.Error())
	}
	run, sb := c.run, pr.sb
	var waiting string
	if c.state.Waiting != nil {
		waiting = c.state.Waiting.Reason
	}
	pr.mu.Unlock()
	if run == nil || sb == nil {
		return nil, errdefs.InvalidInputf("container %q in pod %q is waiting to start: %s", name, pr.pod.Name, waiting)
	}
	index, exited := run.index, run.exited
	if opts.Previous {
		if index == 0 {
			return nil, errdefs.InvalidInputf("previous terminated container %q in pod %q not found", name, pr.pod.Name)
		}
		index--
		exited = nil // finished long ago
	}
	f, err := os.Open(sb.LogPath(name, index))
	if err != nil {
		return nil, errdefs.NotFoundf("log of container %q in pod %q: %v", name, pr.pod.Name, err)
	}
	if err := seekTail(f, opts.Tail); err != nil {
		f.Close()
		return nil, err
	}
	var r io.Reader = f
	if opts.Follow && exited != nil {
		r = &follower{ctx: ctx, f: f, exited: exited, podDone: pr.done}
	}
	if opts.LimitBytes > 0 {
		r = io.LimitReader(r, int64(opts.LimitBytes))
	}
	return readCloser{r, f}, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// seekTail positions f at the start of its last n lines (n <= 0: keep all).
func seekTail(f *os.File, n int) error {
	if n <= 0 {
		return nil
	}
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	const chunk = 64 * 1024
	buf := make([]byte, chunk)
	lines, pos := 0, size
	// A trailing newline ends the last line; it does not start another.
	skipLast := true
	for pos > 0 {
		read := int64(chunk)
		if pos < read {
			read = pos
		}
		pos -= read
		if _, err := f.ReadAt(buf[:read], pos); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		b := buf[:read]
		for i := len(b) - 1; i >= 0; i-- {
			if b[i] != '\n' {
				continue
			}
			if skipLast && pos+int64(i) == size-1 {
				continue
			}
			lines++
			if lines == n {
				_, err := f.Seek(pos+int64(i)+1, io.SeekStart)
				return err
			}
		}
		skipLast = false
	}
	_, err = f.Seek(0, io.SeekStart)
	return err
}

// follower reads a growing log file until its run has exited and all of it
// was read, or the request ends.
type follower struct {
	ctx     context.Context
	f       *os.File
	exited  <-chan struct{}
	podDone <-chan struct{}
}

func (r *follower) Read(p []byte) (int, error) {
	for {
		n, err := r.f.Read(p)
		if n > 0 || (err != nil && !errors.Is(err, io.EOF)) {
			return n, err
		}
		select {
		case <-r.exited:
			// Drain what was written before the exit.
			n, err := r.f.Read(p)
			if n > 0 {
				return n, nil
			}
			if err == nil {
				err = io.EOF
			}
			return 0, err
		default:
		}
		t := time.NewTimer(followPoll)
		select {
		case <-r.ctx.Done():
			t.Stop()
			return 0, io.EOF
		case <-r.podDone:
			t.Stop()
		case <-r.exited:
			t.Stop()
		case <-t.C:
		}
	}
}

// exec runs a command in a container's namespaces for `kubectl exec`.
func (pr *podRuntime) exec(ctx context.Context, name string, argv []string, attach api.AttachIO) error {
	pr.mu.Lock()
	c, err := pr.container(name)
	sb := pr.sb
	running := err == nil && c.state.Running != nil
	pr.mu.Unlock()
	if err != nil {
		return errdefs.InvalidInput(err.Error())
	}
	if !running || sb == nil {
		return errdefs.InvalidInputf("container %q in pod %q is not running", name, pr.pod.Name)
	}
	cmd, err := sb.Exec(name, argv)
	if err != nil {
		return err
	}
	if in := attach.Stdin(); in != nil {
		cmd.Stdin = in
	}
	var stderr bytes.Buffer
	if out := attach.Stdout(); out != nil {
		cmd.Stdout = out
	}
	if e := attach.Stderr(); e != nil {
		cmd.Stderr = e
	} else {
		cmd.Stderr = &stderr
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = killGroup(cmd.Process.Pid)
		err = <-done
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		// A command killed by a signal exits 128+signal, as a container
		// runtime reports it (ExitCode is -1 then, which kubectl refuses as
		// "invalid exit code"): e.g. an exec killed with its container.
		code := ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
		return utilexec.CodeExitError{Err: fmt.Errorf("command terminated: %v %s", err, stderr.String()), Code: code}
	}
	return err
}

func killGroup(pid int) error { return syscall.Kill(-pid, syscall.SIGKILL) }
