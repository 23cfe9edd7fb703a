package localapi

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The other half of reusing files (filepool.go): a function's put hands
// the sidecar a file of its own, which becomes the object's storage. A
// client that asks for it (metadata lendKey and clientKey on the put) gets
// the file back once the object is freed — its last read done, expired,
// collected — named in the header returnedKey of its next call, and
// writes its next object into it instead of a new file.
//
//   - The sidecar leaves the name in the directory while the object lives
//     (the function could keep the file open anyway: writing to it changes
//     only its own object, as before).
//   - A file goes back only once no read uses the object (the store's
//     free), only to the client that put it, and only once.
//   - Bounds: maxReturns names waiting per client, maxClients clients,
//     returnTTL for a client to come back; past them the sidecar removes
//     the file instead.
const (
	clientKey   = "ziptrail-client"   // request: the client's id (letters and digits)
	returnedKey = "ziptrail-returned" // response header: base names of files given back

	maxReturns = 16
	maxClients = 64
	returnTTL  = 2 * time.Minute
)

type returnList struct {
	names []string
	seen  time.Time
}

// returns holds the put files waiting for their clients.
type returns struct {
	dir     string
	maps    *parkedMaps
	mu      sync.Mutex
	clients map[string]*returnList
	stopped bool
}

func validClientID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// add queues a freed object's file for its client, or removes it when
// the client cannot take it.
func (r *returns) add(client, name string) {
	now := time.Now()
	r.mu.Lock()
	var drop []string
	l := r.clients[client]
	switch {
	case r.stopped:
		drop = append(drop, name)
	case l == nil && len(r.clients) >= maxClients:
		drop = append(drop, name)
	default:
		if l == nil {
			l = &returnList{seen: now}
			if r.clients == nil {
				r.clients = map[string]*returnList{}
			}
			r.clients[client] = l
		}
		l.names = append(l.names, name)
		if len(l.names) > maxReturns {
			drop = append(drop, l.names[0])
			l.names = l.names[1:]
		}
	}
	drop = append(drop, r.sweepLocked(now)...)
	r.mu.Unlock()
	r.remove(drop)
}

// take drains the files waiting for client.
func (r *returns) take(client string) []string {
	now := time.Now()
	r.mu.Lock()
	var names []string
	if l := r.clients[client]; l != nil {
		names = l.names
		delete(r.clients, client)
	}
	drop := r.sweepLocked(now)
	r.mu.Unlock()
	r.remove(drop)
	return names
}

// sweepLocked forgets clients that did not come back within returnTTL of
// their first waiting file.
func (r *returns) sweepLocked(now time.Time) []string {
	var drop []string
	for c, l := range r.clients {
		if now.Sub(l.seen) > returnTTL {
			drop = append(drop, l.names...)
			delete(r.clients, c)
		}
	}
	return drop
}

func (r *returns) remove(names []string) {
	for _, n := range names {
		_ = os.Remove(filepath.Join(r.dir, n))
	}
}

// stop removes every waiting file; objects freed later have theirs
// removed at once.
func (r *returns) stop() {
	r.mu.Lock()
	var drop []string
	for _, l := range r.clients {
		drop = append(drop, l.names...)
	}
	r.clients, r.stopped = nil, true
	r.mu.Unlock()
	r.remove(drop)
	r.maps.stop()
}

// mapKey names a file's contents as mapped: a file given back and
// written again in place (same inode, same size) is still mapped.
type mapKey struct {
	dev, ino uint64
	size     int64
}

type parked struct {
	key   mapKey
	mem   []byte
	since time.Time
}

// parkedMaps keeps the read-only mappings of freed objects' files that
// go back to their clients, so that the file's next object needs no new
// mapping (mapping 10 MB page by page costs as much as copying it). A
// parked mapping maps pages the client may still free (it removed the
// file): so at most maxParked, for at most idleTTL.
type parkedMaps struct {
	mu      sync.Mutex
	maps    []parked // oldest first
	stopped bool
}

const maxParked = 16

func (m *parkedMaps) take(k mapKey) []byte {
	m.mu.Lock()
	out := m.sweepLocked(time.Now())
	var mem []byte
	for i := len(m.maps) - 1; i >= 0; i-- {
		if m.maps[i].key == k {
			mem = m.maps[i].mem
			m.maps = append(m.maps[:i], m.maps[i+1:]...)
			break
		}
	}
	m.mu.Unlock()
	unmapAll(out)
	return mem
}

func (m *parkedMaps) park(k mapKey, mem []byte) {
	m.mu.Lock()
	var out [][]byte
	if m.stopped {
		out = append(out, mem)
	} else {
		m.maps = append(m.maps, parked{key: k, mem: mem, since: time.Now()})
	}
	out = append(out, m.sweepLocked(time.Now())...)
	m.mu.Unlock()
	unmapAll(out)
}

func (m *parkedMaps) sweepLocked(now time.Time) [][]byte {
	var out [][]byte
	for len(m.maps) > 0 && (len(m.maps) > maxParked || now.Sub(m.maps[0].since) > idleTTL) {
		out = append(out, m.maps[0].mem)
		m.maps = m.maps[1:]
	}
	return out
}

func unmapAll(maps [][]byte) {
	for _, mem := range maps {
		_ = syscall.Munmap(mem)
	}
}

func (m *parkedMaps) stop() {
	m.mu.Lock()
	maps := m.maps
	m.maps, m.stopped = nil, true
	m.mu.Unlock()
	for _, p := range maps {
		_ = syscall.Munmap(p.mem)
	}
}

// joinNames is the header value of names (base names hold no comma: the
// client made them, and the sidecar checked them as files of its
// directory).
func joinNames(names []string) string { return strings.Join(names, ",") }
