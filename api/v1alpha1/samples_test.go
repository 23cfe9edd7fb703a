package v1alpha1_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

func samplePaths() []string {
	files, err := filepath.Glob(filepath.Join(paths.RepoRoot(), "config", "samples", "*.yaml"))
	Expect(err).NotTo(HaveOccurred())
	return files
}

var _ = Describe("samples", func() {
	It("has one sample per primitive and the two workflows", func() {
		seen := map[string]bool{}
		var workflows []string
		for _, p := range samplePaths() {
			data, err := os.ReadFile(p)
			Expect(err).NotTo(HaveOccurred())
			obj := &unstructured.Unstructured{}
			Expect(yaml.Unmarshal(data, &obj.Object)).To(Succeed(), p)
			switch obj.GetKind() {
			case "Trigger":
				prim, _, _ := unstructured.NestedString(obj.Object, "spec", "primitive")
				seen[prim] = true
			case "Workflow":
				workflows = append(workflows, obj.GetName())
			}
		}
		for _, prim := range []v1alpha1.Primitive{v1alpha1.Immediate, v1alpha1.ByName, v1alpha1.BySet, v1alpha1.ByBatchSize,
			v1alpha1.ByTime, v1alpha1.Redundant, v1alpha1.DynamicJoin, v1alpha1.DynamicGroup} {
			Expect(seen).To(HaveKey(string(prim)), "no sample Trigger for %s", prim)
		}
		Expect(workflows).To(ContainElements("wordcount", "adevents"))
	})

	It("are all accepted by the API server, with defaults applied", func() {
		ns := newNamespace()
		for _, p := range samplePaths() {
			data, err := os.ReadFile(p)
			Expect(err).NotTo(HaveOccurred())
			obj := &unstructured.Unstructured{}
			Expect(yaml.Unmarshal(data, &obj.Object)).To(Succeed())
			obj.SetNamespace(ns)
			// Strict, as kubectl apply: a field the API does not have
			// (such as the removed `local` block) fails the sample.
			Expect(k8s.Create(ctx, obj, client.FieldValidation(metav1.FieldValidationStrict))).To(Succeed(), "sample %s", filepath.Base(p))
		}
		var wf v1alpha1.Workflow
		Expect(k8s.Get(ctx, key(ns, "wordcount"), &wf)).To(Succeed())
		Expect(wf.Spec.SessionDeadline.Duration.String()).To(Equal("5m0s"))
		Expect(wf.Spec.Buckets[2].Spec.GCPolicy).To(Equal(v1alpha1.GCOnSessionComplete), "bucket defaults apply inside workflows")
		Expect(wf.Spec.Triggers[0].Spec.Reexecution[0].MaxAttempts).To(BeEquivalentTo(3))
		var b v1alpha1.Bucket
		Expect(k8s.Get(ctx, key(ns, "events"), &b)).To(Succeed())
		Expect(b.Spec.InlineThreshold.String()).To(Equal("64Ki"))
	})

	It("shows useful printer columns in kubectl get", func() {
		ns := newNamespace()
		for _, p := range samplePaths() {
			data, err := os.ReadFile(p)
			Expect(err).NotTo(HaveOccurred())
			obj := &unstructured.Unstructured{}
			Expect(yaml.Unmarshal(data, &obj.Object)).To(Succeed())
			obj.SetNamespace(ns)
			Expect(k8s.Create(ctx, obj)).To(Succeed())
		}
		kubeconfig, err := env.Kubeconfig(GinkgoT().TempDir())
		Expect(err).NotTo(HaveOccurred())
		kubectl := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
		var out, stderr bytes.Buffer
		cmd := exec.Command(kubectl, "--kubeconfig", kubeconfig, "-n", ns, "get", "buckets,triggers,workflows")
		cmd.Stdout, cmd.Stderr = &out, &stderr
		Expect(cmd.Run()).To(Succeed(), stderr.String())
		GinkgoWriter.Println(out.String())
		text := out.String()
		for _, header := range []string{"MEMORY/POD", "TTL", "SPILL", "OBJECTS", "BUCKET", "PRIMITIVE", "TARGETS", "FIRINGS", "ENTRY", "FUNCTIONS", "ACTIVE", "COMPLETED"} {
			Expect(text).To(ContainSubstring(header))
		}
		Expect(text).To(ContainSubstring("trigger.ziptrail.dev/three-of-five"))
		Expect(strings.Count(text, "Redundant")).To(Equal(1))
	})
})
