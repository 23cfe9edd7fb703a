package ziptrail

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The collectives' algorithms over an in-memory transport with the
// sidecar's semantics (per-sender order, exact tag match, PeerGone for a
// gone peer once nothing matching is queued): every collective for every
// group size 1..9 and every root, checked against a direct computation.
// The same collectives run against real sidecars in group_test.go.

// memNet is the in-memory network of one group.
type memNet struct {
	mu      sync.Mutex
	size    int
	queues  map[memKey][][]byte
	gone    []bool
	changed chan struct{} // closed and replaced on every change
	sends   []int         // data messages sent per rank
}

type memKey struct {
	to, from int
	tag      int64
}

func newMemNet(size int) *memNet {
	return &memNet{size: size, queues: map[memKey][][]byte{}, gone: make([]bool, size), changed: make(chan struct{}), sends: make([]int, size)}
}

func (n *memNet) notify() {
	close(n.changed)
	n.changed = make(chan struct{})
}

// kill makes rank r gone, as a SIGKILLed pod: its queued messages stay
// deliverable, new ones to it fail.
func (n *memNet) kill(r int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.gone[r] = true
	n.notify()
}

// memComm is one member's end.
type memComm struct {
	net  *memNet
	rank int
	seq  int64
	// dieAfter: the member dies (kill) when it is about to make its
	// dieAfter+1-th send; -1 never. A dead member sends nothing more.
	dieAfter int
	dead     bool
}

var errKilled = errors.New("killed")

func (c *memComm) commRank() int  { return c.rank }
func (c *memComm) commSize() int  { return c.net.size }
func (c *memComm) nextSeq() int64 { c.seq++; return c.seq - 1 }

// csend queues the message as the Group would send it inline (a frame), so
// that the framing is exercised too.
func (c *memComm) csend(ctx context.Context, dests []int, tag int64, typ byte, hdr, data []byte) error {
	n := c.net
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, to := range dests {
		if c.dead || n.gone[c.rank] {
			c.dead = true
			return errKilled
		}
		if c.dieAfter >= 0 && n.sends[c.rank] >= c.dieAfter {
			c.dead = true
			n.gone[c.rank] = true
			n.notify()
			return errKilled
		}
		if n.gone[to] {
			return &Error{Kind: KindPeerGone, Op: "send", Reason: reasonPeerGone, Err: &PeerError{Rank: to, Err: errors.New("peer gone")}}
		}
		n.sends[c.rank]++
		k := memKey{to, c.rank, tag}
		n.queues[k] = append(n.queues[k], inlineFrame(typ, hdr, data))
		n.notify()
	}
	return nil
}

func (c *memComm) crecv(ctx context.Context, from int, tag int64) (byte, []byte, *Message, error) {
	n := c.net
	k := memKey{c.rank, from, tag}
	for {
		n.mu.Lock()
		if c.dead {
			n.mu.Unlock()
			return 0, nil, nil, errKilled
		}
		if q := n.queues[k]; len(q) > 0 {
			n.queues[k] = q[1:]
			n.mu.Unlock()
			typ, hdr, data, err := parseInline(q[0])
			if err != nil {
				return 0, nil, nil, err
			}
			return typ, hdr, &Message{From: from, data: data, Size: int64(len(data))}, nil
		}
		if n.gone[from] {
			n.mu.Unlock()
			return 0, nil, nil, &Error{Kind: KindPeerGone, Op: "recv", Reason: reasonPeerGone, Err: &PeerError{Rank: from, Err: errors.New("peer gone")}}
		}
		ch := n.changed
		n.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, nil, nil, &Error{Kind: KindTimeout, Op: "recv", Err: ctx.Err()}
		}
	}
}

// leftovers counts queued messages no one received.
func (n *memNet) leftovers() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := 0
	for _, q := range n.queues {
		c += len(q)
	}
	return c
}

// onMembers runs f as every member of a new group of size n, concurrently,
// and returns their errors. A member that does not return within a minute
// counts as hung (a deadlock), not as slow.
func onMembers(t *testing.T, n int, dieRank, dieAfter int, f func(ctx context.Context, c *memComm) error) (*memNet, []error) {
	t.Helper()
	net := newMemNet(n)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		c := &memComm{net: net, rank: r, dieAfter: -1}
		if r == dieRank {
			c.dieAfter = dieAfter
		}
		wg.Go(func() { errs[r] = f(ctx, c) })
	}
	wg.Wait()
	for r, err := range errs {
		if r != dieRank && IsKind(err, KindTimeout) {
			t.Fatalf("size %d: rank %d hung (a deadlock): %v", n, r, err)
		}
	}
	return net, errs
}

func payload(r, size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(r*31 + i)
	}
	return b
}

func checkAll(t *testing.T, what string, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%s: rank %d: %v", what, r, err)
		}
	}
}

func TestCollectiveBroadcastScatterGather(t *testing.T) {
	for n := 1; n <= 9; n++ {
		for root := range n {
			what := fmt.Sprintf("size %d root %d", n, root)
			net, errs := onMembers(t, n, -1, 0, func(ctx context.Context, c *memComm) error {
				// broadcast
				var in []byte
				if c.rank == root {
					in = payload(100+root, 1000+root)
				}
				m, err := broadcast(ctx, c, root, in)
				if err != nil {
					return err
				}
				if !bytes.Equal(m.Bytes(), payload(100+root, 1000+root)) {
					return fmt.Errorf("broadcast: got %d bytes, not the root's", len(m.Bytes()))
				}
				// scatter
				var parts [][]byte
				if c.rank == root {
					for i := range n {
						parts = append(parts, payload(i, 10+i))
					}
				}
				m, err = scatter(ctx, c, root, parts)
				if err != nil {
					return err
				}
				if !bytes.Equal(m.Bytes(), payload(c.rank, 10+c.rank)) {
					return fmt.Errorf("scatter: got %v", m.Bytes())
				}
				// gather
				ms, err := gather(ctx, c, root, payload(c.rank, 5+c.rank))
				if err != nil {
					return err
				}
				if c.rank != root {
					if ms != nil {
						return errors.New("gather: a non-root got messages")
					}
					return nil
				}
				for i, m := range ms {
					if !bytes.Equal(m.Bytes(), payload(i, 5+i)) {
						return fmt.Errorf("gather: part %d is %v", i, m.Bytes())
					}
				}
				return nil
			})
			checkAll(t, what, errs)
			if l := net.leftovers(); l != 0 {
				t.Fatalf("%s: %d messages left unreceived", what, l)
			}
		}
	}
}

func TestCollectiveBarrierAlltoall(t *testing.T) {
	for n := 1; n <= 9; n++ {
		// Barrier: no member leaves it before every member entered it.
		var mu sync.Mutex
		entered := 0
		net, errs := onMembers(t, n, -1, 0, func(ctx context.Context, c *memComm) error {
			for round := 1; round <= 3; round++ {
				mu.Lock()
				entered++
				mu.Unlock()
				if err := barrier(ctx, c); err != nil {
					return err
				}
				mu.Lock()
				e := entered
				mu.Unlock()
				if e < round*n {
					return fmt.Errorf("left barrier %d after only %d entries", round, e)
				}
			}
			parts := make([][]byte, n)
			for j := range n {
				parts[j] = []byte(fmt.Sprintf("%d->%d", c.rank, j))
			}
			ms, err := alltoall(ctx, c, parts)
			if err != nil {
				return err
			}
			for i, m := range ms {
				if want := fmt.Sprintf("%d->%d", i, c.rank); string(m.Bytes()) != want {
					return fmt.Errorf("alltoall: from %d got %q, want %q", i, m.Bytes(), want)
				}
			}
			return nil
		})
		checkAll(t, fmt.Sprintf("size %d", n), errs)
		if l := net.leftovers(); l != 0 {
			t.Fatalf("size %d: %d messages left unreceived", n, l)
		}
	}
}

// contribution is rank r's array: integers, so float sums are exact.
func contribution[T Number](r, length int) []T {
	out := make([]T, length)
	for i := range out {
		out[i] = T((r*7919 + i*104729) % 1000003)
		if (r+i)%3 == 0 {
			out[i] = -out[i]
		}
	}
	return out
}

func direct[T Number](n, length int, op Op[T]) []T {
	acc := contribution[T](0, length)
	for r := 1; r < n; r++ {
		op(acc, contribution[T](r, length))
	}
	return acc
}

func testReductions[T Number](t *testing.T, name string) {
	ops := map[string]Op[T]{"sum": Sum[T], "min": Min[T], "max": Max[T],
		// a user function: the sum of absolute values (associative and
		// commutative, as the collectives need)
		"user": func(dst, src []T) {
			for i := range dst {
				a, b := dst[i], src[i]
				if a < 0 {
					a = -a
				}
				if b < 0 {
					b = -b
				}
				dst[i] = a + b
			}
		}}
	// 100 elements go up and down the tree, 10000 (80 KB) round the ring;
	// 10001 does not divide among the members evenly.
	for _, length := range []int{0, 1, 100, 10000, 10001} {
		for opName, op := range ops {
			for n := 1; n <= 9; n++ {
				want := direct(n, length, op)
				for root := range n {
					what := fmt.Sprintf("%s %s length %d size %d root %d", name, opName, length, n, root)
					net, errs := onMembers(t, n, -1, 0, func(ctx context.Context, c *memComm) error {
						in := contribution[T](c.rank, length)
						orig := slices.Clone(in)
						got, err := reduce(ctx, c, root, in, op)
						if err != nil {
							return err
						}
						if c.rank == root && !slices.Equal(got, want) {
							return fmt.Errorf("reduce differs from the direct computation")
						}
						if c.rank != root && got != nil {
							return fmt.Errorf("reduce: a non-root got a result")
						}
						if root == 0 || length == 10001 { // allreduce once per size
							got, err = allreduce(ctx, c, in, op)
							if err != nil {
								return err
							}
							if !slices.Equal(got, want) {
								return fmt.Errorf("allreduce differs from the direct computation")
							}
						}
						if !slices.Equal(in, orig) {
							return fmt.Errorf("the input was modified")
						}
						return nil
					})
					checkAll(t, what, errs)
					if l := net.leftovers(); l != 0 {
						t.Fatalf("%s: %d messages left unreceived", what, l)
					}
				}
			}
		}
	}
}

func TestCollectiveReduceInt64(t *testing.T)   { testReductions[int64](t, "int64") }
func TestCollectiveReduceFloat64(t *testing.T) { testReductions[float64](t, "float64") }

// Float sums of non-integers differ with the order of the additions; every
// member still gets the same bits (each segment is summed once, then
// copied round).
func TestCollectiveAllreduceSameBitsEverywhere(t *testing.T) {
	for _, length := range []int{50, 20000} {
		for n := 2; n <= 9; n++ {
			results := make([][]float64, n)
			_, errs := onMembers(t, n, -1, 0, func(ctx context.Context, c *memComm) error {
				rng := rand.New(rand.NewPCG(uint64(c.rank), 1))
				in := make([]float64, length)
				for i := range in {
					in[i] = rng.NormFloat64() * 1e6
				}
				var err error
				results[c.rank], err = allreduce(ctx, c, in, Sum)
				return err
			})
			checkAll(t, fmt.Sprintf("length %d size %d", length, n), errs)
			for r := 1; r < n; r++ {
				if !slices.Equal(results[r], results[0]) {
					t.Fatalf("length %d size %d: rank %d's sum differs from rank 0's", length, n, r)
				}
			}
		}
	}
}

func TestCollectiveBytesReduce(t *testing.T) {
	// concatenation sorted by content: associative and commutative
	f := func(a, b []byte) ([]byte, error) {
		parts := append(bytes.Split(a, []byte{','}), bytes.Split(b, []byte{','})...)
		slices.SortFunc(parts, bytes.Compare)
		return bytes.Join(parts, []byte{','}), nil
	}
	for n := 1; n <= 9; n++ {
		var all []string
		for r := range n {
			all = append(all, fmt.Sprintf("r%d", r))
		}
		slices.Sort(all)
		want := []byte(strings.Join(all, ","))
		for root := range n {
			_, errs := onMembers(t, n, -1, 0, func(ctx context.Context, c *memComm) error {
				mine := []byte(fmt.Sprintf("r%d", c.rank))
				got, err := reduceBytes(ctx, c, root, mine, f)
				if err != nil {
					return err
				}
				if c.rank == root && !bytes.Equal(got, want) {
					return fmt.Errorf("reduce: %q, want %q", got, want)
				}
				got, err = allreduceBytes(ctx, c, mine, f)
				if err != nil {
					return err
				}
				if !bytes.Equal(got, want) {
					return fmt.Errorf("allreduce: %q, want %q", got, want)
				}
				return nil
			})
			checkAll(t, fmt.Sprintf("size %d root %d", n, root), errs)
		}
	}
	// a user function's error fails the collective everywhere
	_, errs := onMembers(t, 4, -1, 0, func(ctx context.Context, c *memComm) error {
		_, err := allreduceBytes(ctx, c, []byte{byte(c.rank)}, func(a, b []byte) ([]byte, error) {
			return nil, errors.New("cannot combine")
		})
		return err
	})
	for r, err := range errs {
		if !IsKind(err, KindInvalid) {
			t.Fatalf("rank %d: %v, want Invalid", r, err)
		}
	}
}

// Consecutive collectives with different roots, run without barriers in
// between, never take each other's messages: members race ahead into the
// next collective while others are still in the previous one, and the
// aborts of a failed collective (left queued at members that failed on
// their own) never reach a later one.
func TestCollectiveSequenceNeverMixes(t *testing.T) {
	for n := 2; n <= 9; n++ {
		_, errs := onMembers(t, n, -1, 0, func(ctx context.Context, c *memComm) error {
			for i := range 20 {
				if _, err := broadcast(ctx, c, -1, nil); !IsKind(err, KindInvalid) {
					return fmt.Errorf("broadcast from rank -1: %v, want Invalid", err)
				}
				root := (i * 5) % n
				var in []byte
				if c.rank == root {
					in = []byte(fmt.Sprintf("round %d", i))
				}
				m, err := broadcast(ctx, c, root, in)
				if err != nil {
					return err
				}
				if want := fmt.Sprintf("round %d", i); string(m.Bytes()) != want {
					return fmt.Errorf("broadcast %d got %q", i, m.Bytes())
				}
				sum, err := allreduce(ctx, c, []int64{int64(i), 1}, Sum)
				if err != nil {
					return err
				}
				if sum[0] != int64(i*n) || sum[1] != int64(n) {
					return fmt.Errorf("allreduce %d got %v", i, sum)
				}
				ms, err := gather(ctx, c, (root+1)%n, []byte{byte(i), byte(c.rank)})
				if err != nil {
					return err
				}
				for r, m := range ms {
					if !bytes.Equal(m.Bytes(), []byte{byte(i), byte(r)}) {
						return fmt.Errorf("gather %d from %d got %v", i, r, m.Bytes())
					}
				}
			}
			return nil
		})
		checkAll(t, fmt.Sprintf("size %d", n), errs)
	}
}

// A member that dies mid-collective (after any number of its sends) ends
// the collective for every other member: each either completed it (the
// dead member had done its part for it) or fails with PeerGone naming the
// dead rank. None waits forever. Dying before its first send fails every
// other member of the collectives where all depend on all.
func TestCollectivePeerGoneAborts(t *testing.T) {
	type collective struct {
		name string
		all  bool // every member depends on every other
		// rootSends: the root sends (a dying member dies on a send, so a
		// root that only receives never dies)
		rootSends bool
		run       func(ctx context.Context, c *memComm, root int) error
	}
	big := 10000
	collectives := []collective{
		{"barrier", true, false, func(ctx context.Context, c *memComm, _ int) error { return barrier(ctx, c) }},
		{"broadcast", false, true, func(ctx context.Context, c *memComm, root int) error {
			_, err := broadcast(ctx, c, root, []byte("x"))
			return err
		}},
		{"scatter", false, true, func(ctx context.Context, c *memComm, root int) error {
			_, err := scatter(ctx, c, root, make([][]byte, c.net.size))
			return err
		}},
		{"gather", false, false, func(ctx context.Context, c *memComm, root int) error {
			_, err := gather(ctx, c, root, []byte("x"))
			return err
		}},
		{"reduce", false, false, func(ctx context.Context, c *memComm, root int) error {
			_, err := reduce(ctx, c, root, []int64{1, 2}, Sum)
			return err
		}},
		{"allreduce-tree", true, false, func(ctx context.Context, c *memComm, _ int) error {
			_, err := allreduce(ctx, c, []int64{1, 2}, Sum)
			return err
		}},
		{"allreduce-ring", true, false, func(ctx context.Context, c *memComm, _ int) error {
			_, err := allreduce(ctx, c, make([]float64, big), Max)
			return err
		}},
		{"alltoall", true, false, func(ctx context.Context, c *memComm, _ int) error {
			_, err := alltoall(ctx, c, make([][]byte, c.net.size))
			return err
		}},
	}
	for _, coll := range collectives {
		for n := 2; n <= 9; n++ {
			for dead := range n {
				for after := 0; after <= 2*n; after++ {
					root := (dead + after) % n
					_, errs := onMembers(t, n, dead, after, func(ctx context.Context, c *memComm) error {
						return coll.run(ctx, c, root)
					})
					failed := 0
					for r, err := range errs {
						if r == dead || err == nil {
							continue
						}
						failed++
						var pe *PeerError
						if !IsKind(err, KindPeerGone) || !errors.As(err, &pe) || pe.Rank != dead {
							t.Fatalf("%s size %d, rank %d dead after %d sends: rank %d got %v, want PeerGone naming rank %d", coll.name, n, dead, after, r, err, dead)
						}
					}
					if after == 0 && (coll.all || (root == dead && coll.rootSends)) && failed != n-1 {
						t.Fatalf("%s size %d, rank %d (root %d) dead before sending: only %d of %d others failed", coll.name, n, dead, root, failed, n-1)
					}
				}
			}
		}
	}
}

func TestCollectiveInvalidArguments(t *testing.T) {
	_, errs := onMembers(t, 3, -1, 0, func(ctx context.Context, c *memComm) error {
		_, err := broadcast(ctx, c, 3, nil)
		return err
	})
	for r, err := range errs {
		if !IsKind(err, KindInvalid) {
			t.Fatalf("rank %d: %v, want Invalid", r, err)
		}
	}
	// the root passing the wrong number of parts fails everyone (the
	// others hear of it by the root's abort)
	_, errs = onMembers(t, 3, -1, 0, func(ctx context.Context, c *memComm) error {
		_, err := scatter(ctx, c, 1, [][]byte{{1}})
		return err
	})
	for r, err := range errs {
		var pe *PeerError
		if !IsKind(err, KindInvalid) || (r != 1 && (!errors.As(err, &pe) || pe.Rank != 1)) {
			t.Fatalf("rank %d: %v, want Invalid naming rank 1", r, err)
		}
	}
	// arrays of different lengths fail, on the tree and on the ring
	for _, length := range []int{10, 10000} {
		_, errs = onMembers(t, 4, -1, 0, func(ctx context.Context, c *memComm) error {
			l := length
			if c.rank == 2 {
				l += 8 * 4 // a different length, the same segmentation would not notice
			}
			_, err := allreduce(ctx, c, make([]int64, l), Sum)
			return err
		})
		for r, err := range errs {
			if !IsKind(err, KindInvalid) {
				t.Fatalf("length %d: rank %d: %v, want Invalid", length, r, err)
			}
		}
	}
}

// Collective messages that pass through files (large ones) are frames
// whose data starts at a page boundary: the receiver maps it (no copy) and
// removes the file; sizes around the page size and an empty one.
func TestMessageFrameFile(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []int{0, 1, pageSize - 1, pageSize, 3*pageSize + 5} {
		for _, hdr := range [][]byte{nil, []byte("f8"), []byte(`{"gone":true,"rank":3,"message":"x"}`)} {
			data := payload(n, n)
			path, err := writeFrameFile(dir, frameData, hdr, data)
			if err != nil {
				t.Fatal(err)
			}
			typ, gotHdr, m, err := readFrameFile(path)
			if err != nil {
				t.Fatalf("%d bytes, header %q: %v", n, hdr, err)
			}
			if typ != frameData || !bytes.Equal(gotHdr, hdr) || !bytes.Equal(m.Bytes(), data) || m.Size != int64(n) {
				t.Fatalf("%d bytes, header %q: got type %d, header %q, %d bytes", n, hdr, typ, gotHdr, len(m.Bytes()))
			}
			if m.Mapped() != (n > 0) {
				t.Fatalf("%d bytes: mapped %v", n, m.Mapped())
			}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
				t.Fatalf("files left: %v", left)
			}
		}
	}
}

// Malformed frames (another SDK version, a user message on a reserved tag)
// are refused, not misread.
func TestMessageFrameMalformed(t *testing.T) {
	good := inlineFrame(frameData, []byte("i8"), []byte{1, 2, 3, 4, 5, 6, 7, 8})
	if typ, hdr, data, err := parseInline(good); err != nil || typ != frameData || string(hdr) != "i8" || len(data) != 8 {
		t.Fatalf("a good frame: %d %q %v %v", typ, hdr, data, err)
	}
	for name, raw := range map[string][]byte{
		"empty":        {},
		"short":        good[:frameSize-1],
		"version 2":    append([]byte{2}, good[1:]...),
		"type 7":       append([]byte{1, 7}, good[2:]...),
		"offset past":  append(append([]byte{}, good[:4]...), append([]byte{99, 0, 0, 0, 0, 0, 0, 0}, good[frameSize:]...)...),
		"header past":  append(append([]byte{1, 0, 200, 0}, good[4:frameSize]...), good[frameSize:]...),
		"offset short": append(append([]byte{1, 0, 2, 0}, []byte{5, 0, 0, 0, 0, 0, 0, 0}...), good[frameSize:]...),
	} {
		if _, _, _, err := parseInline(raw); !errors.Is(err, errBadFrame) {
			t.Errorf("%s: %v, want errBadFrame", name, err)
		}
	}
}

// writeFrameFile writes a message into a new file of dir, its data at a
// page boundary, as a sidecar-path collective message is laid out (frameFile).
func writeFrameFile(dir string, typ byte, hdr, data []byte) (string, error) {
	base := frameSize + len(hdr)
	off := (base + pageSize - 1) / pageSize * pageSize
	f, err := os.CreateTemp(dir, "put-*")
	if err != nil {
		return "", err
	}
	_, err = f.Write(frameHead(typ, hdr, off))
	if err == nil {
		_, err = f.WriteAt(data, int64(off))
	}
	if err == nil && len(data) == 0 {
		err = f.Truncate(int64(off))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}
