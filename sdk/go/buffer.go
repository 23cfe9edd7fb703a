package ziptrail

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
)

// Buffer is a large object written in place: a file in the shared-memory
// directory mapped writable, which Put hands to the sidecar as it is. A
// producer that fills Bytes directly never holds the object in its heap
// (Put of a []byte writes one copy into such a file).
type Buffer struct {
	c    *Client
	path string // "" once handed over or discarded
	data []byte
}

// Alloc creates a zero-filled buffer of size bytes.
func (c *Client) Alloc(size int) (*Buffer, error) {
	if size <= 0 {
		return nil, &Error{Kind: KindInvalid, Op: "alloc", Err: fmt.Errorf("size must be positive, got %d", size)}
	}
	f, err := os.CreateTemp(c.api.Dir, "put-*")
	if err != nil {
		return nil, &Error{Kind: KindInternal, Op: "alloc", Err: err}
	}
	defer f.Close()
	b := &Buffer{c: c, path: f.Name()}
	if err := f.Truncate(int64(size)); err != nil {
		_ = os.Remove(b.path)
		return nil, &Error{Kind: KindInternal, Op: "alloc", Err: err}
	}
	if b.data, err = syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED); err != nil {
		_ = os.Remove(b.path)
		return nil, &Error{Kind: KindInternal, Op: "alloc", Err: fmt.Errorf("map %s: %w", b.path, err)}
	}
	return b, nil
}

// Bytes is the buffer's memory, writable until Put or Discard.
func (b *Buffer) Bytes() []byte { return b.data }

// Put unmaps the buffer and hands it to the sidecar for n reads, as
// Client.Put does; the buffer is unusable afterwards, whatever the result.
func (b *Buffer) Put(ctx context.Context, n int, opts ...Option) (string, error) {
	path := b.path
	if path == "" {
		return "", &Error{Kind: KindInvalid, Op: "put", Err: errors.New("buffer already put or discarded")}
	}
	b.path = ""
	if err := b.unmap(); err != nil {
		_ = os.Remove(path)
		return "", &Error{Kind: KindInternal, Op: "put", Err: err}
	}
	return b.c.put(ctx, &sidecarv1.Payload{Source: &sidecarv1.Payload_Path{Path: path}}, n, opts)
}

// Discard drops the buffer without putting it; a no-op after Put.
func (b *Buffer) Discard() error {
	if b.path == "" {
		return nil
	}
	path := b.path
	b.path = ""
	return errors.Join(b.unmap(), os.Remove(path))
}

func (b *Buffer) unmap() error {
	if b.data == nil {
		return nil
	}
	err := syscall.Munmap(b.data)
	b.data = nil
	return err
}
