package samenode

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkGet: put (store) + same-node get + touching every page of
// the mapping, per size; "prepared" copies into the memfd at put.
func BenchmarkGet(b *testing.B) {
	for _, size := range []int{10_000, 1_000_000, 10_000_000} {
		for _, prepared := range []bool{false, true} {
			b.Run(fmt.Sprintf("%d/prepared=%v", size, prepared), func(b *testing.B) {
				f := newFixture(b)
				data := payload(size)
				b.SetBytes(int64(size))
				var sink byte
				for i := 0; b.Loop(); i++ {
					id := fmt.Sprintf("o%d", i)
					r := f.put(b, id, data, 1)
					if prepared {
						if err := f.srv.Prepare(id, data); err != nil {
							b.Fatal(err)
						}
					}
					o, err := f.cli.Get(context.Background(), r)
					if err != nil {
						b.Fatal(err)
					}
					m, err := o.Map()
					if err != nil {
						b.Fatal(err)
					}
					for j := 0; j < len(m); j += 4096 {
						sink ^= m[j]
					}
					_ = Unmap(m)
					o.Close()
				}
				_ = sink
			})
		}
	}
}

// BenchmarkMemfdCopy is the producer's one copy into a sealed memfd.
func BenchmarkMemfdCopy(b *testing.B) {
	data := payload(10_000_000)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		f, err := newSealedMemfd("x", data)
		if err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}
