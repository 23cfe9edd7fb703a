package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/tools/chartops"
)

// A nemesis acts on the cluster on a schedule with jitter for as long as
// its phase lasts: act, then wait every ± jitter, again.
type nemesis struct {
	name, doc string
	every     time.Duration
	act       func(ctx context.Context, m *modeRun) (string, error)
}

// pauseFor is how long a SIGSTOP lasts.
const pauseFor = 10 * time.Second

var nemeses = []nemesis{
	{name: "kill-leader", every: 20 * time.Second, act: killOperator,
		doc: "SIGKILL of the operator process of the leader (sharded: of a random bucket owner); the node agent restarts it"},
	{name: "stop-leader", every: 25 * time.Second, act: stopOperator,
		doc: "SIGSTOP of the leader's (sharded: a bucket owner's) operator process for 10 s, then SIGCONT"},
	{name: "rollout-restart", every: 40 * time.Second, act: rolloutRestart,
		doc: "`kubectl rollout restart` of the operator's Deployment, waiting for `rollout status`"},
	{name: "helm-upgrade", every: 40 * time.Second, act: helmUpgrade,
		doc: "`helm upgrade --reuse-values` flipping operator.logLevel (a new ReplicaSet), waiting for the rollout"},
	{name: "kill-function", every: 10 * time.Second, act: killFunction,
		doc: "SIGKILL of the user process (python3) of a random function pod; the node agent restarts it"},
	{name: "kill-queue-proxy", every: 10 * time.Second, act: killQueueProxy,
		doc: "SIGKILL of queue-proxy-zl in a random function pod; the node agent restarts it"},
	{name: "redis-restart", every: 30 * time.Second, act: redisRestart,
		doc: "redis-server SHUTDOWN SAVE, down 2 s, started again on the same address with its data"},
	{name: "redis-stop", every: 25 * time.Second, act: redisStop,
		doc: "SIGSTOP of redis-server for 10 s, then SIGCONT"},
}

func nemesisNames() []string {
	var names []string
	for _, n := range nemeses {
		names = append(names, n.name)
	}
	return names
}

func nemesisByName(name string) *nemesis {
	for i := range nemeses {
		if nemeses[i].name == name {
			return &nemeses[i]
		}
	}
	return nil
}

// run acts until ctx ends: first after a quarter of its interval or of
// the phase, whichever is shorter (the phase's sessions are under way, and
// a short phase still sees its nemesis), then every interval ± 25 %.
func (n *nemesis) run(ctx context.Context, m *modeRun, phase int, phaseLen time.Duration) {
	wait := m.jitter(min(n.every, phaseLen)/4, 0.25)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		what, err := n.act(ctx, m)
		if ctx.Err() != nil && err != nil && errors.Is(err, context.DeadlineExceeded) {
			return // the phase ended during the act
		}
		m.recordFault(phase, n.name+": "+what, err)
		wait = m.jitter(n.every, 0.25)
	}
}

// operatorTarget is the operator pod a kill or stop hits: the leader, or
// (sharded) the owner of a random bucket.
func operatorTarget(ctx context.Context, m *modeRun) (*corev1.Pod, error) {
	if !m.sharded() {
		return m.rel.Leader(ctx)
	}
	owners, err := m.rel.BucketOwners(ctx, engineLease)
	if err != nil {
		return nil, err
	}
	var ips []string
	for _, ip := range owners {
		if ip != "" {
			ips = append(ips, ip)
		}
	}
	if len(ips) == 0 {
		return nil, errors.New("no bucket has a live owner")
	}
	sort.Strings(ips)
	return m.rel.PodByIP(ctx, ips[m.intn(len(ips))])
}

// operatorProcess matches the operator's process in its pod (only that
// pod's processes are candidates: see SignalContainerProcess).
const operatorContainer, operatorProcess = "operator", "operator"

func killOperator(ctx context.Context, m *modeRun) (string, error) {
	p, err := operatorTarget(ctx, m)
	if err != nil {
		return "no target", err
	}
	return "SIGKILL " + p.Name, localcluster.SignalContainerProcess(ctx, m.cluster.Kubeconfig, p, operatorContainer, operatorProcess, "KILL")
}

func stopOperator(ctx context.Context, m *modeRun) (string, error) {
	p, err := operatorTarget(ctx, m)
	if err != nil {
		return "no target", err
	}
	what := fmt.Sprintf("SIGSTOP %s for %s", p.Name, pauseFor)
	if err := localcluster.SignalContainerProcess(ctx, m.cluster.Kubeconfig, p, operatorContainer, operatorProcess, "STOP"); err != nil {
		return what, err
	}
	sleep(ctx, pauseFor)
	// Always resumed, even when the phase (or the run) ended meanwhile.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return what, localcluster.SignalContainerProcess(cctx, m.cluster.Kubeconfig, p, operatorContainer, operatorProcess, "CONT")
}

func rolloutRestart(ctx context.Context, m *modeRun) (string, error) {
	t := time.Now()
	err := m.rel.RolloutRestart(context.WithoutCancel(ctx))
	return fmt.Sprintf("kubectl rollout restart deploy/%s (%s)", m.rel.Deployment(), time.Since(t).Round(time.Second)), err
}

func helmUpgrade(ctx context.Context, m *modeRun) (string, error) {
	level := "debug"
	d, err := m.cluster.Clientset.AppsV1().Deployments(m.rel.Namespace).Get(ctx, m.rel.Deployment(), metav1.GetOptions{})
	if err == nil {
		for _, a := range d.Spec.Template.Spec.Containers[0].Args {
			if a == "--zap-log-level=debug" {
				level = "info"
			}
		}
	}
	t := time.Now()
	err = m.rel.Upgrade(context.WithoutCancel(ctx), "operator.logLevel="+level)
	return fmt.Sprintf("helm upgrade --set operator.logLevel=%s (%s)", level, time.Since(t).Round(time.Second)), err
}

// functionPod is a random running pod of the workflows' functions.
func functionPod(ctx context.Context, m *modeRun) (*corev1.Pod, error) {
	list, err := m.cluster.Clientset.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "serving.knative.dev/service"})
	if err != nil {
		return nil, err
	}
	var pods []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && chartops.PodReady(&p) {
			pods = append(pods, p)
		}
	}
	if len(pods) == 0 {
		return nil, errors.New("no ready function pod")
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	return &pods[m.intn(len(pods))], nil
}

func killFunction(ctx context.Context, m *modeRun) (string, error) {
	p, err := functionPod(ctx, m)
	if err != nil {
		return "no target", err
	}
	return "SIGKILL python3 in " + p.Name, localcluster.SignalContainerProcess(ctx, m.cluster.Kubeconfig, p, "user-container", "python3", "KILL")
}

func killQueueProxy(ctx context.Context, m *modeRun) (string, error) {
	p, err := functionPod(ctx, m)
	if err != nil {
		return "no target", err
	}
	return "SIGKILL queue-proxy-zl in " + p.Name, localcluster.SignalContainerProcess(ctx, m.cluster.Kubeconfig, p, "queue-proxy", "queue-proxy", "KILL")
}

func redisRestart(ctx context.Context, m *modeRun) (string, error) {
	t := time.Now()
	err := m.cluster.RestartRedis(context.WithoutCancel(ctx), 2*time.Second)
	return fmt.Sprintf("redis-server restarted (%s)", time.Since(t).Round(100*time.Millisecond)), err
}

func redisStop(ctx context.Context, m *modeRun) (string, error) {
	what := fmt.Sprintf("SIGSTOP redis-server for %s", pauseFor)
	if err := m.cluster.SignalRedis(syscall.SIGSTOP); err != nil {
		return what, err
	}
	sleep(ctx, pauseFor)
	return what, m.cluster.SignalRedis(syscall.SIGCONT)
}

// sleep waits d, or less if ctx ends first.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
