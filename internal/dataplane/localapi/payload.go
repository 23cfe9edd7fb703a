package localapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sync/semaphore"
	"golang.org/x/sys/unix"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/invocation"
)

// ErrBadPayload: a request's object is missing or names a file the sidecar
// must not read.
var ErrBadPayload = errors.New("bad object payload")

// readPayload returns an object's bytes. A file must be a regular file
// directly inside dir (invocation.OpenInDir, the rule the SDKs apply to
// their inputs too): the sidecar runs with other privileges than the
// function (it holds the reference keys), so a path elsewhere or a symlink
// is refused instead of followed. The file is removed once read: the
// sidecar now owns the object. reserve runs with the file's size before
// its bytes are read into memory (back-pressure).
func readPayload(ctx context.Context, dir string, p *sidecarv1.Payload, limit int64, reserve func(context.Context, int64) error) ([]byte, error) {
	switch src := p.GetSource().(type) {
	case *sidecarv1.Payload_Inline:
		if src.Inline == nil {
			return []byte{}, nil
		}
		return src.Inline, nil
	case *sidecarv1.Payload_Path:
		f, st, err := invocation.OpenInDir(dir, src.Path)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadPayload, err)
		}
		defer f.Close()
		if st.Size() > limit {
			return nil, fmt.Errorf("%w: %s is %d bytes, cap %d", store.ErrTooLarge, src.Path, st.Size(), limit)
		}
		if err := reserve(ctx, st.Size()); err != nil {
			return nil, err
		}
		// One allocation of the exact size; the file may not grow meanwhile
		// (ReadFull stops at the size taken from Stat).
		data := make([]byte, st.Size())
		if _, err := io.ReadFull(f, data); err != nil {
			return nil, fmt.Errorf("%w: read %s: %v", ErrBadPayload, src.Path, err)
		}
		_ = os.Remove(f.Name())
		return data, nil
	default:
		return nil, fmt.Errorf("%w: neither inline bytes nor a file", ErrBadPayload)
	}
}

// mapPayload maps a payload file above minMap bytes read-only, under the
// same rule as readPayload, and removes its name (the sidecar owns the
// object now; the mapping holds its pages until free unmaps them). A file of at most
// minMap bytes is left alone (free nil): it is read instead.
//
// Trust: the function keeps write access to the file it handed over; by
// writing to it, it changes only its own object, and by truncating it, it
// makes the sidecar's reads of the mapping fault: the kernel's (writev to
// a consumer) fail with EFAULT, and every copy the sidecar makes in user
// space goes through store.Clone, which turns the fault into an error.
//
// With kept set the name stays (the file goes back to the function that
// made it once the object is freed, see putreturn.go), and park, instead
// of unmapping, keeps the mapping in kept for the file's next object.
func mapPayload(dir, path string, limit, minMap int64, kept *parkedMaps) (data []byte, unmap, park func(), err error) {
	f, st, err := invocation.OpenInDir(dir, path)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %v", ErrBadPayload, err)
	}
	defer f.Close()
	if st.Size() > limit {
		return nil, nil, nil, fmt.Errorf("%w: %s is %d bytes, cap %d", store.ErrTooLarge, path, st.Size(), limit)
	}
	if st.Size() <= minMap || st.Size() == 0 {
		return nil, nil, nil, nil
	}
	if int64(int(st.Size())) != st.Size() {
		return nil, nil, nil, fmt.Errorf("%w: %s is %d bytes", store.ErrTooLarge, path, st.Size())
	}
	var key mapKey
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && kept != nil {
		key = mapKey{dev: sys.Dev, ino: sys.Ino, size: st.Size()}
		data = kept.take(key)
	}
	if data == nil {
		data, err = syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED|syscall.MAP_POPULATE)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%w: map %s: %v", ErrBadPayload, path, err)
		}
	}
	unmap = func() { _ = syscall.Munmap(data) }
	if kept == nil {
		// The mapping keeps the pages: the name goes at once, as after a
		// read, so nothing is left in the directory whatever happens next.
		_ = os.Remove(f.Name())
		return data, unmap, unmap, nil
	}
	return data, unmap, func() { kept.park(key, data) }, nil
}

// shmRoom reports whether the shared-memory directory's filesystem has at
// least half of its space free (or a GiB), so that a put's file may stay
// there as the object's storage. A pod's /dev/shm is a small tmpfs (64 MiB by
// default in Kubernetes, whatever the pod's memory): objects kept there
// would fill it, and the function's next write into it would fail with
// ENOSPC long before the store's cap (memoryLimitPerPod). Past half, a
// put's file is read into the sidecar's memory and removed, which gives
// its space back. A filesystem that cannot be asked counts as roomy.
func shmRoom(dir string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Blocks == 0 {
		return true
	}
	return st.Bavail*2 >= st.Blocks || st.Bavail*uint64(st.Bsize) >= 1<<30
}

// load reads a request's object. Payload files are read only while the
// bytes of all puts still waiting for the store stay under its cap, so a
// burst of puts into a full pod waits in the shared-memory files instead
// of growing the sidecar's heap. release ends the reservation once the
// object is stored (or refused).
func (s *Server) load(ctx context.Context, p *sidecarv1.Payload) (data []byte, release func(), err error) {
	s.initOnce.Do(func() { s.inflight = semaphore.NewWeighted(s.limit()) })
	var held int64
	data, err = readPayload(ctx, s.Dir, p, s.limit(), func(ctx context.Context, n int64) error {
		wctx, cancel := s.memoryWait(ctx)
		defer cancel()
		if err := s.inflight.Acquire(wctx, n); err != nil {
			return storeFull(wctx, fmt.Errorf("waiting to read the object: %w", err))
		}
		held = n
		return nil
	})
	release = func() {
		if held > 0 {
			s.inflight.Release(held)
			held = 0
		}
	}
	if err != nil {
		release()
		return nil, func() {}, err
	}
	return data, release, nil
}

// loaded is a request's object: bytes in the heap, or (free set) a
// mapping of the payload file, which stays the object's storage.
type loaded struct {
	data []byte
	free func() // unmaps the file, unless the store took it
}

// loadObject reads a request's object for the store. A payload file
// above the inline threshold is not read: it is mapped, and the mapping
// becomes the object's storage (no copy into the sidecar's heap; the
// store's cap still counts it, and freeing the object unmaps it). release
// frees what the store did not take.
//
// With returnTo (a client's id, see putreturn.go) the file keeps its name
// and goes back to that client once the stored object is freed; a file
// the store did not take is left to the client. While the directory is
// short of room (shmRoom) no file is kept, the client's neither: it is
// read and removed, and its name goes back at once so that the client
// unmaps it.
func (s *Server) loadObject(ctx context.Context, p *sidecarv1.Payload, returnTo string) (*loaded, func(), error) {
	path := p.GetPath()
	if path != "" && shmRoom(s.Dir) {
		var kept *parkedMaps
		if returnTo != "" && !strings.ContainsRune(filepath.Base(path), ',') {
			kept = s.returned().maps
		}
		data, unmap, park, err := mapPayload(s.Dir, path, s.limit(), int64(s.InlineThreshold), kept)
		if err != nil {
			return nil, func() {}, err
		}
		if unmap != nil {
			free := unmap
			if kept != nil {
				name := filepath.Base(path)
				free = func() {
					park()
					s.returned().add(returnTo, name)
				}
			}
			obj := &loaded{data: data, free: free}
			return obj, func() {
				if obj.free != nil {
					unmap()
					obj.free = nil
				}
			}, nil
		}
	}
	data, release, err := s.load(ctx, p)
	if err == nil && path != "" && returnTo != "" && !strings.ContainsRune(filepath.Base(path), ',') {
		// Read and removed (the directory is short of room): the client
		// hears of it with its next call and lets its mapping of the file
		// go, which gives the pages back.
		s.returned().add(returnTo, filepath.Base(path))
	}
	return &loaded{data: data}, release, err
}

// put stores an object and seals a reference to it; the store takes a
// mapped object's file over.
func (s *Server) put(ctx context.Context, m store.Meta, obj *loaded) (string, error) {
	kr, err := s.keys(ctx)
	if err != nil {
		return "", err
	}
	wctx, cancel := s.memoryWait(ctx)
	defer cancel()
	if err := s.Store.PutOwned(wctx, m, obj.data, obj.free); err != nil {
		return "", s.putError(m, int64(len(obj.data)), storeFull(wctx, err))
	}
	obj.free = nil // the store's now
	rec := ref.Record{Addr: s.Addr, Key: m.ID, Expires: m.Expires, Reads: m.Reads}
	if s.Sealer != nil {
		rec = s.Sealer.Seal(rec)
	}
	r, err := kr.Seal(rec)
	if err != nil {
		s.Store.Remove(m.ID)
		return "", err
	}
	return r, nil
}

// memoryWait bounds a wait for room in the store by PutTimeout (default
// 30 s), with errStoreFull as the cause when that bound is what ends it.
func (s *Server) memoryWait(ctx context.Context) (context.Context, context.CancelFunc) {
	timeout := s.PutTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	return context.WithTimeoutCause(ctx, timeout, errStoreFull)
}

// storeFull names a wait that PutTimeout ended; other errors (the
// caller's deadline or cancellation among them) pass unchanged.
// putError says whose object did not fit and which limit stopped it: the
// store's cap is the largest memoryLimitPerPod of the workflow's buckets
// (the Workflow controller writes it on the revision), and a full store
// with no spill tier makes a put wait for room, then fail. size < 0: not
// known yet.
func (s *Server) putError(m store.Meta, size int64, err error) error {
	what := "an object"
	if m.Bucket != "" {
		what = fmt.Sprintf("object %s of bucket %s", m.Key, m.Bucket)
	}
	if size >= 0 {
		what += fmt.Sprintf(" (%d bytes)", size)
	}
	switch {
	case errors.Is(err, store.ErrTooLarge):
		return fmt.Errorf("%s: %w; the cap is this pod's memoryLimitPerPod, the largest of the workflow's buckets: raise it", what, err)
	case errors.Is(err, errStoreFull):
		return fmt.Errorf("%s: %w; the pod's objects hold %d of its memoryLimitPerPod of %d bytes and no spill tier took any: "+
			"give the bucket spillTiers, read or free objects sooner, or raise memoryLimitPerPod", what, err, s.Store.Used(), s.Store.Cap())
	}
	return err
}

func storeFull(wctx context.Context, err error) error {
	if errors.Is(context.Cause(wctx), errStoreFull) {
		return fmt.Errorf("%w: %v", errStoreFull, err)
	}
	return err
}
