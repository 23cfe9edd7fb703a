package localapi

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ziptrail/ziptrail/internal/dataplane/streamio"
)

// A new file of the object directory costs the kernel a page allocation,
// a zeroing and a fault per 4 KiB page, and as much again to free it:
// most of an SDK get of a large object. The sidecar therefore keeps the
// files it pulls objects into and fills them again, once the function
// that read one says it is done (the local API's "release", see
// docs/dataplane.md "Reused files"):
//
//   - A file is lent to a function only when its request asked for it
//     (metadata lendKey); to any other caller the file is handed over as
//     before (the sidecar closes its copy; the caller removes the name).
//   - A lent file is filled again only after the function released it,
//     and only while its name is still there and the only one (so an SDK
//     that removed it, or linked it elsewhere, keeps what it has).
//   - Before a refill the file is cut to the new object's size (the
//     kernel zeroes the rest of the last page and frees the pages past
//     it), and the pull writes every byte below it: a reader never sees a
//     previous object's bytes.
//   - The sidecar writes only through the kernel (pwrite, and socket reads
//     into its own mapping), so a function that truncates a file under it
//     fails that pull (EFAULT) without faulting the sidecar.
//   - Bounds: idle files at most maxIdleBytes and idleTTL; lent files at
//     most maxLent and lentTTL. Forgetting a file (unlink, close, unmap)
//     is safe at any time: a function's own mapping outlives the name.

const (
	lendKey    = "ziptrail-files"   // request: "lend" (the caller releases what it gets)
	releaseKey = "ziptrail-release" // request: base names of lent files the caller is done with
	lentKey    = "ziptrail-lent"    // response header: the base name of the file lent
	lendValue  = "lend"

	defaultPoolBytes = 64 << 20
	idleTTL          = 30 * time.Second
	maxLent          = 64
	lentTTL          = 2 * time.Minute
)

// poolBytes is how many idle bytes one side (the sidecar's pool, or a
// client's given-back put files) keeps by default: a quarter of the
// directory's volume, at least defaultPoolBytes. The Workflow controller
// sizes a pod's objects volume at twice the largest memoryLimitPerPod of
// its buckets, so objects up to half of that limit are filled again
// instead of allocated, zeroed and faulted page by page each time (the
// most of a 100 MB get); the volume is counted in the pod's memory, and
// idle files are dropped whenever the directory is short of room
// (shmRoom).
func poolBytes(dir string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Blocks == 0 {
		return defaultPoolBytes
	}
	return max(defaultPoolBytes, int64(st.Blocks)*st.Bsize/4)
}

// poolFile is a file of the object directory the sidecar made, open
// read-write and mapped shared (mem) over its whole size.
type poolFile struct {
	f     *os.File
	name  string // base name in the directory
	mem   []byte
	size  int64
	since time.Time // idle or lent since
	gen   uint64    // lendings so far: a release names the one it ends
}

// filePool holds the directory's reusable files: idle ones (ready to be
// filled) and lent ones (a function reads them).
type filePool struct {
	dir      string
	maxBytes int64 // idle bytes kept

	mu        sync.Mutex
	idle      []*poolFile // oldest first
	idleBytes int64
	lent      map[string]*poolFile
	stopped   bool
}

func newFilePool(dir string, maxBytes int64) *filePool {
	if maxBytes <= 0 {
		maxBytes = poolBytes(dir)
	}
	return &filePool{dir: dir, maxBytes: maxBytes, lent: map[string]*poolFile{}}
}

// take returns a file of exactly size bytes, mapped: an idle one resized,
// else a new one. Its pages are reserved (a full directory is ErrNoRoom,
// not a SIGBUS later) and mapped in (no fault per page while filling).
func (p *filePool) take(size int64) (*poolFile, error) {
	if size <= 0 || int64(int(size)) != size {
		return nil, fmt.Errorf("%w: a %d-byte file", streamio.ErrNoRoom, size)
	}
	now := time.Now()
	p.mu.Lock()
	p.sweepLocked(now)
	var pf *poolFile
	// The smallest idle file that holds size, else the largest (grown).
	fits := func(c *poolFile) bool { return c.size >= size }
	best := -1
	for i, c := range p.idle {
		if best < 0 {
			best = i
			continue
		}
		b := p.idle[best]
		switch {
		case fits(c) != fits(b):
			if fits(c) {
				best = i
			}
		case fits(c) && c.size < b.size, !fits(c) && c.size > b.size:
			best = i
		}
	}
	if best >= 0 {
		pf = p.idle[best]
		p.idle = append(p.idle[:best], p.idle[best+1:]...)
		p.idleBytes -= pf.size
	}
	p.mu.Unlock()
	if pf != nil {
		if err := pf.resize(size); err == nil {
			return pf, nil
		} else if errors.Is(err, streamio.ErrNoRoom) {
			pf.drop()
			return nil, err
		}
		pf.drop() // tampered with, or cannot be mapped: a new one
	}
	return p.create(size)
}

func (p *filePool) create(size int64) (*poolFile, error) {
	f, err := os.CreateTemp(p.dir, "get-*")
	if err != nil {
		return nil, err
	}
	pf := &poolFile{f: f, name: filepath.Base(f.Name())}
	if err := pf.resize(size); err != nil {
		pf.drop()
		return nil, err
	}
	return pf, nil
}

// resize makes the file exactly size bytes, reserved and mapped. A file
// whose name is gone or doubled, or whose size changed behind the
// sidecar's back, is refused.
func (pf *poolFile) resize(size int64) error {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(pf.f.Fd()), &st); err != nil {
		return err
	}
	if st.Nlink != 1 || st.Size != pf.size {
		return fmt.Errorf("pooled file %s changed (links %d, %d bytes, expected %d)", pf.name, st.Nlink, st.Size, pf.size)
	}
	if size == pf.size && pf.mem != nil {
		return nil
	}
	if pf.mem != nil {
		_ = syscall.Munmap(pf.mem)
		pf.mem = nil
	}
	if size < pf.size {
		// Frees the pages past size and zeroes the rest of the last one.
		if err := pf.f.Truncate(size); err != nil {
			return err
		}
	} else if err := syscall.Fallocate(int(pf.f.Fd()), 0, 0, size); err != nil {
		return fmt.Errorf("%w: %v", streamio.ErrNoRoom, err)
	}
	pf.size = size
	mem, err := syscall.Mmap(int(pf.f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("map %s: %w", pf.name, err)
	}
	pf.mem = mem
	return nil
}

// drop forgets the file: its name, the sidecar's descriptor and mapping.
func (pf *poolFile) drop() {
	pf.unmap()
	_ = os.Remove(filepath.Join(filepath.Dir(pf.f.Name()), pf.name))
}

// unmap closes the sidecar's copy, leaving the name (the function's now).
func (pf *poolFile) unmap() {
	if pf.mem != nil {
		_ = syscall.Munmap(pf.mem)
		pf.mem = nil
	}
	_ = pf.f.Close()
}

// handOut gives the file to the function: lent (kept for a release) when
// it asked, else closed here and its own from now on. It returns the
// file's path and, when lent, the token that releases it.
func (p *filePool) handOut(pf *poolFile, lend bool) (path, lent string) {
	path = filepath.Join(p.dir, pf.name)
	if !lend {
		pf.unmap()
		return path, ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		pf.unmap()
		return path, ""
	}
	pf.since = time.Now()
	pf.gen++
	p.lent[pf.name] = pf
	for len(p.lent) > maxLent {
		p.forgetOldestLentLocked()
	}
	return path, pf.name + ":" + strconv.FormatUint(pf.gen, 10)
}

// canLend reports whether another file may be lent without forgetting
// an earlier lending (at most maxLent at once).
func (p *filePool) canLend() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.lent) < maxLent
}

// forget ends pf's lending, if it is lent (the pool no longer reuses or
// removes it).
func (p *filePool) forget(pf *poolFile) {
	p.mu.Lock()
	if p.lent[pf.name] == pf {
		delete(p.lent, pf.name)
	}
	p.mu.Unlock()
}

// release takes back lent files by token (name:lending, as handOut made
// it); unknown tokens are ignored (a file forgotten meanwhile, a lending
// already released, or a token the function made up).
func (p *filePool) release(tokens []string) {
	for _, t := range tokens {
		name, gen, _ := strings.Cut(t, ":")
		p.mu.Lock()
		pf, ok := p.lent[name]
		ok = ok && strconv.FormatUint(pf.gen, 10) == gen
		if ok {
			delete(p.lent, name)
		}
		p.mu.Unlock()
		if ok {
			p.idleAdd(pf)
		}
	}
}

func (p *filePool) idleAdd(pf *poolFile) {
	now := time.Now()
	p.mu.Lock()
	// Idle files hold the directory's space: none is kept while it is
	// short of room (a pod's /dev/shm is 64 MiB), where the function's
	// writes and the next pulls need it.
	if p.stopped || pf.size > p.maxBytes || !shmRoom(p.dir) {
		p.mu.Unlock()
		pf.drop()
		return
	}
	pf.since = now
	p.idle = append(p.idle, pf)
	p.idleBytes += pf.size
	var out []*poolFile
	for p.idleBytes > p.maxBytes {
		out = append(out, p.idle[0])
		p.idleBytes -= p.idle[0].size
		p.idle = p.idle[1:]
	}
	p.sweepLocked(now)
	p.mu.Unlock()
	for _, o := range out {
		o.drop()
	}
}

// sweepLocked forgets idle files unused for idleTTL and lent ones never
// released within lentTTL.
func (p *filePool) sweepLocked(now time.Time) {
	for len(p.idle) > 0 && now.Sub(p.idle[0].since) > idleTTL {
		p.idleBytes -= p.idle[0].size
		p.idle[0].drop()
		p.idle = p.idle[1:]
	}
	for n, pf := range p.lent {
		if now.Sub(pf.since) > lentTTL {
			delete(p.lent, n)
			pf.drop()
		}
	}
}

func (p *filePool) forgetOldestLentLocked() {
	var old *poolFile
	for _, pf := range p.lent {
		if old == nil || pf.since.Before(old.since) {
			old = pf
		}
	}
	delete(p.lent, old.name)
	old.drop()
}

// stop forgets every file (the sidecar stops).
func (p *filePool) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	for _, pf := range p.idle {
		pf.drop()
	}
	for _, pf := range p.lent {
		pf.drop()
	}
	p.idle, p.idleBytes, p.lent = nil, 0, map[string]*poolFile{}
}
