package orchestrator

import (
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// SessionCounts implements the Workflow reconciler's session counter: the
// counts by state, and the last failed session with its reason, for the
// Workflow's status.
func (o *Orchestrator) SessionCounts(namespace, name string) v1alpha1.SessionCounts {
	c := o.sessions.Counts(namespace, name)
	counts := v1alpha1.SessionCounts{Active: c[sessions.Running], Completed: c[sessions.Completed], Failed: c[sessions.Failed], Expired: c[sessions.Expired]}
	if s, ok := o.sessions.LastFailed(namespace, name); ok {
		counts.LastFailure = &v1alpha1.SessionFailure{Session: s.ID, Reason: truncateReason(s.Error), Time: metav1.NewTime(*s.Ended)}
	}
	return counts
}

// truncateReason fits a failure reason into the status field's 1 KiB.
func truncateReason(s string) string {
	const limit = 1024
	if len(s) <= limit {
		return s
	}
	s = s[:limit-len("…")]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}
