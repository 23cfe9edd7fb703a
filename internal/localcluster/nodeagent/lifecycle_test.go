package nodeagent_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// A crashing container is restarted with the kubelet's back-off
// (CrashLoopBackOff, doubling), its restart count grows, lastState holds
// the exit code, and `kubectl logs --previous` shows the last run.
func TestCrashRestartBackoff(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pod := echoPod(ns, "crash", nodes[0].Name)
	pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, corev1.EnvVar{Name: "CRASH_AFTER", Value: "1s"})
	p := create(t, pod)
	var backoffs []string
	g.Eventually(func(g Gomega) {
		p := getPod(g, ns, "crash")
		g.Expect(p.Status.ContainerStatuses).To(HaveLen(1))
		cs := p.Status.ContainerStatuses[0]
		if w := cs.State.Waiting; w != nil && w.Reason == "CrashLoopBackOff" {
			if len(backoffs) == 0 || backoffs[len(backoffs)-1] != w.Message {
				backoffs = append(backoffs, w.Message)
			}
		}
		g.Expect(cs.RestartCount).To(BeNumerically(">=", 2))
		g.Expect(cs.LastTerminationState.Terminated).NotTo(BeNil())
		g.Expect(cs.LastTerminationState.Terminated.ExitCode).To(Equal(int32(1)))
		g.Expect(cs.LastTerminationState.Terminated.Reason).To(Equal("Error"))
		g.Expect(p.Status.Phase).To(Equal(corev1.PodRunning))
	}, 90*time.Second, 100*time.Millisecond).Should(Succeed())
	g.Expect(strings.Join(backoffs, "\n")).To(ContainSubstring("back-off 2s restarting failed container=echo pod=crash_" + ns))
	g.Expect(strings.Join(backoffs, "\n")).To(ContainSubstring("back-off 4s restarting failed container=echo"))
	g.Eventually(func(g Gomega) {
		ev := events(g, p)
		g.Expect(containsLine(ev, "BackOff: Back-off restarting failed container echo in pod crash_"+ns)).To(BeTrue(), "%v", ev)
	}, 10*time.Second, 200*time.Millisecond).Should(Succeed())
	prev, err := logs(ns, "crash", &corev1.PodLogOptions{Previous: true})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(prev).To(ContainSubstring("crashing after 1s"))
}

// A failing readiness probe turns Ready (and ContainersReady) False, and a
// passing one True again; the probe carries the kubelet's User-Agent and
// the probe's headers.
func TestReadinessFlips(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	create(t, echoPod(ns, "ready", nodes[1].Name))
	p := waitReady(t, ns, "ready")
	post := func(ok bool) {
		resp, err := http.Post(echoURL(p, fmt.Sprintf("/ready?ok=%v", ok)), "text/plain", nil)
		g.Expect(err).NotTo(HaveOccurred())
		resp.Body.Close()
	}
	post(false)
	g.Eventually(func(g Gomega) {
		p := getPod(g, ns, "ready")
		g.Expect(isReady(p)).To(BeFalse())
		g.Expect(p.Status.ContainerStatuses[0].Ready).To(BeFalse())
		g.Expect(p.Status.Phase).To(Equal(corev1.PodRunning))
	}, 30*time.Second, 100*time.Millisecond).Should(Succeed())
	g.Eventually(func(g Gomega) {
		ev := events(g, p)
		g.Expect(containsLine(ev, "Unhealthy: Readiness probe failed: HTTP probe failed with statuscode: 503")).To(BeTrue(), "%v", ev)
	}, 10*time.Second, 200*time.Millisecond).Should(Succeed())
	post(true)
	waitReady(t, ns, "ready")
}

// A failing liveness probe kills the container, which is restarted
// (restartCount 1, an Unhealthy and a Killing event); a startup probe holds
// liveness back until the server listens; an exec readiness probe runs
// inside the container's mounts.
func TestLivenessRestartsAndExecProbe(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pod := echoPod(ns, "live", nodes[0].Name)
	c := &pod.Spec.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: "NOT_READY_FILE", Value: "/ztn-scratch/unhealthy"})
	pod.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	c.VolumeMounts = []corev1.VolumeMount{{Name: "scratch", MountPath: "/ztn-scratch"}}
	// Readiness: the file must not exist as the container sees it (its mount).
	c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{
		Command: []string{"sh", "-c", "test ! -e /ztn-scratch/unhealthy"}}}, PeriodSeconds: 1, FailureThreshold: 1, TimeoutSeconds: 10}
	// The startup probe holds the liveness probe back until the server listens.
	c.StartupProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}},
		PeriodSeconds: 1, FailureThreshold: 60}
	c.LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}},
		PeriodSeconds: 1, FailureThreshold: 2, TimeoutSeconds: 5}
	p := create(t, pod)
	waitReady(t, ns, "live")
	// Make the container unhealthy from the host: the emptyDir is in the
	// pod's sandbox directory.
	podDir := stateDir + "/pods/" + string(p.UID) + "/volumes/scratch"
	g.Expect(writeFile(podDir+"/unhealthy", "x")).To(Succeed())
	g.Eventually(func(g Gomega) {
		p := getPod(g, ns, "live")
		g.Expect(p.Status.ContainerStatuses[0].RestartCount).To(BeNumerically(">=", 1))
	}, 60*time.Second, 100*time.Millisecond).Should(Succeed())
	g.Eventually(func(g Gomega) {
		ev := events(g, p)
		g.Expect(containsLine(ev, "Unhealthy: Liveness probe failed: HTTP probe failed with statuscode: 503")).To(BeTrue(), "%v", ev)
		g.Expect(containsLine(ev, "Killing: Container echo failed liveness probe, will be restarted")).To(BeTrue(), "%v", ev)
		g.Expect(containsLine(ev, "Unhealthy: Readiness probe failed: command \"sh -c test ! -e /ztn-scratch/unhealthy\"")).To(BeTrue(), "%v", ev)
	}, 10*time.Second, 200*time.Millisecond).Should(Succeed())
	g.Expect(removeFile(podDir + "/unhealthy")).To(Succeed())
	waitReady(t, ns, "live")
}

// Deleting a pod runs the preStop hook, then SIGTERM, and SIGKILLs the
// container once the grace period is over; the pod then disappears.
func TestGracefulDeletion(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	pod := echoPod(ns, "grace", nodes[1].Name)
	grace := int64(3)
	pod.Spec.TerminationGracePeriodSeconds = &grace
	c := &pod.Spec.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: "TERM_DELAY", Value: "forever"})
	c.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{
		Path: "/hook?name=prestop&sleep=1s", Port: intstr.FromInt32(8080)}}}
	create(t, pod)
	waitReady(t, ns, "grace")

	// Follow the logs through the deletion: the stream ends with the run.
	stream, err := client.CoreV1().Pods(ns).GetLogs("grace", &corev1.PodLogOptions{Follow: true}).Stream(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	defer stream.Close()
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stream)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	start := time.Now()
	g.Expect(client.CoreV1().Pods(ns).Delete(ctx, "grace", metav1.DeleteOptions{})).To(Succeed())
	var got []string
	for l := range lines {
		got = append(got, l)
	}
	stopped := time.Since(start)
	all := strings.Join(got, "\n")
	g.Expect(all).To(MatchRegexp(`(?s)hook prestop called \(User-Agent "kube-probe/1\.36"\).*received terminated.*ignoring terminated`))
	g.Expect(all).NotTo(ContainSubstring("exiting"))
	// SIGKILL only after the grace period (a lower bound, not a timing target).
	g.Expect(stopped).To(BeNumerically(">=", 3*time.Second))
	g.Eventually(func() bool {
		_, err := client.CoreV1().Pods(ns).Get(ctx, "grace", metav1.GetOptions{})
		return err != nil
	}, 30*time.Second, 100*time.Millisecond).Should(BeTrue())
}

// A container exiting 0 with restartPolicy Never ends the pod Succeeded; one
// exiting non-zero with Never ends it Failed with the exit code.
func TestRestartPolicyNever(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	for name, code := range map[string]string{"ok": "0", "bad": "3"} {
		pod := echoPod(ns, name, nodes[0].Name)
		pod.Spec.RestartPolicy = corev1.RestartPolicyNever
		pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, corev1.EnvVar{Name: "EXIT_CODE", Value: code})
		pod.Spec.Containers[0].TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError
		create(t, pod)
	}
	g.Eventually(func(g Gomega) {
		p := getPod(g, ns, "ok")
		g.Expect(p.Status.Phase).To(Equal(corev1.PodSucceeded))
		p = getPod(g, ns, "bad")
		g.Expect(p.Status.Phase).To(Equal(corev1.PodFailed))
		g.Expect(p.Status.ContainerStatuses[0].State.Terminated.ExitCode).To(Equal(int32(3)))
		// FallbackToLogsOnError: the end of the output is the message.
		g.Expect(p.Status.ContainerStatuses[0].State.Terminated.Message).To(HaveSuffix("exiting with code 3\n"))
		g.Expect(p.Status.ContainerStatuses[0].RestartCount).To(BeZero())
	}, 2*time.Minute, 200*time.Millisecond).Should(Succeed())
}

// `kubectl logs` through the API server reaches the node's kubelet API
// (TLS, client certificate of the API server); --tail limits the lines.
// Anonymous callers and other clients' certificates are refused.
func TestLogsThroughKubeletAPI(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pod := echoPod(ns, "logs", nodes[0].Name)
	pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, corev1.EnvVar{Name: "LOG_LINES", Value: "alpha,beta,gamma"})
	create(t, pod)
	waitReady(t, ns, "logs")
	out, err := logs(ns, "logs", &corev1.PodLogOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out).To(MatchRegexp(`(?s)echo starting: pod=logs.*alpha\nbeta\ngamma\n`))
	tail := int64(2)
	out, err = logs(ns, "logs", &corev1.PodLogOptions{TailLines: &tail})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out).To(Equal("beta\ngamma\n"))
	// No earlier run: the kubelet API answers 400 (previous terminated container not found).
	_, err = logs(ns, "logs", &corev1.PodLogOptions{Previous: true})
	g.Expect(apierrors.IsBadRequest(err)).To(BeTrue(), "%v", err)

	// Straight to the kubelet port without credentials: refused.
	url := fmt.Sprintf("https://%s:%d/containerLogs/%s/logs/echo", nodes[0].PodCIDR.Addr().Next(), kubeletPort, ns)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed kubelet cert
	resp, err := hc.Get(url)
	g.Expect(err).NotTo(HaveOccurred())
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized), "%s", body)
	g.Expect(string(body)).NotTo(ContainSubstring("alpha"))
	// A forged bearer token is refused too.
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer forged.token.value")
	resp, err = hc.Do(req)
	g.Expect(err).NotTo(HaveOccurred())
	resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized))
}

func logs(ns, name string, opts *corev1.PodLogOptions) (string, error) {
	b, err := client.CoreV1().Pods(ns).GetLogs(name, opts).DoRaw(context.Background())
	return string(b), err
}

// Init containers run to completion, in order, before the containers
// start; they share the pod's volumes.
func TestInitContainers(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pod := echoPod(ns, "init", nodes[0].Name)
	pod.Spec.Volumes = []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	mount := []corev1.VolumeMount{{Name: "work", MountPath: "/ztn-work"}}
	pod.Spec.InitContainers = []corev1.Container{
		{Name: "first", Image: "ziptrail.dev/test/shell", Args: []string{"echo one > /ztn-work/order"}, VolumeMounts: mount},
		{Name: "second", Image: "ziptrail.dev/test/shell", Args: []string{"sleep 1; echo two >> /ztn-work/order"}, VolumeMounts: mount},
	}
	pod.Spec.Containers[0].VolumeMounts = mount
	create(t, pod)
	g.Eventually(func(g Gomega) {
		p := getPod(g, ns, "init")
		g.Expect(p.Status.Phase).To(Equal(corev1.PodPending))
		g.Expect(p.Status.InitContainerStatuses).To(HaveLen(2))
		var initialized corev1.ConditionStatus
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodInitialized {
				initialized = c.Status
			}
		}
		g.Expect(initialized).To(Equal(corev1.ConditionFalse))
	}, 30*time.Second, 50*time.Millisecond).Should(Succeed())
	p := waitReady(t, ns, "init")
	g.Expect(readFile(p, "/ztn-work/order")).To(Equal("one\ntwo\n"))
	for _, s := range p.Status.InitContainerStatuses {
		g.Expect(s.State.Terminated).NotTo(BeNil(), "%s", s.Name)
		g.Expect(s.State.Terminated.ExitCode).To(BeZero())
		g.Expect(s.State.Terminated.Reason).To(Equal("Completed"))
	}
}

// activeDeadlineSeconds fails the pod (DeadlineExceeded) and stops its
// containers.
func TestActiveDeadline(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pod := echoPod(ns, "deadline", nodes[1].Name)
	d := int64(3)
	pod.Spec.ActiveDeadlineSeconds = &d
	create(t, pod)
	g.Eventually(func(g Gomega) {
		p := getPod(g, ns, "deadline")
		g.Expect(p.Status.Phase).To(Equal(corev1.PodFailed))
		g.Expect(p.Status.Reason).To(Equal("DeadlineExceeded"))
		g.Expect(p.Status.ContainerStatuses[0].State.Terminated).NotTo(BeNil())
	}, 60*time.Second, 200*time.Millisecond).Should(Succeed())
}

// A pod whose containers stop well before its grace period ends (Knative's
// revision pods have 300 s) is removed from the API as soon as they have
// stopped, as the kubelet does — not left Succeeded until the deadline,
// where its Deployment and every pod count would still see it.
func TestDeletedPodLeavesAPIWhenStopped(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	pod := echoPod(ns, "quick", nodes[0].Name)
	grace := int64(300)
	pod.Spec.TerminationGracePeriodSeconds = &grace
	create(t, pod)
	waitReady(t, ns, "quick")
	g.Expect(client.CoreV1().Pods(ns).Delete(ctx, "quick", metav1.DeleteOptions{})).To(Succeed())
	g.Eventually(func() bool {
		_, err := client.CoreV1().Pods(ns).Get(ctx, "quick", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, 60*time.Second, 100*time.Millisecond).Should(BeTrue(), "the echo exits on SIGTERM at once; the pod must not wait out its 300 s")
}
