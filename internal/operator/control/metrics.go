package control

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	connectedSidecars = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ziptrail_control_sidecars_connected",
		Help: "Sidecars connected to the operator's control stream.",
	})
	eventErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_control_event_errors_total",
		Help: "Sidecar events the trigger engine rejected.",
	})
	rejections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ziptrail_control_rejections_total",
		Help: "Calls and events the control service refused, by reason: no_authenticator, no_token, unauthenticated " +
			"(forged, expired, revoked or wrong-audience token), review_unavailable (TokenReview failed), not_pod_bound, " +
			"foreign_namespace, foreign_pod (a Hello naming another namespace or pod than the token's), foreign_session " +
			"(an event naming another namespace's session), foreign_invocation (an event for another pod's invocation), " +
			"keys_forbidden (GetKeys of a namespace the caller may not read).",
	}, []string{"reason"})
	groupViews = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_control_group_views_sent_total",
		Help: "Messaging-group membership views pushed to sidecars (one per pod per change).",
	})
	unackedEvents = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ziptrail_control_events_awaiting_save",
		Help: "Sidecar events applied but not acknowledged yet: an event is acknowledged once a checkpoint holds it (the sidecar keeps it until then).",
	})
	events = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ziptrail_control_events_total",
		Help: "Sidecar messages received on the control stream, by kind: object_ready, function_started, function_finished, group_join, group_leave.",
	}, []string{"kind"})
	tokenReviews = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ziptrail_control_token_reviews_total",
		Help: "Token checks of the control service, by result: authenticated, rejected, error (TokenReview failed), cached (answered from the cache).",
	}, []string{"result"})
)

// Reasons counted by ziptrail_control_rejections_total.
const (
	ReasonNoAuthenticator   = "no_authenticator"
	ReasonNoToken           = "no_token"
	ReasonUnauthenticated   = "unauthenticated"
	ReasonReviewUnavailable = "review_unavailable"
	ReasonNotPodBound       = "not_pod_bound"
	ReasonForeignNamespace  = "foreign_namespace"
	ReasonForeignPod        = "foreign_pod"
	ReasonForeignSession    = "foreign_session"
	ReasonForeignInvocation = "foreign_invocation"
	ReasonKeysForbidden     = "keys_forbidden"
)

func rejected(reason string) { rejections.WithLabelValues(reason).Inc() }

func init() {
	// The operator's /metrics endpoint serves controller-runtime's registry.
	metrics.Registry.MustRegister(connectedSidecars, unackedEvents, events, eventErrors, groupViews, rejections, tokenReviews)
	for _, r := range []string{ReasonNoAuthenticator, ReasonNoToken, ReasonUnauthenticated, ReasonReviewUnavailable, ReasonNotPodBound,
		ReasonForeignNamespace, ReasonForeignPod, ReasonForeignSession, ReasonForeignInvocation, ReasonKeysForbidden} {
		rejections.WithLabelValues(r) // export zeros, so alerts on rate() see the series from the start
	}
}
