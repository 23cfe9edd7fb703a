package nodeagent_test

import (
	"context"
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

	"github.com/ziptrail/ziptrail/internal/controlplane"
)

// The ziptrail-node binary, run with the command line `ziptrail local up`
// uses: /healthz turns 200 once its node is Ready, a pod runs, SIGTERM
// stops it cleanly (exit 0, no namespace, bridge or mount left); after a
// crash (SIGKILL) --cleanup removes the leftovers and the pod's processes.
func TestBinaryLifecycle(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "ziptrail-node")
	build := exec.Command("go", "build", "-o", bin, "./cmd/ziptrail-node")
	build.Dir = controlplane.RepoRoot()
	out, err := build.CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), "%s", out)
	kubeconfig := filepath.Join(catalogDir, "kubeconfig")
	state := filepath.Join(dir, "state")
	// Reuse the echo binary the in-process agent built.
	g.Expect(os.MkdirAll(filepath.Join(state, "images"), 0o755)).To(Succeed())
	if echo, err := filepath.Glob(filepath.Join(stateDir, "images", "*echo*")); err == nil && len(echo) > 0 {
		data, err := os.ReadFile(echo[0])
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(os.WriteFile(filepath.Join(state, "images", filepath.Base(echo[0])), data, 0o755)).To(Succeed())
	}
	healthz := freePort()
	args := []string{"--kubeconfig", kubeconfig, "--state-dir", state, "--catalog", filepath.Join(catalogDir, "images.yaml"),
		"--node", "ztm-node-0=10.221.8.0/24", "--net-prefix", "ztm", "--cluster-dns", "10.0.0.10",
		"--cluster-domain", "cluster.local", "--listen-address", "127.0.0.1", "--healthz-port", strconv.Itoa(healthz), "--kubelet-port", strconv.Itoa(freePort())}
	start := func() (*exec.Cmd, *syncBuffer) {
		logs := &syncBuffer{}
		cmd := exec.Command(bin, args...)
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
	_, err = httpGet(echoURL(p, "/"))
	g.Expect(err).NotTo(HaveOccurred(), "the orphaned container still serves after the crash")
	clean := exec.CommandContext(context.Background(), bin, append(args, "--cleanup")...)
	out, err = clean.CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), "%s", out)
	g.Expect(leftovers()).To(BeEmpty(), "agent output:\n%s", logs)
	_, err = httpGet(echoURL(p, "/"))
	g.Expect(err).To(HaveOccurred(), "the container survived --cleanup")
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
