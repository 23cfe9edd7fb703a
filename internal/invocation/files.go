package invocation

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// The pod's object directory (ZIPTRAIL_SHM_DIR, shared memory) is where
// the sidecar and the function pass object bytes as files. The rules for
// which file may be opened live here, used by both sides: the sidecar's
// local API reading a file the function wrote, and the SDKs opening an
// input the sidecar pulled.

// ErrBadPath: a file that is not one the reader may open: not directly
// inside the object directory, a symlink, not a regular file, or (for
// invocation inputs) not a name the sidecar gives.
var ErrBadPath = errors.New("not a file of the pod's object directory")

// inputPrefix starts the names of input files the sidecar places.
const inputPrefix = "in-"

// inputRandomBytes: 128 random bits make a name nobody outside the pod can
// guess, so a name is as good as a capability: a request that did not
// pass through the pod's sidecar cannot name an existing input.
const inputRandomBytes = 16

// NewInputName returns a fresh name for an input file the sidecar places
// in the object directory: "in-" and 32 random hex digits.
func NewInputName() string {
	b := make([]byte, inputRandomBytes)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (it panics if the OS cannot provide randomness)
	return inputPrefix + hex.EncodeToString(b)
}

// IsInputName reports whether name has the form NewInputName gives: a bare
// file name (no separator, no "..") of lower-case hex digits after "in-".
func IsInputName(name string) bool {
	if len(name) != len(inputPrefix)+2*inputRandomBytes || name[:len(inputPrefix)] != inputPrefix {
		return false
	}
	for _, c := range []byte(name[len(inputPrefix):]) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// InDir resolves name to a path directly inside dir: a bare file name, or
// an absolute path whose directory is dir. Anything else (a path into a
// subdirectory, out of dir with "..", or elsewhere) fails with ErrBadPath.
func InDir(dir, name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("%w: no file name", ErrBadPath)
	}
	if !filepath.IsAbs(name) {
		name = filepath.Join(dir, name)
	}
	clean := filepath.Clean(name)
	if filepath.Dir(clean) != filepath.Clean(dir) || clean == filepath.Clean(dir) {
		return "", fmt.Errorf("%w: %s is not directly inside the object directory %s", ErrBadPath, name, dir)
	}
	return clean, nil
}

// OpenInDir opens a regular file directly inside dir (see InDir) for
// reading. A symlink is refused, not followed, and so is anything but a
// regular file (a FIFO does not block the open): the reader may hold
// privileges the writer lacks, so it reads only what really is in dir.
func OpenInDir(dir, name string) (*os.File, os.FileInfo, error) {
	path, err := InDir(dir, name)
	if err != nil {
		return nil, nil, err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, nil, fmt.Errorf("%w: %s is a symlink", ErrBadPath, name)
		}
		return nil, nil, fmt.Errorf("%w: %v", ErrBadPath, err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, nil, fmt.Errorf("%w: %v", ErrBadPath, err)
	}
	if !st.Mode().IsRegular() {
		_ = f.Close()
		return nil, nil, fmt.Errorf("%w: %s is not a regular file", ErrBadPath, name)
	}
	return f, st, nil
}

// OpenInput opens an invocation input the sidecar placed in dir: name
// must be a name NewInputName gives (IsInputName), then OpenInDir.
func OpenInput(dir, name string) (*os.File, os.FileInfo, error) {
	if !IsInputName(name) {
		return nil, nil, fmt.Errorf("%w: %q is not a name the pod's sidecar gives its inputs", ErrBadPath, name)
	}
	return OpenInDir(dir, name)
}
