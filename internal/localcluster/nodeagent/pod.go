package nodeagent

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/cgroups"
	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/downward"
	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/sandbox"
	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/volumes"
)

// podRuntime is one pod's state machine: sandbox → volumes → init
// containers → containers → (on deletion) stop → teardown. Every transition
// marks the pod for a status push.
type podRuntime struct {
	p   *Provider
	key string
	uid types.UID

	ctx    context.Context // cancelled when termination starts
	cancel context.CancelFunc
	done   chan struct{} // closed once torn down

	mu               sync.Mutex
	pod              *corev1.Pod
	startTime        metav1.Time
	sb               *sandbox.Sandbox
	vols             *volumes.Set
	conds            map[corev1.PodConditionType]*corev1.PodCondition
	initDone         bool
	failReason       string // the pod failed as a whole (phase Failed)
	failMessage      string
	deadlineExceeded bool
	terminating      bool
	// apiDeletion: the pod is being deleted through the API (it has a
	// deletionTimestamp); once its containers are gone the agent removes
	// it, as the kubelet does, instead of leaving it until the deadline.
	apiDeletion   bool
	deadline      time.Time     // end of the grace period while terminating
	shorten       chan struct{} // closed (and replaced) when the deadline moves earlier
	finished      bool
	inits, ctrs   []*ctrRuntime
	volumeErr     string
	sandboxErr    string
	sandboxFailed int
	cgroup        *cgroups.Group // the pod's cgroup (nil: no limits)
}

func newPodRuntime(p *Provider, pod *corev1.Pod) *podRuntime {
	ctx, cancel := context.WithCancel(context.Background())
	pr := &podRuntime{p: p, key: key(pod.Namespace, pod.Name), uid: pod.UID, ctx: ctx, cancel: cancel,
		done: make(chan struct{}), pod: pod.DeepCopy(), startTime: metav1.Now(),
		conds: map[corev1.PodConditionType]*corev1.PodCondition{}, shorten: make(chan struct{})}
	for i := range pod.Spec.InitContainers {
		pr.inits = append(pr.inits, newCtrRuntime(pr, pod.Spec.InitContainers[i], true))
	}
	for i := range pod.Spec.Containers {
		pr.ctrs = append(pr.ctrs, newCtrRuntime(pr, pod.Spec.Containers[i], false))
	}
	return pr
}

func (pr *podRuntime) notify() { pr.p.changed(pr) }

func (pr *podRuntime) event(typ, reason, format string, args ...any) {
	pr.mu.Lock()
	pod := pr.pod.DeepCopy()
	pr.mu.Unlock()
	pr.p.cfg.Recorder.Eventf(pod, typ, reason, format, args...)
}

func (pr *podRuntime) logf(format string, args ...any) {
	pr.p.cfg.Log.Info(fmt.Sprintf(format, args...), "node", pr.p.cfg.NodeName, "pod", pr.key)
}

// unsupported names what the agent cannot honour for a pod.
func unsupported(pod *corev1.Pod) (string, string) {
	switch {
	case pod.Spec.HostNetwork:
		return "HostNetworkUnsupported", "ziptrail-node runs every pod in its own network namespace and cannot honour hostNetwork: true"
	case pod.Spec.HostPID || pod.Spec.HostIPC:
		return "HostNamespaceUnsupported", "ziptrail-node cannot honour hostPID or hostIPC"
	}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			return "SidecarContainersUnsupported", fmt.Sprintf("init container %q has restartPolicy Always (a sidecar container), which ziptrail-node does not support", c.Name)
		}
	}
	return "", ""
}

func (pr *podRuntime) run() {
	defer pr.finish()
	pr.notify()
	if reason, msg := unsupported(pr.pod); reason != "" {
		pr.mu.Lock()
		pr.failReason, pr.failMessage = reason, msg
		pr.mu.Unlock()
		pr.event(corev1.EventTypeWarning, reason, "%s", msg)
		pr.notify()
		<-pr.ctx.Done()
		return
	}
	if d := pr.pod.Spec.ActiveDeadlineSeconds; d != nil {
		go pr.enforceDeadline(time.Duration(*d) * time.Second)
	}
	if !pr.createSandbox() {
		return
	}
	pr.createCgroup()
	if !pr.setupVolumes() {
		return
	}
	go pr.refreshVolumes()
	for _, c := range pr.inits {
		if !c.runInit() {
			<-pr.ctx.Done()
			return
		}
	}
	pr.mu.Lock()
	pr.initDone = true
	pr.mu.Unlock()
	pr.notify()
	var wg sync.WaitGroup
	for _, c := range pr.ctrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.loop()
		}()
	}
	wg.Wait()
	<-pr.ctx.Done()
}

const deadlineMessage = "Pod was active on the node longer than the specified deadline"

// enforceDeadline fails the pod once it has been active for longer than
// spec.activeDeadlineSeconds (counted from its start, as the kubelet does)
// and stops its containers.
func (pr *podRuntime) enforceDeadline(d time.Duration) {
	t := time.NewTimer(time.Until(pr.startTime.Add(d)))
	defer t.Stop()
	select {
	case <-pr.ctx.Done():
		return
	case <-t.C:
	}
	// The Failed phase is only pushed with the containers' final states
	// (finish): the core ignores status updates once a pod is Failed.
	pr.mu.Lock()
	pr.deadlineExceeded = true
	pr.mu.Unlock()
	pr.event(corev1.EventTypeWarning, "DeadlineExceeded", "%s", deadlineMessage)
	pr.terminate(pr.graceFromSpec(), "active deadline exceeded")
}

// retry waits before the next attempt of a failed step; false when the pod
// is terminating.
func (pr *podRuntime) retry(attempt int) bool {
	d := time.Duration(1<<min(attempt, 5)) * time.Second
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-pr.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (pr *podRuntime) createSandbox() bool {
	for attempt := 0; ; attempt++ {
		sb, err := sandbox.Create(pr.ctx, pr.p.cfg.Network, pr.p.cfg.PodsDir, pr.pod, pr.p.cfg.DNS)
		if err == nil {
			pr.mu.Lock()
			pr.sb, pr.sandboxErr = sb, ""
			pr.mu.Unlock()
			pr.logf("sandbox ready: %s in namespace %s", sb.IP(), sb.Net.Name)
			pr.notify()
			return true
		}
		if pr.ctx.Err() != nil {
			return false
		}
		pr.mu.Lock()
		pr.sandboxErr = err.Error()
		pr.mu.Unlock()
		pr.event(corev1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod sandbox: %v", err)
		pr.notify()
		if !pr.retry(attempt) {
			return false
		}
	}
}

func (pr *podRuntime) ips() downward.IPs {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	ips := downward.IPs{HostIP: pr.p.cfg.NodeIP}
	if pr.sb != nil {
		ips.PodIP = pr.sb.IP()
	}
	return ips
}

func (pr *podRuntime) podIP() string { return pr.ips().PodIP }

func (pr *podRuntime) setupVolumes() bool {
	pr.mu.Lock()
	vols := volumes.New(pr.sb.Dir+"/volumes", volumes.Sources{
		Client: pr.p.cfg.Client, ConfigMaps: pr.p.cfg.ConfigMaps, Secrets: pr.p.cfg.Secrets, Allocatable: pr.p.allocatable,
		NodePaths: pr.p.cfg.NodePaths,
	}, pr.pod, downward.IPs{PodIP: pr.sb.IP(), HostIP: pr.p.cfg.NodeIP})
	pr.vols = vols
	pr.mu.Unlock()
	for attempt := 0; ; attempt++ {
		err := vols.Sync(pr.ctx)
		if err == nil {
			pr.mu.Lock()
			pr.volumeErr = ""
			pr.mu.Unlock()
			return true
		}
		if pr.ctx.Err() != nil {
			return false
		}
		pr.mu.Lock()
		first := pr.volumeErr != err.Error()
		pr.volumeErr = err.Error()
		pr.mu.Unlock()
		if first {
			pr.event(corev1.EventTypeWarning, "FailedMount", "MountVolume.SetUp failed: %v", err)
			pr.notify()
		}
		if !pr.retry(attempt) {
			return false
		}
	}
}

// volumeSyncPeriod is how often ConfigMap, Secret and downward API files are
// brought up to date (from the informers' caches, so it costs no API calls).
const volumeSyncPeriod = 2 * time.Second

func (pr *podRuntime) refreshVolumes() {
	t := time.NewTicker(volumeSyncPeriod)
	defer t.Stop()
	for {
		select {
		case <-pr.ctx.Done():
			return
		case <-t.C:
		}
		if err := pr.vols.Sync(pr.ctx); err != nil && pr.ctx.Err() == nil {
			pr.p.cfg.Log.Warn("volume refresh failed", "pod", pr.key, "err", err)
		}
	}
}

// update applies a changed pod from the API (metadata for downward API files).
func (pr *podRuntime) update(ctx context.Context, pod *corev1.Pod) {
	pr.mu.Lock()
	pr.pod.Labels, pr.pod.Annotations = pod.Labels, pod.Annotations
	pr.pod.Spec.ActiveDeadlineSeconds = pod.Spec.ActiveDeadlineSeconds
	pr.pod.Spec.Tolerations = pod.Spec.Tolerations
	// Only image changes of running containers are accepted by the API; the
	// agent keeps running the old process (documented limitation).
	for i := range pr.pod.Spec.Containers {
		if i < len(pod.Spec.Containers) {
			pr.pod.Spec.Containers[i].Image = pod.Spec.Containers[i].Image
		}
	}
	vols := pr.vols
	cur := pr.pod.DeepCopy()
	pr.mu.Unlock()
	if vols != nil {
		vols.SetPod(cur)
		_ = vols.Sync(ctx)
	}
	pr.notify()
}

func (pr *podRuntime) graceFromSpec() time.Duration {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if g := pr.pod.Spec.TerminationGracePeriodSeconds; g != nil {
		return time.Duration(*g) * time.Second
	}
	return corev1.DefaultTerminationGracePeriodSeconds * time.Second
}

// terminate starts stopping the pod with the given grace period; a second
// call can only shorten it.
func (pr *podRuntime) terminate(grace time.Duration, why string) {
	pr.mu.Lock()
	deadline := time.Now().Add(grace)
	switch {
	case !pr.terminating:
		pr.terminating, pr.deadline = true, deadline
		if why != "" {
			pr.logf("terminating (grace %s): %s", grace, why)
		} else {
			pr.logf("terminating (grace %s)", grace)
		}
	case deadline.Before(pr.deadline):
		pr.deadline = deadline
		close(pr.shorten)
		pr.shorten = make(chan struct{})
	}
	pr.mu.Unlock()
	pr.cancel()
}

// waitDeadline waits for ch until the grace period ends; false on timeout.
func (pr *podRuntime) waitDeadline(ch <-chan struct{}, minimum time.Duration) bool {
	for {
		pr.mu.Lock()
		d, shorten := time.Until(pr.deadline), pr.shorten
		pr.mu.Unlock()
		if d < minimum {
			d = minimum
		}
		t := time.NewTimer(d)
		select {
		case <-ch:
			t.Stop()
			return true
		case <-t.C:
			return false
		case <-shorten:
			t.Stop()
		}
	}
}

// finish tears the sandbox down, pushes the terminal status and forgets the pod.
func (pr *podRuntime) finish() {
	// Whatever still runs in the pod's cgroup goes before its sandbox.
	pr.removeCgroup()
	pr.mu.Lock()
	sb := pr.sb
	pr.mu.Unlock()
	if sb != nil {
		if err := sb.Destroy(context.Background()); err != nil {
			pr.p.cfg.Log.Warn("sandbox teardown", "pod", pr.key, "err", err)
		}
	}
	pr.mu.Lock()
	pr.finished = true
	if pr.deadlineExceeded {
		pr.failReason, pr.failMessage = "DeadlineExceeded", deadlineMessage
	}
	for _, c := range append(append([]*ctrRuntime{}, pr.inits...), pr.ctrs...) {
		c.finalState()
	}
	pr.mu.Unlock()
	apiDeletion := pr.apiDeletion
	pr.logf("terminated")
	pr.notify()
	pr.p.forget(pr)
	if apiDeletion {
		pr.p.removeFromAPI(pr.pod.Namespace, pr.pod.Name, pr.uid)
	}
	close(pr.done)
}

// snapshot is a deep copy of the pod with its current status.
func (pr *podRuntime) snapshot() *corev1.Pod {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pod := pr.pod.DeepCopy()
	st := corev1.PodStatus{
		HostIP:    pr.p.cfg.NodeIP,
		HostIPs:   []corev1.HostIP{{IP: pr.p.cfg.NodeIP}},
		StartTime: &pr.startTime,
		QOSClass:  qosClass(pod),
	}
	if pr.sb != nil {
		st.PodIP = pr.sb.IP()
		st.PodIPs = []corev1.PodIP{{IP: st.PodIP}}
	}
	for _, c := range pr.inits {
		st.InitContainerStatuses = append(st.InitContainerStatuses, c.status())
	}
	for _, c := range pr.ctrs {
		st.ContainerStatuses = append(st.ContainerStatuses, c.status())
	}
	st.Phase = pr.phase(st.ContainerStatuses)
	if pr.failReason != "" {
		st.Reason, st.Message = pr.failReason, pr.failMessage
	}
	st.Conditions = pr.conditions(&st)
	pod.Status = st
	return pod
}

func (pr *podRuntime) phase(statuses []corev1.ContainerStatus) corev1.PodPhase {
	if pr.failReason != "" {
		return corev1.PodFailed
	}
	if !pr.initDone && !pr.finished {
		return corev1.PodPending
	}
	var running, waiting, stopped, succeeded int
	for _, s := range statuses {
		switch {
		case s.State.Running != nil:
			running++
		case s.State.Terminated != nil:
			stopped++
			if s.State.Terminated.ExitCode == 0 {
				succeeded++
			}
		case s.LastTerminationState.Terminated != nil:
			stopped++
		default:
			waiting++
		}
	}
	switch {
	case pr.finished:
		if stopped == succeeded && waiting == 0 {
			return corev1.PodSucceeded
		}
		return corev1.PodFailed
	case waiting > 0:
		return corev1.PodPending
	case running > 0:
		return corev1.PodRunning
	case stopped > 0:
		switch {
		case pr.pod.Spec.RestartPolicy == corev1.RestartPolicyAlways || pr.pod.Spec.RestartPolicy == "":
			return corev1.PodRunning
		case stopped == succeeded:
			return corev1.PodSucceeded
		case pr.pod.Spec.RestartPolicy == corev1.RestartPolicyNever:
			return corev1.PodFailed
		}
		return corev1.PodRunning
	}
	return corev1.PodPending
}

func (pr *podRuntime) conditions(st *corev1.PodStatus) []corev1.PodCondition {
	set := func(t corev1.PodConditionType, ok bool, reason, msg string) {
		status := corev1.ConditionFalse
		if ok {
			status, reason, msg = corev1.ConditionTrue, "", ""
		}
		c, exists := pr.conds[t]
		if !exists || c.Status != status {
			c = &corev1.PodCondition{Type: t, Status: status, LastTransitionTime: metav1.Now()}
			pr.conds[t] = c
		}
		c.Reason, c.Message = reason, msg
	}
	var notInit, notReady []string
	for i, c := range st.InitContainerStatuses {
		if !pr.initDone && (c.State.Terminated == nil || c.State.Terminated.ExitCode != 0) {
			notInit = append(notInit, pr.inits[i].spec.Name)
		}
	}
	for _, c := range st.ContainerStatuses {
		if !c.Ready {
			notReady = append(notReady, c.Name)
		}
	}
	done := st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed
	set(corev1.PodScheduled, true, "", "")
	set(corev1.PodReadyToStartContainers, pr.sb != nil && !pr.finished, "", "")
	switch {
	case pr.initDone || len(pr.inits) == 0:
		set(corev1.PodInitialized, true, "", "")
	default:
		set(corev1.PodInitialized, false, "ContainersNotInitialized", fmt.Sprintf("containers with incomplete status: [%s]", strings.Join(notInit, " ")))
	}
	switch {
	case done:
		set(corev1.ContainersReady, false, "PodCompleted", "")
		set(corev1.PodReady, false, "PodCompleted", "")
	case len(notReady) > 0:
		msg := fmt.Sprintf("containers with unready status: [%s]", strings.Join(notReady, " "))
		set(corev1.ContainersReady, false, "ContainersNotReady", msg)
		set(corev1.PodReady, false, "ContainersNotReady", msg)
	default:
		set(corev1.ContainersReady, true, "", "")
		set(corev1.PodReady, true, "", "")
	}
	order := []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.PodReady, corev1.ContainersReady, corev1.PodScheduled}
	out := make([]corev1.PodCondition, 0, len(order))
	for _, t := range order {
		out = append(out, *pr.conds[t])
	}
	return out
}

func qosClass(pod *corev1.Pod) corev1.PodQOSClass {
	requests, limits := corev1.ResourceList{}, corev1.ResourceList{}
	guaranteed := true
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		for n, q := range c.Resources.Requests {
			if n == corev1.ResourceCPU || n == corev1.ResourceMemory {
				add(requests, n, q)
			}
		}
		got := 0
		for n, q := range c.Resources.Limits {
			if n == corev1.ResourceCPU || n == corev1.ResourceMemory {
				add(limits, n, q)
				got++
			}
		}
		if got < 2 {
			guaranteed = false
		}
	}
	if len(requests) == 0 && len(limits) == 0 {
		return corev1.PodQOSBestEffort
	}
	if guaranteed {
		for n, l := range limits {
			if r, ok := requests[n]; ok && r.Cmp(l) != 0 {
				guaranteed = false
			}
		}
	}
	if guaranteed {
		return corev1.PodQOSGuaranteed
	}
	return corev1.PodQOSBurstable
}

func add(l corev1.ResourceList, n corev1.ResourceName, q resource.Quantity) {
	cur := l[n]
	cur.Add(q)
	l[n] = cur
}

// container returns a container of the pod by name.
func (pr *podRuntime) container(name string) (*ctrRuntime, error) {
	for _, c := range append(append([]*ctrRuntime{}, pr.inits...), pr.ctrs...) {
		if c.spec.Name == name {
			return c, nil
		}
	}
	names := make([]string, 0, len(pr.ctrs))
	for _, c := range pr.ctrs {
		names = append(names, c.spec.Name)
	}
	sort.Strings(names)
	return nil, fmt.Errorf("container %s is not valid for pod %s (containers: %s)", name, pr.pod.Name, strings.Join(names, ", "))
}
