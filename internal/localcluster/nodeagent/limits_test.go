package nodeagent_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/cgroups"
)

const shellImage = "ziptrail.dev/test/shell"

// shellContainer runs script with sh -c, with memory and CPU limits
// ("" for none).
func shellContainer(name, script, memory, cpu string) corev1.Container {
	c := corev1.Container{Name: name, Image: shellImage, Args: []string{script},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError}
	if memory != "" || cpu != "" {
		c.Resources.Limits = corev1.ResourceList{}
	}
	if memory != "" {
		c.Resources.Limits[corev1.ResourceMemory] = resource.MustParse(memory)
	}
	if cpu != "" {
		c.Resources.Limits[corev1.ResourceCPU] = resource.MustParse(cpu)
	}
	return c
}

func shellPod(ns, name, node string, ctrs ...corev1.Container) *corev1.Pod {
	grace := int64(2)
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: &grace, Containers: ctrs}}
}

// podCgroup is the pod's cgroup as the agent of this suite (this process)
// lays it out; the test is skipped where cgroups are not usable.
func podCgroup(t *testing.T, p *corev1.Pod) *cgroups.Group {
	t.Helper()
	h, err := cgroups.Detect()
	if err != nil {
		t.Skipf("cgroups are not usable here, pods run without limits: %v", err)
	}
	return h.Own().Sub(cgroups.NodeGroup(p.Spec.NodeName)).Sub(cgroups.PodGroup(string(p.UID)))
}

// controlFile reads a control file of the group in the hierarchy that has
// it (v1 keeps memory and cpu files in different trees).
func controlFile(g Gomega, cg *cgroups.Group, name string) string {
	for _, d := range cg.Dirs() {
		if b, err := os.ReadFile(filepath.Join(d, name)); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	g.Expect(name).To(BeEmpty(), "no %s in %v", name, cg.Dirs())
	return ""
}

func memoryLimitFile(h int) string {
	if h == 1 {
		return "memory.limit_in_bytes"
	}
	return "memory.max"
}

func cgroupVersion(t *testing.T) int {
	h, err := cgroups.Detect()
	if err != nil {
		t.Skipf("cgroups are not usable here: %v", err)
	}
	return h.Version()
}

func containerStatus(p *corev1.Pod, name string) corev1.ContainerStatus {
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == name {
			return s
		}
	}
	return corev1.ContainerStatus{}
}

// A container allocating past its memory limit is OOM-killed by the
// kernel, reported as the kubelet reports it (OOMKilled, 137, in
// lastState after the restart, restartCount, an OOMKilling event) and
// restarted; its sibling keeps running. The pod's cgroup has the sum of
// the limits, and it is gone once the pod is deleted.
func TestOOMKilledContainer(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	p := create(t, shellPod(ns, "oom", nodes[0].Name,
		// dd reads 256 MiB from /dev/zero into one buffer: every page is touched.
		shellContainer("hog", "exec dd if=/dev/zero of=/dev/null bs=256M count=1", "64Mi", ""),
		shellContainer("steady", "exec sleep 3600", "32Mi", "")))
	cg := podCgroup(t, p)
	version := cgroupVersion(t)
	g.Eventually(func(g Gomega) {
		p := getPod(g, ns, "oom")
		hog := containerStatus(p, "hog")
		g.Expect(hog.RestartCount).To(BeNumerically(">=", 1), "%+v", hog)
		last := hog.LastTerminationState.Terminated
		g.Expect(last).NotTo(BeNil(), "%+v", hog)
		g.Expect(last.Reason).To(Equal("OOMKilled"))
		g.Expect(last.ExitCode).To(Equal(int32(137)))
		steady := containerStatus(p, "steady")
		g.Expect(steady.State.Running).NotTo(BeNil(), "%+v", steady)
		g.Expect(steady.RestartCount).To(BeZero())
	}, 90*time.Second, 100*time.Millisecond).Should(Succeed())
	g.Eventually(func(g Gomega) {
		ev := events(g, p)
		g.Expect(containsLine(ev, "OOMKilling: Memory cgroup out of memory: container hog was killed (memory limit 64Mi)")).To(BeTrue(), "%v", ev)
		g.Expect(containsLine(ev, "BackOff: Back-off restarting failed container hog")).To(BeTrue(), "%v", ev)
		nodeEvents, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
			"involvedObject.kind": "Node", "involvedObject.name": nodes[0].Name, "reason": "OOMKilling"}.String()})
		g.Expect(err).NotTo(HaveOccurred())
		var msgs []string
		for _, e := range nodeEvents.Items {
			msgs = append(msgs, e.Message)
		}
		g.Expect(containsLine(msgs, "killed container hog of pod "+ns+"/oom")).To(BeTrue(), "%v", msgs)
	}, 10*time.Second, 200*time.Millisecond).Should(Succeed())

	// The kernel counted the kills in hog's cgroup, none in steady's; the
	// pod's memory limit is the sum of its containers'.
	hogKills, err := cg.Sub("hog").OOMKills()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(hogKills).To(BeNumerically(">=", 1))
	g.Expect(cg.Sub("steady").OOMKills()).To(BeZero())
	g.Expect(controlFile(g, cg, memoryLimitFile(version))).To(Equal("100663296")) // 96Mi
	g.Expect(controlFile(g, cg.Sub("hog"), memoryLimitFile(version))).To(Equal("67108864"))

	g.Expect(client.CoreV1().Pods(ns).Delete(ctx, "oom", metav1.DeleteOptions{})).To(Succeed())
	g.Eventually(func() bool {
		_, err := client.CoreV1().Pods(ns).Get(ctx, "oom", metav1.GetOptions{})
		return err != nil
	}, 30*time.Second, 100*time.Millisecond).Should(BeTrue())
	g.Eventually(cg.Exists, 10*time.Second, 100*time.Millisecond).Should(BeFalse(), "the pod's cgroups %v outlive it", cg.Dirs())
}

// A container using memory below its limit is not killed: it runs to
// completion, and its cgroup saw the memory it used.
func TestMemoryBelowLimit(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pod := shellPod(ns, "fits", nodes[1].Name, shellContainer("fits", "exec dd if=/dev/zero of=/dev/null bs=32M count=1", "64Mi", ""))
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	p := create(t, pod)
	cg := podCgroup(t, p).Sub("fits")
	version := cgroupVersion(t)
	g.Eventually(func(g Gomega) {
		p := getPod(g, ns, "fits")
		g.Expect(p.Status.Phase).To(Equal(corev1.PodSucceeded), "%+v", p.Status)
		term := p.Status.ContainerStatuses[0].State.Terminated
		g.Expect(term.Reason).To(Equal("Completed"))
		g.Expect(term.ExitCode).To(BeZero())
	}, 60*time.Second, 100*time.Millisecond).Should(Succeed())
	g.Expect(controlFile(g, cg, memoryLimitFile(version))).To(Equal("67108864"))
	peak := "memory.max_usage_in_bytes"
	if version == 2 {
		peak = "memory.peak"
	}
	used, err := strconv.ParseInt(controlFile(g, cg, peak), 10, 64)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(used).To(BeNumerically(">=", 32<<20), "the 32 MiB were charged to the container's cgroup")
	g.Expect(cg.OOMKills()).To(BeZero())
}

// A container with a CPU limit of 200m burning CPU gets about its quota:
// the kernel's CFS bandwidth control, not the agent, is measured here, so
// the bound is generous.
func TestCPULimit(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	c := shellContainer("burn", "while :; do :; done", "", "200m")
	c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}
	p := create(t, shellPod(ns, "burn", nodes[0].Name, c))
	cg := podCgroup(t, p).Sub("burn")
	g.Eventually(func(g Gomega) {
		p := getPod(g, ns, "burn")
		g.Expect(p.Status.ContainerStatuses).To(HaveLen(1))
		g.Expect(p.Status.ContainerStatuses[0].State.Running).NotTo(BeNil())
	}, 60*time.Second, 100*time.Millisecond).Should(Succeed())
	if cgroupVersion(t) == 1 {
		g.Expect(controlFile(g, cg, "cpu.cfs_quota_us")).To(Equal("20000"))
		g.Expect(controlFile(g, cg, "cpu.cfs_period_us")).To(Equal("100000"))
		g.Expect(controlFile(g, cg, "cpu.shares")).To(Equal("102"))
	} else {
		g.Expect(controlFile(g, cg, "cpu.max")).To(Equal("20000 100000"))
	}
	// Running is reported once the init is started: measure once the loop
	// is in the cgroup.
	g.Eventually(cg.Pids, 10*time.Second, 20*time.Millisecond).ShouldNot(BeEmpty())
	u0, err := cg.CPUUsage()
	g.Expect(err).NotTo(HaveOccurred())
	t0 := time.Now()
	time.Sleep(time.Second) // the measurement window
	u1, err := cg.CPUUsage()
	g.Expect(err).NotTo(HaveOccurred())
	cores := float64(u1-u0) / float64(time.Since(t0))
	t.Logf("a container limited to 200m used %.3f cores", cores)
	g.Expect(cores).To(BeNumerically("<", 0.5))
	g.Expect(cores).To(BeNumerically(">", 0.05), "the loop does not run in the container's cgroup")
}

// A memory-backed emptyDir with sizeLimit 1Mi is a tmpfs of that size: a
// 512 KiB file fits, a 2 MiB write fails with ENOSPC.
func TestMemoryEmptyDirSizeLimit(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pod := shellPod(ns, "small", nodes[1].Name, shellContainer("write",
		"head -c 524288 /dev/zero > /ztn-small/half && echo half written && head -c 2097152 /dev/zero > /ztn-small/big", "", ""))
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	limit := resource.MustParse("1Mi")
	pod.Spec.Volumes = []corev1.Volume{{Name: "small", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
		Medium: corev1.StorageMediumMemory, SizeLimit: &limit}}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "small", MountPath: "/ztn-small"}}
	p := create(t, pod)
	g.Eventually(func(g Gomega) {
		p := getPod(g, ns, "small")
		g.Expect(p.Status.Phase).To(Equal(corev1.PodFailed), "%+v", p.Status)
		term := p.Status.ContainerStatuses[0].State.Terminated
		g.Expect(term.ExitCode).To(Equal(int32(1)))
		g.Expect(term.Message).To(ContainSubstring("half written"))
		g.Expect(term.Message).To(ContainSubstring("No space left on device"))
	}, 60*time.Second, 100*time.Millisecond).Should(Succeed())
	mounts, err := os.ReadFile("/proc/self/mounts")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(mounts)).To(MatchRegexp(`(?m)^tmpfs ` + stateDir + `/pods/` + string(p.UID) + `/volumes/small tmpfs \S*size=1024k`))
}

// The container's process is in its cgroup from the start (the init joins
// it before the exec), and so are `kubectl exec` commands, as with a
// container runtime.
func TestExecJoinsContainerCgroup(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	p := create(t, shellPod(ns, "joined", nodes[1].Name, shellContainer("echo", "exec sleep 3600", "32Mi", "")))
	cg := podCgroup(t, p).Sub("echo")
	g.Eventually(func(g Gomega) {
		p := getPod(g, ns, "joined")
		g.Expect(p.Status.ContainerStatuses).To(HaveLen(1))
		g.Expect(p.Status.ContainerStatuses[0].State.Running).NotTo(BeNil())
	}, 60*time.Second, 100*time.Millisecond).Should(Succeed())
	// Running is reported once the init is started; it joins, then execs.
	g.Eventually(func(g Gomega) {
		pids, err := cg.Pids()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(pids).To(HaveLen(1))
		comm, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pids[0]), "comm"))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(string(comm)).To(Equal("sleep\n"))
	}, 10*time.Second, 20*time.Millisecond).Should(Succeed())
	stdout, stderr, err := execIn(ns, "joined", []string{"cat", "/proc/self/cgroup"})
	g.Expect(err).NotTo(HaveOccurred(), "stderr: %s", stderr)
	// One line per hierarchy the agent uses ends in the container's cgroup.
	joined := 0
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		if strings.HasSuffix(line, "/"+cg.Path()) {
			joined++
		}
	}
	g.Expect(joined).To(Equal(len(cg.Dirs())), "%s", stdout)
}
