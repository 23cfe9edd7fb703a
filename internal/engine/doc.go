// Package engine is ziptrail's trigger engine: the data-centric state
// machine of Pheromone (§3.2, §4.2–4.4). It consumes events — session
// started, object ready in a bucket, function started, function finished,
// clock ticks — and returns actions: invoke a function with objects,
// re-invoke a late source function, a session completed or expired, drop a
// session's objects.
//
// It is a plain Go package: no Kubernetes, no HTTP, no goroutines of its
// own. Time comes from the caller (every event carries now), so tests are
// deterministic and never sleep; the operator calls Tick periodically.
//
// Triggers implement the Pheromone trigger interface (Primitive):
// ActionForNewObject decides firings when an object arrives (or, with a nil
// object, when time passes), NotifySourceFunc learns about running source
// functions, ActionForRerun returns source invocations whose output is late.
// The eight built-in primitives implement it; custom ones can be registered.
//
// State is per session: every (trigger, session) pair has its own State, and
// sessions are sharded over independently locked shards so that concurrent
// event producers for different sessions never contend on one lock.
//
// Delivery is at least once upstream (sidecars resend unacknowledged
// events), so the engine is idempotent: an object key is accepted once per
// session and bucket, an invocation id is counted once, and nothing fires for
// a session after it completed, expired or failed (a tombstone remembers
// it).
//
// An invocation's outputs may reach the engine after its finish (those a
// sidecar reports on its own); a finish says how many distinct outputs the
// invocation sent (Finish.Outputs), and until the engine has counted them
// all the invocation still counts as running. Primitives that wait for
// their sources (DynamicGroup, DynamicJoin) therefore never close early.
// A function that fails with no re-execution rule covering it fails its
// session: ActSessionFailed with the reason, then its objects are dropped.
//
// Re-executions (ActRerun) run beside their original: an invocation is
// outstanding again from the moment one is issued until it ends, the first
// execution to finish without failing wins (the others' outputs carry the
// same keys and are dropped as duplicates, their ends are ignored), and a
// failure of one execution while another may still run is not the
// invocation's failure. A rule with SpeculateAfter also issues speculative
// copies of stragglers (Locus §3.5): once that fraction of a wave of the
// rule's invocations sent their output, each one still outstanding gets one
// copy (ActRerun with Speculative set), counted against MaxAttempts; see
// RerunRule.
package engine
