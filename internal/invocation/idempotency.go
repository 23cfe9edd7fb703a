package invocation

import "strconv"

// HeaderIdempotencyKey carries an invocation's idempotency key (see
// IdempotencyKey) on the request, and, on a receiving sidecar's answer,
// the key it recorded the outcome under: a response that echoes it came
// from a sidecar that honours keys (it answers a duplicate delivery from
// its record instead of running the function again).
const HeaderIdempotencyKey = "Ziptrail-Idempotency-Key"

// HeaderReplayed, on a sidecar's answer, says the answer is the recorded
// outcome of an earlier delivery of the same key: the function did not run
// again.
const HeaderReplayed = "Ziptrail-Idempotent-Replay"

// IdempotencyKey is the stable key of one execution of an invocation:
// "<session>/<invocation>/<attempt>". Every delivery of that execution
// (a dispatcher's retry, a resend after an operator handover) carries the
// same key; a re-execution the engine decides has another invocation id
// (".r<n>") and so another key. A receiver keeps keys per session, and
// the attempt follows the last "/".
func IdempotencyKey(session, invocation string, attempt int) string {
	return session + "/" + invocation + "/" + strconv.Itoa(attempt)
}

// Key is the envelope's idempotency key, derived from its session,
// invocation id and attempt; the field IdempotencyKey, which the receiving
// sidecar sets for the function, is not trusted for it.
func (e *Envelope) Key() string { return IdempotencyKey(e.Session, e.Invocation, e.Attempt) }
