package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/yaml"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

var _ = Describe("the word count sample (DynamicGroup shuffle, DynamicJoin gather)", func() {
	It("counts the words of a real text like a plain count does", func() {
		root := paths.RepoRoot()
		data, err := os.ReadFile(filepath.Join(root, "examples", "wordcount", "workflow.yaml"))
		Expect(err).NotTo(HaveOccurred())
		wf := &v1alpha1.Workflow{}
		Expect(yaml.UnmarshalStrict(data, wf)).To(Succeed())
		wf.Namespace = newNamespace()
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitWorkflowReady(wf)

		text, err := os.ReadFile(filepath.Join(root, "LICENSE"))
		Expect(err).NotTo(HaveOccurred())
		result, s := runSession(wf.Namespace, wf.Name, string(text))
		Expect(s.State).To(Equal(sessions.Completed))
		var got struct {
			Total    int     `json:"total"`
			Distinct int     `json:"distinct"`
			Top      [][]any `json:"top"`
		}
		Expect(json.Unmarshal([]byte(result), &got)).To(Succeed())

		counts := map[string]int{}
		total := 0
		for _, w := range strings.FieldsFunc(strings.ToLower(string(text)), func(r rune) bool { return r < 'a' || r > 'z' }) {
			counts[w]++
			total++
		}
		Expect(got.Total).To(Equal(total))
		Expect(got.Distinct).To(Equal(len(counts)))
		for _, kv := range got.Top {
			Expect(kv[1]).To(BeNumerically("==", counts[kv[0].(string)]), "count of %v", kv[0])
		}
		// split + 4 map + 3 reduce + collect
		Expect(s.Invocations).To(Equal(9))
	})
})
