package controllers

import (
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
)

// setCondition records one condition at the object's generation.
func setCondition(conds *[]metav1.Condition, generation int64, typ string, ok bool, reason, message string) {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(conds, metav1.Condition{
		Type:               typ,
		Status:             status,
		ObservedGeneration: generation,
		Reason:             reason,
		Message:            message,
	})
}

// setReady derives the Ready condition from the given dependent conditions:
// Ready is True only when all are True, else it carries the first failure's
// reason and message so `kubectl get` explains what is missing.
func setReady(conds *[]metav1.Condition, generation int64, dependents ...string) {
	for _, typ := range dependents {
		c := meta.FindStatusCondition(*conds, typ)
		if c == nil || c.Status != metav1.ConditionTrue {
			reason, msg := v1alpha1.ReasonDependenciesFailed, typ+" is not yet known"
			if c != nil {
				reason, msg = c.Reason, c.Message
			}
			setCondition(conds, generation, v1alpha1.ConditionReady, false, reason, msg)
			return
		}
	}
	setCondition(conds, generation, v1alpha1.ConditionReady, true, v1alpha1.ReasonReconciled, "")
}

// readyStatus is the Ready condition's status, "" before the first reconcile.
func readyStatus(conds []metav1.Condition) metav1.ConditionStatus {
	if c := meta.FindStatusCondition(conds, v1alpha1.ConditionReady); c != nil {
		return c.Status
	}
	return ""
}

// readyMessage is the Ready condition's "reason: message", for events.
func readyMessage(conds []metav1.Condition) string {
	c := meta.FindStatusCondition(conds, v1alpha1.ConditionReady)
	if c == nil {
		return "not reconciled yet"
	}
	return eventNote(c.Reason + ": " + c.Message)
}

// maxEventNote is the API server's limit on an event's note
// (events.k8s.io/v1); a longer note makes it reject the whole event.
const maxEventNote = 1024

// eventNote shortens s to fit an event note, cutting on a rune boundary.
func eventNote(s string) string {
	if len(s) <= maxEventNote {
		return s
	}
	const more = " …"
	cut := maxEventNote - len(more)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + more
}
