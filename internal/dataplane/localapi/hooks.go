package localapi

import (
	"context"
	"io"
	"os"

	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// What a Server needs from the pod it serves, one small interface each; a
// ...Func adapts a function, as http.HandlerFunc does.

// KeySource gives the namespace's keyring once the sidecar has it.
type KeySource interface {
	Keys(ctx context.Context) (*ref.Keyring, error)
}

// KeysFunc is a KeySource.
type KeysFunc func(ctx context.Context) (*ref.Keyring, error)

// Keys calls f.
func (f KeysFunc) Keys(ctx context.Context) (*ref.Keyring, error) { return f(ctx) }

// Puller fetches a referenced object from its producer into dst (falling
// back to the tiers when the producer is gone); *pull.Client is one.
type Puller interface {
	PullTo(ctx context.Context, r string, dst func(size int64) (io.WriterAt, error)) (pull.Info, error)
}

// PullFunc is a Puller.
type PullFunc func(ctx context.Context, r string, dst func(size int64) (io.WriterAt, error)) (pull.Info, error)

// PullTo calls f.
func (f PullFunc) PullTo(ctx context.Context, r string, dst func(size int64) (io.WriterAt, error)) (pull.Info, error) {
	return f(ctx, r, dst)
}

// Reporter sends an object-ready event to the operator.
type Reporter interface {
	Report(*controlv1.ObjectReady) error
}

// ReportFunc is a Reporter.
type ReportFunc func(*controlv1.ObjectReady) error

// Report calls f.
func (f ReportFunc) Report(ev *controlv1.ObjectReady) error { return f(ev) }

// Sealer adds what the sidecar seals into every reference it makes
// besides the address (its node and pod, for the same-node path).
type Sealer interface {
	Seal(ref.Record) ref.Record
}

// SealFunc is a Sealer.
type SealFunc func(ref.Record) ref.Record

// Seal calls f.
func (f SealFunc) Seal(r ref.Record) ref.Record { return f(r) }

// Adopter is given a duplicate of every memfd a function put through the
// object socket, with the object's id, so that same-node consumers get
// that memfd; it owns f on success (*samenode.Server is one).
type Adopter interface {
	Adopt(id string, f *os.File, size int64) error
}
