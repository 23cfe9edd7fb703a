package ziptrail

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"
)

// Reductions over the collectives' plumbing (collectives.go): a binomial
// tree to the root for Reduce and small Allreduce (then a broadcast), a
// ring for Allreduce of arrays of at least ringThreshold bytes.

// --- reductions ---

// acc is a reduction's running value on one member.
type acc interface {
	encode() (f string, data []byte)
	absorb(from int, f string, in []byte) error // acc = acc op in
}

// treeReduce combines every member's value at root (binomial tree: in
// round k, relative rank v sends to v-2^k when its bit k is set, else
// receives from v+2^k). Values combine in relative rank order.
func treeReduce(ctx context.Context, x *coll, root int, a acc) error {
	n := x.size
	vr := (x.rank - root + n) % n
	for mask := 1; mask < n; mask <<= 1 {
		if vr&mask != 0 {
			f, data := a.encode()
			return x.send(ctx, []int{(vr - mask + root) % n}, f, data)
		}
		if src := vr | mask; src < n {
			from := (src + root) % n
			f, m, err := x.recv(ctx, from)
			if err != nil {
				return err
			}
			err = a.absorb(from, f, m.Bytes())
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

func (b *bytesAcc) encode() (string, []byte) { return "", b.data }

func (b *bytesAcc) absorb(from int, _ string, in []byte) error {
	if b.f == nil {
		return nil // barrier
	}
	out, err := b.f(b.data, in)
	if err != nil {
		return &Error{Kind: KindInvalid, Err: fmt.Errorf("reduce function (with rank %d's value): %w", from, err)}
	}
	if len(out) > 0 && len(in) > 0 && &out[0] == &in[0] {
		out = append([]byte(nil), out...) // in may be a mapping that goes away
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
		a := &bytesAcc{data: data, f: f}
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

// AllreduceBytes combines every member's data with f and gives every
// member the result (a tree reduce to rank 0, then a broadcast). See
// ReduceBytes for f.
func (g *Group) AllreduceBytes(ctx context.Context, data []byte, f func(a, b []byte) ([]byte, error)) ([]byte, error) {
	return allreduceBytes(ctx, g, data, f)
}

func allreduceBytes(ctx context.Context, c comm, data []byte, f func(a, b []byte) ([]byte, error)) ([]byte, error) {
	var out []byte
	err := run(ctx, c, collAllreduce, func(ctx context.Context, x *coll) error {
		a := &bytesAcc{data: data, f: f}
		if err := treeReduce(ctx, x, 0, a); err != nil {
			return err
		}
		_, m, err := treeBcast(ctx, x, 0, "", a.data)
		if err != nil {
			return err
		}
		out = append([]byte{}, m.Bytes()...)
		return m.Close()
	})
	return out, err
}

// Number is the element type of the typed reductions (on the wire: "i8"
// or "f8", 8 bytes little-endian; an int64 array meeting a float64 one
// of another SDK's member is a float64 one).
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
// the same length; data is not modified. Example:
//
//	centroids, err := ziptrail.Allreduce(ctx, g, sums, ziptrail.Sum)
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
		var f string
		var payload []byte
		if x.rank == 0 {
			f, payload = a.encode()
		}
		f, m, err := treeBcast(ctx, x, 0, f, payload)
		if err != nil {
			return err
		}
		defer m.Close()
		out, err = decodeArray[T](f, m.Bytes())
		if err == nil && len(out) != len(data) {
			err = fmt.Errorf("the result has %d elements, this rank passed %d", len(out), len(data))
		}
		if err != nil {
			return &Error{Kind: KindInvalid, Err: err}
		}
		return nil
	})
	return out, err
}

// ringAllreduce: n-1 steps of reduce-scatter (in step s, rank r sends its
// partial segment r-s to r+1 and combines segment r-s-1 from r-1 into its
// own), after which rank r holds the whole reduction of segment r+1; then
// n-1 steps of allgather pass the finished segments round. Segment i is
// elements [len*i/n, len*(i+1)/n).
func ringAllreduce[T Number](ctx context.Context, x *coll, a *arrayAcc[T]) error {
	n, r := x.size, x.rank
	total := len(a.data)
	seg := func(i int) []T { return a.data[i*total/n : (i+1)*total/n] }
	right, left := (r+1)%n, (r-1+n)%n
	step := func(send, recv int, combine bool) error {
		f, m, err := x.sendrecv(ctx, right, fmtOf[T](), encodeArray(seg(send)), left)
		if err != nil {
			return err
		}
		defer m.Close()
		dst := seg(recv)
		in, err := decodeArray[T](f, m.Bytes())
		if err == nil && len(in) != len(dst) {
			err = fmt.Errorf("rank %d sent a segment of %d elements, want %d (do the members' arrays differ in length?)", left, len(in), len(dst))
		}
		if err != nil {
			return &Error{Kind: KindInvalid, Err: err}
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

func (a *arrayAcc[T]) encode() (string, []byte) { return fmtOf[T](), encodeArray(a.data) }

func (a *arrayAcc[T]) absorb(from int, f string, in []byte) error {
	v, err := decodeArray[T](f, in)
	if err == nil && len(v) != len(a.data) {
		err = fmt.Errorf("members reduce arrays of different lengths (rank %d's partial result has %d elements, this rank's %d)", from, len(v), len(a.data))
	}
	if err != nil {
		return &Error{Kind: KindInvalid, Err: err}
	}
	a.op(a.data, v)
	return nil
}

// fmtOf is the wire format of T's elements.
func fmtOf[T Number]() string {
	var zero T
	if _, ok := any(zero).(float64); ok {
		return "f8"
	}
	return "i8"
}

// nativeLE: this machine stores numbers as the wire does (little-endian,
// IEEE 754), so an array's bytes are its encoding: one copy, not a loop.
var nativeLE = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// asBytes is s's memory as bytes (nativeLE only).
func asBytes[T Number](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), 8*len(s))
}

// encodeArray: 8 bytes per element, little-endian (IEEE 754 for float64).
func encodeArray[T Number](s []T) []byte {
	b := make([]byte, 8*len(s))
	if nativeLE {
		copy(b, asBytes(s))
		return b
	}
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

// decodeArray reads elements of format f as T: the same format, or int64
// ones into a float64 array.
func decodeArray[T Number](f string, b []byte) ([]T, error) {
	want := fmtOf[T]()
	if f != want && (f != "i8" || want != "f8") {
		return nil, fmt.Errorf("members reduce different element types (%q here, %q received)", want, f)
	}
	if len(b)%8 != 0 {
		return nil, fmt.Errorf("an array of %d bytes (not a multiple of 8)", len(b))
	}
	out := make([]T, len(b)/8)
	if nativeLE && f == want {
		copy(asBytes(out), b)
		return out, nil
	}
	switch v := any(out).(type) {
	case []float64:
		for i := range v {
			u := binary.LittleEndian.Uint64(b[8*i:])
			if f == "i8" {
				v[i] = float64(int64(u))
			} else {
				v[i] = math.Float64frombits(u)
			}
		}
	case []int64:
		for i := range v {
			v[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
		}
	}
	return out, nil
}
