// Package ziptrail is the Go SDK of ziptrail: the Zipline API (Invoke, Put,
// Get), the Pheromone user library (CreateObject, SendObject, GetObject), a
// function server (Serve) and an admin client.
package ziptrail

import (
	"errors"
	"fmt"
)

// Kind classifies an SDK error so callers can react without parsing text.
type Kind string

const (
	KindBadReference Kind = "BadReference" // malformed, tampered, foreign or unknown-key reference
	KindExpired      Kind = "Expired"      // reference or object past its TTL
	KindExhausted    Kind = "Exhausted"    // object already read as often as allowed
	KindProducerGone Kind = "ProducerGone" // producer pod gone and no tier holds the object
	KindNotFound     Kind = "NotFound"     // unknown bucket, key, session or workflow
	KindTimeout      Kind = "Timeout"
	KindUnavailable  Kind = "Unavailable" // sidecar or gateway unreachable
)

// Error is every error the SDK returns.
type Error struct {
	Kind Kind
	Op   string
	Err  error
}

func (e *Error) Error() string { return fmt.Sprintf("ziptrail %s: %s: %v", e.Op, e.Kind, e.Err) }
func (e *Error) Unwrap() error { return e.Err }

// Is lets errors.Is(err, &ziptrail.Error{Kind: ziptrail.KindExpired}) match by kind.
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t.Kind == e.Kind && t.Op == "" && t.Err == nil
}

// IsKind reports whether err is a ziptrail error of the given kind.
func IsKind(err error, kind Kind) bool {
	var e *Error
	return errors.As(err, &e) && e.Kind == kind
}
