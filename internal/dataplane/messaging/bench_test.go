package messaging

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// benchPods are a sender and a receiver, the sender's stream open.
func benchPods(b *testing.B) (snd, rcv *testPod, auth string) {
	d := newTestDir(b)
	rcv, snd = d.newPod(b, nil), d.newPod(b, nil)
	rcv.join(b, 1, 2)
	snd.join(b, 0, 2)
	return snd, rcv, snd.auth(b)
}

// BenchmarkDeliver: one delivery over an open stream and its receive.
func BenchmarkDeliver(b *testing.B) {
	for _, size := range []int{64, 60 << 10} {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			snd, rcv, auth := benchPods(b)
			ctx := context.Background()
			data := make([]byte, size)
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := range b.N {
				m := Message{Session: "s1", Group: "g", From: 0, To: 1, Seq: uint64(i + 1), Data: data}
				if st, err := snd.r.streams.Deliver(ctx, rcv.addr, auth, m, nil); err != nil || st != Queued {
					b.Fatal(st, err)
				}
				if _, err := rcv.r.Recv(ctx, "s1", "g", 1, Filter{AnySource: true, AnyTag: true}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDeliverDuringDeadDial: the same while a dial to a peer whose
// SYNs vanish is under way (issue 31: 7.8 s a delivery, for as long as
// the dial lasted).
func BenchmarkDeliverDuringDeadDial(b *testing.B) {
	snd, rcv, auth := benchPods(b)
	ctx := context.Background()
	m := Message{Session: "s1", Group: "g", From: 0, To: 1, Seq: 1, Data: make([]byte, 64)}
	if _, err := snd.r.streams.Deliver(ctx, rcv.addr, auth, m, nil); err != nil {
		b.Fatal(err)
	}
	dead, port := blackhole(b)
	deadCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	go func() { _, _ = snd.r.streams.Deliver(deadCtx, dead, auth, m, nil) }()
	for synSent(b, port) == 0 {
		time.Sleep(time.Millisecond)
	}
	b.ResetTimer()
	for i := range b.N {
		m.Seq = uint64(i + 2)
		if st, err := snd.r.streams.Deliver(ctx, rcv.addr, auth, m, nil); err != nil || st != Queued {
			b.Fatal(st, err)
		}
		if _, err := rcv.r.Recv(ctx, "s1", "g", 1, Filter{AnySource: true, AnyTag: true}); err != nil {
			b.Fatal(err)
		}
	}
}
