package controllers

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

// Environment the operator sets in every function's user container so the
// SDK finds its sidecar. The pod's containers share SidecarDir: a
// memory-backed volume sized from the workflow's buckets, which the pod
// webhook mounts in every container (objectsVolumeSize), or without the
// webhook the pod's /dev/shm (one IPC namespace).
const (
	EnvSocket   = "ZIPTRAIL_SOCKET"
	EnvShmDir   = "ZIPTRAIL_SHM_DIR"
	EnvWorkflow = "ZIPTRAIL_WORKFLOW"
	EnvFunction = "ZIPTRAIL_FUNCTION"
	SidecarDir  = v1alpha1.ObjectsDir
)

// ServiceName is the Knative Service that runs a workflow function.
func ServiceName(workflow, function string) string { return workflow + "-" + function }

// ChildName is the name of a Bucket or Trigger a workflow declares inline.
func ChildName(workflow, name string) string { return workflow + "-" + name }

// children is everything a Workflow owns, as it should be.
type children struct {
	services []*servingv1.Service
	buckets  []*v1alpha1.Bucket
	triggers []*v1alpha1.Trigger
	// problems are invalid references in the spec; they surface as the
	// TargetsResolved condition instead of failing the whole reconcile.
	problems []string
}

// desiredChildren compiles a Workflow into its Knative Services, Buckets and
// Triggers. Names inside the workflow (functions, buckets) are rewritten to
// the namespaced child names so standalone objects never collide with them.
func desiredChildren(wf *v1alpha1.Workflow, controlAddr string) (*children, error) {
	out := &children{}
	functions := map[string]bool{}
	for _, f := range wf.Spec.Functions {
		functions[f.Name] = true
	}
	buckets := map[string]v1alpha1.BucketSpec{}
	for _, b := range wf.Spec.Buckets {
		buckets[b.Name] = b.Spec
	}
	outputBucket := wf.Spec.Output()
	if _, ok := buckets[outputBucket]; !ok {
		buckets[outputBucket] = v1alpha1.BucketSpec{}
	}

	triggers, compiledBuckets := wf.Spec.CompiledTriggers()
	for _, b := range compiledBuckets {
		if _, ok := buckets[b]; !ok {
			buckets[b] = v1alpha1.BucketSpec{}
		}
	}

	fn := func(where, name string) string {
		if !functions[name] {
			out.problems = append(out.problems, fmt.Sprintf("%s names function %q, which the workflow does not define", where, name))
		}
		return ServiceName(wf.Name, name)
	}
	fns := func(where string, names []string) []string {
		if names == nil {
			return nil
		}
		res := make([]string, len(names))
		for i, n := range names {
			res[i] = fn(where, n)
		}
		return res
	}
	for _, t := range triggers {
		spec := *t.Spec.DeepCopy()
		where := fmt.Sprintf("trigger %q", t.Name)
		if _, ok := buckets[spec.Bucket]; !ok {
			out.problems = append(out.problems, fmt.Sprintf("%s watches bucket %q, which the workflow does not define", where, spec.Bucket))
		}
		spec.Bucket = ChildName(wf.Name, spec.Bucket)
		spec.Targets = fns(where, spec.Targets)
		for i := range spec.Reexecution {
			spec.Reexecution[i].SourceFunction = fn(where+" re-execution", spec.Reexecution[i].SourceFunction)
		}
		if spec.DynamicGroup != nil {
			spec.DynamicGroup.Sources = fns(where+" dynamicGroup", spec.DynamicGroup.Sources)
		}
		if spec.DynamicJoin != nil {
			spec.DynamicJoin.Sources = fns(where+" dynamicJoin", spec.DynamicJoin.Sources)
		}
		out.triggers = append(out.triggers, &v1alpha1.Trigger{
			ObjectMeta: childMeta(wf, ChildName(wf.Name, t.Name)),
			Spec:       spec,
		})
	}

	names := make([]string, 0, len(buckets))
	for name := range buckets {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		out.buckets = append(out.buckets, &v1alpha1.Bucket{
			ObjectMeta: childMeta(wf, ChildName(wf.Name, name)),
			Spec:       buckets[name],
		})
	}

	for i := range wf.Spec.Functions {
		svc, err := desiredService(wf, &wf.Spec.Functions[i], controlAddr)
		if err != nil {
			return nil, err
		}
		out.services = append(out.services, svc)
	}
	return out, nil
}

func childMeta(wf *v1alpha1.Workflow, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:      name,
		Namespace: wf.Namespace,
		Labels:    map[string]string{v1alpha1.LabelWorkflow: wf.Name},
	}
}

// desiredService builds the Knative Service of one function: the user's
// template (if any) with image, command, args, env, resources and scale
// bounds applied to its first container, plus
// what the ziptrail sidecar and SDK need. The sidecar's per-function
// settings are annotations on the revision template (sidecarAnnotations),
// which Knative mounts into queue-proxy as /etc/podinfo/annotations.
func desiredService(wf *v1alpha1.Workflow, f *v1alpha1.FunctionSpec, controlAddr string) (*servingv1.Service, error) {
	svc := &servingv1.Service{ObjectMeta: childMeta(wf, ServiceName(wf.Name, f.Name))}
	svc.Labels[v1alpha1.LabelFunction] = f.Name
	tmpl := &svc.Spec.Template
	if f.Template != nil && len(f.Template.Raw) > 0 {
		if err := json.Unmarshal(f.Template.Raw, tmpl); err != nil {
			return nil, fmt.Errorf("function %q: template is not a Knative RevisionTemplateSpec: %w", f.Name, err)
		}
	}
	if len(tmpl.Spec.Containers) == 0 {
		tmpl.Spec.Containers = []corev1.Container{{Name: "user-container"}}
	}
	c := &tmpl.Spec.Containers[0]
	if f.Image != "" {
		c.Image = f.Image
	}
	if len(f.Command) > 0 {
		c.Command = append([]string(nil), f.Command...)
	}
	if len(f.Args) > 0 {
		c.Args = append([]string(nil), f.Args...)
	}
	if f.Resources != nil {
		c.Resources = *f.Resources
	}
	c.Env = mergeEnv(c.Env, f.Env)
	c.Env = mergeEnv(c.Env, []corev1.EnvVar{
		{Name: EnvSocket, Value: SidecarDir + "/sidecar.sock"},
		{Name: EnvShmDir, Value: SidecarDir + "/objects"},
		{Name: EnvWorkflow, Value: wf.Name},
		{Name: EnvFunction, Value: f.Name},
	})
	if f.ContainerConcurrency != nil {
		tmpl.Spec.ContainerConcurrency = f.ContainerConcurrency
	}
	if tmpl.Labels == nil {
		tmpl.Labels = map[string]string{}
	}
	tmpl.Labels[v1alpha1.LabelWorkflow] = wf.Name
	tmpl.Labels[v1alpha1.LabelFunction] = f.Name
	if tmpl.Annotations == nil {
		tmpl.Annotations = map[string]string{}
	}
	if f.MinScale != nil {
		tmpl.Annotations["autoscaling.knative.dev/min-scale"] = strconv.Itoa(int(*f.MinScale))
	}
	if f.MaxScale != nil {
		tmpl.Annotations["autoscaling.knative.dev/max-scale"] = strconv.Itoa(int(*f.MaxScale))
	}
	tmpl.Annotations[v1alpha1.AnnotationBuckets] = bucketAnnotation(wf)
	tmpl.Annotations[v1alpha1.AnnotationObjectsVolume] = strconv.FormatInt(objectsVolumeSize(wf), 10)
	for k, v := range sidecarAnnotations(wf, f, controlAddr) {
		tmpl.Annotations[k] = v
	}
	return svc, nil
}

// sidecarAnnotations are queue-proxy-zl's per-function settings, which it
// reads from Knative's podinfo volume (Knative writes queue-proxy's
// environment itself, so env vars would never reach it): the workflow and
// function, the operator's control address, and the workflow's bucket
// settings folded into the one store a pod has: the largest per-pod memory
// limit, the longest object TTL and the smallest inline threshold of its
// buckets (each only when some bucket sets it; the sidecar's defaults
// apply otherwise). Nothing here is a secret.
func sidecarAnnotations(wf *v1alpha1.Workflow, f *v1alpha1.FunctionSpec, controlAddr string) map[string]string {
	a := map[string]string{
		v1alpha1.AnnotationWorkflow: wf.Name,
		v1alpha1.AnnotationFunction: f.Name,
	}
	if controlAddr != "" {
		a[v1alpha1.AnnotationControlAddr] = controlAddr
	}
	var mem, inline int64 = -1, -1
	var ttl time.Duration
	for _, b := range wf.Spec.Buckets {
		if q := b.Spec.MemoryLimitPerPod; q != nil && q.Value() > mem {
			mem = q.Value()
		}
		if q := b.Spec.InlineThreshold; q != nil && (inline < 0 || q.Value() < inline) {
			inline = q.Value()
		}
		if d := b.Spec.ObjectTTL; d != nil && d.Duration > ttl {
			ttl = d.Duration
		}
	}
	if mem > 0 {
		a[v1alpha1.AnnotationMemoryLimit] = strconv.FormatInt(mem, 10)
	}
	if inline >= 0 {
		a[v1alpha1.AnnotationInlineThreshold] = strconv.FormatInt(inline, 10)
	}
	if ttl > 0 {
		a[v1alpha1.AnnotationObjectTTL] = ttl.String()
	}
	return a
}

// objectsVolumeSize is the size of a function pod's memory-backed objects
// volume (v1alpha1.AnnotationObjectsVolume): the pod's object store, whose
// cap is the largest memoryLimitPerPod of the workflow's buckets (the one
// queue-proxy-zl enforces, sidecarAnnotations), plus as much again for the
// inputs the sidecar pulls into it for the invocations running.
func objectsVolumeSize(wf *v1alpha1.Workflow) int64 {
	store := int64(-1)
	for _, b := range wf.Spec.Buckets {
		if q := b.Spec.MemoryLimitPerPod; q != nil && q.Value() > store {
			store = q.Value()
		}
	}
	if store <= 0 {
		store = v1alpha1.DefaultMemoryLimitPerPod
	}
	return 2 * store
}

// bucketAnnotation tells queue-proxy-zl (through Knative's pod-info volume)
// which buckets exist and their per-pod memory limits: "name=limit,...".
func bucketAnnotation(wf *v1alpha1.Workflow) string {
	parts := make([]string, 0, len(wf.Spec.Buckets))
	for _, b := range wf.Spec.Buckets {
		limit := "256Mi"
		if b.Spec.MemoryLimitPerPod != nil {
			limit = b.Spec.MemoryLimitPerPod.String()
		}
		parts = append(parts, ChildName(wf.Name, b.Name)+"="+limit)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// mergeEnv sets each of add in env, replacing a variable of the same name.
func mergeEnv(env, add []corev1.EnvVar) []corev1.EnvVar {
	for _, a := range add {
		replaced := false
		for i := range env {
			if env[i].Name == a.Name {
				env[i], replaced = a, true
				break
			}
		}
		if !replaced {
			env = append(env, a)
		}
	}
	return env
}
