package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

// sortResult is what examples/sort's collect returns (its validator's
// report, valsort-like).
type sortResult struct {
	Valid            bool    `json:"valid"`
	Method           string  `json:"method"`
	Rounds           int     `json:"rounds"`
	Partitions       int     `json:"partitions"`
	Records          int64   `json:"records"`
	Bytes            int64   `json:"bytes"`
	Checksum         string  `json:"checksum"`
	InputRecords     int64   `json:"inputRecords"`
	InputChecksum    string  `json:"inputChecksum"`
	Sorted           bool    `json:"sorted"`
	SHA256           string  `json:"sha256"`
	PartitionRecords []int64 `json:"partitionRecords"`
	ValidateSeconds  float64 `json:"validateSeconds"`
}

// runLongSession starts a session and polls its result for up to limit
// (the gateway's ?wait= is capped, so it asks again while it runs).
func runLongSession(ns, wf, input string, limit time.Duration) (string, sessions.Session) {
	resp, err := gw.Post(fmt.Sprintf("%s/v1/namespaces/%s/workflows/%s/sessions", gatewayURL(), ns, wf), "application/octet-stream", strings.NewReader(input))
	Expect(err).NotTo(HaveOccurred())
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	Expect(resp.StatusCode).To(Equal(http.StatusCreated), string(body))
	var s sessions.Session
	Expect(json.Unmarshal(body, &s)).To(Succeed())
	var result []byte
	Eventually(func(g Gomega) {
		resp, err := gw.Get(fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s/result?wait=1m", gatewayURL(), ns, s.ID))
		g.Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		result, _ = io.ReadAll(resp.Body)
		if resp.StatusCode == http.StatusAccepted {
			g.Expect(resp.StatusCode).To(Equal(http.StatusOK), "still running")
			return
		}
		// A failed or expired session ends the wait with its reason.
		Expect(resp.StatusCode).To(Equal(http.StatusOK), "result: %s", result)
	}).WithTimeout(limit).WithPolling(time.Second).Should(Succeed())
	st, err := gw.Get(fmt.Sprintf("%s/v1/namespaces/%s/sessions/%s", gatewayURL(), ns, s.ID))
	Expect(err).NotTo(HaveOccurred())
	defer st.Body.Close()
	Expect(json.NewDecoder(st.Body).Decode(&s)).To(Succeed())
	return string(result), s
}

// sortSession runs one sort and checks its validator's report.
func sortSession(ns string, params map[string]any) (sortResult, time.Duration) {
	in, err := json.Marshal(params)
	Expect(err).NotTo(HaveOccurred())
	raw, s := runLongSession(ns, "sort", string(in), 40*time.Minute)
	Expect(s.State).To(Equal(sessions.Completed))
	var got sortResult
	Expect(json.Unmarshal([]byte(raw), &got)).To(Succeed(), raw)
	took := s.Ended.Sub(s.Started)
	fmt.Fprintf(GinkgoWriter, "sort %v: %s in %v (validation in the collector %.1fs): %s\n", params, humanBytes(got.Bytes), took, got.ValidateSeconds, raw)
	AddReportEntry(fmt.Sprintf("sort %s %s", params["method"], humanBytes(got.Bytes)), took.String())
	Expect(got.Valid).To(BeTrue(), raw)
	Expect(got.Sorted).To(BeTrue(), raw)
	Expect(got.Records).To(Equal(got.InputRecords), raw)
	Expect(got.Checksum).To(Equal(got.InputChecksum), raw)
	Expect(got.Method).To(Equal(params["method"]))
	return got, took
}

func humanBytes(n int64) string {
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// expectedInput computes the input's summary with the sample's generator,
// here, independently of the workflow.
func expectedInput(seed, records int64) (int64, string) {
	root := paths.RepoRoot()
	cmd := exec.Command("python3", "sort.py", "expected", fmt.Sprint(seed), fmt.Sprint(records))
	cmd.Dir = filepath.Join(root, "examples", "sort")
	cmd.Env = append(cmd.Environ(), "PYTHONPATH="+filepath.Join(root, "sdk", "python"))
	out, err := cmd.Output()
	Expect(err).NotTo(HaveOccurred(), "%s", out)
	var s struct {
		Records  int64  `json:"records"`
		Checksum string `json:"checksum"`
	}
	Expect(json.Unmarshal(out, &s)).To(Succeed(), "%s", out)
	return s.Records, s.Checksum
}

var _ = Describe("the sort sample (shuffle library: pod memory, Redis, S3, hybrid)", Ordered, func() {
	var wf *v1alpha1.Workflow
	BeforeAll(func() {
		wf = loadSample("sort", newNamespace())
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitWorkflowReady(wf)
	})

	It("sorts the same 16 MiB through every method into byte-identical output", func() {
		const seed, size = 3, 16 << 20
		records, checksum := expectedInput(seed, size/100)
		var first sortResult
		for i, method := range []string{"podmemory", "redis", "s3", "hybrid"} {
			got, _ := sortSession(wf.Namespace, map[string]any{"method": method, "bytes": size, "seed": seed, "partitions": 8,
				"taskRecords": (2 << 20) / 100, "fastCapacity": 4 << 20})
			Expect(got.Records).To(Equal(records))
			Expect(got.Checksum).To(Equal(checksum), "the generator's checksum of the input")
			if method == "hybrid" {
				Expect(got.Rounds).To(Equal(4))
			}
			if i == 0 {
				first = got
				continue
			}
			Expect(got.SHA256).To(Equal(first.SHA256), "%s's output differs from %s's", method, first.Method)
			Expect(got.PartitionRecords).To(Equal(first.PartitionRecords))
		}
	})

	It("sorts 256 MiB with the hybrid shuffle (4 rounds of 64 MiB through Redis), validated", func() {
		const size = 256 << 20
		got, _ := sortSession(wf.Namespace, map[string]any{"method": "hybrid", "bytes": size, "seed": 7, "partitions": 16,
			"fastCapacity": 64 << 20})
		Expect(got.Bytes).To(Equal(int64(size / 100 * 100)))
		Expect(got.Rounds).To(Equal(4))
		Expect(got.Partitions).To(Equal(16))
	})
})
