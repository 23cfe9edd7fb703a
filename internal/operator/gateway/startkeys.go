package gateway

import (
	"context"
	"fmt"

	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
)

// IdempotencyKeyHeader is the HTTP header (gRPC: the metadata key
// IdempotencyKeyMetadata) of a session start that a client may send again:
// starts with the same key in the same namespace and workflow answer the
// same session, so a client that lost the answer to a start (its
// connection broke after the request went out) retries without starting
// a second session. The Starter honours it (orchestrator's startkeys.go).
const IdempotencyKeyHeader = "Idempotency-Key"

// IdempotencyKeyMetadata is IdempotencyKeyHeader's gRPC metadata key.
const IdempotencyKeyMetadata = gatewayv1.IdempotencyKeyMetadata

// MaxIdempotencyKey is the longest idempotency key accepted.
const MaxIdempotencyKey = 255

type idempotencyKey struct{}

// WithIdempotencyKey returns ctx carrying a start's idempotency key.
func WithIdempotencyKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, idempotencyKey{}, key)
}

// IdempotencyKey is the idempotency key a start's context carries ("" for
// none).
func IdempotencyKey(ctx context.Context) string {
	k, _ := ctx.Value(idempotencyKey{}).(string)
	return k
}

// withKeyHeader checks a start's idempotency key (none when empty) and
// puts it in ctx.
func withKeyHeader(ctx context.Context, key string) (context.Context, error) {
	if key == "" {
		return ctx, nil
	}
	if len(key) > MaxIdempotencyKey {
		return ctx, fmt.Errorf("%s of %d bytes: at most %d", IdempotencyKeyHeader, len(key), MaxIdempotencyKey)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return ctx, fmt.Errorf("%s %q: only printable ASCII without spaces (e.g. a UUID)", IdempotencyKeyHeader, truncate(key))
		}
	}
	return WithIdempotencyKey(ctx, key), nil
}
