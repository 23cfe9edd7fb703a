// Package streamio holds what the data plane's framed streams between
// sidecars share (the message stream, messaging.StreamMagic, and the pull
// stream, pull.StreamMagic): reading a body that follows its header
// straight into its destination — a buffer, or a shared-memory file whose
// pages are reserved first and filled through a mapping — so no body is
// copied through the heap twice.
package streamio

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// ErrNoRoom: the destination file's pages could not be reserved (a full
// shared-memory directory); nothing was read from the stream.
var ErrNoRoom = errors.New("no room for the body in the object directory")

// ReadFull fills dst with the stream's next bytes: first what br already
// buffered, then straight from r (the connection under br), so a large
// body is not copied through br's buffer.
func ReadFull(br *bufio.Reader, r io.Reader, dst []byte) error {
	n, _ := br.Read(dst[:min(br.Buffered(), len(dst))])
	if n == len(dst) {
		return nil
	}
	_, err := io.ReadFull(r, dst[n:])
	return err
}

// ReadIntoFile reads the stream's next size bytes into f from its start:
// the pages are reserved first (fallocate: writing through a mapping into
// a full tmpfs would kill the process with SIGBUS instead of failing),
// then the socket's bytes land in them through a shared mapping, one copy.
// A reservation that fails returns ErrNoRoom, a file that cannot be
// reserved or mapped (a file system without fallocate, a write-only file)
// errors.ErrUnsupported, both without reading: the caller still has the
// body on the stream (read it another way, discard it, or drop the stream).
func ReadIntoFile(br *bufio.Reader, r io.Reader, f *os.File, size int64) error {
	if size == 0 {
		return f.Truncate(0)
	}
	if int64(int(size)) != size {
		return fmt.Errorf("%w: %d bytes do not fit in memory", ErrNoRoom, size)
	}
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		if errors.Is(err, syscall.EOPNOTSUPP) {
			return fmt.Errorf("%w: fallocate: %v", errors.ErrUnsupported, err)
		}
		return fmt.Errorf("%w: %v", ErrNoRoom, err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		// E.g. a file opened write-only.
		return fmt.Errorf("%w: map: %v", errors.ErrUnsupported, err)
	}
	defer syscall.Munmap(mem)
	return ReadFull(br, r, mem)
}
