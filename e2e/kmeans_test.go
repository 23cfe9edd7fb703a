package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

// kmeansResult is what examples/kmeans prints (local) or sends to its
// output bucket (the workers' rank 0).
type kmeansResult struct {
	Params struct {
		Workers int `json:"workers"`
	} `json:"params"`
	Centroids  [][]float64 `json:"centroids"`
	Iterations int         `json:"iterations"`
	Converged  bool        `json:"converged"`
	Inertia    float64     `json:"inertia"`
	Sizes      []int       `json:"sizes"`
	Ranks      []string    `json:"ranks"`
	Pods       []string    `json:"pods"`
	Seconds    float64     `json:"seconds"`
}

// sortedCentroids orders centroids lexicographically: the workers and the
// single process may number the same clusters alike, but the check should
// not depend on it.
func sortedCentroids(cs [][]float64) [][]float64 {
	out := slices.Clone(cs)
	slices.SortFunc(out, func(a, b []float64) int { return slices.Compare(a, b) })
	return out
}

// closeRel: equal within rel relative to the larger magnitude (sums added
// in another order: the allreduce's tree against one process's loop).
func closeRel(a, b, rel float64) bool {
	return math.Abs(a-b) <= rel*math.Max(math.Abs(a), math.Abs(b))
}

// logPodsOnFailure prints the logs of every container of the namespace's
// pods when the spec failed (local cluster only).
func logPodsOnFailure(ns string) {
	DeferCleanup(func() {
		if !CurrentSpecReport().Failed() || cluster == nil {
			return
		}
		var pods corev1.PodList
		if err := k8s.List(context.Background(), &pods, client.InNamespace(ns)); err != nil {
			GinkgoWriter.Printf("list pods of %s: %v\n", ns, err)
			return
		}
		for _, p := range pods.Items {
			for _, c := range p.Spec.Containers {
				data, err := cluster.Clientset.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: c.Name}).DoRaw(context.Background())
				GinkgoWriter.Printf("===== logs of %s/%s (%s), err %v\n%s\n", p.Name, c.Name, p.Status.Phase, err, data)
			}
		}
	})
}

var _ = Describe("the kmeans sample (k-means, allreduce between function instances)", func() {
	It("computes with 4 workers on several pods what one process computes", func() {
		root := paths.RepoRoot()
		params := strings.TrimSpace(string(sampleInput("kmeans", "params.json")))
		var p struct{ Workers int }
		Expect(json.Unmarshal([]byte(params), &p)).To(Succeed())
		Expect(p.Workers).To(Equal(4))

		ns := newNamespace()
		logPodsOnFailure(ns)
		wf := loadSample("kmeans", ns)
		// A worker that waits in vain fails well before the session's
		// result wait (2 min) gives up, so that its error is in its log.
		for i, fn := range wf.Spec.Functions {
			if fn.Name == "worker" {
				wf.Spec.Functions[i].Env = append(fn.Env, corev1.EnvVar{Name: "KMEANS_JOIN_TIMEOUT", Value: "60"},
					corev1.EnvVar{Name: "KMEANS_STEP_TIMEOUT", Value: "30"})
			}
		}
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitWorkflowReady(wf)

		began := time.Now()
		result, s := runSession(ns, wf.Name, params)
		took := time.Since(began)
		Expect(s.State).To(Equal(sessions.Completed))
		var got kmeansResult
		Expect(json.Unmarshal([]byte(result), &got)).To(Succeed(), result)
		AddReportEntry("kmeans result (4 workers)", result)
		AddReportEntry("kmeans session", fmt.Sprintf("%s through the gateway (session %s), iterations %.3f s in the workers",
			took.Round(time.Millisecond), s.Ended.Sub(s.Started).Round(time.Millisecond), got.Seconds))

		// The same computation in one process, on the host.
		began = time.Now()
		cmd := exec.Command("python3", filepath.Join(root, "examples", "kmeans", "kmeans.py"), "local", params)
		out, err := cmd.Output()
		Expect(err).NotTo(HaveOccurred(), "kmeans.py local: %s", errOutput(err))
		AddReportEntry("kmeans local", fmt.Sprintf("%s: %s", time.Since(began).Round(time.Millisecond), out))
		var want kmeansResult
		Expect(json.Unmarshal(out, &want)).To(Succeed(), string(out))

		Expect(got.Params.Workers).To(Equal(4))
		Expect(got.Iterations).To(Equal(want.Iterations))
		Expect(got.Converged).To(Equal(want.Converged))
		Expect(got.Sizes).To(Equal(want.Sizes))
		Expect(closeRel(got.Inertia, want.Inertia, 1e-9)).To(BeTrue(), "inertia %v, local %v", got.Inertia, want.Inertia)
		gc, wc := sortedCentroids(got.Centroids), sortedCentroids(want.Centroids)
		Expect(gc).To(HaveLen(len(wc)))
		for i := range wc {
			Expect(gc[i]).To(HaveLen(len(wc[i])))
			for d := range wc[i] {
				Expect(closeRel(gc[i][d], wc[i][d], 1e-9)).To(BeTrue(), "centroid %d: %v, local %v", i, gc[i], wc[i])
			}
		}

		// Every rank ran in a pod of the worker Service, and not all in one.
		Expect(got.Ranks).To(HaveLen(4))
		for _, pod := range got.Ranks {
			Expect(pod).To(HavePrefix(wf.Name+"-worker-"), "rank's pod %q", pod)
		}
		Expect(len(got.Pods)).To(BeNumerically(">", 1), "the workers' pods: %v", got.Pods)
		// start + one worker per rank
		Expect(s.Invocations).To(Equal(5))
	})
})

// errOutput is a failed command's stderr.
func errOutput(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}
