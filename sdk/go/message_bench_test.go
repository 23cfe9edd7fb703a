package ziptrail

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// BenchmarkMessagePingPong64B: a 64 B message to a rank in another pod and
// back (Send, Recv on both ends), between two real sidecar processes on the
// operator's directory. ns/op is a round trip; µs/one-way is half of it.
func BenchmarkMessagePingPong64B(b *testing.B) {
	op := servers.StartOperator(b)
	p0, p1 := startPod(b, op, "ns", "pod-a"), startPod(b, op, "ns", "pod-b")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	gs := joinAll(b, ctx, []*sidecar{p0, p1}, "bench", "pingpong", 2)
	msg := bytes.Repeat([]byte{7}, 64)
	// Warm up both directions (connections, the sidecars' streams).
	pingPong := func(n int) {
		echoed := make(chan error, 1)
		go func() {
			for range n {
				m, err := gs[1].Recv(ctx, 0, 1)
				if err == nil {
					err = gs[1].Send(ctx, 0, 2, m.Bytes())
				}
				if err != nil {
					echoed <- err
					return
				}
			}
			echoed <- nil
		}()
		for range n {
			if err := gs[0].Send(ctx, 1, 1, msg); err != nil {
				b.Fatal(err)
			}
			m, err := gs[0].Recv(ctx, 1, 2)
			if err != nil {
				b.Fatal(err)
			}
			if len(m.Bytes()) != len(msg) {
				b.Fatalf("echo of %d bytes, want %d", len(m.Bytes()), len(msg))
			}
		}
		if err := <-echoed; err != nil {
			b.Fatal(err)
		}
	}
	pingPong(100)
	b.ResetTimer()
	pingPong(b.N)
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2/1e3, "µs/one-way")
}
