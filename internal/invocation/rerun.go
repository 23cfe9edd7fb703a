package invocation

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// RerunArgs encodes what a re-execution needs of the invocation it
// repeats: the envelope as first sent, without its id and attempt —
// objects with their contents (an
// empty object stays one), the trigger, DynamicGroup's group and the
// arguments. The engine keeps it as the invocation's arguments.
func RerunArgs(env *Envelope) ([]byte, error) {
	orig := *env
	orig.Invocation, orig.Attempt = "", 0
	return json.Marshal(&orig)
}

// RerunEnvelope rebuilds a re-execution's envelope: rerun names it (its
// namespace, function, session, invocation id and attempt), args (from
// RerunArgs) gives what the original carried. Arguments saved by an
// earlier version — the original's objects alone, as a JSON array — are
// still understood.
func RerunEnvelope(rerun Envelope, args []byte) (*Envelope, error) {
	env := rerun
	if trimmed := bytes.TrimLeft(args, " \t\r\n"); len(trimmed) > 0 && trimmed[0] == '[' {
		if err := json.Unmarshal(args, &env.Objects); err != nil {
			return nil, fmt.Errorf("re-execution of %s: its original's objects: %w", rerun.Invocation, err)
		}
		return &env, nil
	}
	var orig Envelope
	if err := json.Unmarshal(args, &orig); err != nil {
		return nil, fmt.Errorf("re-execution of %s: its original's envelope: %w", rerun.Invocation, err)
	}
	env.Objects, env.Trigger, env.Group, env.Args = orig.Objects, orig.Trigger, orig.Group, orig.Args
	return &env, nil
}
