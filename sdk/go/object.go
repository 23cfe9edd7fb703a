package ziptrail

import (
	"fmt"
	"os"
	"syscall"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
)

// Object is an object's bytes: an input of an invocation, or the result of
// Get, Gather or GetObject. Large objects are files in the pod's
// shared-memory directory mapped into this process, so Bytes costs no
// copy; small ones arrived inline. An Object is not safe for concurrent
// Close.
type Object struct {
	Bucket   string
	Key      string
	Size     int64
	Metadata map[string]string
	// Source says where a Get found the object: "local" (this pod),
	// "remote" (its producer pod, or a tier when it was gone), "redis"
	// (spilled) or "s3" (persisted). Empty for invocation inputs.
	Source string
	data   []byte
	mapped bool
	lent   *localapi.Mapped // a Get's object: closing it releases the file
}

// Bytes returns the object's contents, read-only. For a mapped object the
// slice is valid until Close (for invocation inputs: until the handler
// returns); copy what must outlive it. Writing to it faults.
func (o *Object) Bytes() []byte { return o.data }

// Mapped reports whether Bytes is a mapping of a shared-memory file (no
// copy was made) rather than bytes that arrived inline.
func (o *Object) Mapped() bool { return o.mapped }

// Close releases a mapped object's memory; Bytes is nil afterwards.
// Objects from Get and GetObject should be closed when done (their file is
// already unlinked, so the memory is freed when the mapping goes away).
// Invocation inputs are closed by the function server.
func (o *Object) Close() error {
	if o.lent != nil {
		err := o.lent.Close()
		o.data, o.mapped, o.lent = nil, false, nil
		return err
	}
	if !o.mapped {
		return nil
	}
	err := syscall.Munmap(o.data)
	o.data, o.mapped = nil, false
	return err
}

// mapFile maps a shared-memory file read-only. With unlink, the file is
// removed right away: the mapping keeps its pages alive, and nothing is
// left behind in the directory if the caller never closes the object.
func mapFile(path string, unlink bool) (data []byte, mapped bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	if unlink {
		defer os.Remove(path)
	}
	st, err := f.Stat()
	if err != nil {
		return nil, false, err
	}
	return mapOpen(f, st.Size())
}

// mapOpen maps the first size bytes of an open file read-only.
func mapOpen(f *os.File, size int64) (data []byte, mapped bool, err error) {
	if size == 0 {
		return []byte{}, false, nil // mmap refuses empty files
	}
	data, err = syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, false, fmt.Errorf("map %s: %w", f.Name(), err)
	}
	return data, true, nil
}
