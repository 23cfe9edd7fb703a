package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
)

// Delegation (docs/design.md, "Delegated firing"): a trigger whose firing
// needs nothing but the object itself — Immediate, and ByName — may be
// fired by the producer's sidecar, which invokes the target at once and
// reports that it did on the object's ObjectReady (Object.FiredLocally).
// The engine stays the authority: it decides every firing as before, under
// an id both sides derive the same way (DelegatedInvocation), and records
// each firing once, from whichever it sees first — the producer's report
// or the consumer's FunctionStarted under that id. A firing nobody
// reported is dispatched by the engine's caller as any other, under the
// same id; duplicates are dropped by id.

// Delegable reports whether a trigger's firings may be made by the
// producer's sidecar: Immediate and ByName need no engine state beyond the
// object. Every other primitive (BySet, ByBatchSize, ByTime, Redundant,
// DynamicJoin, DynamicGroup, custom ones) fires only in the engine.
func Delegable(t TriggerSpec) bool { return t.Primitive == Immediate || t.Primitive == ByName }

// Matches reports whether a delegable trigger fires for an object with
// this key (ByName: its key only).
func Matches(t TriggerSpec, key string) bool {
	switch t.Primitive {
	case Immediate:
		return true
	case ByName:
		return key == t.Key
	}
	return false
}

// DelegatedInvocation is the invocation id of the firing of trigger for
// target on the object bucket/key of session: session + ".d" + 24 hex
// digits of a SHA-256 over the rest. Its re-executions add ".r<attempt>"
// like any other's (BaseInvocation strips it).
func DelegatedInvocation(session, trigger, target, bucket, key string) string {
	h := sha256.New()
	for _, s := range []string{trigger, target, bucket, key} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	var sum [sha256.Size]byte
	return session + ".d" + hex.EncodeToString(h.Sum(sum[:0])[:12])
}

// delegated returns the action of a delegable trigger's firing for target
// on obj, recorded under its derived id: marked Delegated (not to be
// sent) when the producer reported invoking it (claims) or the consumer
// already reported it started. ok false: the id is taken by an invocation
// of another function (a forged start), so the caller fires under a fresh
// id instead.
func (s *session) delegated(wf *workflow, t *trigger, target string, obj *Object, claims []string) (Action, bool) {
	id := DelegatedInvocation(s.id, t.spec.Name, target, obj.Bucket, obj.Key)
	a := Action{Kind: ActInvoke, Workflow: wf.spec.Name, Session: s.id, Function: target, Trigger: t.spec.Name, Invocation: id, Objects: []Object{*obj}}
	if inv := s.invocations[id]; inv != nil {
		if inv.Function != target {
			return Action{}, false
		}
		a.Delegated = true // the consumer's start came first
		return a, true
	}
	a.Delegated = slices.Contains(claims, id)
	s.track(id, &invState{Function: target, Upstream: upstreamOf(a.Objects), Issued: !a.Delegated})
	return a, true
}
