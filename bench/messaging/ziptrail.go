package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/ziptrail/ziptrail/bench/internal/parallel"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// ztBench runs the ziptrail side: functions are goroutines using the Go
// SDK on their pod's socket.
type ztBench struct {
	pods []*pod
	ps   *pods
	pair []*ziptrail.Group // ranks 0 and 1 on pods 0 and 1
	seq  atomic.Int64
	tag  string // of its groups' names (the arms share the directory)
}

const session = "bench"

func (z *ztBench) group(prefix string) string {
	return fmt.Sprintf("%s%s-%d", z.tag, prefix, z.seq.Add(1))
}

func (z *ztBench) close() {
	leaveAll(z.pair)
}

// setupPair joins a fresh two-member group on pods 0 and 1.
func (z *ztBench) setupPair(ctx context.Context) error {
	leaveAll(z.pair)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var err error
	z.pair, err = joinAll(ctx, session, z.group("pair"), z.pods[:2])
	return err
}

const warmups = 3

// pingPong: rank 0 sends data to rank 1, which sends it back; the round
// trip is timed from rank 0's Send to its Recv returning with the echo
// (its pages read). Rank 1 reads every page of what it got, as a function
// would, and echoes it.
func (z *ztBench) pingPong(ctx context.Context, data []byte, n int) ([]float64, error) {
	a, b := z.pair[0], z.pair[1]
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	total := n + warmups
	echoed := make(chan error, 1)
	go func() {
		err := echo(ctx, b, total)
		echoed <- err
		if err != nil {
			cancel() // a failed echo must not leave rank 0 waiting
		}
	}()
	rtts, err := roundTrips(ctx, a, data, n, func() error {
		select {
		case eerr := <-echoed:
			if eerr != nil {
				return fmt.Errorf("echo: %w", eerr)
			}
		default:
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return rtts, <-echoed
}

// echo is rank 1 of a ping-pong: it receives total messages from rank 0,
// reads every page of each, as a function would, and sends it back.
func echo(ctx context.Context, b *ziptrail.Group, total int) error {
	for range total {
		m, err := b.Recv(ctx, 0, 7)
		if err != nil {
			return err
		}
		touch(m.Bytes())
		err = b.Send(ctx, 0, 7, m.Bytes())
		if cerr := m.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("closing a received message: %w", cerr)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// roundTrips is rank 0 of a ping-pong: warmups+n round trips of data,
// each timed from its Send to its Recv returning with the echo (pages
// read); the first echo is compared with data. When a receive fails,
// echoFailed may name the echo's failure instead.
func roundTrips(ctx context.Context, a *ziptrail.Group, data []byte, n int, echoFailed func() error) ([]float64, error) {
	rtts := make([]float64, 0, n)
	for i := range n + warmups {
		t := time.Now()
		if err := a.Send(ctx, 1, 7, data); err != nil {
			return nil, err
		}
		m, err := a.Recv(ctx, 1, 7)
		if err != nil {
			if eerr := echoFailed(); eerr != nil {
				return nil, eerr
			}
			return nil, err
		}
		touch(m.Bytes())
		rtt := time.Since(t).Seconds()
		if i == 0 && !slices.Equal(m.Bytes(), data) {
			m.Close()
			return nil, fmt.Errorf("the echo differs (%d bytes, sent %d)", m.Size, len(data))
		}
		if m.Size != int64(len(data)) {
			m.Close()
			return nil, fmt.Errorf("the echo has %d bytes, sent %d", m.Size, len(data))
		}
		if err := m.Close(); err != nil {
			return nil, fmt.Errorf("closing a received message: %w", err)
		}
		if i >= warmups {
			rtts = append(rtts, rtt)
		}
	}
	return rtts, nil
}

// stream: rank 0 sends count messages of 64 B back to back (each Send
// returns once the receiver's sidecar queued it); timed until rank 1
// received the last.
func (z *ztBench) stream(ctx context.Context, count, n int) ([]float64, error) {
	return z.streamBy(ctx, 1, count, n)
}

// streamConcurrent is stream with rank 0's sends spread over 8
// goroutines (ziptrail's counterpart of pipelining: the sends overlap,
// so their order is no longer the program's).
func (z *ztBench) streamConcurrent(ctx context.Context, count, n int) ([]float64, error) {
	return z.streamBy(ctx, 8, count, n)
}

// streamOnce is one timed stream (no warm-up).
func (z *ztBench) streamOnce(ctx context.Context, senders, count int) (float64, error) {
	ts, err := z.streamBy(ctx, senders, count, 0)
	if err != nil {
		return 0, err
	}
	return ts[0], nil
}

func (z *ztBench) streamBy(ctx context.Context, senders, count, n int) ([]float64, error) {
	a, b := z.pair[0], z.pair[1]
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msg := payload(64)
	var ts []float64
	for i := range n + 1 {
		got := make(chan error, 1)
		go func() {
			got <- func() error {
				for j := range count {
					m, err := b.Recv(ctx, 0, 8)
					if err != nil {
						return err
					}
					if m.Size != 64 {
						return fmt.Errorf("message %d has %d bytes", j, m.Size)
					}
					m.Close()
				}
				return nil
			}()
		}()
		t := time.Now()
		if err := parallel.Do(min(senders, count), func(k int) error {
			for j := k; j < count; j += senders {
				if err := a.Send(ctx, 1, 8, msg); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return nil, err
		}
		if err := <-got; err != nil {
			return nil, err
		}
		if i > 0 || n == 0 { // the first is a warm-up, unless only one is asked for
			ts = append(ts, time.Since(t).Seconds())
		}
	}
	return ts, nil
}

// vector is member rank's input: element j is (rank+1)·(j mod 7), so the
// sum over n members is n(n+1)/2·(j mod 7), exact in float64.
func vector(rank, elems int) []float64 {
	v := make([]float64, elems)
	for j := range v {
		v[j] = float64((rank + 1) * (j % 7))
	}
	return v
}

func checkSum(out []float64, members, elems int) error {
	if len(out) != elems {
		return fmt.Errorf("result has %d elements, want %d", len(out), elems)
	}
	f := float64(members * (members + 1) / 2)
	for j, x := range out {
		if x != f*float64(j%7) {
			return fmt.Errorf("element %d is %v, want %v", j, x, f*float64(j%7))
		}
	}
	return nil
}

// timeMembers starts f(rank) for every member at once and returns the
// time until the last finished; check runs after, untimed.
func timeMembers(members int, f func(rank int) error) (float64, error) {
	startc := make(chan struct{})
	ends := make([]time.Time, members)
	errs := make(chan error, members)
	for r := range members {
		go func() {
			<-startc
			err := f(r)
			ends[r] = time.Now()
			errs <- err
		}()
	}
	t := time.Now()
	close(startc)
	var first error
	for range members {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return 0, first
	}
	last := t
	for _, e := range ends {
		if e.After(last) {
			last = e
		}
	}
	return last.Sub(t).Seconds(), nil
}

// allreduce: the Go SDK's Allreduce (a ring above 64 KiB) over members
// pods, one member per pod.
func (z *ztBench) allreduce(ctx context.Context, members, n int) ([]float64, error) {
	jctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	gs, err := joinAll(jctx, session, z.group(fmt.Sprintf("allreduce%d", members)), z.pods[:members])
	defer leaveAll(gs)
	if err != nil {
		return nil, err
	}
	elems := allreduceBytes / 8
	in := make([][]float64, members)
	for r := range in {
		in[r] = vector(r, elems)
	}
	outs := make([][]float64, members)
	var ts []float64
	for i := range n + 1 {
		t, err := timeMembers(members, func(r int) error {
			var err error
			outs[r], err = ziptrail.Allreduce(ctx, gs[r], in[r], ziptrail.Sum[float64])
			return err
		})
		if err != nil {
			return nil, err
		}
		for r := range outs {
			if err := checkSum(outs[r], members, elems); err != nil {
				return nil, fmt.Errorf("rank %d: %w", r, err)
			}
		}
		if i > 0 {
			ts = append(ts, t)
		}
	}
	return ts, nil
}

// membership: ranks 0-2 of a 4-member group (pods 0-2) watch; rank 3
// joins from pod 3. Timed from the Join call until every watcher's Watch
// returned a view with rank 3 live; also the Join call itself.
func (z *ztBench) membership(ctx context.Context, n int) (seen, joins []float64, err error) {
	for i := range n + 1 {
		name := z.group("members")
		jctx, cancel := context.WithTimeout(ctx, time.Minute)
		gs := make([]*ziptrail.Group, 4)
		err := parallel.Do(3, func(r int) error {
			var err error
			gs[r], err = z.pods[r].client.Join(jctx, session, name, r, 4)
			return err
		})
		if err != nil {
			cancel()
			return nil, nil, err
		}
		// Each watcher first sees ranks 0-2 live, then waits in Watch.
		ready := make(chan error, 3)
		done := make(chan time.Time, 3)
		for r := range 3 {
			go func() {
				m, err := gs[r].Members(jctx)
				for err == nil && len(m.Live) < 3 {
					m, err = gs[r].Watch(jctx, m.Epoch)
				}
				ready <- err
				if err != nil {
					return
				}
				for err == nil && !slices.Contains(m.Live, 3) {
					m, err = gs[r].Watch(jctx, m.Epoch)
				}
				if err != nil {
					done <- time.Time{}
					return
				}
				done <- time.Now()
			}()
		}
		for range 3 {
			if err := <-ready; err != nil {
				cancel()
				return nil, nil, err
			}
		}
		time.Sleep(20 * time.Millisecond) // let the watchers' long polls reach their sidecars
		t := time.Now()
		gs[3], err = z.pods[3].client.Join(jctx, session, name, 3, 4)
		joined := time.Since(t).Seconds()
		if err != nil {
			cancel()
			return nil, nil, err
		}
		last := t
		for range 3 {
			e := <-done
			if e.IsZero() {
				cancel()
				leaveAll(gs)
				return nil, nil, errors.New("a watcher failed")
			}
			if e.After(last) {
				last = e
			}
		}
		cancel()
		leaveAll(gs)
		if i > 0 {
			seen = append(seen, last.Sub(t).Seconds())
			joins = append(joins, joined)
		}
	}
	return seen, joins, nil
}

// death: ranks 0-2 (pods 0-2) block in Recv from rank 3, which runs in a
// fresh pod; its queue-proxy-zl gets SIGKILL. Timed from the kill until
// every survivor's Recv returned PeerGone.
func (z *ztBench) death(ctx context.Context, n int) ([]float64, error) {
	var ts []float64
	for i := range n + 1 {
		victim, err := z.ps.start()
		if err != nil {
			return nil, err
		}
		members := append(slices.Clone(z.pods[:3]), victim)
		jctx, cancel := context.WithTimeout(ctx, time.Minute)
		gs, err := joinAll(jctx, session, z.group("death"), members)
		if err != nil {
			cancel()
			return nil, err
		}
		type res struct {
			at  time.Time
			err error
		}
		done := make(chan res, 3)
		for r := range 3 {
			go func() {
				_, err := gs[r].Recv(jctx, 3, ziptrail.AnyTag)
				done <- res{time.Now(), err}
			}()
		}
		time.Sleep(50 * time.Millisecond) // let the Recvs reach their sidecars
		t := time.Now()
		victim.kill()
		last := t
		var failed error
		for range 3 {
			r := <-done
			if !errors.Is(r.err, ziptrail.ErrPeerGone) && failed == nil {
				failed = fmt.Errorf("a survivor's Recv returned %v, want PeerGone", r.err)
			}
			if r.at.After(last) {
				last = r.at
			}
		}
		cancel()
		leaveAll(gs[:3])
		victim.client.Close()
		if failed != nil {
			return nil, failed
		}
		if i > 0 {
			ts = append(ts, last.Sub(t).Seconds())
		}
	}
	return ts, nil
}

// apiRoundTrip times Members on pod 0's sidecar: one local-API call over
// the unix socket that involves no other pod (the floor under every Send
// and Recv).
func (z *ztBench) apiRoundTrip(ctx context.Context, n int) ([]float64, error) {
	ts := make([]float64, 0, n)
	for i := range n + warmups {
		t := time.Now()
		if _, err := z.pair[0].Members(ctx); err != nil {
			return nil, err
		}
		if i >= warmups {
			ts = append(ts, time.Since(t).Seconds())
		}
	}
	return ts, nil
}

// sendOnly times rank 0's Send of 64 B alone (it returns once pod 1's
// sidecar queued the message), while rank 1 receives them.
func (z *ztBench) sendOnly(ctx context.Context, n int) ([]float64, error) {
	a, b := z.pair[0], z.pair[1]
	got := make(chan error, 1)
	go func() {
		got <- func() error {
			for range n + warmups {
				m, err := b.Recv(ctx, 0, 9)
				if err != nil {
					return err
				}
				m.Close()
			}
			return nil
		}()
	}()
	msg := payload(64)
	ts := make([]float64, 0, n)
	for i := range n + warmups {
		t := time.Now()
		if err := a.Send(ctx, 1, 9, msg); err != nil {
			return nil, err
		}
		if i >= warmups {
			ts = append(ts, time.Since(t).Seconds())
		}
	}
	return ts, <-got
}
