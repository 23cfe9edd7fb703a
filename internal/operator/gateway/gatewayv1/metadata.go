package gatewayv1

// By hand, beside the generated code: the parts of the session gateway's
// contract that are not in gateway.proto.

// IdempotencyKeyMetadata is the gRPC metadata key (HTTP: the header
// Idempotency-Key) of a session start a client may send again: starts
// with the same key in the same namespace and workflow answer the same
// session.
const IdempotencyKeyMetadata = "idempotency-key"

// EngineMovingMessage begins the message of an Unavailable status while
// the workflow's engine bucket changes owners (sharded operators): ask
// again soon.
const EngineMovingMessage = "the workflow's engine is moving to another operator replica"
