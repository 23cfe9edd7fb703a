package nodeagent_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/cgroups"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

// The ziptrail-node binary, run with the command line `ziptrail local up`
// uses: /healthz turns 200 once its node is Ready, a pod runs, SIGTERM
// stops it cleanly (exit 0, no namespace, bridge, mount or cgroup left);
// after a crash (SIGKILL) --cleanup removes the leftovers and the pod's
// processes.
func TestBinaryLifecycle(t *testing.T) {
	g := NewWithT(t)
	bin := agentBinary(g)
	state := agentState(g, t.TempDir())
	healthz := freePort()
	args := agentArgs(state, "ztm-node-0=10.221.8.0/24", "ztm", healthz)
	start := func() (*exec.Cmd, *syncBuffer) {
		return startAgent(g, exec.Command(bin, args...), healthz)
	}
	leftovers := func() []string {
		var found []string
		ns, _ := exec.Command("ip", "netns", "list").Output()
		links, _ := exec.Command("ip", "-o", "link", "show").Output()
		mounts, _ := os.ReadFile("/proc/self/mounts")
		for _, text := range []string{string(ns), string(links), string(mounts)} {
			for _, line := range strings.Split(text, "\n") {
				if strings.Contains(line, "ztm0") || strings.Contains(line, state) {
					found = append(found, line)
				}
			}
		}
		// The node's cgroups (below this process's: the agent is its child).
		if h, err := cgroups.Detect(); err == nil {
			if g := h.Own().Sub(cgroups.NodeGroup("ztm-node-0")); g.Exists() {
				found = append(found, g.Dirs()...)
			}
		}
		return found
	}

	ns := newNamespace(t)
	cmd, logs := start()
	g.Expect(logs.String()).To(ContainSubstring(`msg="node is Ready" node=ztm-node-0`))
	create(t, echoPod(ns, "via-binary", "ztm-node-0"))
	p := waitReady(t, ns, "via-binary")
	g.Expect(httpGet(echoURL(p, "/env?name=POD_IP"))).To(Equal(p.Status.PodIP))
	g.Expect(leftovers()).NotTo(BeEmpty())
	g.Expect(cmd.Process.Signal(syscall.SIGTERM)).To(Succeed())
	g.Expect(cmd.Wait()).To(Succeed(), "agent output:\n%s", logs)
	g.Expect(leftovers()).To(BeEmpty())

	// A crash leaves the sandbox behind; --cleanup removes it.
	firstID := p.Status.ContainerStatuses[0].ContainerID
	cmd, logs = start()
	// The pod is still bound to the node: the new run starts it again (the
	// API still shows the first run's status until the new one is pushed).
	g.Eventually(func(g Gomega) {
		p = waitReady(t, ns, "via-binary")
		g.Expect(p.Status.ContainerStatuses[0].ContainerID).NotTo(Equal(firstID))
	}, 2*time.Minute, 200*time.Millisecond).Should(Succeed())
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	g.Expect(leftovers()).NotTo(BeEmpty())
	_, err := httpGet(echoURL(p, "/"))
	g.Expect(err).NotTo(HaveOccurred(), "the orphaned container still serves after the crash")
	clean := exec.CommandContext(context.Background(), bin, append(args, "--cleanup")...)
	out, err := clean.CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), "%s", out)
	g.Expect(leftovers()).To(BeEmpty(), "agent output:\n%s", logs)
	_, err = httpGet(echoURL(p, "/"))
	g.Expect(err).To(HaveOccurred(), "the container survived --cleanup")
}

// Where cgroups are not usable — here the agent runs in a mount namespace
// without /sys/fs/cgroup — the node says so with a Warning event, and its
// pods run without limits instead of failing.
func TestBinaryWithoutCgroups(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	bin := agentBinary(g)
	state := agentState(g, t.TempDir())
	healthz := freePort()
	args := agentArgs(state, "ztw-node-0=10.221.9.0/24", "ztw", healthz)
	cmd, logs := startAgent(g, exec.Command("unshare", append([]string{"--mount", "--propagation", "private",
		"sh", "-c", `umount -R /sys/fs/cgroup && exec "$@"`, "sh", bin}, args...)...), healthz)
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		g.Expect(cmd.Wait()).To(Succeed(), "agent output:\n%s", logs)
	}()
	g.Expect(logs.String()).To(ContainSubstring("cgroups are not usable: pods run without resource limits"))
	ns := newNamespace(t)
	pod := echoPod(ns, "unlimited", "ztw-node-0")
	pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}
	create(t, pod)
	waitReady(t, ns, "unlimited")
	g.Eventually(func(g Gomega) {
		list, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
			"involvedObject.kind": "Node", "involvedObject.name": "ztw-node-0", "reason": "CgroupsUnavailable"}.String()})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(list.Items).NotTo(BeEmpty())
		g.Expect(list.Items[0].Type).To(Equal(corev1.EventTypeWarning))
		g.Expect(list.Items[0].Message).To(HavePrefix("Resource limits are not enforced on this node"))
	}, 10*time.Second, 200*time.Millisecond).Should(Succeed())
	if h, err := cgroups.Detect(); err == nil {
		g.Expect(h.Own().Sub(cgroups.NodeGroup("ztw-node-0")).Exists()).To(BeFalse())
	}
}

var (
	buildOnce sync.Once
	built     string
	buildErr  error
)

// agentBinary builds cmd/ziptrail-node once for the suite.
func agentBinary(g Gomega) string {
	buildOnce.Do(func() {
		built = filepath.Join(catalogDir, "bin", "ziptrail-node")
		build := exec.Command("go", "build", "-o", built, "./cmd/ziptrail-node")
		build.Dir = paths.RepoRoot()
		if out, err := build.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("%w: %s", err, out)
		}
	})
	g.Expect(buildErr).NotTo(HaveOccurred())
	return built
}

// agentState prepares a state directory below dir for a binary agent,
// with the echo binary the in-process agent built (when it has).
func agentState(g Gomega, dir string) string {
	state := filepath.Join(dir, "state")
	g.Expect(os.MkdirAll(filepath.Join(state, "images"), 0o755)).To(Succeed())
	if echo, err := filepath.Glob(filepath.Join(stateDir, "images", "*echo*")); err == nil && len(echo) > 0 {
		data, err := os.ReadFile(echo[0])
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(os.WriteFile(filepath.Join(state, "images", filepath.Base(echo[0])), data, 0o755)).To(Succeed())
	}
	return state
}

// agentArgs is the command line `ziptrail local up` gives the agent, for
// one node.
func agentArgs(state, node, prefix string, healthz int) []string {
	return []string{"--kubeconfig", filepath.Join(catalogDir, "kubeconfig"), "--state-dir", state, "--catalog", filepath.Join(catalogDir, "images.yaml"),
		"--node", node, "--net-prefix", prefix, "--cluster-dns", "10.0.0.10",
		"--cluster-domain", "cluster.local", "--listen-address", "127.0.0.1", "--healthz-port", strconv.Itoa(healthz), "--kubelet-port", strconv.Itoa(freePort())}
}

// startAgent starts an agent and waits for its /healthz to answer 200.
func startAgent(g Gomega, cmd *exec.Cmd, healthz int) (*exec.Cmd, *syncBuffer) {
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	g.Expect(cmd.Start()).To(Succeed())
	g.Eventually(func() (int, error) {
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(healthz) + "/healthz")
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}, 60*time.Second, 200*time.Millisecond).Should(Equal(http.StatusOK), "agent output:\n%s", logs)
	return cmd, logs
}

// syncBuffer collects a process's output while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
