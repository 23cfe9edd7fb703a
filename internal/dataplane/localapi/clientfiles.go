package localapi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
)

// Mapped is an object a get returned: bytes that arrived inline, or a
// read-only mapping of the file the sidecar put it in. Close it when
// done: the mapping goes, and a file the sidecar lent goes back to it
// for the next get (see filepool.go).
type Mapped struct {
	Data   []byte
	Mapped bool // Data maps a file (else it arrived inline)
	c      *Client
	token  string // the lending to release, if the file was lent
	key    keptKey
	file   *os.File // a memfd the object socket passed (closed with the mapping)
}

// Close unmaps the object and releases its file; Data is nil afterwards.
// Closing twice is a no-op.
func (m *Mapped) Close() error {
	if !m.Mapped {
		return nil
	}
	data := m.Data
	m.Data, m.Mapped = nil, false
	if m.file != nil {
		err := unix.Munmap(data) // mapped by samenode.MapSealed (x/sys/unix's own table)
		return errors.Join(err, m.file.Close())
	}
	if m.token == "" {
		return syscall.Munmap(data)
	}
	// A lent file: its mapping is kept for the file's next lending, but
	// made inaccessible first (a slice kept past Close faults, as after
	// an unmap, and never shows the next object's bytes).
	if err := syscall.Mprotect(data, syscall.PROT_NONE); err != nil {
		_ = syscall.Munmap(data)
	} else {
		m.c.keep(m.key, data)
	}
	// Released only now that nothing here reads it: the sidecar fills it
	// again once it hears of it (with the next call).
	m.c.release(m.token)
	m.token = ""
	return nil
}

// keptKey names a lent file's mapping: the same file (inode) at the
// same size.
type keptKey struct {
	name string
	ino  uint64
	size int64
}

type keptMap struct {
	key   keptKey
	mem   []byte
	since time.Time
}

// maxKept bounds the mappings of released files kept for their next
// lending (each keeps its pages while the sidecar may have dropped the
// file); they go after idleTTL too.
const maxKept = 4

func (c *Client) keep(k keptKey, mem []byte) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		_ = syscall.Munmap(mem)
		return
	}
	c.kept = append(c.kept, keptMap{key: k, mem: mem, since: time.Now()})
	out := c.sweepKeptLocked(time.Now())
	c.mu.Unlock()
	for _, mem := range out {
		_ = syscall.Munmap(mem)
	}
}

// kept returns the kept mapping of k, readable again, or nil.
func (c *Client) keptMapping(k keptKey) []byte {
	c.mu.Lock()
	out := c.sweepKeptLocked(time.Now())
	var mem []byte
	for i, km := range c.kept {
		if km.key == k {
			mem = km.mem
			c.kept = append(c.kept[:i], c.kept[i+1:]...)
			break
		}
	}
	c.mu.Unlock()
	for _, mem := range out {
		_ = syscall.Munmap(mem)
	}
	if mem != nil && syscall.Mprotect(mem, syscall.PROT_READ) != nil {
		_ = syscall.Munmap(mem)
		return nil
	}
	return mem
}

func (c *Client) sweepKeptLocked(now time.Time) [][]byte {
	var out [][]byte
	for len(c.kept) > 0 && (len(c.kept) > maxKept || now.Sub(c.kept[0].since) > idleTTL) {
		out = append(out, c.kept[0].mem)
		c.kept = c.kept[1:]
	}
	return out
}

// GetMapped gets a referenced object as the SDKs do: in one exchange on
// the object socket when the sidecar serves it there (objbytes.go), else
// as its sealed memfd when the sidecar has one (same-node path,
// objsock.go), else asking the sidecar to lend its file (no new file,
// page by page, per get).
func (c *Client) GetMapped(ctx context.Context, ref string) (*sidecarv1.GetResponse, *Mapped, error) {
	if c.objBytes(ctx) {
		return c.getAny(ctx, ref)
	}
	if _, sameNode := c.objectSocket(ctx); sameNode && c.Memfds != MemfdNever {
		resp, m, err := c.getMemfd(ctx, ref)
		if !errors.Is(err, errFallback) {
			return resp, m, err
		}
	}
	return c.getMapped(ctx, func(ctx context.Context, opts ...grpc.CallOption) (*sidecarv1.GetResponse, error) {
		return c.rpc.Get(ctx, &sidecarv1.GetRequest{Ref: ref}, opts...)
	})
}

// GetObjectMapped reads a bucket's object by key, as GetMapped.
func (c *Client) GetObjectMapped(ctx context.Context, session, bucket, key string) (*sidecarv1.GetResponse, *Mapped, error) {
	return c.getMapped(ctx, func(ctx context.Context, opts ...grpc.CallOption) (*sidecarv1.GetResponse, error) {
		return c.rpc.GetObject(ctx, &sidecarv1.GetObjectRequest{Session: session, Bucket: bucket, Key: key}, opts...)
	})
}

func (c *Client) getMapped(ctx context.Context, call func(context.Context, ...grpc.CallOption) (*sidecarv1.GetResponse, error)) (*sidecarv1.GetResponse, *Mapped, error) {
	var hdr metadata.MD
	resp, err := call(c.lending(ctx), grpc.Header(&hdr))
	if err != nil {
		return nil, nil, err
	}
	var token string
	if v := hdr.Get(lentKey); len(v) == 1 {
		token = v[0]
	}
	m, err := c.mapPayload(resp.GetObject(), resp.GetSize(), token)
	return resp, m, err
}

// lending asks the sidecar to lend files, and hands back those released
// since the last call. A release is sent once, whatever the call's fate:
// sent again later, it could end a newer lending of the same file.
func (c *Client) lending(ctx context.Context) context.Context {
	c.mu.Lock()
	released := c.released
	c.released = nil
	c.mu.Unlock()
	kv := []string{lendKey, lendValue}
	if len(released) > 0 {
		kv = append(kv, releaseKey, strings.Join(released, ","))
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

func (c *Client) release(token string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// Bounded: with no call for a long time the sidecar forgets lent
	// files anyway.
	if len(c.released) < maxLent {
		c.released = append(c.released, token)
	}
}

// mapPayload maps a response's file read-only (all its pages at once), or
// wraps inline bytes. A file that was not lent is removed at once: the
// mapping keeps its pages, and nothing is left behind if Close never
// comes.
func (c *Client) mapPayload(p *sidecarv1.Payload, size int64, token string) (*Mapped, error) {
	switch src := p.GetSource().(type) {
	case *sidecarv1.Payload_Inline:
		data := src.Inline
		if data == nil {
			data = []byte{}
		}
		return &Mapped{Data: data}, nil
	case *sidecarv1.Payload_Path:
		if token != "" && size > 0 {
			var st syscall.Stat_t
			if err := syscall.Stat(src.Path, &st); err == nil && st.Size == size {
				k := keptKey{name: src.Path, ino: st.Ino, size: size}
				if mem := c.keptMapping(k); mem != nil {
					return &Mapped{Data: mem, Mapped: true, c: c, token: token, key: k}, nil
				}
			}
		}
		f, err := os.Open(src.Path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if token == "" {
			defer os.Remove(src.Path)
		}
		if size == 0 {
			if token != "" {
				c.release(token)
			}
			return &Mapped{Data: []byte{}}, nil // mmap refuses empty files
		}
		data, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED|syscall.MAP_POPULATE)
		if err != nil {
			if token != "" {
				c.release(token)
			}
			return nil, fmt.Errorf("map %s: %w", src.Path, err)
		}
		m := &Mapped{Data: data, Mapped: true, c: c, token: token}
		var st syscall.Stat_t
		if token != "" && syscall.Fstat(int(f.Fd()), &st) == nil {
			m.key = keptKey{name: src.Path, ino: st.Ino, size: size}
		}
		return m, nil
	default:
		return nil, fmt.Errorf("local API: response without an object")
	}
}

// Put files a client takes back (putreturn.go): the files it handed the
// sidecar (by base name, with their size) and those given back, idle.
type putFile struct {
	name  string
	size  int64
	since time.Time
	ino   uint64 // with mem: the file mapped
	mem   []byte // a writable mapping kept for the file's next object
}

// PutObject puts obj with req's other fields: inline when small (on the
// object socket when the sidecar serves it there, objbytes.go), else
// written into a file of the directory — one the sidecar gave back after
// an earlier object was freed when there is one (its pages already
// there: no new file to fill page by page), else a new one.
//
// With the object socket's memfds in use (MemfdMode), a large obj is
// written into a new sealed memfd instead (samenode.NewSealed, pwrite), which a
// consumer on this node then maps without another copy.
func (c *Client) PutObject(ctx context.Context, obj []byte, req *sidecarv1.PutRequest) (*sidecarv1.PutResponse, error) {
	if len(obj) <= min(c.InlineThreshold, objInlineMax) && c.objBytes(ctx) {
		return c.putBytes(ctx, obj, req)
	}
	if len(obj) > c.InlineThreshold && c.useMemfd(ctx) {
		f, err := samenode.NewSealed("put", obj)
		if err != nil {
			return nil, &PayloadError{Err: err}
		}
		defer f.Close()
		return c.putMemfd(ctx, f, int64(len(obj)), req)
	}
	p, name, err := c.putPayload(obj)
	if err != nil {
		return nil, &PayloadError{Err: err}
	}
	return c.sendPut(ctx, p, name, req)
}

// putFilePayload hands over a file written in place (PutBuffer).
func (c *Client) putFilePayload(ctx context.Context, pf putFile, req *sidecarv1.PutRequest) (*sidecarv1.PutResponse, error) {
	c.mu.Lock()
	if c.putLent == nil {
		c.putLent = map[string]putFile{}
	}
	c.putLent[pf.name] = pf
	c.mu.Unlock()
	return c.sendPut(ctx, pathPayload(filepath.Join(c.Dir, pf.name)), pf.name, req)
}

// sendPut sends a put whose payload file (if any) is name.
func (c *Client) sendPut(ctx context.Context, p *sidecarv1.Payload, name string, req *sidecarv1.PutRequest) (*sidecarv1.PutResponse, error) {
	req.Object = p
	var hdr metadata.MD
	resp, err := c.rpc.Put(metadata.AppendToOutgoingContext(ctx, lendKey, lendValue, clientKey, c.id), req, grpc.Header(&hdr))
	if err != nil && name != "" {
		// Whether the sidecar took it or not, the file is not reused: a
		// later return of it is then a stranger's, and removed.
		c.mu.Lock()
		pf := c.putLent[name]
		delete(c.putLent, name)
		c.mu.Unlock()
		pf.unmap()
		c.discard(p)
	}
	for _, v := range hdr.Get(returnedKey) {
		c.takeBack(strings.Split(v, ","))
	}
	return resp, err
}

// PayloadError: the object could not be written into the shared-memory
// directory (nothing was sent to the sidecar).
type PayloadError struct{ Err error }

func (e *PayloadError) Error() string {
	return "write to the shared-memory directory: " + e.Err.Error()
}
func (e *PayloadError) Unwrap() error { return e.Err }

// putPayload writes a large obj into a reused file, else a new one, and
// notes it as handed over. A file used again at the same size is written
// through a mapping kept from its previous use (a copy, no system call);
// otherwise with pwrite (a full directory is then an error, not a
// SIGBUS), and a reused file is mapped for next time.
func (c *Client) putPayload(obj []byte) (*sidecarv1.Payload, string, error) {
	if len(obj) <= c.InlineThreshold {
		return inlinePayload(obj), "", nil
	}
	return c.filePayload(int64(len(obj)), Part{Data: obj})
}

// Part is bytes to write at an offset of a file (the rest stays zero, or
// what a reused file held there).
type Part struct {
	Off  int64
	Data []byte
}

// filePayload writes parts into a reused file of size bytes, else a new
// one (see putPayload), and notes it as handed over.
func (c *Client) filePayload(size int64, parts ...Part) (*sidecarv1.Payload, string, error) {
	pf, ok := c.reusedPutFile()
	var err error
	switch {
	case ok && pf.mem != nil && int64(len(pf.mem)) == size && pf.size == size:
		// Still this client's file, whole (nobody truncated it: the
		// mapping's pages are there, no fault).
		var st syscall.Stat_t
		if err = syscall.Stat(filepath.Join(c.Dir, pf.name), &st); err == nil && (st.Ino != pf.ino || st.Size != size || st.Nlink != 1) {
			err = fmt.Errorf("put file %s changed", pf.name)
		}
		if err == nil {
			for _, p := range parts {
				copy(pf.mem[p.Off:], p.Data)
			}
			break
		}
		pf.drop(c.Dir)
		ok = false
		fallthrough
	default:
		var f *os.File
		if ok {
			pf.unmap()
			if f, err = os.OpenFile(filepath.Join(c.Dir, pf.name), os.O_RDWR, 0); err != nil {
				pf.drop(c.Dir)
				ok = false
			}
		}
		if !ok {
			if f, err = os.CreateTemp(c.Dir, "put-"+c.id+"-*"); err != nil {
				return nil, "", err
			}
			pf = putFile{name: filepath.Base(f.Name())}
		}
		err = f.Truncate(size) // a reused file may be larger: no stale bytes past the end
		for _, p := range parts {
			if err == nil {
				_, err = f.WriteAt(p.Data, p.Off)
			}
		}
		var st syscall.Stat_t
		if err == nil && ok && syscall.Fstat(int(f.Fd()), &st) == nil {
			// Reused once, likely again: map it for the next time.
			if mem, merr := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE); merr == nil {
				pf.mem, pf.ino = mem, st.Ino
			}
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			pf.drop(c.Dir)
			return nil, "", err
		}
	}
	pf.size, pf.since = size, time.Now()
	c.mu.Lock()
	if c.putLent == nil {
		c.putLent = map[string]putFile{}
	}
	c.putLent[pf.name] = pf
	c.mu.Unlock()
	return pathPayload(filepath.Join(c.Dir, pf.name)), pf.name, nil
}

// reusedPutFile takes the most recently given back file, if any.
func (c *Client) reusedPutFile() (putFile, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	drop := c.sweepPutLocked(time.Now())
	defer dropAll(c.Dir, drop)
	n := len(c.putIdle)
	if n == 0 {
		return putFile{}, false
	}
	pf := c.putIdle[n-1]
	c.putIdle = c.putIdle[:n-1]
	c.putIdleBytes -= pf.size
	return pf, true
}

func (pf *putFile) unmap() {
	if pf.mem != nil {
		_ = syscall.Munmap(pf.mem)
		pf.mem = nil
	}
}

// drop removes the file and its mapping.
func (pf *putFile) drop(dir string) {
	pf.unmap()
	_ = os.Remove(filepath.Join(dir, pf.name))
}

func dropAll(dir string, files []putFile) {
	for i := range files {
		files[i].drop(dir)
	}
}

// idleLimit bounds the given-back put files kept idle (poolBytes, taken
// once).
func (c *Client) idleLimit() int64 {
	c.poolOnce.Do(func() { c.poolBytes = poolBytes(c.Dir) })
	return c.poolBytes
}

// takeBack makes files the sidecar gave back idle; a name this client
// did not hand over (or gave up on) is removed.
func (c *Client) takeBack(names []string) {
	var drop []putFile
	c.mu.Lock()
	for _, n := range names {
		pf, ok := c.putLent[n]
		if !ok {
			if n == filepath.Base(n) && n != "." && n != ".." {
				drop = append(drop, putFile{name: n})
			}
			continue
		}
		delete(c.putLent, n)
		pf.since = time.Now()
		c.putIdle = append(c.putIdle, pf)
		c.putIdleBytes += pf.size
	}
	// Idle files hold the directory's space too: none is kept while it is
	// short of room (a pod's /dev/shm is 64 MiB), where the function's
	// next write and the sidecar's pulls need it.
	short := len(c.putIdle) > 0 && !shmRoom(c.Dir)
	for len(c.putIdle) > 0 && (short || c.putIdleBytes > c.idleLimit() || len(c.putIdle) > maxReturns) {
		drop = append(drop, c.putIdle[0])
		c.putIdleBytes -= c.putIdle[0].size
		c.putIdle = c.putIdle[1:]
	}
	c.mu.Unlock()
	dropAll(c.Dir, drop)
}

// sweepPutLocked takes out idle files unused for idleTTL (to be dropped)
// and forgets files handed over longer than returnTTL ago (the sidecar
// removes those).
func (c *Client) sweepPutLocked(now time.Time) []putFile {
	var drop []putFile
	for len(c.putIdle) > 0 && now.Sub(c.putIdle[0].since) > idleTTL {
		drop = append(drop, c.putIdle[0])
		c.putIdleBytes -= c.putIdle[0].size
		c.putIdle = c.putIdle[1:]
	}
	for n, pf := range c.putLent {
		if now.Sub(pf.since) > returnTTL+idleTTL {
			delete(c.putLent, n)
			if pf.mem != nil {
				_ = syscall.Munmap(pf.mem)
			}
		}
	}
	return drop
}

// dropPutFiles removes the idle files and unmaps the rest (Close).
func (c *Client) dropPutFiles() {
	c.mu.Lock()
	idle := c.putIdle
	c.putIdle, c.putIdleBytes = nil, 0
	for n, pf := range c.putLent {
		pf.unmap()
		delete(c.putLent, n)
	}
	c.mu.Unlock()
	dropAll(c.Dir, idle)
}
