package nodeagent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/cgroups"
	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/probe"
	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/sandbox"
)

// ctrRuntime is one container: its runs, restarts and probes. Its fields
// are guarded by the pod's mutex.
type ctrRuntime struct {
	pr   *podRuntime
	spec corev1.Container
	init bool

	state        corev1.ContainerState
	lastState    corev1.ContainerState
	ready        bool
	started      bool
	restartCount int32
	containerID  string
	imageID      string
	run          *ctrRun // current (or last) run
	backoff      time.Duration
	preStopDone  bool
}

// ctrRun is one process of a container.
type ctrRun struct {
	index   int32
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the process is gone
	started time.Time
	kill    chan string // a probe asks for a restart (message)
	// cgroup is the container's cgroup (nil: no limits); oomBase its
	// OOM-kill count at the start, when the kernel counts them (oomCounted).
	cgroup     *cgroups.Group
	oomBase    uint64
	oomCounted bool
}

func newCtrRuntime(pr *podRuntime, spec corev1.Container, init bool) *ctrRuntime {
	return &ctrRuntime{pr: pr, spec: spec, init: init,
		state: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}
}

func (c *ctrRuntime) setState(f func()) {
	c.pr.mu.Lock()
	f()
	c.pr.mu.Unlock()
	c.pr.notify()
}

func (c *ctrRuntime) status() corev1.ContainerStatus {
	started := c.started && c.state.Running != nil
	s := corev1.ContainerStatus{
		Name: c.spec.Name, State: c.state, LastTerminationState: c.lastState,
		Ready: c.ready && c.state.Running != nil, RestartCount: c.restartCount,
		Image: c.spec.Image, ImageID: c.imageID, ContainerID: c.containerID,
	}
	if !c.init {
		s.Started = &started
	}
	return s
}

// finalState turns a never-finished container into a terminated one when
// the pod is torn down (pod mutex held).
func (c *ctrRuntime) finalState() {
	c.ready = false
	if c.state.Terminated != nil {
		return
	}
	if c.state.Running != nil {
		c.state = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error",
			StartedAt: c.state.Running.StartedAt, FinishedAt: metav1.Now(), ContainerID: c.containerID}}
		return
	}
	if c.lastState.Terminated != nil && c.init {
		c.state = c.lastState
		return
	}
	c.state = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "ContainerStatusUnknown",
		Message: "The container could not be located when the pod was terminated", FinishedAt: metav1.Now()}}
}

func (c *ctrRuntime) event(typ, reason, format string, args ...any) {
	c.pr.event(typ, reason, format, args...)
}

func (c *ctrRuntime) restartPolicy() corev1.RestartPolicy {
	if p := c.pr.pod.Spec.RestartPolicy; p != "" {
		return p
	}
	return corev1.RestartPolicyAlways
}

// loop runs a regular container until the pod terminates, restarting it as
// the restart policy says with the kubelet's back-off.
func (c *ctrRuntime) loop() {
	for {
		run, ok := c.start()
		if !ok {
			if c.pr.ctx.Err() != nil {
				return
			}
			continue // start failed; start already waited its back-off
		}
		exitCode := c.wait(run)
		if c.pr.ctx.Err() != nil {
			return
		}
		switch c.restartPolicy() {
		case corev1.RestartPolicyNever:
			return
		case corev1.RestartPolicyOnFailure:
			if exitCode == 0 {
				return
			}
		}
		if !c.backOff(run) {
			return
		}
	}
}

// runInit runs an init container to successful completion; false when the
// pod failed (restartPolicy Never) or is terminating.
func (c *ctrRuntime) runInit() bool {
	for {
		run, ok := c.start()
		if !ok {
			if c.pr.ctx.Err() != nil {
				return false
			}
			continue
		}
		exitCode := c.wait(run)
		if c.pr.ctx.Err() != nil {
			return false
		}
		if exitCode == 0 {
			return true
		}
		if c.restartPolicy() == corev1.RestartPolicyNever {
			c.pr.mu.Lock()
			c.pr.failReason = "InitContainerFailed"
			c.pr.failMessage = fmt.Sprintf("init container %q exited with code %d", c.spec.Name, exitCode)
			c.pr.mu.Unlock()
			c.pr.notify()
			return false
		}
		if !c.backOff(run) {
			return false
		}
	}
}

// backOff waits before a restart: CrashLoopBackOff, 10 s doubling to 5 min,
// reset after a run of 10 min. False when the pod terminates meanwhile.
func (c *ctrRuntime) backOff(run *ctrRun) bool {
	b := c.pr.p.cfg.Backoff
	c.pr.mu.Lock()
	switch {
	case run != nil && time.Since(run.started) > b.Reset, c.backoff == 0:
		c.backoff = b.Initial
	default:
		c.backoff = min(c.backoff*2, b.Max)
	}
	d := c.backoff
	name, pod := c.spec.Name, c.pr.pod
	c.pr.mu.Unlock()
	msg := fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", d, name, pod.Name, pod.Namespace, pod.UID)
	c.setState(func() {
		c.lastState = c.state
		c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: msg}}
	})
	c.event(corev1.EventTypeWarning, "BackOff", "Back-off restarting failed container %s in pod %s_%s(%s)", name, pod.Name, pod.Namespace, pod.UID)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.pr.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// waitFailure sets a Waiting reason for a failed start and waits the back-off.
func (c *ctrRuntime) waitFailure(reason, backoffReason, msg string) {
	c.setState(func() {
		c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}
	})
	c.pr.mu.Lock()
	b := c.pr.p.cfg.Backoff
	if c.backoff == 0 {
		c.backoff = b.Initial
	} else {
		c.backoff = min(c.backoff*2, b.Max)
	}
	d := c.backoff
	c.pr.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.pr.ctx.Done():
		return
	case <-t.C:
	}
	if backoffReason != "" {
		c.setState(func() {
			c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: backoffReason,
				Message: fmt.Sprintf("Back-off after %s: %s", reason, msg)}}
		})
	}
}

// start resolves the image, builds the environment and mounts, and starts
// the process with its probes.
func (c *ctrRuntime) start() (*ctrRun, bool) {
	if c.pr.ctx.Err() != nil {
		return nil, false
	}
	cat := c.pr.p.cfg.Catalog
	img, err := cat.Lookup(c.spec.Image)
	if err != nil {
		c.event(corev1.EventTypeWarning, "Failed", "Failed to pull image %q: %v", c.spec.Image, err)
		c.event(corev1.EventTypeWarning, "Failed", "Error: ErrImagePull")
		c.waitFailure("ErrImagePull", "ImagePullBackOff", err.Error())
		return nil, false
	}
	if !cat.Present(img) {
		c.event(corev1.EventTypeNormal, "Pulling", "Pulling image %q (building Go package %s)", c.spec.Image, img.GoPackage)
	}
	t0 := time.Now()
	ips := c.pr.ips()
	c.pr.mu.Lock()
	pod := c.pr.pod.DeepCopy()
	c.pr.mu.Unlock()
	env, vars, err := c.pr.p.containerEnv(pod, &c.spec, img.Env, ips)
	if err != nil {
		c.event(corev1.EventTypeWarning, "Failed", "Error: %v", err)
		c.waitFailure("CreateContainerConfigError", "", err.Error())
		return nil, false
	}
	proc, err := cat.Resolve(c.pr.ctx, img, expandAll(c.spec.Command, vars), expandAll(c.spec.Args, vars), c.spec.WorkingDir)
	if err != nil {
		if c.pr.ctx.Err() != nil {
			return nil, false
		}
		c.event(corev1.EventTypeWarning, "Failed", "Failed to pull image %q: %v", c.spec.Image, err)
		c.waitFailure("ErrImagePull", "ImagePullBackOff", err.Error())
		return nil, false
	}
	if proc.Built {
		c.event(corev1.EventTypeNormal, "Pulled", "Successfully pulled image %q in %s", c.spec.Image, time.Since(t0).Round(time.Millisecond))
	} else {
		c.event(corev1.EventTypeNormal, "Pulled", "Container image %q already present on machine", c.spec.Image)
	}
	mounts, err := c.mounts()
	if err != nil {
		c.event(corev1.EventTypeWarning, "Failed", "Error: %v", err)
		c.waitFailure("CreateContainerConfigError", "", err.Error())
		return nil, false
	}
	spec := sandbox.Spec{Argv: proc.Argv, Env: dedupEnv(env), WorkingDir: proc.WorkingDir, Mounts: mounts, Hostname: hostname(pod)}
	c.pr.mu.Lock()
	index := c.restartCount
	if c.run != nil {
		index++
	}
	sb := c.pr.sb
	c.pr.mu.Unlock()
	run := &ctrRun{index: index, exited: make(chan struct{}), kill: make(chan string, 1)}
	c.cgroup(run)
	if run.cgroup != nil {
		spec.Cgroups = run.cgroup.Dirs()
	}
	id := newID()
	c.event(corev1.EventTypeNormal, "Created", "Created container: %s", c.spec.Name)
	cmd, err := sb.Start(c.spec.Name, spec, sb.LogPath(c.spec.Name, index))
	if err != nil {
		c.event(corev1.EventTypeWarning, "Failed", "Error: %v", err)
		c.setState(func() {
			c.lastState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError", Message: err.Error(), FinishedAt: metav1.Now()}}
		})
		c.waitFailure("RunContainerError", "", err.Error())
		return nil, false
	}
	run.cmd, run.started = cmd, time.Now()
	go func() {
		_ = cmd.Wait()
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // what the container left behind
		if run.cgroup != nil {
			_ = run.cgroup.Kill() // and what left the process group, as a runtime stops a container
		}
		close(run.exited)
	}()
	c.setState(func() {
		if c.run != nil {
			c.restartCount++
		}
		c.run = run
		c.containerID = "ziptrail://" + id
		c.imageID = "catalog://" + img.Image
		c.preStopDone = false
		c.started = c.spec.StartupProbe == nil
		c.ready = false
		c.state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(run.started)}}
	})
	c.event(corev1.EventTypeNormal, "Started", "Started container %s", c.spec.Name)
	if h := c.spec.Lifecycle; h != nil && h.PostStart != nil {
		ctx, cancel := context.WithTimeout(c.pr.ctx, 2*time.Minute)
		err := probe.Run(ctx, probe.FromLifecycle(h.PostStart), c.target())
		cancel()
		if err != nil && c.pr.ctx.Err() == nil {
			c.event(corev1.EventTypeWarning, "FailedPostStartHook", "PostStartHook failed: %v", err)
			run.kill <- "FailedPostStartHook"
		}
	}
	return run, true
}

func dedupEnv(env []string) []string {
	seen := map[string]int{}
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := seen[k]; ok {
			out[i] = kv
			continue
		}
		seen[k] = len(out)
		out = append(out, kv)
	}
	return out
}

func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// mounts lists the container's bind mounts: the pod's shm, hosts and
// resolv.conf, then its volumeMounts.
func (c *ctrRuntime) mounts() ([]sandbox.Mount, error) {
	c.pr.mu.Lock()
	sb, vols := c.pr.sb, c.pr.vols
	c.pr.mu.Unlock()
	mounts := sb.BaseMounts()
	for _, vm := range c.spec.VolumeMounts {
		src, err := vols.Path(vm.Name)
		if err != nil {
			return nil, err
		}
		sub := vm.SubPath
		if vm.SubPathExpr != "" {
			sub = vm.SubPathExpr // expansion of $(VAR) is not supported; used literally
		}
		if sub != "" {
			if filepath.IsAbs(sub) || strings.HasPrefix(filepath.Clean(sub), "..") {
				return nil, fmt.Errorf("volumeMount %s: subPath %q must be a relative path inside the volume", vm.Name, sub)
			}
			src = filepath.Join(src, sub)
		}
		if !filepath.IsAbs(vm.MountPath) {
			return nil, fmt.Errorf("volumeMount %s: mountPath %q must be absolute", vm.Name, vm.MountPath)
		}
		mounts = append(mounts, sandbox.Mount{Source: src, Target: filepath.Clean(vm.MountPath), ReadOnly: vm.ReadOnly || vols.ReadOnly(vm.Name)})
	}
	return mounts, nil
}

func (c *ctrRuntime) target() probe.Target {
	return probe.Target{PodIP: c.pr.podIP(), Ports: c.spec.Ports, Exec: func(argv []string) (*exec.Cmd, error) {
		c.pr.mu.Lock()
		sb := c.pr.sb
		c.pr.mu.Unlock()
		return sb.Exec(c.spec.Name, argv)
	}}
}

// wait runs the probes and waits for the process to end (or stops it when
// the pod terminates or a probe asks for a restart); it records the exit
// and returns the exit code.
func (c *ctrRuntime) wait(run *ctrRun) int {
	probeCtx, stopProbes := context.WithCancel(c.pr.ctx)
	c.startProbes(probeCtx, run)
	select {
	case <-run.exited:
	case <-c.pr.ctx.Done():
		c.stop(run, fmt.Sprintf("Stopping container %s", c.spec.Name))
	case msg := <-run.kill:
		c.stop(run, msg)
	}
	stopProbes()
	<-run.exited
	ps := run.cmd.ProcessState
	code := ps.ExitCode()
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	reason, message := "Completed", ""
	if code != 0 {
		reason = "Error"
		if run.oomKilled() {
			reason = "OOMKilled"
			c.reportOOM()
		}
		if c.spec.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError {
			message = c.logTail(run.index)
		}
	}
	c.setState(func() {
		c.ready = false
		c.state = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: int32(code), Reason: reason, Message: message, StartedAt: metav1.NewTime(run.started), FinishedAt: metav1.Now(), ContainerID: c.containerID}}
	})
	return code
}

// stop runs the preStop hook, sends SIGTERM to the process group, waits
// for the rest of the grace period and then SIGKILLs the group.
func (c *ctrRuntime) stop(run *ctrRun, msg string) {
	c.event(corev1.EventTypeNormal, "Killing", "%s", msg)
	terminating := c.pr.ctx.Err() != nil
	if !terminating {
		// A probe-triggered restart: the grace period of the pod (or of
		// the probe) applies from now.
		grace := c.pr.graceFromSpec()
		if p := c.spec.LivenessProbe; p != nil && p.TerminationGracePeriodSeconds != nil {
			grace = time.Duration(*p.TerminationGracePeriodSeconds) * time.Second
		}
		c.pr.mu.Lock()
		c.pr.deadline = time.Now().Add(grace)
		c.pr.mu.Unlock()
	}
	c.pr.mu.Lock()
	deadline := c.pr.deadline
	runPreStop := !c.preStopDone && c.spec.Lifecycle != nil && c.spec.Lifecycle.PreStop != nil
	c.preStopDone = true
	c.pr.mu.Unlock()
	if runPreStop {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		done := make(chan error, 1)
		go func() { done <- probe.Run(ctx, probe.FromLifecycle(c.spec.Lifecycle.PreStop), c.target()) }()
		select {
		case err := <-done:
			if err != nil {
				c.event(corev1.EventTypeWarning, "FailedPreStopHook", "PreStopHook failed: %v", err)
			}
		case <-run.exited:
		}
		cancel()
	}
	pid := run.cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	var exited bool
	if terminating {
		exited = c.pr.waitDeadline(run.exited, 2*time.Second)
	} else {
		t := time.NewTimer(max(time.Until(deadline), 2*time.Second))
		select {
		case <-run.exited:
			exited = true
		case <-t.C:
		}
		t.Stop()
	}
	if !exited {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	<-run.exited
}

// startProbes starts the startup probe, then liveness and readiness once
// the container has started.
func (c *ctrRuntime) startProbes(ctx context.Context, run *ctrRun) {
	if c.init {
		return
	}
	startOthers := func() {
		if p := c.spec.LivenessProbe; p != nil {
			w := &probe.Worker{Probe: p, Target: c.target(), Initial: true, Report: func(r probe.Result) {
				if r.Err != nil {
					c.event(corev1.EventTypeWarning, "Unhealthy", "Liveness probe failed: %v", r.Err)
				}
				if r.Failed {
					requestKill(run, fmt.Sprintf("Container %s failed liveness probe, will be restarted", c.spec.Name))
				}
			}}
			go w.Run(ctx)
		}
		if p := c.spec.ReadinessProbe; p != nil {
			w := &probe.Worker{Probe: p, Target: c.target(), Initial: false, Eager: eagerReadiness, Report: func(r probe.Result) {
				if r.Err != nil && !r.Quiet && ctx.Err() == nil {
					c.event(corev1.EventTypeWarning, "Unhealthy", "Readiness probe failed: %v", r.Err)
				}
				if r.Changed && ctx.Err() == nil {
					c.setState(func() { c.ready = r.Success })
				}
			}}
			go w.Run(ctx)
		} else {
			c.setState(func() { c.ready = true })
		}
	}
	p := c.spec.StartupProbe
	if p == nil {
		startOthers()
		return
	}
	startupCtx, stopStartup := context.WithCancel(ctx)
	w := &probe.Worker{Probe: p, Target: c.target(), Initial: false, Report: func(r probe.Result) {
		if r.Err != nil {
			c.event(corev1.EventTypeWarning, "Unhealthy", "Startup probe failed: %v", r.Err)
		}
		if r.Failed {
			requestKill(run, fmt.Sprintf("Container %s failed startup probe, will be restarted", c.spec.Name))
			stopStartup()
			return
		}
		if r.Success {
			stopStartup()
			c.setState(func() { c.started = true })
			startOthers()
		}
	}}
	go w.Run(startupCtx)
}

// eagerReadiness is the readiness probe interval of a fresh container until
// its first success (see probe.Worker.Eager).
const eagerReadiness = 250 * time.Millisecond

func requestKill(run *ctrRun, msg string) {
	select {
	case run.kill <- msg:
	default:
	}
}

// logTail is the end of a run's output, as the kubelet reports it for
// terminationMessagePolicy FallbackToLogsOnError: the last 80 lines, at
// most 2048 bytes.
func (c *ctrRuntime) logTail(index int32) string {
	c.pr.mu.Lock()
	sb := c.pr.sb
	c.pr.mu.Unlock()
	f, err := os.Open(sb.LogPath(c.spec.Name, index))
	if err != nil {
		return ""
	}
	defer f.Close()
	if err := seekTail(f, 80); err != nil {
		return ""
	}
	b, _ := io.ReadAll(f)
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return string(b)
}
