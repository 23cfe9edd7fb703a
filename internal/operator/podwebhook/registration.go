package podwebhook

import (
	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Webhook names, as the chart's MutatingWebhookConfiguration has them.
const (
	ObjectsWebhook  = "objects.ziptrail.dev" // ObjectsMutator, at ObjectsPath
	SameNodeWebhook = "pods.ziptrail.dev"    // Mutator, at Path
)

// Registration is one webhook of the configuration as the chart registers
// it (charts/ziptrail/templates/podwebhook.yaml, less the chart's namespace
// selector of the same-node one): CREATE of revision pods of ziptrail
// workflows, failurePolicy Ignore, reinvoked if needed, 5 s; cc says where
// it is served.
func Registration(name string, cc admissionv1.WebhookClientConfig) admissionv1.MutatingWebhook {
	ignore := admissionv1.Ignore
	none := admissionv1.SideEffectClassNone
	ifNeeded := admissionv1.IfNeededReinvocationPolicy
	timeout := int32(5)
	return admissionv1.MutatingWebhook{
		Name:                    name,
		AdmissionReviewVersions: []string{"v1"},
		SideEffects:             &none,
		FailurePolicy:           &ignore,
		ReinvocationPolicy:      &ifNeeded,
		TimeoutSeconds:          &timeout,
		ClientConfig:            cc,
		ObjectSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: labelRevision, Operator: metav1.LabelSelectorOpExists}, {Key: labelWorkflow, Operator: metav1.LabelSelectorOpExists}}},
		Rules: []admissionv1.RuleWithOperations{{Operations: []admissionv1.OperationType{admissionv1.Create},
			Rule: admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
	}
}
