package ziptrail

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/testservers"
)

// aheadOfFailure: rank 1, a leaf of the reduce, sends its part and is done
// with the reduce; the root (rank 0) then fails it (rank 1's array has
// another length). Rank 1 is already in the next collective, a broadcast
// from the root, when the root's abort comes: the abort must end that
// broadcast too (it once was tagged for the failed reduce only, and rank 1
// waited for ever; CI hung on this in TestCollectivePeerGoneOnSidecars).
func aheadOfFailure(ctx context.Context, rank int, reduce func([]float64) ([]float64, error), broadcast func() error) error {
	if rank == 0 {
		if _, err := reduce([]float64{1, 2, 3, 4}); err == nil {
			return errors.New("the root's reduce of arrays of different lengths succeeded")
		}
		<-ctx.Done() // stays in the group, as a handler that goes on would
		return nil
	}
	if _, err := reduce([]float64{1, 2, 3}); err != nil {
		return err
	}
	return broadcast()
}

// checkAborted: rank 1's broadcast ended with the root's failure, not a
// timeout.
func checkAborted(t *testing.T, err error) {
	t.Helper()
	var pe *PeerError
	if err == nil || IsKind(err, KindTimeout) || !errors.As(err, &pe) || pe.Rank != 0 {
		t.Fatalf("rank 1's broadcast after the root's failed reduce: %v, want the root's failure (rank 0)", err)
	}
}

func TestCollectiveAbortReachesMemberAhead(t *testing.T) {
	net := newMemNet(2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rootCtx, rootDone := context.WithCancel(ctx)
	c0, c1 := &memComm{net: net, rank: 0, dieAfter: -1}, &memComm{net: net, rank: 1, dieAfter: -1}
	root := make(chan error, 1)
	go func() {
		root <- aheadOfFailure(rootCtx, 0, func(d []float64) ([]float64, error) { return reduce(rootCtx, c0, 0, d, Sum) }, nil)
	}()
	err := aheadOfFailure(ctx, 1, func(d []float64) ([]float64, error) { return reduce(ctx, c1, 0, d, Sum) },
		func() error { _, err := broadcast(ctx, c1, 0, nil); return err })
	checkAborted(t, err)
	rootDone()
	if err := <-root; err != nil {
		t.Fatal(err)
	}
}

// The same through real sidecars (the sidecar's inbox matches the abort).
func TestCollectiveAbortReachesMemberAheadOnSidecars(t *testing.T) {
	op := testservers.StartOperator(t)
	pods := []*sidecar{startPod(t, op, "ns", "pod-a"), startPod(t, op, "ns", "pod-b")}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	gs := joinAll(t, ctx, pods, "s-ahead", "g", 2)
	rootCtx, rootDone := context.WithCancel(ctx)
	root := make(chan error, 1)
	go func() {
		root <- aheadOfFailure(rootCtx, 0, func(d []float64) ([]float64, error) { return Reduce(rootCtx, gs[0], 0, d, Sum) }, nil)
	}()
	err := aheadOfFailure(ctx, 1, func(d []float64) ([]float64, error) { return Reduce(ctx, gs[1], 0, d, Sum) },
		func() error { _, err := gs[1].Broadcast(ctx, 0, nil); return err })
	checkAborted(t, err)
	rootDone()
	if err := <-root; err != nil {
		t.Fatal(err)
	}
	for _, g := range gs {
		_ = g.Leave(context.Background())
	}
}
