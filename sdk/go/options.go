package ziptrail

import (
	"context"
	"time"
)

// Option adjusts one call. Each option says which calls read it; the others
// ignore it.
type Option func(*options)

type options struct {
	ttl         time.Duration
	session     string
	function    string
	args        []byte
	bucket, key string
}

// WithTTL bounds how long a put object (and its reference) lives (Put,
// Broadcast); default: the sidecar's object TTL.
func WithTTL(d time.Duration) Option { return func(o *options) { o.ttl = d } }

// WithSession ties a call to a workflow session: put objects are freed with
// it, and bucket objects are named within it (Put, Invoke, SendObject,
// GetObject). Default: the session of the invocation in the context, if
// any.
func WithSession(id string) Option { return func(o *options) { o.session = id } }

// WithFunction names the callee in its invocation envelope (Invoke,
// InvokeRef, Scatter, Broadcast); default: the URL.
func WithFunction(name string) Option { return func(o *options) { o.function = name } }

// WithArgs passes arguments next to the object (the callee's
// Invocation.Args).
func WithArgs(args []byte) Option { return func(o *options) { o.args = args } }

// WithObjectName names the object for the callee (its Invocation.Objects
// entry); default bucket "input" and a key unique to the call.
func WithObjectName(bucket, key string) Option {
	return func(o *options) { o.bucket, o.key = bucket, key }
}

func collect(ctx context.Context, opts []Option) options {
	var o options
	if inv, ok := CurrentInvocation(ctx); ok {
		o.session = inv.Session
	}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}
