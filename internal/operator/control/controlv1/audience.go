package controlv1

// This file is written by hand (the rest of the package is generated from
// proto/ziptrail/control/v1/control.proto): the constants both ends of the
// control stream share beyond its messages.

// Audience is the audience of the service-account tokens that callers of
// the control service present, and that the operator asks TokenReview to
// check. Knative mounts a token for it into every queue-proxy when
// config-deployment lists it in queue-sidecar-token-audiences.
const Audience = "control.ziptrail.dev"

// DefaultTokenFile is where Knative mounts queue-proxy's token for
// Audience: knative.dev/serving v0.50.0 projects one token per audience of
// queue-sidecar-token-audiences into /var/run/secrets/tokens (its
// queue.TokenDirectory), in a file named after the audience
// (pkg/reconciler/revision/resources/deploy.go, addToken).
const DefaultTokenFile = "/var/run/secrets/tokens/" + Audience
