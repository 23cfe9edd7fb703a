package gateway

import "errors"

// ErrNotSaved: the operator could not save the session where its next
// owner would find it (the checkpoint store is unreachable), so it did not
// start it. Answered 503 with Retry-After: the start is safe to send again.
var ErrNotSaved = errors.New("the session could not be saved durably; it was not started")
