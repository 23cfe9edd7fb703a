package controllers_test

import (
	"context"

	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"knative.dev/pkg/apis"
	duckv1 "knative.dev/pkg/apis/duck/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/controllers"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

func loadSample(name, ns string) *v1alpha1.Workflow {
	data, err := os.ReadFile(filepath.Join(paths.RepoRoot(), "config", "samples", name))
	Expect(err).NotTo(HaveOccurred())
	wf := &v1alpha1.Workflow{}
	Expect(yaml.UnmarshalStrict(data, wf)).To(Succeed(), "sample %s", name)
	wf.Namespace = ns
	return wf
}

func condition(conds []metav1.Condition, typ string) metav1.Condition {
	if c := meta.FindStatusCondition(conds, typ); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// markServiceReady plays Knative's part: the Service reports Ready.
func markServiceReady(ns, name string) {
	Eventually(func() error {
		svc := &servingv1.Service{}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, svc); err != nil {
			return err
		}
		svc.Status.ObservedGeneration = svc.Generation
		svc.Status.Conditions = duckv1.Conditions{{Type: apis.ConditionReady, Status: corev1.ConditionTrue}}
		return k8s.Status().Update(ctx, svc)
	}).Should(Succeed())
}

func eventReasons(ns, name string) []string {
	var list eventsv1.EventList
	Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	var reasons []string
	for _, e := range list.Items {
		if e.Regarding.Name == name {
			reasons = append(reasons, e.Reason)
		}
	}
	return reasons
}

var _ = Describe("Workflow controller", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("creates a Knative Service per function and the workflow's Buckets and Triggers", func() {
		wf := loadSample("workflow_wordcount.yaml", ns)
		x := int32(90)
		for i := range wf.Spec.Triggers {
			if wf.Spec.Triggers[i].Name == "reduce-each-group" {
				wf.Spec.Triggers[i].Spec.Reexecution[0].SpeculateAfter = &x // passed on to the child Trigger
			}
		}
		Expect(k8s.Create(ctx, wf)).To(Succeed())

		for _, fn := range []string{"split", "map", "reduce", "collect"} {
			svc := &servingv1.Service{}
			Eventually(func() error {
				return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "wordcount-" + fn}, svc)
			}).Should(Succeed())
			Expect(metav1.IsControlledBy(svc, wf)).To(BeTrue(), "service %s is owned by the workflow", svc.Name)
			Expect(svc.Labels).To(HaveKeyWithValue(v1alpha1.LabelFunction, fn))
			c := svc.Spec.Template.Spec.Containers[0]
			Expect(c.Image).To(Equal("ghcr.io/ziptrail/examples-wordcount:latest"))
			Expect(c.Env).To(ContainElement(corev1.EnvVar{Name: controllers.EnvSocket, Value: "/dev/shm/ziptrail/sidecar.sock"}))
			Expect(svc.Spec.Template.Annotations).To(HaveKeyWithValue(v1alpha1.AnnotationBuckets, ContainSubstring("wordcount-shuffle=1Gi")))
			// queue-proxy-zl's settings, which it reads from Knative's podinfo
			// volume: Knative writes queue-proxy's env, so env would not reach it.
			Expect(svc.Spec.Template.Annotations).To(HaveKeyWithValue(v1alpha1.AnnotationWorkflow, "wordcount"))
			Expect(svc.Spec.Template.Annotations).To(HaveKeyWithValue(v1alpha1.AnnotationFunction, fn))
			Expect(svc.Spec.Template.Annotations).To(HaveKeyWithValue(v1alpha1.AnnotationControlAddr, testControlAddr))
			Expect(svc.Spec.Template.Annotations).To(HaveKeyWithValue(v1alpha1.AnnotationMemoryLimit, "1073741824"))
		}
		mapSvc := &servingv1.Service{}
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "wordcount-map"}, mapSvc)).To(Succeed())
		Expect(mapSvc.Spec.Template.Annotations).To(HaveKeyWithValue("autoscaling.knative.dev/max-scale", "16"))
		// The role is the container's argument; the image's entrypoint runs it.
		Expect(mapSvc.Spec.Template.Spec.Containers[0].Command).To(BeEmpty())
		Expect(mapSvc.Spec.Template.Spec.Containers[0].Args).To(Equal([]string{"map"}))
		for k := range mapSvc.Spec.Template.Annotations {
			Expect(k).NotTo(HavePrefix("ziptrail.dev/local-"), "no local-runtime annotations on the revision template")
		}

		for _, b := range []string{"chunks", "shuffle", "counts", "output"} {
			Eventually(func() error {
				return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "wordcount-" + b}, &v1alpha1.Bucket{})
			}).Should(Succeed())
		}
		trig := &v1alpha1.Trigger{}
		Eventually(func() error {
			return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "wordcount-reduce-each-group"}, trig)
		}).Should(Succeed())
		Expect(trig.Spec.Bucket).To(Equal("wordcount-shuffle"))
		Expect(trig.Spec.Targets).To(Equal([]string{"wordcount-reduce"}))
		Expect(trig.Spec.DynamicGroup.Sources).To(Equal([]string{"wordcount-map"}))
		Expect(trig.Spec.Reexecution[0].SourceFunction).To(Equal("wordcount-map"))
		Expect(trig.Spec.Reexecution[0].SpeculateAfter).To(HaveValue(BeEquivalentTo(90)))

		By("reporting not-ready services until Knative says they are ready")
		Eventually(func(g Gomega) {
			got := &v1alpha1.Workflow{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(wf), got)).To(Succeed())
			g.Expect(condition(got.Status.Conditions, v1alpha1.ConditionTargetsResolved).Status).To(Equal(metav1.ConditionTrue))
			ready := condition(got.Status.Conditions, v1alpha1.ConditionReady)
			g.Expect(ready.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(ready.Reason).To(Equal(v1alpha1.ReasonServiceNotReady))
			g.Expect(ready.Message).To(ContainSubstring("wordcount-split"))
			g.Expect(got.Status.Functions).To(BeEquivalentTo(4))
			g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
		}).Should(Succeed())

		for _, fn := range []string{"split", "map", "reduce", "collect"} {
			markServiceReady(ns, "wordcount-"+fn)
		}
		Eventually(func(g Gomega) {
			got := &v1alpha1.Workflow{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(wf), got)).To(Succeed())
			g.Expect(condition(got.Status.Conditions, v1alpha1.ConditionReady).Status).To(Equal(metav1.ConditionTrue))
		}).Should(Succeed())
		Eventually(func() []string { return eventReasons(ns, "wordcount") }).Should(ContainElements("Created", "NotReady", "Ready"))
	})

	It("propagates spec changes and prunes what the spec no longer declares", func() {
		wf := loadSample("workflow_adevents.yaml", ns)
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		Eventually(func() error {
			return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "adevents-count-per-window"}, &v1alpha1.Trigger{})
		}).Should(Succeed())

		Eventually(func() error {
			got := &v1alpha1.Workflow{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(wf), got); err != nil {
				return err
			}
			got.Spec.Functions[0].Image = "ghcr.io/ziptrail/examples-adevents:v2"
			got.Spec.Functions = append(got.Spec.Functions, v1alpha1.FunctionSpec{Name: "alert", Image: "ghcr.io/ziptrail/alert:v1"})
			got.Spec.Triggers = got.Spec.Triggers[:1] // drop count-per-window
			got.Spec.Triggers[0].Spec.Targets = []string{"query-event-info", "alert"}
			return k8s.Update(ctx, got)
		}).Should(Succeed())

		Eventually(func(g Gomega) {
			svc := &servingv1.Service{}
			g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "adevents-preprocess"}, svc)).To(Succeed())
			g.Expect(svc.Spec.Template.Spec.Containers[0].Image).To(Equal("ghcr.io/ziptrail/examples-adevents:v2"))
			g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "adevents-alert"}, &servingv1.Service{})).To(Succeed())
			err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "adevents-count-per-window"}, &v1alpha1.Trigger{})
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "dropped trigger is pruned")
			t := &v1alpha1.Trigger{}
			g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "adevents-enrich-each"}, t)).To(Succeed())
			g.Expect(t.Spec.Targets).To(ConsistOf("adevents-query-event-info", "adevents-alert"))
		}).Should(Succeed())
		Eventually(func() []string { return eventReasons(ns, "adevents") }).Should(ContainElements("Updated", "Deleted"))
	})

	It("puts a function's command, args and env on the user container, also over a template", func() {
		env := []corev1.EnvVar{{Name: "MODE", Value: "fast"}, {Name: "FROM_TEMPLATE", Value: "overridden"}}
		wf := &v1alpha1.Workflow{
			ObjectMeta: metav1.ObjectMeta{Name: "cmds", Namespace: ns},
			Spec: v1alpha1.WorkflowSpec{
				Entry: "plain",
				Functions: []v1alpha1.FunctionSpec{
					{Name: "plain", Image: "ghcr.io/ziptrail/python:3", Command: []string{"python3", "-c", "print(1)"}, Args: []string{"a", "b"}, Env: env},
					{Name: "argsonly", Image: "ghcr.io/ziptrail/examples-wordcount:latest", Args: []string{"split"}},
					{Name: "templated", Command: []string{"/bin/fn"}, Env: env, Template: &runtime.RawExtension{Raw: []byte(`{
						"metadata": {"annotations": {"example.dev/keep": "yes"}},
						"spec": {"containers": [{
							"image": "ghcr.io/example/fn:1",
							"command": ["/bin/old"],
							"args": ["--from-template"],
							"workingDir": "/srv",
							"env": [{"name": "FROM_TEMPLATE", "value": "template"}, {"name": "KEPT", "value": "1"}]
						}]}}`)}},
				},
				Dependencies: []v1alpha1.Dependency{{From: []string{"plain"}, To: []string{"argsonly", "templated"}}},
			},
		}
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		container := func(fn string) corev1.Container {
			svc := &servingv1.Service{}
			Eventually(func() error {
				return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "cmds-" + fn}, svc)
			}).Should(Succeed())
			Expect(svc.Spec.Template.Spec.Containers).To(HaveLen(1))
			return svc.Spec.Template.Spec.Containers[0]
		}
		envOf := func(c corev1.Container) map[string]string {
			m := map[string]string{}
			for _, e := range c.Env {
				m[e.Name] = e.Value
			}
			return m
		}

		c := container("plain")
		Expect(c.Image).To(Equal("ghcr.io/ziptrail/python:3"))
		Expect(c.Command).To(Equal([]string{"python3", "-c", "print(1)"}))
		Expect(c.Args).To(Equal([]string{"a", "b"}))
		Expect(envOf(c)).To(HaveKeyWithValue("MODE", "fast"))
		Expect(envOf(c)).To(HaveKeyWithValue(controllers.EnvFunction, "plain"))

		c = container("argsonly")
		Expect(c.Command).To(BeEmpty(), "without a command the image's entrypoint runs")
		Expect(c.Args).To(Equal([]string{"split"}))

		By("applying command and env on top of the template's container, keeping what the function does not set")
		c = container("templated")
		Expect(c.Image).To(Equal("ghcr.io/example/fn:1"))
		Expect(c.Command).To(Equal([]string{"/bin/fn"}))
		Expect(c.Args).To(Equal([]string{"--from-template"}))
		Expect(c.WorkingDir).To(Equal("/srv"))
		Expect(envOf(c)).To(And(HaveKeyWithValue("MODE", "fast"), HaveKeyWithValue("FROM_TEMPLATE", "overridden"), HaveKeyWithValue("KEPT", "1")))
		Expect(envOf(c)).To(HaveKeyWithValue(controllers.EnvWorkflow, "cmds"))

		By("propagating a change of args")
		Eventually(func() error {
			got := &v1alpha1.Workflow{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(wf), got); err != nil {
				return err
			}
			got.Spec.Functions[1].Args = []string{"map"}
			got.Spec.Functions[2].Args = []string{"--fn"}
			return k8s.Update(ctx, got)
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			for fn, want := range map[string][]string{"argsonly": {"map"}, "templated": {"--fn"}} {
				svc := &servingv1.Service{}
				g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "cmds-" + fn}, svc)).To(Succeed())
				g.Expect(svc.Spec.Template.Spec.Containers[0].Args).To(Equal(want), fn)
			}
		}).Should(Succeed())
	})

	It("surfaces references to undefined functions and buckets as a condition", func() {
		wf := &v1alpha1.Workflow{
			ObjectMeta: metav1.ObjectMeta{Name: "broken", Namespace: ns},
			Spec: v1alpha1.WorkflowSpec{
				Entry:     "a",
				Functions: []v1alpha1.FunctionSpec{{Name: "a", Image: "x"}},
				Triggers: []v1alpha1.NamedTrigger{{Name: "t", Spec: v1alpha1.TriggerSpec{
					Bucket: "nowhere", Primitive: v1alpha1.Immediate, Targets: []string{"ghost"},
				}}},
			},
		}
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		Eventually(func(g Gomega) {
			got := &v1alpha1.Workflow{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(wf), got)).To(Succeed())
			c := condition(got.Status.Conditions, v1alpha1.ConditionTargetsResolved)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonTargetNotFound))
			g.Expect(c.Message).To(And(ContainSubstring(`function "ghost"`), ContainSubstring(`bucket "nowhere"`)))
			g.Expect(condition(got.Status.Conditions, v1alpha1.ConditionReady).Status).To(Equal(metav1.ConditionFalse))
		}).Should(Succeed())
	})

	It("says, with the numbers, when a function's pods need more memory than any node allocates", func() {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "small-" + ns}}
		Expect(k8s.Create(ctx, node)).To(Succeed())
		DeferCleanup(func() { Expect(k8s.Delete(context.Background(), node)).To(Succeed()) })
		node.Status.Allocatable = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("4Gi")}
		Expect(k8s.Status().Update(ctx, node)).To(Succeed())
		big, small := resource.MustParse("3Gi"), resource.MustParse("256Mi")
		wf := &v1alpha1.Workflow{
			ObjectMeta: metav1.ObjectMeta{Name: "toobig", Namespace: ns},
			Spec: v1alpha1.WorkflowSpec{
				Entry: "a",
				Functions: []v1alpha1.FunctionSpec{{Name: "a", Image: "x", Resources: &corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}}}},
				Buckets: []v1alpha1.NamedBucket{{Name: "huge", Spec: v1alpha1.BucketSpec{MemoryLimitPerPod: &big}},
					{Name: "fine", Spec: v1alpha1.BucketSpec{MemoryLimitPerPod: &small}}},
			},
		}
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		Eventually(func(g Gomega) {
			got := &v1alpha1.Workflow{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(wf), got)).To(Succeed())
			c := condition(got.Status.Conditions, v1alpha1.ConditionServicesReady)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonDoesNotFit))
			g.Expect(c.Message).To(Equal("function a: its pods need 7Gi of memory: an objects volume of 6Gi (twice the largest memoryLimitPerPod " +
				"of the workflow's buckets) and the container's 1Gi; the largest schedulable node, " + node.Name + ", allocates 4Gi: " +
				"lower memoryLimitPerPod or add a larger node"))
			g.Expect(condition(got.Status.Conditions, v1alpha1.ConditionReady).Reason).To(Equal(v1alpha1.ReasonDoesNotFit))
		}).Should(Succeed())

		// Within the node's memory, the Services are only not ready yet.
		Eventually(func(g Gomega) {
			got := &v1alpha1.Workflow{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(wf), got)).To(Succeed())
			got.Spec.Buckets[0].Spec.MemoryLimitPerPod = &small
			g.Expect(k8s.Update(ctx, got)).To(Succeed())
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			got := &v1alpha1.Workflow{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(wf), got)).To(Succeed())
			g.Expect(condition(got.Status.Conditions, v1alpha1.ConditionServicesReady).Reason).To(Equal(v1alpha1.ReasonServiceNotReady))
		}).Should(Succeed())
	})

	It("compiles function-oriented dependencies into buckets and triggers", func() {
		wf := loadSample("workflow_dependencies.yaml", ns)
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		want := map[string]v1alpha1.Primitive{"pipeline-dep-0": v1alpha1.Immediate, "pipeline-dep-1": v1alpha1.DynamicGroup, "pipeline-dep-2": v1alpha1.ByTime}
		for name, prim := range want {
			t := &v1alpha1.Trigger{}
			Eventually(func() error { return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, t) }).Should(Succeed())
			Expect(t.Spec.Primitive).To(Equal(prim), name)
			Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: t.Spec.Bucket}, &v1alpha1.Bucket{})).To(Succeed())
		}
		t := &v1alpha1.Trigger{}
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "pipeline-dep-1"}, t)).To(Succeed())
		// A fan-in: every return value of the sources, once all of them ran.
		Expect(t.Spec.DynamicGroup.Sources).To(ConsistOf("pipeline-resize", "pipeline-classify"))
		Expect(t.Spec.DynamicGroup.GroupMetadataKey).To(Equal(v1alpha1.DependencyGroupKey))
		Expect(t.Spec.Targets).To(Equal([]string{"pipeline-report"}))
	})

	It("refuses to take over an object it does not own", func() {
		squatter := &v1alpha1.Bucket{ObjectMeta: metav1.ObjectMeta{Name: "solo-output", Namespace: ns}}
		Expect(k8s.Create(ctx, squatter)).To(Succeed())
		wf := &v1alpha1.Workflow{
			ObjectMeta: metav1.ObjectMeta{Name: "solo", Namespace: ns},
			Spec:       v1alpha1.WorkflowSpec{Entry: "a", Functions: []v1alpha1.FunctionSpec{{Name: "a", Image: "x"}}},
		}
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		Eventually(func(g Gomega) {
			got := &v1alpha1.Workflow{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(wf), got)).To(Succeed())
			c := condition(got.Status.Conditions, v1alpha1.ConditionReady)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonChildConflict))
			g.Expect(c.Message).To(ContainSubstring(`Bucket "solo-output"`))
		}).Should(Succeed())
		got := &v1alpha1.Bucket{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(squatter), got)).To(Succeed())
		Expect(got.OwnerReferences).To(BeEmpty())
	})

	It("deletes its children when it is deleted", func() {
		wf := loadSample("workflow_adevents.yaml", ns)
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		Eventually(func() error {
			return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "adevents-aggregate"}, &servingv1.Service{})
		}).Should(Succeed())
		Expect(k8s.Delete(ctx, wf)).To(Succeed())
		Eventually(func(g Gomega) {
			var svcs servingv1.ServiceList
			g.Expect(k8s.List(ctx, &svcs, client.InNamespace(ns))).To(Succeed())
			g.Expect(svcs.Items).To(BeEmpty())
			var buckets v1alpha1.BucketList
			g.Expect(k8s.List(ctx, &buckets, client.InNamespace(ns))).To(Succeed())
			g.Expect(buckets.Items).To(BeEmpty())
			var triggers v1alpha1.TriggerList
			g.Expect(k8s.List(ctx, &triggers, client.InNamespace(ns))).To(Succeed())
			g.Expect(triggers.Items).To(BeEmpty())
			err := k8s.Get(ctx, client.ObjectKeyFromObject(wf), &v1alpha1.Workflow{})
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
		}).Should(Succeed())
	})
})
