// Package ziptrail is the Go SDK of ziptrail: the Zipline API (Invoke, Put,
// Get, Scatter, Gather, Broadcast), the Pheromone user library
// (CreateObject, SendObject, GetObject) and a function server (Serve). The
// admin client (resources and sessions) is the subpackage admin.
package ziptrail

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
)

// Kind classifies an SDK error so callers can react without parsing text.
type Kind string

const (
	KindBadReference   Kind = "BadReference"   // malformed, tampered, foreign-namespace or unknown-key reference
	KindExpired        Kind = "Expired"        // reference or object past its TTL (or a session that expired)
	KindExhausted      Kind = "Exhausted"      // object already read as often as its reference allows
	KindProducerGone   Kind = "ProducerGone"   // producer pod gone and no tier holds the object
	KindNotFound       Kind = "NotFound"       // unknown object, bucket key, session or workflow
	KindTimeout        Kind = "Timeout"        // the caller's context ended (deadline or cancel) first
	KindUnavailable    Kind = "Unavailable"    // sidecar or gateway unreachable, or not ready yet
	KindStoreFull      Kind = "StoreFull"      // the pod's object store stayed full for the put timeout
	KindTooLarge       Kind = "TooLarge"       // object larger than the pod's store can ever hold
	KindInvalid        Kind = "Invalid"        // a request the sidecar refuses (missing bucket, no persist tier, ...)
	KindFunctionFailed Kind = "FunctionFailed" // the invoked function (or its session) answered with an error
	KindConflict       Kind = "Conflict"       // a resource that already exists or changed meanwhile (admin); a taken rank or a differing size (Join)
	KindPeerGone       Kind = "PeerGone"       // a group's peer instance ended or its pod died (messages, collectives)
	KindForeign        Kind = "Foreign"        // the peer's sidecar is not of this namespace (messages)
	KindClosed         Kind = "Closed"         // this instance is not, or no longer, a member of the group
	KindInternal       Kind = "Internal"       // anything else
)

// Sentinels for errors.Is: errors.Is(err, ziptrail.ErrExpired) holds for
// every SDK error of that kind, whatever its operation and cause.
var (
	ErrBadReference   = &Error{Kind: KindBadReference}
	ErrExpired        = &Error{Kind: KindExpired}
	ErrExhausted      = &Error{Kind: KindExhausted}
	ErrProducerGone   = &Error{Kind: KindProducerGone}
	ErrNotFound       = &Error{Kind: KindNotFound}
	ErrTimeout        = &Error{Kind: KindTimeout}
	ErrUnavailable    = &Error{Kind: KindUnavailable}
	ErrStoreFull      = &Error{Kind: KindStoreFull}
	ErrTooLarge       = &Error{Kind: KindTooLarge}
	ErrInvalid        = &Error{Kind: KindInvalid}
	ErrFunctionFailed = &Error{Kind: KindFunctionFailed}
	ErrConflict       = &Error{Kind: KindConflict}
	ErrPeerGone       = &Error{Kind: KindPeerGone}
	ErrForeign        = &Error{Kind: KindForeign}
	ErrClosed         = &Error{Kind: KindClosed}
)

// Error is every error the SDK returns.
type Error struct {
	Kind Kind
	Op   string // the SDK call: "get", "put", "invoke", ...
	// Reason is the sidecar's finer class when it gave one, e.g.
	// REF_TAMPERED or REF_FOREIGN_NAMESPACE for a KindBadReference.
	Reason string
	Err    error
}

func (e *Error) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("ziptrail %s: %s (%s): %v", e.Op, e.Kind, e.Reason, e.Err)
	}
	return fmt.Sprintf("ziptrail %s: %s: %v", e.Op, e.Kind, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Is matches by kind against a bare target such as ErrExpired or
// &Error{Kind: KindExpired}.
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t.Kind == e.Kind && t.Op == "" && t.Reason == "" && t.Err == nil
}

// IsKind reports whether err is a ziptrail error of the given kind.
func IsKind(err error, kind Kind) bool {
	var e *Error
	return errors.As(err, &e) && e.Kind == kind
}

// reasonKinds maps the local API's error classes to kinds.
var reasonKinds = map[string]Kind{
	localapi.ReasonMalformed:    KindBadReference,
	localapi.ReasonTampered:     KindBadReference,
	localapi.ReasonUnknownKey:   KindBadReference,
	localapi.ReasonForeign:      KindBadReference,
	localapi.ReasonExpired:      KindExpired,
	localapi.ReasonExhausted:    KindExhausted,
	localapi.ReasonNotFound:     KindNotFound,
	localapi.ReasonProducerGone: KindProducerGone,
	localapi.ReasonTooLarge:     KindTooLarge,
	localapi.ReasonStoreFull:    KindStoreFull,
	localapi.ReasonBadPayload:   KindInvalid,
	localapi.ReasonNotReady:     KindUnavailable,
	// messaging (Join, Send, Recv, ...)
	localapi.ReasonPeerGone:      KindPeerGone,
	localapi.ReasonMsgTimeout:    KindTimeout,
	localapi.ReasonMsgForeign:    KindForeign,
	localapi.ReasonGroupClosed:   KindClosed,
	localapi.ReasonGroupConflict: KindConflict,
	localapi.ReasonMsgInvalid:    KindInvalid,
	localapi.ReasonNoDirectory:   KindUnavailable,
	localapi.ReasonUnreachable:   KindUnavailable,
}

const reasonPeerGone = localapi.ReasonPeerGone

// codeKinds classifies gRPC errors that carry no ziptrail reason.
var codeKinds = map[codes.Code]Kind{
	codes.DeadlineExceeded:   KindTimeout,
	codes.Canceled:           KindTimeout,
	codes.Unavailable:        KindUnavailable,
	codes.NotFound:           KindNotFound,
	codes.InvalidArgument:    KindInvalid,
	codes.ResourceExhausted:  KindTooLarge,
	codes.FailedPrecondition: KindInvalid,
}

// rpcError turns an error of a sidecar or gateway call into an *Error. The
// gRPC status stays reachable through Unwrap; the message is the server's
// own text, without gRPC's "rpc error: code = ..." prefix. When ctx ended,
// the error is a KindTimeout wrapping ctx.Err() (so errors.Is with
// context.DeadlineExceeded or context.Canceled holds too).
func rpcError(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	var already *Error
	if errors.As(err, &already) {
		return err
	}
	if cerr := ctx.Err(); cerr != nil {
		return &Error{Kind: KindTimeout, Op: op, Err: fmt.Errorf("%w (%v)", cerr, status.Convert(err).Message())}
	}
	st, ok := status.FromError(err)
	if !ok {
		kind := KindInternal
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			kind = KindTimeout
		}
		return &Error{Kind: kind, Op: op, Err: err}
	}
	return classified(op, localapi.Reason(err), codeKinds[st.Code()], st.Message(), err)
}

// classified is an error the sidecar answered: its kind is the reason's,
// else fallback's (a class without a reason), else KindInternal. The
// message is msg; err stays reachable through Unwrap.
func classified(op, reason string, fallback Kind, msg string, err error) *Error {
	e := &Error{Op: op, Reason: reason, Kind: fallback}
	if kind, ok := reasonKinds[reason]; ok {
		e.Kind = kind
	} else if e.Kind == "" {
		e.Kind = KindInternal
	}
	if e.Kind == KindUnavailable && reason == "" {
		msg += " (is the pod's queue-proxy-zl sidecar running, and ZIPTRAIL_SOCKET its socket?)"
	}
	e.Err = &statusError{msg: msg, err: err}
	return e
}

// messageError turns an error of the messaging socket (Group.Send, Recv)
// into an *Error as rpcError does a gRPC call's: by its reason, and the
// classes without one (the socket unreachable, a cancelled call, anything
// else) as their gRPC codes are. When ctx ended, a KindTimeout wrapping
// ctx.Err().
func messageError(ctx context.Context, op string, err error) error {
	var me *localapi.MessageError
	if !errors.As(err, &me) {
		return rpcError(ctx, op, err)
	}
	if cerr := ctx.Err(); cerr != nil {
		return &Error{Kind: KindTimeout, Op: op, Err: fmt.Errorf("%w (%v)", cerr, me.Message)}
	}
	reason, fallback := me.Reason, Kind("")
	switch reason {
	case "UNAVAILABLE":
		reason, fallback = "", codeKinds[codes.Unavailable]
	case "CANCELED":
		reason, fallback = "", codeKinds[codes.Canceled]
	case "INTERNAL":
		reason = ""
	}
	return classified(op, reason, fallback, me.Message, me)
}

// statusError shows a sidecar error's message and unwraps to the error
// (for a gRPC one, status.FromError and status.Code still work on the
// SDK's errors).
type statusError struct {
	msg string
	err error
}

func (s *statusError) Error() string { return s.msg }
func (s *statusError) Unwrap() error { return s.err }
