package ziptrail

import (
	"math/bits"
	"sync"

	"github.com/ziptrail/ziptrail/internal/dataplane/directmsg"
)

// Recycled receive buffers (WithRecycledBuffers): a message from a
// same-node direct channel of minRecycled bytes up to directmsg.CopyMax is
// copied into a buffer Message.Close gives back, so that a member
// receiving many such messages does not allocate one each time; the
// allocations, and the garbage collections they cause, are what a
// receiver spent most on at these sizes (docs/bench/history/messaging.md,
// "The 64 MB slow mode was a leak; copies between mappings; recycled
// buffers").

const (
	// minRecycled is the smallest message put in a recycled buffer.
	minRecycled = 16 << 10
	// maxRecycledOut bounds the bytes of recycled buffers handed out and
	// not given back: past it (messages never closed), received messages
	// get buffers of their own again, which the garbage collector frees.
	maxRecycledOut = 64 << 20
	// recycledKeep is how many free buffers of each size class are kept.
	recycledKeep = 4
)

// nClasses: one size class per power of two from minRecycled to CopyMax.
var nClasses = bits.Len(uint(directmsg.CopyMax)) - bits.Len(uint(minRecycled)) + 1

// recycler is one member's recycled buffers.
type recycler struct {
	mu   sync.Mutex
	free [][][]byte // by size class
	out  int        // bytes handed out and not given back
}

func newRecycler() *recycler { return &recycler{free: make([][][]byte, nClasses)} }

// class is the size class of a message of n bytes (n in
// [minRecycled, CopyMax]) and its buffers' size.
func class(n int) (int, int) {
	c := bits.Len(uint(n-1)) - bits.Len(uint(minRecycled-1))
	return c, minRecycled << c
}

// get is directmsg.Conn.Alloc: a buffer for a received message with a
// user tag (the collectives' own messages, negative tags, may end up in
// the caller's hands: they keep buffers of their own), nil otherwise.
func (r *recycler) get(tag int64, n int) []byte {
	if tag < 0 || n < minRecycled || n > directmsg.CopyMax {
		return nil
	}
	c, size := class(n)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.out+size > maxRecycledOut {
		return nil
	}
	r.out += size
	if k := len(r.free[c]); k > 0 {
		b := r.free[c][k-1]
		r.free[c] = r.free[c][:k-1]
		return b[:n]
	}
	return make([]byte, n, size)
}

// put gives a buffer get handed out back.
func (r *recycler) put(b []byte) {
	c, size := class(cap(b))
	r.mu.Lock()
	defer r.mu.Unlock()
	r.out -= size
	if len(r.free[c]) < recycledKeep {
		r.free[c] = append(r.free[c], b[:size])
	}
}
