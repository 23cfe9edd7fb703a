package v1alpha1_test

import (
	"os"
	"os/exec"
	"path/filepath"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

func key(ns, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: ns, Name: name}
}

// invalid is one object the API server must reject: field is the path the
// error must name, message a fragment of the explanation.
type invalid struct {
	yaml    string
	field   string
	message string
}

const trigger = "apiVersion: ziptrail.dev/v1alpha1\nkind: Trigger\nmetadata: {name: t}\n"
const bucket = "apiVersion: ziptrail.dev/v1alpha1\nkind: Bucket\nmetadata: {name: b}\n"
const workflow = "apiVersion: ziptrail.dev/v1alpha1\nkind: Workflow\nmetadata: {name: w}\n"

var _ = Describe("schema validation", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	DescribeTable("rejects an invalid object with a field-level message",
		func(c invalid) {
			obj := &unstructured.Unstructured{}
			Expect(yaml.Unmarshal([]byte(c.yaml), &obj.Object)).To(Succeed())
			obj.SetNamespace(ns)
			err := k8s.Create(ctx, obj)
			Expect(err).To(HaveOccurred(), "the API server accepted an invalid object")
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want 422 Invalid, got %v", err)
			Expect(err.Error()).To(ContainSubstring(c.field))
			Expect(err.Error()).To(ContainSubstring(c.message))
			GinkgoWriter.Println(err.Error())
		},
		// Triggers
		Entry("Redundant with k > n", invalid{trigger + "spec: {bucket: b, primitive: Redundant, targets: [f], redundant: {k: 4, outOf: 3}}",
			"spec.redundant.k", "k must not exceed outOf"}),
		Entry("Redundant with k = 0", invalid{trigger + "spec: {bucket: b, primitive: Redundant, targets: [f], redundant: {k: 0, outOf: 3}}",
			"spec.redundant.k", "should be greater than or equal to 1"}),
		Entry("ByName without its key", invalid{trigger + "spec: {bucket: b, primitive: ByName, targets: [f]}",
			"spec.byName", "byName is required when primitive is ByName"}),
		Entry("ByName with an empty key", invalid{trigger + "spec: {bucket: b, primitive: ByName, targets: [f], byName: {key: ''}}",
			"spec.byName.key", "should be at least 1 chars long"}),
		Entry("an unknown primitive", invalid{trigger + "spec: {bucket: b, primitive: Sometimes, targets: [f]}",
			"spec.primitive", "Unsupported value"}),
		Entry("no targets", invalid{trigger + "spec: {bucket: b, primitive: Immediate, targets: []}",
			"spec.targets", "should have at least 1 items"}),
		Entry("a target that is not a DNS label", invalid{trigger + "spec: {bucket: b, primitive: Immediate, targets: [Bad_Fn]}",
			"spec.targets[0]", "should match"}),
		Entry("no bucket", invalid{trigger + "spec: {primitive: Immediate, targets: [f]}",
			"spec.bucket", "Required value"}),
		Entry("a zero batch size", invalid{trigger + "spec: {bucket: b, primitive: ByBatchSize, targets: [f], byBatchSize: {size: 0}}",
			"spec.byBatchSize.size", "should be greater than or equal to 1"}),
		Entry("a zero time window", invalid{trigger + "spec: {bucket: b, primitive: ByTime, targets: [f], byTime: {window: 0s}}",
			"spec.byTime.window", "window must be positive"}),
		Entry("a negative time window", invalid{trigger + "spec: {bucket: b, primitive: ByTime, targets: [f], byTime: {window: -5s}}",
			"spec.byTime.window", "window must be positive"}),
		Entry("parameters of another primitive", invalid{trigger + "spec: {bucket: b, primitive: Immediate, targets: [f], bySet: {keys: [a]}}",
			"spec.bySet", "bySet is only valid with primitive BySet"}),
		Entry("BySet with a repeated key", invalid{trigger + "spec: {bucket: b, primitive: BySet, targets: [f], bySet: {keys: [a, a]}}",
			"spec.bySet.keys[1]", "Duplicate value"}),
		Entry("DynamicGroup without sources", invalid{trigger + "spec: {bucket: b, primitive: DynamicGroup, targets: [f], dynamicGroup: {groupMetadataKey: g}}",
			"spec.dynamicGroup.sources", "Required value"}),
		Entry("a re-execution rule with a zero timeout", invalid{trigger + "spec: {bucket: b, primitive: Immediate, targets: [f], reexecution: [{sourceFunction: s, timeout: 0s}]}",
			"spec.reexecution[0].timeout", "timeout must be positive"}),
		Entry("a re-execution rule with zero attempts", invalid{trigger + "spec: {bucket: b, primitive: Immediate, targets: [f], reexecution: [{sourceFunction: s, timeout: 1s, maxAttempts: 0}]}",
			"spec.reexecution[0].maxAttempts", "should be greater than or equal to 1"}),
		Entry("a re-execution rule with an unknown scope", invalid{trigger + "spec: {bucket: b, primitive: Immediate, targets: [f], reexecution: [{sourceFunction: s, timeout: 1s, scope: Forever}]}",
			"spec.reexecution[0].scope", "Unsupported value"}),
		Entry("a re-execution rule speculating after 0 %", invalid{trigger + "spec: {bucket: b, primitive: Immediate, targets: [f], reexecution: [{sourceFunction: s, timeout: 1s, speculateAfter: 0}]}",
			"spec.reexecution[0].speculateAfter", "speculateAfter is the percentage of a wave that must have finished, 1 to 99"}),
		Entry("a re-execution rule speculating after 100 %", invalid{trigger + "spec: {bucket: b, primitive: Immediate, targets: [f], reexecution: [{sourceFunction: s, timeout: 1s, speculateAfter: 100}]}",
			"spec.reexecution[0].speculateAfter", "speculateAfter is the percentage of a wave that must have finished, 1 to 99"}),
		Entry("a per-session re-execution rule that speculates", invalid{trigger + "spec: {bucket: b, primitive: Immediate, targets: [f], reexecution: [{sourceFunction: s, timeout: 1s, scope: PerSession, speculateAfter: 90}]}",
			"spec.reexecution[0].speculateAfter", "speculateAfter needs scope PerObject"}),
		Entry("an inline trigger's rule speculating after 100 %", invalid{workflow + "spec: {entry: a, functions: [{name: a, image: x}], triggers: [{name: t, spec: {bucket: b, primitive: Immediate, targets: [a], reexecution: [{sourceFunction: a, timeout: 1s, speculateAfter: 100}]}}]}",
			"spec.triggers[0].spec.reexecution[0].speculateAfter", "1 to 99"}),
		// Buckets
		Entry("an unknown spill tier", invalid{bucket + "spec: {spillTiers: [gcs]}",
			"spec.spillTiers[0]", "Unsupported value"}),
		Entry("a repeated spill tier", invalid{bucket + "spec: {spillTiers: [redis, redis]}",
			"spec.spillTiers[1]", "Duplicate value"}),
		Entry("a zero object TTL", invalid{bucket + "spec: {objectTTL: 0s}",
			"spec.objectTTL", "objectTTL must be positive"}),
		Entry("a zero memory limit", invalid{bucket + "spec: {memoryLimitPerPod: '0'}",
			"spec.memoryLimitPerPod", "memoryLimitPerPod must be positive"}),
		Entry("an unknown GC policy", invalid{bucket + "spec: {gcPolicy: Never}",
			"spec.gcPolicy", "Unsupported value"}),
		Entry("a bucket name that is not a DNS label", invalid{"apiVersion: ziptrail.dev/v1alpha1\nkind: Bucket\nmetadata: {name: a.b}\nspec: {}",
			"metadata.name", "must be a DNS label"}),
		// Workflows
		Entry("an entry that is not a function", invalid{workflow + "spec: {entry: nope, functions: [{name: a, image: x}]}",
			"spec.entry", "entry must name one of the functions"}),
		Entry("two functions with one name", invalid{workflow + "spec: {entry: a, functions: [{name: a, image: x}, {name: a, image: y}], dependencies: [{from: [a], to: [a]}]}",
			"spec.functions[1]", "Duplicate value"}),
		Entry("a function with nothing to run", invalid{workflow + "spec: {entry: a, functions: [{name: a}]}",
			"spec.functions[0]", "a function needs an image or a template"}),
		Entry("a Periodic dependency without a period", invalid{workflow + "spec: {entry: a, functions: [{name: a, image: x}, {name: b, image: x}], dependencies: [{from: [a], to: [b], type: Periodic}]}",
			"spec.dependencies[0].period", "period is required for a Periodic dependency"}),
		Entry("several functions and no wiring", invalid{workflow + "spec: {entry: a, functions: [{name: a, image: x}, {name: b, image: x}]}",
			"spec", "a workflow with several functions needs triggers or dependencies"}),
		Entry("a workflow name too long for Knative Service names", invalid{"apiVersion: ziptrail.dev/v1alpha1\nkind: Workflow\nmetadata: {name: abcdefghijklmnopqrstuvwxyz0123}\nspec: {entry: a, functions: [{name: a, image: x}]}",
			"metadata.name", "at most 28 characters"}),
		Entry("an inline trigger that is invalid", invalid{workflow + "spec: {entry: a, functions: [{name: a, image: x}], triggers: [{name: t, spec: {bucket: b, primitive: Redundant, targets: [a], redundant: {k: 9, outOf: 2}}}]}",
			"spec.triggers[0].spec.redundant.k", "k must not exceed outOf"}),
	)
})

// The local-runtime block (`local: {command, workingDir, env}`) is gone from
// the API: a function runs like a container (image, command, args, env) and
// the local cluster finds how to run an image in its image catalog. A
// manifest still carrying it must not be half-applied without a word.
var _ = Describe("a Workflow with the removed local block", func() {
	const withLocal = workflow + `spec:
  entry: a
  functions:
    - name: a
      image: ghcr.io/ziptrail/python:3
      local: {command: [python3, fn.py], workingDir: examples/a}
`
	It("is refused under strict field validation, naming the field", func() {
		obj := &unstructured.Unstructured{}
		Expect(yaml.Unmarshal([]byte(withLocal), &obj.Object)).To(Succeed())
		obj.SetNamespace(newNamespace())
		err := k8s.Create(ctx, obj, client.FieldValidation(metav1.FieldValidationStrict))
		Expect(err).To(HaveOccurred(), "the API server accepted an unknown field under Strict")
		Expect(apierrors.IsBadRequest(err)).To(BeTrue(), "want 400 BadRequest, got %v", err)
		Expect(err.Error()).To(ContainSubstring(`unknown field "spec.functions[0].local"`))
	})

	It("is refused by kubectl apply (strict by default) with a clear error", func() {
		ns := newNamespace()
		dir := GinkgoT().TempDir()
		kubeconfig, err := env.Kubeconfig(dir)
		Expect(err).NotTo(HaveOccurred())
		manifest := filepath.Join(dir, "workflow.yaml")
		Expect(os.WriteFile(manifest, []byte(withLocal), 0o644)).To(Succeed())
		kubectl := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
		out, err := exec.Command(kubectl, "--kubeconfig", kubeconfig, "-n", ns, "apply", "-f", manifest).CombinedOutput()
		Expect(err).To(HaveOccurred(), "kubectl apply accepted the local block: %s", out)
		GinkgoWriter.Printf("%s", out)
		Expect(string(out)).To(ContainSubstring(`unknown field "spec.functions[0].local"`))
		var wf v1alpha1.Workflow
		Expect(apierrors.IsNotFound(k8s.Get(ctx, key(ns, "w"), &wf))).To(BeTrue(), "nothing is created")
	})

	It("is stored without it when validation is not strict (the field is pruned)", func() {
		obj := &unstructured.Unstructured{}
		Expect(yaml.Unmarshal([]byte(withLocal), &obj.Object)).To(Succeed())
		ns := newNamespace()
		obj.SetNamespace(ns)
		Expect(k8s.Create(ctx, obj, client.FieldValidation(metav1.FieldValidationIgnore))).To(Succeed())
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(obj.GroupVersionKind())
		Expect(k8s.Get(ctx, key(ns, "w"), got)).To(Succeed())
		fns, _, _ := unstructured.NestedSlice(got.Object, "spec", "functions")
		Expect(fns).To(HaveLen(1))
		Expect(fns[0]).NotTo(HaveKey("local"))
		Expect(fns[0]).To(HaveKeyWithValue("image", "ghcr.io/ziptrail/python:3"))
	})

	It("accepts command and args instead", func() {
		obj := &unstructured.Unstructured{}
		Expect(yaml.Unmarshal([]byte(workflow+`spec:
  entry: a
  functions:
    - {name: a, image: ghcr.io/ziptrail/python:3, command: [python3, -c, "print(1)"], args: [x]}
`), &obj.Object)).To(Succeed())
		ns := newNamespace()
		obj.SetNamespace(ns)
		Expect(k8s.Create(ctx, obj, client.FieldValidation(metav1.FieldValidationStrict))).To(Succeed())
		var wf v1alpha1.Workflow
		Expect(k8s.Get(ctx, key(ns, "w"), &wf)).To(Succeed())
		Expect(wf.Spec.Functions[0].Command).To(Equal([]string{"python3", "-c", "print(1)"}))
		Expect(wf.Spec.Functions[0].Args).To(Equal([]string{"x"}))
	})
})

var _ = Describe("speculative copies (reexecution[].speculateAfter)", func() {
	It("accepts a percentage with the default scope and keeps it", func() {
		ns := newNamespace()
		obj := &unstructured.Unstructured{}
		Expect(yaml.Unmarshal([]byte(trigger+"spec: {bucket: b, primitive: DynamicJoin, dynamicJoin: {}, targets: [f], reexecution: [{sourceFunction: map, timeout: 5m, maxAttempts: 2, speculateAfter: 90}]}"), &obj.Object)).To(Succeed())
		obj.SetNamespace(ns)
		Expect(k8s.Create(ctx, obj, client.FieldValidation(metav1.FieldValidationStrict))).To(Succeed())
		var t v1alpha1.Trigger
		Expect(k8s.Get(ctx, key(ns, "t"), &t)).To(Succeed())
		r := t.Spec.Reexecution[0]
		Expect(r.Scope).To(Equal(v1alpha1.RerunPerObject))
		Expect(r.SpeculateAfter).NotTo(BeNil())
		Expect(*r.SpeculateAfter).To(BeEquivalentTo(90))
	})

	It("accepts examples/sort's workflow, whose mappers and reducers speculate after 90 %", func() {
		data, err := os.ReadFile(filepath.Join("..", "..", "examples", "sort", "workflow.yaml"))
		Expect(err).NotTo(HaveOccurred())
		ns := newNamespace()
		obj := &unstructured.Unstructured{}
		Expect(yaml.Unmarshal(data, &obj.Object)).To(Succeed())
		obj.SetNamespace(ns)
		Expect(k8s.Create(ctx, obj, client.FieldValidation(metav1.FieldValidationStrict))).To(Succeed())
		var wf v1alpha1.Workflow
		Expect(k8s.Get(ctx, key(ns, "sort"), &wf)).To(Succeed())
		speculating := map[string]int32{}
		for _, t := range wf.Spec.Triggers {
			for _, r := range t.Spec.Reexecution {
				if r.SpeculateAfter != nil {
					speculating[r.SourceFunction] = *r.SpeculateAfter
				}
			}
		}
		Expect(speculating).To(Equal(map[string]int32{"map": 90, "merge": 90, "final": 90}))
	})
})
