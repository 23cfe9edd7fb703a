// Package store is the sidecar's in-pod object store: objects live in the
// producer pod's memory until they have been read as often as allowed, their
// TTL passes, or their session is collected. A per-pod memory cap applies
// back-pressure: a put that does not fit waits for space (or for its context
// to end) instead of growing the pod until the kernel kills it.
package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sort"
	"sync"
	"time"
)

// Errors a reader can tell apart.
var (
	ErrNotFound  = errors.New("object not found (never stored, or already freed)")
	ErrExhausted = errors.New("object already read as often as allowed")
	ErrExpired   = errors.New("object expired")
	ErrTooLarge  = errors.New("object larger than the pod's memory cap")
)

// Meta describes a stored object.
type Meta struct {
	ID       string
	Session  string
	Bucket   string
	Key      string
	Size     int64
	Reads    uint32 // reads allowed in total
	Expires  time.Time
	Metadata map[string]string
}

type entry struct {
	meta     Meta
	seq      uint64 // insertion order, for spilling the oldest first
	spilling bool
	data     []byte
	free     func() // releases data's storage (a mapped file); nil for heap bytes
	read     uint32 // reads started
	readers  int    // reads in progress (leases)
	gone     bool   // freed while leased: the last Release drops it
}

// Store is safe for concurrent use.
type Store struct {
	cap  int64
	now  func() time.Time
	mu   sync.Mutex
	used int64
	seq  uint64
	objs map[string]*entry
	free chan struct{} // closed and replaced whenever memory is released
	// spent remembers objects freed after their last allowed read, until
	// their expiry, so a reader is told "exhausted" rather than "not found".
	spent map[string]time.Time

	// Spill, when set, moves objects out of memory (to the fast tier)
	// instead of making a put wait: the oldest unleased objects go first.
	Spill func(ctx context.Context, m Meta, data []byte) error
}

// New returns a store holding at most capBytes of object data.
func New(capBytes int64, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{cap: capBytes, now: now, objs: map[string]*entry{}, free: make(chan struct{})}
}

// Put stores data (the store keeps the slice; the caller must not modify it).
// When the cap is reached it waits for memory until ctx ends.
func (s *Store) Put(ctx context.Context, m Meta, data []byte) error {
	return s.PutOwned(ctx, m, data, nil)
}

// PutOwned stores data that lives outside the heap (e.g. a mapped
// shared-memory file): it counts against the cap like any object, and
// free runs once, when the object is freed and no read holds it any more
// (read its bytes only through leases: Read, Hold). On error the caller
// keeps data and calls free itself.
func (s *Store) PutOwned(ctx context.Context, m Meta, data []byte, free func()) error {
	m.Size = int64(len(data))
	if m.Size > s.cap {
		return fmt.Errorf("%w: %d bytes, cap %d", ErrTooLarge, m.Size, s.cap)
	}
	if m.Reads == 0 {
		m.Reads = 1
	}
	for {
		s.mu.Lock()
		if _, dup := s.objs[m.ID]; dup {
			s.mu.Unlock()
			return fmt.Errorf("object %s already stored", m.ID)
		}
		// Expired objects are swept only when the object does not fit
		// (and by the sidecar's periodic Sweep): a sweep visits every
		// object, which on each put would make a put cost O(objects).
		if s.used+m.Size > s.cap {
			s.sweepLocked()
		}
		if s.used+m.Size <= s.cap {
			s.seq++
			s.objs[m.ID] = &entry{meta: m, data: data, free: free, seq: s.seq}
			s.used += m.Size
			s.mu.Unlock()
			return nil
		}
		wait := s.free
		victims := s.victimsLocked(s.used + m.Size - s.cap)
		s.mu.Unlock()
		if len(victims) > 0 {
			if err := s.spill(ctx, victims); err != nil {
				return fmt.Errorf("store full and spilling failed: %w", err)
			}
			continue
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return fmt.Errorf("store full (%d of %d bytes used): %w", s.Used(), s.cap, ctx.Err())
		}
	}
}

// Lease is one read of an object: Data stays valid until Release.
type Lease struct {
	Meta Meta
	Data []byte
	s    *Store
	e    *entry
	once sync.Once
}

// Owned reports whether the bytes live outside the heap (PutOwned): a
// copy of them in user space should go through Clone.
func (l *Lease) Owned() bool { return l.e.free != nil }

// Clone copies bytes into the heap. For bytes stored with PutOwned — a
// mapped file the function that made it could still truncate — a fault
// while copying is an error, not a crash of the sidecar.
func Clone(data []byte) (out []byte, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("object bytes unreadable (their file shrank?): %v", r)
		}
	}()
	return bytes.Clone(data), nil
}

// Hold keeps an object's bytes valid without counting a read (backup):
// Release the lease when done.
func (s *Store) Hold(id string) (*Lease, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.objs[id]
	if !ok || e.gone {
		return nil, false
	}
	e.readers++
	return &Lease{Meta: e.meta, Data: e.data, s: s, e: e}, true
}

// Release ends the read; the object is freed if that was the last allowed one.
func (l *Lease) Release() {
	l.once.Do(func() {
		l.s.mu.Lock()
		defer l.s.mu.Unlock()
		l.e.readers--
		if l.e.readers == 0 && (l.e.gone || l.e.read >= l.e.meta.Reads) {
			if l.e.read >= l.e.meta.Reads {
				l.s.tombstoneLocked(l.e.meta)
			}
			l.s.dropLocked(l.e)
		}
	})
}

// Read starts one of the object's allowed reads.
func (s *Store) Read(id string) (*Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.objs[id]
	if !ok || e.gone {
		if _, spent := s.spent[id]; spent {
			return nil, fmt.Errorf("%s: %w", id, ErrExhausted)
		}
		return nil, fmt.Errorf("%s: %w", id, ErrNotFound)
	}
	if !s.now().Before(e.meta.Expires) && !e.meta.Expires.IsZero() {
		if e.readers == 0 {
			s.dropLocked(e)
		}
		return nil, fmt.Errorf("%s: %w", id, ErrExpired)
	}
	if e.read >= e.meta.Reads {
		return nil, fmt.Errorf("%s: %w (%d)", id, ErrExhausted, e.meta.Reads)
	}
	e.read++
	e.readers++
	return &Lease{Meta: e.meta, Data: e.data, s: s, e: e}, nil
}

// ExtendedPast reports whether the store holds object id with an expiry
// later than both now and sealed (the expiry its reference carries): a
// keep-alive extended it, so a reference past its sealed expiry still
// reaches it.
func (s *Store) ExtendedPast(id string, sealed, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.objs[id]
	return ok && !e.gone && e.meta.Expires.After(now) && e.meta.Expires.After(sealed)
}

// Extend pushes an object's expiry (keep-alive while a consumer cold-starts).
func (s *Store) Extend(id string, until time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.objs[id]
	if !ok || e.gone {
		return false
	}
	if until.After(e.meta.Expires) {
		e.meta.Expires = until
	}
	return true
}

// DropSession frees every object of a session (session GC).
func (s *Store) DropSession(session string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, e := range s.objs {
		if e.meta.Session == session {
			s.freeLocked(e)
			n++
		}
	}
	return n
}

// Unread lists objects with reads left, oldest first (SIGTERM backup, spill).
func (s *Store) Unread() []Meta {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Meta
	for _, e := range s.objs {
		if !e.gone && e.read < e.meta.Reads {
			out = append(out, e.meta)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Peek returns an object's data without counting a read. The bytes of an
// object stored with PutOwned may go away once it is freed: read those
// through Hold instead.
func (s *Store) Peek(id string) ([]byte, Meta, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.objs[id]
	if !ok || e.gone {
		return nil, Meta{}, false
	}
	return e.data, e.meta, true
}

// Remove frees an object (after it was spilled elsewhere).
func (s *Store) Remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.objs[id]; ok {
		s.freeLocked(e)
	}
}

// Used is the bytes held now; Len the number of objects.
// Cap is the store's memory cap in bytes.
func (s *Store) Cap() int64 { return s.cap }

func (s *Store) Used() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

// Len is the number of objects held.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.objs)
}

// Sweep frees expired objects; the sidecar calls it periodically.
func (s *Store) Sweep() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked()
	now := s.now()
	for id, exp := range s.spent {
		if !now.Before(exp) {
			delete(s.spent, id)
		}
	}
}

func (s *Store) sweepLocked() {
	now := s.now()
	for _, e := range s.objs {
		if !e.meta.Expires.IsZero() && !now.Before(e.meta.Expires) {
			s.freeLocked(e)
		}
	}
}

// maxSpent bounds the exhausted-object memory; past it the oldest reason
// is lost and a late reader gets ErrNotFound instead.
const maxSpent = 1 << 16

func (s *Store) tombstoneLocked(m Meta) {
	if m.Expires.IsZero() {
		return
	}
	if s.spent == nil {
		s.spent = map[string]time.Time{}
	}
	if len(s.spent) >= maxSpent {
		for id := range s.spent { // drop an arbitrary one
			delete(s.spent, id)
			break
		}
	}
	s.spent[m.ID] = m.Expires
}

// freeLocked frees now, or when the last lease ends.
func (s *Store) freeLocked(e *entry) {
	if e.readers > 0 {
		e.gone = true
		return
	}
	s.dropLocked(e)
}

func (s *Store) dropLocked(e *entry) {
	if _, ok := s.objs[e.meta.ID]; !ok {
		return
	}
	delete(s.objs, e.meta.ID)
	s.used -= e.meta.Size
	e.data = nil
	if e.free != nil {
		e.free()
		e.free = nil
	}
	close(s.free)
	s.free = make(chan struct{})
}

// victimsLocked picks the oldest unleased objects adding up to need bytes
// and marks them as being spilled.
func (s *Store) victimsLocked(need int64) []*entry {
	if s.Spill == nil {
		return nil
	}
	var cands []*entry
	for _, e := range s.objs {
		if !e.gone && !e.spilling && e.readers == 0 {
			cands = append(cands, e)
		}
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].seq < cands[j].seq })
	var out []*entry
	for _, e := range cands {
		if need <= 0 {
			break
		}
		e.spilling = true
		e.readers++ // its bytes stay valid while they are spilled
		out = append(out, e)
		need -= e.meta.Size
	}
	return out
}

// spill writes victims to the fast tier (without holding the lock) and
// frees them; a victim that failed to spill stays in memory.
func (s *Store) spill(ctx context.Context, victims []*entry) error {
	var errs []error
	for _, e := range victims {
		data, err := e.data, error(nil)
		if e.free != nil {
			data, err = Clone(data) // the tier's client reads it in user space
		}
		if err == nil {
			err = s.Spill(ctx, e.meta, data)
		}
		s.mu.Lock()
		e.spilling = false
		e.readers--
		if err == nil || (e.gone && e.readers == 0) {
			s.freeLocked(e)
		}
		s.mu.Unlock()
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Detached wraps bytes that live outside the store (read back from a tier)
// as a lease, so they are served like a stored object.
func Detached(m Meta, data []byte) *Lease {
	s := New(int64(len(data))+1, nil)
	e := &entry{meta: m, data: data, readers: 1, read: 1}
	m.Reads = 1
	e.meta = m
	s.objs[m.ID] = e
	s.used = int64(len(data))
	return &Lease{Meta: m, Data: data, s: s, e: e}
}
