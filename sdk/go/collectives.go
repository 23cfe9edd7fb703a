package ziptrail

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Collectives over Send/Recv (MPI-style). Every member calls the same
// collectives in the same order; each runs on its own reserved tag,
//
//	tag = -(seq<<3 | kind)
//
// where seq counts the group's collectives on this member (0, 1, ...)
// and kind is the collective (collBarrier ... collAlltoall), so
// consecutive collectives never take each other's messages, and user
// receives (AnyTag matches tags >= 0 only) never see them. The messages
// are frames (frame.go) shared with the Python SDK. A member whose part
// fails (a peer gone, its context ended, bad arguments, a user function's
// error) sends an abort to every other rank, so the ranks waiting on it
// fail too instead of waiting forever: a PeerGone anywhere ends the
// collective everywhere with ErrPeerGone naming the gone rank (a
// *PeerError); another failure ends it with that failure's kind, naming
// the member that failed.
//
// Algorithms: binomial trees for Barrier, Broadcast, Reduce and small
// Allreduce (log2 n rounds), a ring (reduce-scatter, then allgather) for
// Allreduce of arrays of at least ringThreshold bytes, pairwise exchange
// for Alltoall, and direct sends to or from the root for Scatter and
// Gather (the root's sidecar queues the messages of every rank at once).

const (
	collBarrier   = 1
	collBroadcast = 2
	collScatter   = 3
	collGather    = 4
	collReduce    = 5
	collAllreduce = 6
	collAlltoall  = 7
)

var collNames = [...]string{collBarrier: "barrier", collBroadcast: "broadcast", collScatter: "scatter", collGather: "gather",
	collReduce: "reduce", collAllreduce: "allreduce", collAlltoall: "alltoall"}

// ringThreshold: Allreduce of arrays from this size (bytes) uses the ring.
const ringThreshold = 64 << 10

// abortTimeout bounds the sends that tell the other ranks of a failure.
const abortTimeout = 10 * time.Second

// comm is what the collectives need of a group: Group over the sidecar,
// and an in-memory transport in the algorithm tests.
type comm interface {
	commRank() int
	commSize() int
	nextSeq() int64
	// csend sends one message (a frame of typ, hdr and data) to each of
	// dests in order, stopping at the first failure.
	csend(ctx context.Context, dests []int, tag int64, typ byte, hdr, data []byte) error
	// crecv receives the next message from rank from with tag tag.
	crecv(ctx context.Context, from int, tag int64) (typ byte, hdr []byte, m *Message, err error)
}

func (g *Group) commRank() int  { return g.rank }
func (g *Group) commSize() int  { return g.size }
func (g *Group) nextSeq() int64 { return g.seq.Add(1) - 1 }

// abortNote is an abort message's header (JSON). Gone: Rank is a gone
// peer; else Rank is the member that failed. Kind and Reason are the
// failure's (the Go SDK's; other SDKs leave them out).
type abortNote struct {
	Gone    bool   `json:"gone"`
	Rank    int    `json:"rank"`
	Message string `json:"message"`
	Kind    Kind   `json:"kind,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// abortError is a failure another member reported.
type abortError struct {
	from int // the member that told this one
	note abortNote
}

func (a *abortError) Error() string {
	if a.note.Gone {
		return fmt.Sprintf("rank %d is gone (%s)", a.note.Rank, a.note.Message)
	}
	return fmt.Sprintf("rank %d failed: %s", a.note.Rank, a.note.Message)
}

// coll is one collective in progress on one member.
type coll struct {
	c    comm
	op   string
	tag  int64
	rank int
	size int
}

// send sends a data message of element format f to each of dests.
func (x *coll) send(ctx context.Context, dests []int, f string, data []byte) error {
	return x.c.csend(ctx, dests, x.tag, frameData, []byte(f), data)
}

// recv receives a data message (its element format and data), or the
// error an abort message carries.
func (x *coll) recv(ctx context.Context, from int) (string, *Message, error) {
	typ, hdr, m, err := x.c.crecv(ctx, from, x.tag)
	if err != nil {
		return "", nil, err
	}
	if typ == frameAbort {
		m.Close()
		var n abortNote
		if err := json.Unmarshal(hdr, &n); err != nil {
			return "", nil, &Error{Kind: KindInternal, Op: x.op, Err: fmt.Errorf("rank %d aborted the %s (unreadable note: %v)", from, x.op, err)}
		}
		e := &Error{Kind: n.Kind, Op: x.op, Reason: n.Reason, Err: &PeerError{Rank: n.Rank, Err: &abortError{from: from, note: n}}}
		switch {
		case n.Gone:
			e.Kind, e.Reason = KindPeerGone, reasonPeerGone
		case e.Kind == "":
			e.Kind = KindInternal
		}
		return "", nil, e
	}
	return string(hdr), m, nil
}

// sendrecv sends data to rank to while receiving from rank from (so a
// ring or a pairwise exchange never waits on itself); the first failure
// ends both.
func (x *coll) sendrecv(ctx context.Context, to int, f string, data []byte, from int) (string, *Message, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		first error
	)
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
		cancel()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := x.send(ctx, []int{to}, f, data); err != nil {
			fail(err)
		}
	}()
	gf, m, err := x.recv(ctx, from)
	if err != nil {
		fail(err)
	}
	<-done
	if first != nil {
		m.Close()
		return "", nil, first
	}
	return gf, m, nil
}

// run runs one collective on this member: its tag, and on failure the
// aborts to the other ranks and an error naming the rank at fault.
func run(ctx context.Context, c comm, kind int, body func(ctx context.Context, x *coll) error) error {
	x := &coll{c: c, op: collNames[kind], tag: -(c.nextSeq()<<3 | int64(kind)), rank: c.commRank(), size: c.commSize()}
	err := body(ctx, x)
	if err == nil {
		return nil
	}
	e := collError(x, err)
	note := abortNote{Rank: x.rank, Message: fmt.Sprint(e.Err), Kind: e.Kind, Reason: e.Reason}
	var reported *abortError
	var pe *PeerError
	switch {
	case errors.As(e, &reported):
		note = reported.note // pass the original failure on
	case e.Kind == KindPeerGone && errors.As(e, &pe):
		note.Gone, note.Rank = true, pe.Rank
	default:
		// this member failed: name it
		if !errors.As(e, &pe) {
			e.Err = &PeerError{Rank: x.rank, Err: e.Err}
		}
	}
	if len(note.Message) > 512 {
		note.Message = note.Message[:512]
	}
	x.abort(ctx, note)
	return e
}

// collError makes err an *Error of the collective's operation.
func collError(x *coll, err error) *Error {
	var e *Error
	if !errors.As(err, &e) {
		kind := KindInternal
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			kind = KindTimeout
		}
		return &Error{Kind: kind, Op: x.op, Err: err}
	}
	return &Error{Kind: e.Kind, Op: x.op, Reason: e.Reason, Err: e.Err}
}

// abort tells every other rank (but a gone one) that this collective
// failed, so that none waits on this rank forever.
func (x *coll) abort(ctx context.Context, note abortNote) {
	hdr, _ := json.Marshal(note)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for r := range x.size {
		if r == x.rank || (note.Gone && r == note.Rank) {
			continue
		}
		wg.Go(func() { _ = x.c.csend(ctx, []int{r}, x.tag, frameAbort, hdr, nil) })
	}
	wg.Wait()
}

func checkRoot(root, size int) error {
	if root < 0 || root >= size {
		return &Error{Kind: KindInvalid, Err: fmt.Errorf("root %d outside the group's 0..%d", root, size-1)}
	}
	return nil
}

// --- barrier, broadcast, scatter, gather, alltoall ---

// Barrier returns once every member has entered it (a binomial-tree reduce
// of nothing to rank 0, then a broadcast back).
func (g *Group) Barrier(ctx context.Context) error { return barrier(ctx, g) }

func barrier(ctx context.Context, c comm) error {
	return run(ctx, c, collBarrier, func(ctx context.Context, x *coll) error {
		if err := treeReduce(ctx, x, 0, &bytesAcc{data: []byte{}}); err != nil {
			return err
		}
		_, m, err := treeBcast(ctx, x, 0, "", nil)
		m.Close()
		return err
	})
}

// Broadcast sends the root's data to every member (binomial tree); the
// other members' data is ignored. Every member gets the data as a Message
// (at the root: data itself; elsewhere a mapping when large), which it
// should Close.
func (g *Group) Broadcast(ctx context.Context, root int, data []byte) (*Message, error) {
	return broadcast(ctx, g, root, data)
}

func broadcast(ctx context.Context, c comm, root int, data []byte) (*Message, error) {
	var out *Message
	err := run(ctx, c, collBroadcast, func(ctx context.Context, x *coll) error {
		if err := checkRoot(root, x.size); err != nil {
			return err
		}
		var err error
		_, out, err = treeBcast(ctx, x, root, "", data)
		return err
	})
	return out, err
}

// treeBcast: binomial tree over ranks relative to root (relative rank v
// receives from v minus its lowest set bit, then sends to v+2^k for the
// lower bits k). The root returns a message wrapping data.
func treeBcast(ctx context.Context, x *coll, root int, f string, data []byte) (string, *Message, error) {
	n := x.size
	vr := (x.rank - root + n) % n
	var m *Message
	mask := 1
	for ; mask < n; mask <<= 1 {
		if vr&mask != 0 {
			var err error
			if f, m, err = x.recv(ctx, (vr-mask+root)%n); err != nil {
				return "", nil, err
			}
			data = m.Bytes()
			break
		}
	}
	if m == nil {
		m = localMessage(x.rank, data)
	}
	var children []int
	for mask >>= 1; mask > 0; mask >>= 1 {
		if vr+mask < n {
			children = append(children, (vr+mask+root)%n)
		}
	}
	if err := x.send(ctx, children, f, data); err != nil {
		m.Close()
		return "", nil, err
	}
	return f, m, nil
}

func localMessage(rank int, data []byte) *Message {
	if data == nil {
		data = []byte{}
	}
	return &Message{From: rank, data: data, Size: int64(len(data))}
}

// Scatter sends parts[i] of the root to rank i (the root passes Size()
// parts, the others nil) and returns this member's part (at the root:
// parts[root] itself), which it should Close.
func (g *Group) Scatter(ctx context.Context, root int, parts [][]byte) (*Message, error) {
	return scatter(ctx, g, root, parts)
}

func scatter(ctx context.Context, c comm, root int, parts [][]byte) (*Message, error) {
	var out *Message
	err := run(ctx, c, collScatter, func(ctx context.Context, x *coll) error {
		if err := checkRoot(root, x.size); err != nil {
			return err
		}
		if x.rank != root {
			var err error
			_, out, err = x.recv(ctx, root)
			return err
		}
		if len(parts) != x.size {
			return &Error{Kind: KindInvalid, Err: fmt.Errorf("the root scatters %d parts to %d ranks", len(parts), x.size)}
		}
		for to := range x.size {
			if to != root {
				if err := x.send(ctx, []int{to}, "", parts[to]); err != nil {
					return err
				}
			}
		}
		out = localMessage(root, parts[root])
		return nil
	})
	return out, err
}

// Gather collects every member's data at the root, which gets them in
// rank order (its own is data itself); the others get nil. Close the
// messages when done.
func (g *Group) Gather(ctx context.Context, root int, data []byte) ([]*Message, error) {
	return gather(ctx, g, root, data)
}

func gather(ctx context.Context, c comm, root int, data []byte) ([]*Message, error) {
	var out []*Message
	err := run(ctx, c, collGather, func(ctx context.Context, x *coll) error {
		if err := checkRoot(root, x.size); err != nil {
			return err
		}
		if x.rank != root {
			return x.send(ctx, []int{root}, "", data)
		}
		out = make([]*Message, x.size)
		for from := range x.size {
			if from == root {
				out[from] = localMessage(root, data)
				continue
			}
			_, m, err := x.recv(ctx, from)
			if err != nil {
				closeAll(out)
				out = nil
				return err
			}
			out[from] = m
		}
		return nil
	})
	return out, err
}

// Alltoall sends parts[i] to rank i and returns what every rank sent this
// one, in rank order (pairwise exchange: in round s, rank r sends to r+s
// and receives from r-s). Each member passes Size() parts; its own part
// comes back as itself. Close the messages when done.
func (g *Group) Alltoall(ctx context.Context, parts [][]byte) ([]*Message, error) {
	return alltoall(ctx, g, parts)
}

func alltoall(ctx context.Context, c comm, parts [][]byte) ([]*Message, error) {
	var out []*Message
	err := run(ctx, c, collAlltoall, func(ctx context.Context, x *coll) error {
		if len(parts) != x.size {
			return &Error{Kind: KindInvalid, Err: fmt.Errorf("alltoall of %d parts among %d ranks", len(parts), x.size)}
		}
		out = make([]*Message, x.size)
		out[x.rank] = localMessage(x.rank, parts[x.rank])
		for s := 1; s < x.size; s++ {
			to, from := (x.rank+s)%x.size, (x.rank-s+x.size)%x.size
			_, m, err := x.sendrecv(ctx, to, "", parts[to], from)
			if err != nil {
				closeAll(out)
				out = nil
				return err
			}
			out[from] = m
		}
		return nil
	})
	return out, err
}

func closeAll(ms []*Message) {
	for _, m := range ms {
		m.Close()
	}
}
