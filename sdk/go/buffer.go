package ziptrail

import (
	"context"
	"errors"
	"fmt"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
)

// Buffer is a large object written in place: memory that is already the
// object's storage, which Put hands to the sidecar without a copy. It is
// a sealable memfd when the sidecar offers the same-node path (Put seals
// it read-only and passes the descriptor over the local API's object
// socket; a consumer on this node maps the same pages), else a file of
// the shared-memory directory, one the sidecar gave back after an
// earlier object when there is one (docs/dataplane.md, "Reused files").
// A producer that fills Bytes directly never holds the object in its
// heap (Put of a []byte writes one copy).
type Buffer struct {
	b *localapi.PutBuffer
}

// Alloc creates a zero-filled buffer of size bytes.
func (c *Client) Alloc(size int) (*Buffer, error) {
	if size <= 0 {
		return nil, &Error{Kind: KindInvalid, Op: "alloc", Err: fmt.Errorf("size must be positive, got %d", size)}
	}
	b, err := c.api.Alloc(context.Background(), size)
	if err != nil {
		return nil, &Error{Kind: KindInternal, Op: "alloc", Err: err}
	}
	return &Buffer{b: b}, nil
}

// Bytes is the buffer's memory, writable until Put or Discard.
func (b *Buffer) Bytes() []byte { return b.b.Data }

// Put hands the buffer to the sidecar for n reads, as Client.Put does;
// the buffer is unusable afterwards, whatever the result (its memory is
// unmapped: a slice of Bytes kept past Put faults).
func (b *Buffer) Put(ctx context.Context, n int, opts ...Option) (string, error) {
	if n < 1 {
		_ = b.b.Discard()
		return "", &Error{Kind: KindInvalid, Op: "put", Err: fmt.Errorf("reads must be at least 1, got %d", n)}
	}
	o := collect(ctx, opts)
	resp, err := b.b.Put(ctx, &sidecarv1.PutRequest{Reads: uint32(n), TtlMs: o.ttl.Milliseconds(), Session: o.session})
	if errors.Is(err, localapi.ErrBufferDone) {
		return "", &Error{Kind: KindInvalid, Op: "put", Err: err}
	}
	var werr *localapi.PayloadError
	if errors.As(err, &werr) {
		return "", &Error{Kind: KindInternal, Op: "put", Err: err}
	}
	if err != nil {
		return "", rpcError(ctx, "put", err)
	}
	return resp.GetRef(), nil
}

// Discard drops the buffer without putting it; a no-op after Put.
func (b *Buffer) Discard() error { return b.b.Discard() }
