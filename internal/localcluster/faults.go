package localcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Faults a chaos run (bench/chaos) or a spec injects into the local
// cluster: signals to the processes of a pod's container and to the
// storage tiers' servers, which run as host processes.

// SignalContainerProcess sends sig (a signal name pkill takes: KILL, STOP,
// CONT, TERM) to the processes of a pod's container that match pattern
// (pkill -f, a regular expression): `kubectl exec` into that container
// (kubeconfig), pkill limited to the pod's network namespace (--ns $$
// --nslist net), so that only that pod's processes are hit. The node agent
// sees a killed process exit and restarts it per the pod's restartPolicy,
// as a kubelet does after a crash; a stopped one stays stopped (its probes
// fail) until CONT.
func SignalContainerProcess(ctx context.Context, kubeconfig string, pod *corev1.Pod, container, pattern, sig string) error {
	if pattern == "" {
		return errors.New("SignalContainerProcess: empty pattern")
	}
	if sig == "" {
		return errors.New("SignalContainerProcess: empty signal")
	}
	kubectl := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
	// "[p]ython3" matches python3 but not this shell's own command line.
	script := fmt.Sprintf("pkill -%s --ns $$ --nslist net -f %q", sig, "["+pattern[:1]+"]"+pattern[1:])
	cmd := exec.CommandContext(ctx, kubectl, "--kubeconfig", kubeconfig, "-n", pod.Namespace, "exec", pod.Name,
		"-c", container, "--", "sh", "-c", script)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if n, nerr := strconv.Atoi(sig); errors.As(err, &ee) && nerr == nil && ee.ExitCode() == 128+n {
		// The exec's own shell got the signal: it ran in the container, and
		// when the container's main process was the one killed, the runtime
		// stopped what else ran there too (as runc does), this shell
		// included, before or after pkill returned. The signal was sent.
		return nil
	}
	if err != nil {
		return fmt.Errorf("pkill -%s %q in pod %s/%s (container %s): %w: %s", sig, pattern, pod.Namespace, pod.Name, container, err, out)
	}
	return nil
}

// RedisPID is the pid of the cluster's redis-server (0 when none runs).
func (c *Cluster) RedisPID() int {
	if cmd := c.redisCmd(); cmd != nil {
		return cmd.Process.Pid
	}
	return 0
}

// SignalRedis sends sig to the cluster's redis-server (e.g. SIGSTOP, then
// SIGCONT: a pause, as a stalled host or a long fork would).
func (c *Cluster) SignalRedis(sig syscall.Signal) error {
	cmd := c.redisCmd()
	if cmd == nil {
		return errors.New("localcluster: no redis-server runs")
	}
	return syscall.Kill(cmd.Process.Pid, sig)
}

// RestartRedis restarts the cluster's redis-server as an orderly restart
// of a Redis with persistence does: SHUTDOWN SAVE (its data written to its
// directory), down for down, then the same command again on the same
// address, which loads that data. Writes during the gap fail.
func (c *Cluster) RestartRedis(ctx context.Context, down time.Duration) error {
	t := c.tiers
	old := c.redisCmd()
	if old == nil {
		return errors.New("localcluster: no redis-server runs")
	}
	// The server closes the connection as it exits: that error is expected.
	_ = t.redis.ShutdownSave(ctx).Err()
	exited := make(chan error, 1)
	go func() { exited <- old.Wait() }()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-old.Process.Pid, syscall.SIGKILL)
		<-exited
	case <-ctx.Done():
		return ctx.Err()
	}
	t.procs = slices.DeleteFunc(t.procs, func(p *exec.Cmd) bool { return p == old })
	select {
	case <-time.After(down):
	case <-ctx.Done():
		return ctx.Err()
	}
	cmd := exec.Command(old.Path, old.Args[1:]...)
	if err := t.start(c.opts.StateDir, "redis", cmd); err != nil {
		return err
	}
	if err := waitFor(ctx, "redis-server", func() bool { return t.redis.Ping(ctx).Err() == nil }); err != nil {
		return withLog(err, c.opts.StateDir, "redis")
	}
	return nil
}

// redisCmd is the running redis-server's command, if any.
func (c *Cluster) redisCmd() *exec.Cmd {
	if c.tiers == nil || c.tiers.redis == nil {
		return nil
	}
	for _, p := range c.tiers.procs {
		if filepath.Base(p.Path) == "redis-server" {
			return p
		}
	}
	return nil
}
