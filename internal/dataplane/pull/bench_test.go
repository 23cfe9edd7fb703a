package pull

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
)

// BenchmarkPull is the bare pull between two sidecars on loopback: one
// object put into the producer's store and pulled into the consumer's
// memory (the ziptrail column of bench/dataplane without its harness).
func BenchmarkPull(b *testing.B) {
	for _, size := range []int{10_000, 1_000_000, 10_000_000} {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			obj := random(size)
			s, _ := startProducer(b, nil, 1)
			c := &Client{Keys: s.Keys}
			defer c.Close()
			ctx := context.Background()
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r := putRef(b, s, fmt.Sprint("o", i), obj, 1)
				got, _, err := c.Pull(ctx, r)
				if err != nil || len(got) != size {
					b.Fatalf("pull: %d bytes, %v", len(got), err)
				}
			}
		})
	}
}

// putRef stores obj in s for reads reads and seals a reference to it.
func putRef(t testing.TB, s *Server, id string, obj []byte, reads uint32) string {
	exp := time.Now().Add(time.Hour)
	if err := s.Store.Put(context.Background(), store.Meta{ID: id, Bucket: "b", Key: id, Reads: reads, Expires: exp}, obj); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	addr := serverAddr(s)
	s.mu.Unlock()
	r, err := s.Keys.Seal(ref.Record{Addr: addr, Key: id, Expires: exp, Reads: reads})
	if err != nil {
		t.Fatal(err)
	}
	return r
}
