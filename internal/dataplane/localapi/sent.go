package localapi

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

// sentOutputs counts, per session and invocation, the distinct objects
// (bucket/key) sent through this API and reported to the operator. Those
// reports travel on their own and may reach the operator after the
// invocation's response; the response carries the count
// (invocation.HeaderOutputsSent) so the operator waits for them all.
type sentOutputs struct {
	mu sync.Mutex
	m  map[string]*sentEntry // session \x00 invocation
}

type sentEntry struct {
	names map[string]struct{}
	last  time.Time
}

// maxSentEntries bounds the counts kept for invocations whose response
// never passed through this sidecar (sent from another thread after it, or
// outside any invocation's response).
const maxSentEntries = 4096

func (c *sentOutputs) add(session, inv, bucket, key string, now time.Time, ttl time.Duration) {
	if inv == "" {
		return // not sent by an invocation: nothing waits for it
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*sentEntry{}
	}
	id := session + "\x00" + inv
	e := c.m[id]
	if e == nil {
		if len(c.m) >= maxSentEntries {
			c.prune(now, ttl)
		}
		e = &sentEntry{names: map[string]struct{}{}}
		c.m[id] = e
	}
	e.names[bucket+"/"+key] = struct{}{}
	e.last = now
}

// prune forgets counts older than ttl, or, if none is, the oldest.
func (c *sentOutputs) prune(now time.Time, ttl time.Duration) {
	var oldest string
	for id, e := range c.m {
		if now.Sub(e.last) > ttl {
			delete(c.m, id)
		} else if oldest == "" || e.last.Before(c.m[oldest].last) {
			oldest = id
		}
	}
	if len(c.m) >= maxSentEntries {
		delete(c.m, oldest)
	}
}

func (c *sentOutputs) take(session, inv string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := session + "\x00" + inv
	e := c.m[id]
	delete(c.m, id)
	if e == nil {
		return 0
	}
	return len(e.names)
}

// MarkOutputsSent sets invocation.HeaderOutputsSent on an invocation's
// response when the invocation sent objects through this API, and forgets
// its count. Call it when the response's header is written.
func (s *Server) MarkOutputsSent(h http.Header, session, invocationID string) {
	if s == nil {
		return
	}
	if n := s.sent.take(session, invocationID); n > 0 {
		h.Set(invocation.HeaderOutputsSent, strconv.Itoa(n))
	}
}
