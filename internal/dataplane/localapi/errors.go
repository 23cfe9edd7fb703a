package localapi

import (
	"context"
	"errors"
	"syscall"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ziptrail/ziptrail/internal/dataplane/messaging"
	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/dataplane/tier"
)

// Reasons name the error classes the SDKs tell apart; they travel as a
// google.rpc.ErrorInfo detail of the gRPC status (domain ErrorDomain).
const (
	ErrorDomain = "ziptrail.dev"

	ReasonMalformed    = "REF_MALFORMED"
	ReasonTampered     = "REF_TAMPERED"
	ReasonUnknownKey   = "REF_UNKNOWN_KEY"
	ReasonForeign      = "REF_FOREIGN_NAMESPACE"
	ReasonExpired      = "OBJECT_EXPIRED"
	ReasonExhausted    = "OBJECT_EXHAUSTED"
	ReasonNotFound     = "OBJECT_NOT_FOUND"
	ReasonProducerGone = "PRODUCER_GONE"
	ReasonTooLarge     = "OBJECT_TOO_LARGE"
	ReasonStoreFull    = "STORE_FULL"
	ReasonBadPayload   = "BAD_PAYLOAD"
	ReasonNotReady     = "KEYS_NOT_READY"

	// Messaging (docs/messaging.md).
	ReasonPeerGone      = "PEER_GONE"
	ReasonMsgTimeout    = "MSG_TIMEOUT"
	ReasonMsgForeign    = "MSG_FOREIGN"
	ReasonGroupClosed   = "GROUP_CLOSED"
	ReasonGroupConflict = "GROUP_CONFLICT"
	ReasonMsgInvalid    = "MSG_INVALID"
	ReasonNoDirectory   = "NO_DIRECTORY"
	ReasonUnreachable   = "PEER_UNREACHABLE"

	// Shuffle storage (TierPut/TierGet).
	ReasonTierUnavailable = "TIER_UNAVAILABLE"
)

type class struct {
	err    error
	code   codes.Code
	reason string
}

// classes in match order: reference errors before the store's (a
// producer's exhausted error wraps its store error, for instance).
var classes = []class{
	{messaging.ErrPeerGone, codes.Unavailable, ReasonPeerGone},
	{messaging.ErrTimeout, codes.DeadlineExceeded, ReasonMsgTimeout},
	{messaging.ErrForeign, codes.PermissionDenied, ReasonMsgForeign},
	{messaging.ErrClosed, codes.FailedPrecondition, ReasonGroupClosed},
	{messaging.ErrConflict, codes.AlreadyExists, ReasonGroupConflict},
	{messaging.ErrInvalid, codes.InvalidArgument, ReasonMsgInvalid},
	{messaging.ErrNoDirectory, codes.FailedPrecondition, ReasonNoDirectory},
	{messaging.ErrUnreachable, codes.Unavailable, ReasonUnreachable},
	{ref.ErrMalformed, codes.InvalidArgument, ReasonMalformed},
	{ref.ErrTampered, codes.InvalidArgument, ReasonTampered},
	{ref.ErrUnknownKey, codes.FailedPrecondition, ReasonUnknownKey},
	{ref.ErrForeign, codes.PermissionDenied, ReasonForeign},
	{ref.ErrExpired, codes.FailedPrecondition, ReasonExpired},
	{store.ErrExpired, codes.FailedPrecondition, ReasonExpired},
	{store.ErrExhausted, codes.FailedPrecondition, ReasonExhausted},
	{store.ErrTooLarge, codes.ResourceExhausted, ReasonTooLarge},
	{errStoreFull, codes.ResourceExhausted, ReasonStoreFull},
	// The pod's shared-memory directory is full (its emptyDir's or
	// /dev/shm's size): the object store's class, not an internal error.
	{syscall.ENOSPC, codes.ResourceExhausted, ReasonStoreFull},
	// The same at the receiver of a message.
	{messaging.ErrRefused, codes.ResourceExhausted, ReasonStoreFull},
	{ErrBadPayload, codes.InvalidArgument, ReasonBadPayload},
	{errNotReady, codes.Unavailable, ReasonNotReady},
	{errTierUnavailable, codes.FailedPrecondition, ReasonTierUnavailable},
	// After the specific classes: a gone producer whose object is in no
	// tier either is reported as gone (the cause), not as not-found.
	{pull.ErrProducerGone, codes.Unavailable, ReasonProducerGone},
	{store.ErrNotFound, codes.NotFound, ReasonNotFound},
	{tier.ErrNotFound, codes.NotFound, ReasonNotFound},
}

var errNotReady = errors.New("the sidecar has no reference keys yet")

// errStoreFull ends a wait for memory that outlasted the sidecar's
// PutTimeout. It is the cause of that timeout's context, which tells it
// apart from the caller's own deadline: a caller that gave up first gets
// DEADLINE_EXCEEDED (its timeout), not STORE_FULL.
var errStoreFull = errors.New("no room in the pod's object store within the put timeout (ZIPTRAIL_PUT_TIMEOUT)")

// toStatus turns an error into a gRPC status carrying its class.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if c, ok := classOf(err); ok {
		return withReason(c.code, c.reason, err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	if errors.Is(err, context.Canceled) {
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

func withReason(code codes.Code, reason string, err error) error {
	st, derr := status.New(code, err.Error()).WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain})
	if derr != nil {
		return status.Error(code, err.Error())
	}
	return st.Err()
}

// ReasonOf classifies a Go error of the data plane (a reference, store,
// pull or tier error) by the same classes the local API reports; "" when
// it belongs to none.
func ReasonOf(err error) string {
	c, _ := classOf(err)
	return c.reason
}

// classOf is the first of classes that err belongs to.
func classOf(err error) (class, bool) {
	for _, c := range classes {
		if errors.Is(err, c.err) {
			return c, true
		}
	}
	return class{}, false
}

// Reason returns the class of an error returned by the local API (one of
// the Reason constants), or "" for other errors.
func Reason(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == ErrorDomain {
			return info.Reason
		}
	}
	return ""
}
