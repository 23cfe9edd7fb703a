package controllers

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/dataplane/sidecar"
)

// The workflow's bucket settings fold into the one store a pod has: the
// largest memory limit, the longest TTL and the smallest inline threshold.
func TestSidecarAnnotations(t *testing.T) {
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	d := func(x time.Duration) *metav1.Duration { return &metav1.Duration{Duration: x} }
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Name: "wf"}, Spec: v1alpha1.WorkflowSpec{Buckets: []v1alpha1.NamedBucket{
		{Name: "a", Spec: v1alpha1.BucketSpec{MemoryLimitPerPod: q("64Mi"), ObjectTTL: d(time.Minute), InlineThreshold: q("4Ki")}},
		{Name: "b", Spec: v1alpha1.BucketSpec{MemoryLimitPerPod: q("1Gi"), ObjectTTL: d(10 * time.Minute), InlineThreshold: q("1Ki")}},
		{Name: "c"},
	}}}
	got := sidecarAnnotations(wf, &v1alpha1.FunctionSpec{Name: "fn"}, "ctl:9443")
	want := map[string]string{v1alpha1.AnnotationWorkflow: "wf", v1alpha1.AnnotationFunction: "fn", v1alpha1.AnnotationControlAddr: "ctl:9443",
		v1alpha1.AnnotationMemoryLimit: "1073741824", v1alpha1.AnnotationObjectTTL: "10m0s", v1alpha1.AnnotationInlineThreshold: "1024"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	got = sidecarAnnotations(&v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Name: "wf"}}, &v1alpha1.FunctionSpec{Name: "fn"}, "")
	if len(got) != 2 {
		t.Errorf("no buckets, no control address: %v", got)
	}
}

// A function pod's objects volume holds its store (the largest bucket
// limit, or queue-proxy-zl's default) and as much again for pulled inputs;
// the revision template carries its size for the pod webhook.
func TestObjectsVolumeSize(t *testing.T) {
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Name: "wf"}, Spec: v1alpha1.WorkflowSpec{Entry: "fn",
		Functions: []v1alpha1.FunctionSpec{{Name: "fn", Image: "example.com/fn"}},
		Buckets:   []v1alpha1.NamedBucket{{Name: "a", Spec: v1alpha1.BucketSpec{MemoryLimitPerPod: q("1Gi")}}, {Name: "b"}}}}
	if got := objectsVolumeSize(wf); got != 2<<30 {
		t.Errorf("size %d, want 2 GiB", got)
	}
	svc, err := desiredService(wf, &wf.Spec.Functions[0], "")
	if err != nil {
		t.Fatal(err)
	}
	if got := svc.Spec.Template.Annotations[v1alpha1.AnnotationObjectsVolume]; got != "2147483648" {
		t.Errorf("annotation %q", got)
	}
	if got := objectsVolumeSize(&v1alpha1.Workflow{}); got != 2*v1alpha1.DefaultMemoryLimitPerPod {
		t.Errorf("no bucket limits: %d", got)
	}
}

// The operator's defaults for a pod's objects are queue-proxy-zl's own.
func TestObjectsDefaultsMatchTheSidecar(t *testing.T) {
	for _, k := range []string{"ZIPTRAIL_MEMORY_LIMIT", "ZIPTRAIL_SHM_DIR"} {
		t.Setenv(k, "")
	}
	c := sidecar.FromEnv()
	if c.MemoryLimit != v1alpha1.DefaultMemoryLimitPerPod || c.ShmDir != v1alpha1.ObjectsDir+"/objects" {
		t.Errorf("queue-proxy-zl's store cap %d and object directory %s; the operator assumes %d and %s/objects",
			c.MemoryLimit, c.ShmDir, v1alpha1.DefaultMemoryLimitPerPod, v1alpha1.ObjectsDir)
	}
}
