package orchestrator

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/ziptrail/ziptrail/internal/sessions"
)

// ObjectOpener pulls an object by reference (the data plane's client).
type ObjectOpener interface {
	Open(ctx context.Context, namespace, ref string) (io.ReadCloser, error)
}

// Results implements gateway.ResultReader: inline results directly, results
// by reference through the data plane.
type Results struct {
	Pull ObjectOpener // nil: only inline results can be read
}

// OpenResult implements gateway.ResultReader.
func (r Results) OpenResult(ctx context.Context, namespace string, res *sessions.Result) (io.ReadCloser, error) {
	if res.Ref == "" {
		return io.NopCloser(bytes.NewReader(res.Inline)), nil
	}
	if r.Pull == nil {
		return nil, fmt.Errorf("result %s/%s is held by reference and this gateway has no data-plane client", res.Bucket, res.Key)
	}
	return r.Pull.Open(ctx, namespace, res.Ref)
}
