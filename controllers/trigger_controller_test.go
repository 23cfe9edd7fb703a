package controllers_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

var _ = Describe("Trigger controller", func() {
	It("resolves its bucket and targets as they appear", func() {
		ns := newNamespace()
		t := &v1alpha1.Trigger{
			ObjectMeta: metav1.ObjectMeta{Name: "join", Namespace: ns},
			Spec: v1alpha1.TriggerSpec{Bucket: "parts", Primitive: v1alpha1.BySet, Targets: []string{"assemble"},
				BySet: &v1alpha1.BySetParams{Keys: []string{"a", "b"}}},
		}
		Expect(k8s.Create(ctx, t)).To(Succeed())
		status := func(g Gomega) *v1alpha1.Trigger {
			got := &v1alpha1.Trigger{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(t), got)).To(Succeed())
			return got
		}
		Eventually(func(g Gomega) {
			got := status(g)
			g.Expect(condition(got.Status.Conditions, v1alpha1.ConditionBucketResolved).Reason).To(Equal(v1alpha1.ReasonBucketNotFound))
			g.Expect(condition(got.Status.Conditions, v1alpha1.ConditionTargetsResolved).Message).To(ContainSubstring("assemble"))
			g.Expect(condition(got.Status.Conditions, v1alpha1.ConditionReady).Status).To(Equal(metav1.ConditionFalse))
		}).Should(Succeed())

		Expect(k8s.Create(ctx, &v1alpha1.Bucket{ObjectMeta: metav1.ObjectMeta{Name: "parts", Namespace: ns}})).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(condition(status(g).Status.Conditions, v1alpha1.ConditionBucketResolved).Status).To(Equal(metav1.ConditionTrue))
		}).Should(Succeed())

		svc := &servingv1.Service{ObjectMeta: metav1.ObjectMeta{Name: "assemble", Namespace: ns}}
		svc.Spec.Template.Spec.Containers = []corev1.Container{{Image: "x"}}
		Expect(k8s.Create(ctx, svc)).To(Succeed())
		Eventually(func(g Gomega) {
			got := status(g)
			g.Expect(condition(got.Status.Conditions, v1alpha1.ConditionReady).Status).To(Equal(metav1.ConditionTrue))
			g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
		}).Should(Succeed())
		Eventually(func() []string { return eventReasons(ns, "join") }).Should(ContainElements("NotReady", "Ready"))
	})
})

var _ = Describe("Bucket controller", func() {
	It("reports tiers the operator has no endpoint for", func() {
		ns := newNamespace()
		ok := &v1alpha1.Bucket{ObjectMeta: metav1.ObjectMeta{Name: "fast", Namespace: ns},
			Spec: v1alpha1.BucketSpec{SpillTiers: []v1alpha1.Tier{v1alpha1.TierRedis}}}
		bad := &v1alpha1.Bucket{ObjectMeta: metav1.ObjectMeta{Name: "durable", Namespace: ns},
			Spec: v1alpha1.BucketSpec{SpillTiers: []v1alpha1.Tier{v1alpha1.TierRedis}, PersistTier: v1alpha1.TierS3}}
		Expect(k8s.Create(ctx, ok)).To(Succeed())
		Expect(k8s.Create(ctx, bad)).To(Succeed())
		Eventually(func(g Gomega) {
			got := &v1alpha1.Bucket{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ok), got)).To(Succeed())
			g.Expect(condition(got.Status.Conditions, v1alpha1.ConditionReady).Status).To(Equal(metav1.ConditionTrue))
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(bad), got)).To(Succeed())
			c := condition(got.Status.Conditions, v1alpha1.ConditionTiersReady)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonTierNotConfigured))
			g.Expect(c.Message).To(ContainSubstring("persist tier s3"))
		}).Should(Succeed())
	})
})
