package ziptrail

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
)

// Collectives over Send/Recv (MPI-style). Every member calls the same
// collectives in the same order; each runs on its own reserved tag,
//
//	tag = -(seq<<4 | kind)
//
// where seq counts the group's collectives on this member (1, 2, ...)
// and kind is the collective (collBarrier ... collAlltoall), so
// consecutive collectives never take each other's messages, and user
// receives (AnyTag matches tags >= 0 only) never see them. Every message
// starts with one byte: 0 data (the rest is the payload), 1 abort (the
// rest is a JSON abortNote). A member whose part fails (a peer gone, its
// context ended, bad arguments) sends an abort to every other rank, so the
// ranks waiting on it fail too instead of waiting forever: a PeerGone
// anywhere ends the collective everywhere with ErrPeerGone naming the
// rank (a *PeerError).
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

const (
	hdrData  byte = 0
	hdrAbort byte = 1
)

// comm is what the collectives need of a group: Group over the sidecar,
// and an in-memory transport in the algorithm tests.
type comm interface {
	commRank() int
	commSize() int
	nextSeq() int64
	// csend sends the concatenation of parts to rank to.
	csend(ctx context.Context, to int, tag int64, parts ...[]byte) error
	// crecv receives the next message from rank from with tag tag.
	crecv(ctx context.Context, from int, tag int64) (*Message, error)
}

func (g *Group) commRank() int  { return g.rank }
func (g *Group) commSize() int  { return g.size }
func (g *Group) nextSeq() int64 { return g.seq.Add(1) }
func (g *Group) csend(ctx context.Context, to int, tag int64, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	var payload *sidecarv1.Payload
	if n <= g.c.api.InlineThreshold {
		b := make([]byte, 0, n)
		for _, p := range parts {
			b = append(b, p...)
		}
		payload = &sidecarv1.Payload{Source: &sidecarv1.Payload_Inline{Inline: b}}
	} else {
		path, err := writeParts(g.c.api.Dir, parts...)
		if err != nil {
			return &Error{Kind: KindInternal, Op: "send", Err: fmt.Errorf("write to the shared-memory directory: %w", err)}
		}
		payload = &sidecarv1.Payload{Source: &sidecarv1.Payload_Path{Path: path}}
	}
	return g.send(ctx, "send", to, tag, payload)
}

func (g *Group) crecv(ctx context.Context, from int, tag int64) (*Message, error) {
	return g.recv(ctx, "recv", from, tag, false)
}

// abortNote is an abort message's body.
type abortNote struct {
	From   int    `json:"from"`   // the rank that failed
	Rank   int    `json:"rank"`   // the rank the error names (the gone peer for PeerGone)
	Kind   Kind   `json:"kind"`   // its error kind
	Reason string `json:"reason"` // and reason, if any
	Error  string `json:"error"`
}

// coll is one collective in progress on one member.
type coll struct {
	c    comm
	op   string
	tag  int64
	rank int
	size int
}

// send sends a data message.
func (x *coll) send(ctx context.Context, to int, parts ...[]byte) error {
	return x.c.csend(ctx, to, x.tag, append([][]byte{{hdrData}}, parts...)...)
}

// recv receives a data message (its payload without the header), or the
// error an abort message carries.
func (x *coll) recv(ctx context.Context, from int) (*Message, error) {
	m, err := x.c.crecv(ctx, from, x.tag)
	if err != nil {
		return nil, err
	}
	b := m.Bytes()
	if len(b) == 0 || (b[0] != hdrData && b[0] != hdrAbort) {
		m.Close()
		return nil, &Error{Kind: KindInternal, Op: x.op, Err: fmt.Errorf("rank %d sent a malformed %s message", from, x.op)}
	}
	if b[0] == hdrAbort {
		var n abortNote
		err := json.Unmarshal(b[1:], &n)
		m.Close()
		if err != nil {
			return nil, &Error{Kind: KindInternal, Op: x.op, Err: fmt.Errorf("rank %d aborted the %s (unreadable note: %v)", from, x.op, err)}
		}
		return nil, &Error{Kind: n.Kind, Op: x.op, Reason: n.Reason, Err: &PeerError{Rank: n.Rank, Err: &abortError{note: n}}}
	}
	m.data = b[1:]
	m.Size = int64(len(m.data))
	m.Tag = 0
	return m, nil
}

// abortError is a failure another rank reported.
type abortError struct{ note abortNote }

func (a *abortError) Error() string {
	return fmt.Sprintf("aborted by rank %d: %s", a.note.From, a.note.Error)
}

// sendrecv sends parts to rank to while receiving from rank from (so a
// ring or a pairwise exchange never waits on itself); the first failure
// ends both.
func (x *coll) sendrecv(ctx context.Context, to int, parts [][]byte, from int) (*Message, error) {
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
		if err := x.send(ctx, to, parts...); err != nil {
			fail(err)
		}
	}()
	m, err := x.recv(ctx, from)
	if err != nil {
		fail(err)
	}
	<-done
	if first != nil {
		m.Close()
		return nil, first
	}
	return m, nil
}

// run runs one collective on this member: its tag, and on failure the
// aborts to the other ranks and an error naming the rank at fault.
func run(ctx context.Context, c comm, kind int, body func(ctx context.Context, x *coll) error) error {
	x := &coll{c: c, op: collNames[kind], tag: -(c.nextSeq()<<4 | int64(kind)), rank: c.commRank(), size: c.commSize()}
	err := body(ctx, x)
	if err == nil {
		return nil
	}
	err = collError(x, err)
	var e *Error
	errors.As(err, &e)
	var pe *PeerError
	named := x.rank
	if errors.As(err, &pe) {
		named = pe.Rank
	}
	note := abortNote{From: x.rank, Rank: named, Kind: e.Kind, Reason: e.Reason, Error: fmt.Sprint(e.Err)}
	var reported *abortError
	if errors.As(err, &reported) {
		note = reported.note // pass the original failure on
	}
	x.abort(ctx, note)
	return err
}

// collError makes err an *Error of the collective's operation.
func collError(x *coll, err error) error {
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
	body, _ := json.Marshal(note)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for r := range x.size {
		if r == x.rank || (note.Kind == KindPeerGone && r == note.Rank) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = x.c.csend(ctx, r, x.tag, []byte{hdrAbort}, body)
		}()
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
		m, err := treeBcast(ctx, x, 0, nil)
		m.Close()
		return err
	})
}

// Broadcast sends the root's data to every member (binomial tree); the
// other members' data is ignored. Every member gets the data as a
// Message (at the root: data itself), which it should Close.
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
		out, err = treeBcast(ctx, x, root, data)
		return err
	})
	return out, err
}

// treeBcast: binomial tree over ranks relative to root. The root returns
// a message wrapping data.
func treeBcast(ctx context.Context, x *coll, root int, data []byte) (*Message, error) {
	n := x.size
	vr := (x.rank - root + n) % n
	var m *Message
	mask := 1
	for ; mask < n; mask <<= 1 {
		if vr&mask != 0 {
			var err error
			if m, err = x.recv(ctx, (vr-mask+root)%n); err != nil {
				return nil, err
			}
			data = m.Bytes()
			break
		}
	}
	if m == nil {
		m = localMessage(x.rank, data)
	}
	for mask >>= 1; mask > 0; mask >>= 1 {
		if vr+mask < n {
			if err := x.send(ctx, (vr+mask+root)%n, data); err != nil {
				m.Close()
				return nil, err
			}
		}
	}
	return m, nil
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
			out, err = x.recv(ctx, root)
			return err
		}
		if len(parts) != x.size {
			return &Error{Kind: KindInvalid, Err: fmt.Errorf("the root scatters %d parts to %d ranks", len(parts), x.size)}
		}
		for i := 1; i < x.size; i++ {
			to := (root + i) % x.size
			if err := x.send(ctx, to, parts[to]); err != nil {
				return err
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
			return x.send(ctx, root, data)
		}
		out = make([]*Message, x.size)
		for i := 1; i < x.size; i++ {
			from := (root + i) % x.size
			m, err := x.recv(ctx, from)
			if err != nil {
				closeAll(out)
				out = nil
				return err
			}
			out[from] = m
		}
		out[root] = localMessage(root, data)
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
			m, err := x.sendrecv(ctx, to, [][]byte{parts[to]}, from)
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

// --- reductions ---

// acc is a reduction's running value on one member.
type acc interface {
	encode() [][]byte
	absorb(from int, in []byte) error // acc = acc op in
}

// treeReduce combines every member's value at root (binomial tree: in
// round k, relative rank v receives from v+2^k and sends to v-2^k when
// its bit k is set). Values combine in relative rank order.
func treeReduce(ctx context.Context, x *coll, root int, a acc) error {
	n := x.size
	vr := (x.rank - root + n) % n
	for mask := 1; mask < n; mask <<= 1 {
		if vr&mask != 0 {
			return x.send(ctx, (vr-mask+root)%n, a.encode()...)
		}
		if src := vr | mask; src < n {
			from := (src + root) % n
			m, err := x.recv(ctx, from)
			if err != nil {
				return err
			}
			err = a.absorb(from, m.Bytes())
			m.Close()
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// bytesAcc reduces opaque bytes with a user function.
type bytesAcc struct {
	data []byte
	f    func(a, b []byte) ([]byte, error)
}

func (b *bytesAcc) encode() [][]byte { return [][]byte{b.data} }

func (b *bytesAcc) absorb(from int, in []byte) error {
	if b.f == nil {
		return nil // barrier
	}
	out, err := b.f(b.data, in)
	if err != nil {
		return &Error{Kind: KindInvalid, Err: &PeerError{Rank: from, Err: fmt.Errorf("reduce function: %w", err)}}
	}
	b.data = out
	return nil
}

// ReduceBytes combines every member's data with f at the root, which gets
// the result (the others get nil). f must be associative and commutative;
// it may return one of its arguments, and must not keep them (a received
// one may be a mapping that goes away).
func (g *Group) ReduceBytes(ctx context.Context, root int, data []byte, f func(a, b []byte) ([]byte, error)) ([]byte, error) {
	return reduceBytes(ctx, g, root, data, f)
}

func reduceBytes(ctx context.Context, c comm, root int, data []byte, f func(a, b []byte) ([]byte, error)) ([]byte, error) {
	var out []byte
	err := run(ctx, c, collReduce, func(ctx context.Context, x *coll) error {
		if err := checkRoot(root, x.size); err != nil {
			return err
		}
		a := &bytesAcc{data: data, f: copying(f)}
		if err := treeReduce(ctx, x, root, a); err != nil {
			return err
		}
		if x.rank == root {
			out = a.data
		}
		return nil
	})
	return out, err
}

// copying makes sure a user function's result never aliases a received
// (mapped) argument, which is unmapped after the call.
func copying(f func(a, b []byte) ([]byte, error)) func(a, b []byte) ([]byte, error) {
	return func(a, b []byte) ([]byte, error) {
		out, err := f(a, b)
		if err != nil {
			return nil, err
		}
		if len(out) > 0 && len(b) > 0 && &out[0] == &b[0] {
			out = append([]byte(nil), out...)
		}
		return out, nil
	}
}

// AllreduceBytes combines every member's data with f and gives every
// member the result (a tree reduce to rank 0, then a broadcast). See
// ReduceBytes for f.
func (g *Group) AllreduceBytes(ctx context.Context, data []byte, f func(a, b []byte) ([]byte, error)) ([]byte, error) {
	return allreduceBytes(ctx, g, data, f)
}

func allreduceBytes(ctx context.Context, c comm, data []byte, f func(a, b []byte) ([]byte, error)) ([]byte, error) {
	var out []byte
	err := run(ctx, c, collAllreduce, func(ctx context.Context, x *coll) error {
		a := &bytesAcc{data: data, f: copying(f)}
		if err := treeReduce(ctx, x, 0, a); err != nil {
			return err
		}
		m, err := treeBcast(ctx, x, 0, a.data)
		if err != nil {
			return err
		}
		out = append([]byte{}, m.Bytes()...)
		return m.Close()
	})
	return out, err
}

// Number is the element type of the typed reductions.
type Number interface{ int64 | float64 }

// Op combines two arrays of equal length element by element into dst:
// dst[i] = dst[i] op src[i]. It must be associative and commutative (the
// collectives combine in tree or ring order). Sum, Min and Max are
// built-in; any such function works as well.
type Op[T Number] func(dst, src []T)

// Sum adds src to dst element-wise.
func Sum[T Number](dst, src []T) {
	for i, v := range src {
		dst[i] += v
	}
}

// Min keeps the smaller element of dst and src.
func Min[T Number](dst, src []T) {
	for i, v := range src {
		dst[i] = min(dst[i], v)
	}
}

// Max keeps the larger element of dst and src.
func Max[T Number](dst, src []T) {
	for i, v := range src {
		dst[i] = max(dst[i], v)
	}
}

// Reduce combines every member's array with op at the root, which gets the
// result; the others get nil. Every member passes an array of the same
// length; data is not modified. Example:
//
//	total, err := ziptrail.Reduce(ctx, g, 0, counts, ziptrail.Sum)
func Reduce[T Number](ctx context.Context, g *Group, root int, data []T, op Op[T]) ([]T, error) {
	return reduce(ctx, g, root, data, op)
}

func reduce[T Number](ctx context.Context, c comm, root int, data []T, op Op[T]) ([]T, error) {
	var out []T
	err := run(ctx, c, collReduce, func(ctx context.Context, x *coll) error {
		if err := checkRoot(root, x.size); err != nil {
			return err
		}
		a := &arrayAcc[T]{data: append([]T{}, data...), op: op}
		if err := treeReduce(ctx, x, root, a); err != nil {
			return err
		}
		if x.rank == root {
			out = a.data
		}
		return nil
	})
	return out, err
}

// Allreduce combines every member's array with op and gives every member
// the result (the same bits everywhere). Arrays of at least 64 KiB go
// round a ring (reduce-scatter, then allgather: each member sends about
// twice its array in total, whatever the group's size); smaller ones up a
// binomial tree to rank 0 and back down. Every member passes an array of
// the same length; data is not modified.
func Allreduce[T Number](ctx context.Context, g *Group, data []T, op Op[T]) ([]T, error) {
	return allreduce(ctx, g, data, op)
}

func allreduce[T Number](ctx context.Context, c comm, data []T, op Op[T]) ([]T, error) {
	var out []T
	err := run(ctx, c, collAllreduce, func(ctx context.Context, x *coll) error {
		a := &arrayAcc[T]{data: append([]T{}, data...), op: op}
		if x.size > 1 && len(data)*8 >= ringThreshold {
			if err := ringAllreduce(ctx, x, a); err != nil {
				return err
			}
			out = a.data
			return nil
		}
		if err := treeReduce(ctx, x, 0, a); err != nil {
			return err
		}
		var payload []byte
		if x.rank == 0 {
			payload = encodeArray(a.data)
		}
		m, err := treeBcast(ctx, x, 0, payload)
		if err != nil {
			return err
		}
		defer m.Close()
		out, err = decodeArray[T](m.Bytes())
		if err == nil && len(out) != len(data) {
			err = &Error{Kind: KindInvalid, Err: &PeerError{Rank: 0, Err: fmt.Errorf("allreduce result of %d elements, this rank passed %d", len(out), len(data))}}
		}
		return err
	})
	return out, err
}

// ringAllreduce: n-1 steps of reduce-scatter (in step s, rank r sends its
// partial segment r-s to r+1 and adds segment r-s-1 from r-1 into its
// own), after which rank r holds the whole reduction of segment r+1; then
// n-1 steps of allgather pass the finished segments round. Every message
// starts with the sender's array length (8 bytes), so members that passed
// arrays of different lengths fail instead of mixing them.
func ringAllreduce[T Number](ctx context.Context, x *coll, a *arrayAcc[T]) error {
	n, r := x.size, x.rank
	total := len(a.data)
	seg := func(i int) []T { return a.data[i*total/n : (i+1)*total/n] }
	right, left := (r+1)%n, (r-1+n)%n
	var lenHdr [8]byte
	binary.LittleEndian.PutUint64(lenHdr[:], uint64(total))
	step := func(send, recv int, combine bool) error {
		m, err := x.sendrecv(ctx, right, [][]byte{lenHdr[:], encodeArray(seg(send))}, left)
		if err != nil {
			return err
		}
		defer m.Close()
		b := m.Bytes()
		if len(b) < 8 || binary.LittleEndian.Uint64(b) != uint64(total) {
			return &Error{Kind: KindInvalid, Err: &PeerError{Rank: left, Err: fmt.Errorf("allreduce arrays differ in length (this rank's has %d elements)", total)}}
		}
		dst := seg(recv)
		in, err := decodeArray[T](b[8:])
		if err != nil || len(in) != len(dst) {
			return &Error{Kind: KindInvalid, Err: &PeerError{Rank: left, Err: fmt.Errorf("allreduce segment of %d bytes, want %d elements", len(b)-8, len(dst))}}
		}
		if combine {
			a.op(dst, in)
		} else {
			copy(dst, in)
		}
		return nil
	}
	for s := 0; s < n-1; s++ {
		if err := step((r-s+n)%n, (r-s-1+2*n)%n, true); err != nil {
			return err
		}
	}
	for s := 0; s < n-1; s++ {
		if err := step((r+1-s+n)%n, (r-s+n)%n, false); err != nil {
			return err
		}
	}
	return nil
}

// arrayAcc reduces arrays element-wise.
type arrayAcc[T Number] struct {
	data []T
	op   Op[T]
}

func (a *arrayAcc[T]) encode() [][]byte { return [][]byte{encodeArray(a.data)} }

func (a *arrayAcc[T]) absorb(from int, in []byte) error {
	v, err := decodeArray[T](in)
	if err == nil && len(v) != len(a.data) {
		err = fmt.Errorf("rank %d passed %d elements, this rank %d", from, len(v), len(a.data))
	}
	if err != nil {
		return &Error{Kind: KindInvalid, Err: &PeerError{Rank: from, Err: err}}
	}
	a.op(a.data, v)
	return nil
}

// encodeArray: 8 bytes per element, little-endian (IEEE 754 for float64).
func encodeArray[T Number](s []T) []byte {
	b := make([]byte, 8*len(s))
	switch v := any(s).(type) {
	case []float64:
		for i, f := range v {
			binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(f))
		}
	case []int64:
		for i, n := range v {
			binary.LittleEndian.PutUint64(b[8*i:], uint64(n))
		}
	}
	return b
}

func decodeArray[T Number](b []byte) ([]T, error) {
	if len(b)%8 != 0 {
		return nil, fmt.Errorf("array of %d bytes (not a multiple of 8)", len(b))
	}
	out := make([]T, len(b)/8)
	switch v := any(out).(type) {
	case []float64:
		for i := range v {
			v[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
		}
	case []int64:
		for i := range v {
			v[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
		}
	}
	return out, nil
}
