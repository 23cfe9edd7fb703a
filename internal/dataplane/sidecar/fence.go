package sidecar

import (
	"container/list"
	"net/http"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

// Owner fences (docs/queue-proxy-zl.md, "Owner fences"): an invocation the
// operator's engine dispatches carries its owner's fence
// (invocation.HeaderOwnerFence: the engine's checkpoint key and the
// generation at which that owner claimed it). A new owner of a checkpoint
// key claims it at a higher generation than every earlier owner, so once
// this sidecar has seen a fence for a key, an invocation with a lower one
// comes from a superseded owner (a partitioned or paused operator that
// does not know yet): it is refused with 409 and
// invocation.HeaderStaleOwner, before the function runs and before its
// idempotency key is recorded, and its dispatcher's engine stops. An
// invocation without a fence (a delegated firing, an older operator, a
// direct call) is not fenced.

// maxFenceKeys bounds the checkpoint keys remembered: one per engine
// bucket that dispatches to this pod (one unsharded). Past it, the key
// seen least recently is forgotten (its next fence is accepted, as
// before the fences existed).
const maxFenceKeys = 1024

var staleOwnerRefused = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "ziptrail_sidecar_stale_owner_refused_total",
	Help: "Invocations refused (409) because their owner fence was older than one seen for the same engine checkpoint: " +
		"sent by a superseded operator engine owner.",
})

func init() { prometheus.MustRegister(staleOwnerRefused) }

// fences are the highest generation seen per checkpoint key.
type fences struct {
	max int

	mu    sync.Mutex
	by    map[string]*list.Element // key → element of order (a *fenceSeen)
	order *list.List               // least recently seen first
}

type fenceSeen struct {
	key string
	gen int64
}

func newFences(max int) *fences {
	return &fences{max: max, by: map[string]*list.Element{}, order: list.New()}
}

// admit notes f and reports whether an invocation under it may run: not
// when a higher generation was seen for its key (then highest is that
// one).
func (fs *fences) admit(f invocation.Fence) (ok bool, highest invocation.Fence) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	e := fs.by[f.Key]
	if e == nil {
		fs.by[f.Key] = fs.order.PushBack(&fenceSeen{key: f.Key, gen: f.Generation})
		for fs.order.Len() > fs.max {
			delete(fs.by, fs.order.Remove(fs.order.Front()).(*fenceSeen).key)
		}
		return true, f
	}
	fs.order.MoveToBack(e) // seen, refused or not: a key in use stays
	seen := e.Value.(*fenceSeen)
	if f.Generation < seen.gen {
		return false, invocation.Fence{Key: f.Key, Generation: seen.gen}
	}
	seen.gen = f.Generation
	return true, f
}

// checkFence answers an invocation whose owner fence is malformed (400)
// or stale (409) and returns false; true lets it through (no fence, or a
// current one).
func (s *Sidecar) checkFence(w http.ResponseWriter, r *http.Request) bool {
	v := r.Header.Get(invocation.HeaderOwnerFence)
	if v == "" {
		return true
	}
	f, err := invocation.ParseFence(v)
	if err != nil {
		http.Error(w, "ziptrail: "+err.Error(), http.StatusBadRequest)
		return false
	}
	ok, highest := s.fences.admit(f)
	if ok {
		return true
	}
	staleOwnerRefused.Inc()
	w.Header().Set(invocation.HeaderStaleOwner, highest.String())
	http.Error(w, "ziptrail: stale owner: this invocation comes from the owner of engine checkpoint "+f.Key+" at generation "+
		strconv.FormatInt(f.Generation, 10)+", and this pod has seen the owner at generation "+strconv.FormatInt(highest.Generation, 10)+
		" since; the function did not run (the engine that sent it is superseded)", http.StatusConflict)
	return false
}
