package e2e

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

// Objects and results of any size (issue 36): a 1 GiB object sent from
// inside a Python handler is consumed by a function on the other node, and
// comes back as the session's 1 GiB result through the gateway to `ziptrail
// run -o`, the file's sha256 checked. The operator (in this process with
// the local cluster) must not hold either: its RSS is printed and may grow
// by less than 64 MiB.
var _ = Describe("a 1 GiB object and result", func() {
	It("goes from a Python handler to a function on the other node and back through ziptrail run -o", func() {
		if cluster == nil {
			Skip("needs the local cluster: the operator's RSS is this process's")
		}
		const size = 1 << 30
		bin := filepath.Join(GinkgoT().TempDir(), "ziptrail")
		build := exec.Command("go", "build", "-o", bin, "./cmd/ziptrail")
		build.Dir = paths.RepoRoot()
		out, err := build.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "%s", out)

		var nodes corev1.NodeList
		Expect(k8s.List(ctx, &nodes)).To(Succeed())
		var names []string
		for _, n := range nodes.Items {
			names = append(names, n.Name)
		}
		slices.Sort(names)
		Expect(len(names)).To(BeNumerically(">=", 2), "nodes %v", names)
		// The store holds the object and the pod's objects volume twice that.
		q := resource.MustParse("1536Mi")
		ns := deploy("gib", v1alpha1.WorkflowSpec{Entry: "produce",
			Buckets: []v1alpha1.NamedBucket{{Name: "big", Spec: v1alpha1.BucketSpec{MemoryLimitPerPod: &q}},
				{Name: "output", Spec: v1alpha1.BucketSpec{MemoryLimitPerPod: &q}}},
			Functions: []v1alpha1.FunctionSpec{
				onNode(pyFunction("produce", fmt.Sprintf(`
def handle(inv):
    ziptrail.send_object("big", "blob", bytes(range(256)) * (%d // 256))
    return b""`, size)), names[0]),
				onNode(pyFunction("consume", `
def handle(inv):
    ziptrail.send_object("output", "result", inv.objects[0].data)
    return b""`), names[1]),
			},
			Triggers: []v1alpha1.NamedTrigger{trig("consume-big", "big", v1alpha1.TriggerSpec{Primitive: v1alpha1.Immediate, Targets: []string{"consume"}})},
		})
		for fn, node := range map[string]string{"produce": names[0], "consume": names[1]} {
			pods := functionPods(ns, fn)
			Expect(pods).NotTo(BeEmpty())
			Expect(pods[0].Spec.NodeName).To(Equal(node), "function %s", fn)
		}

		runtime.GC()
		before := rss()
		file := filepath.Join(GinkgoT().TempDir(), "result")
		start := time.Now()
		cmd := exec.Command(bin, "run", "gib", "-q", "-o", file, "--input", "-", "-n", ns, "--gateway", gatewayURL(), "--token", gatewayToken(), "--timeout", "10m")
		cmd.Stdin = strings.NewReader("go")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		done := make(chan error, 1)
		go func() { done <- cmd.Run() }()
		// The operator's RSS, sampled while the bytes go by.
		peak := before
		for waiting := true; waiting; {
			select {
			case err := <-done:
				Expect(err).NotTo(HaveOccurred(), "ziptrail run: %s", stderr.String())
				waiting = false
			case <-time.After(200 * time.Millisecond):
				peak = max(peak, rss())
			}
		}
		took := time.Since(start)
		peak = max(peak, rss())

		f, err := os.Open(file)
		Expect(err).NotTo(HaveOccurred())
		defer f.Close()
		h := sha256.New()
		n, err := io.Copy(h, f)
		Expect(err).NotTo(HaveOccurred())
		Expect(n).To(Equal(int64(size)))
		Expect(fmt.Sprintf("%x", h.Sum(nil))).To(Equal(fmt.Sprintf("%x", sha256.Sum256(ramp(size)))))
		grew := peak - before
		GinkgoWriter.Printf("1 GiB from %s to %s and back as the result in %s; this process's RSS (the operator, gateway included) %d MiB before, %d MiB at most during (+%d MiB)\n",
			names[0], names[1], took.Round(time.Millisecond), before>>20, peak>>20, grew>>20)
		AddReportEntry("1 GiB object and result", took)
		Expect(grew).To(BeNumerically("<", 64<<20), "the operator's RSS grew by %d MiB", grew>>20)
	})
})

// onNode pins a function's pods to a node (Knative's
// kubernetes.podspec-nodeselector, enabled on the local cluster).
func onNode(f v1alpha1.FunctionSpec, node string) v1alpha1.FunctionSpec {
	raw, err := json.Marshal(map[string]any{"spec": map[string]any{"nodeSelector": map[string]string{corev1.LabelHostname: node}}})
	Expect(err).NotTo(HaveOccurred())
	f.Template = &k8sruntime.RawExtension{Raw: raw}
	return f
}

// rss is this process's resident set in bytes.
func rss() int64 {
	data, err := os.ReadFile("/proc/self/status")
	Expect(err).NotTo(HaveOccurred())
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			Expect(err).NotTo(HaveOccurred())
			return kb << 10
		}
	}
	Fail("no VmRSS in /proc/self/status")
	return 0
}
