package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/dispatch"
)

// Fenced owners (docs/guarantees.md, "Fenced owners"). An owner's
// checkpoint saves are conditional on its generation (checkpoint.ErrStale);
// the rest of what it does is fenced too:
//
//   - every invocation it dispatches carries its fence
//     (invocation.HeaderOwnerFence: the checkpoint key and the generation
//     at which it claimed the checkpoint, which grows with each new
//     owner). A sidecar that saw a newer owner's fence refuses an older
//     one's invocation (409, stale owner) without running the function;
//     the owner that gets that refusal stops at once, as on a refused
//     save, without failing the invocation's session: its next owner
//     has it;
//   - while the periodic saves are spaced out (CheckpointMaxShare), the
//     fence is checked at every CheckpointInterval anyway, so an owner
//     that dispatches to no fenced pod still learns it is superseded
//     within about a second;
//   - acknowledgements of sidecars' events wait for a save that holds
//     them (acks.go): an owner that can no longer save acknowledges
//     nothing more.
//
// A refusal is confirmed with the checkpoint store before the engine
// stops: the newer generation the sidecar names must be stored (a newer
// owner claimed it before it sent anything). A fence no owner claimed —
// forged (any caller of a function's route can send one), or seen before
// the checkpoint store lost its data (unsharded generations start again
// from it) — must not stop the engine, nor keep its invocations from
// running: an unconfirmed refusal's invocation is sent again, under the
// same idempotency key, without a fence (the pod runs it as it runs any
// unfenced call). A store that cannot be asked does not overrule the
// sidecar: the owner stops.

type fenceState struct {
	header     atomic.Pointer[string] // this owner's invocation.HeaderOwnerFence, once it claimed
	superseded atomic.Bool            // Run stopped for a newer owner: results are no longer applied

	mu      sync.Mutex
	refused []dispatch.Result // stale-owner refusals for Run's loop
	sig     chan struct{}     // signals refused (capacity 1)

	// unfenced are the idempotency keys to send once without a fence
	// (unconfirmed refusals), until their result.
	unfenced sync.Map
}

// setFence makes this owner's fence from the checkpoint it restored and
// claimed (o.gen is the claim's generation; without a claim, the one it
// restored, or its base).
func (o *Orchestrator) setFence() {
	if o.opts.Checkpoint == nil {
		return
	}
	f := invocation.Fence{Key: o.opts.Checkpoint.Key, Generation: o.gen}.String()
	o.fence.header.Store(&f)
}

// ownerFence is dispatch.Options.Fence: "" before the claim, without
// checkpoints (no owner to tell apart), and for an invocation sent again
// after an unconfirmed refusal.
func (o *Orchestrator) ownerFence(env *invocation.Envelope) string {
	f := o.fence.header.Load()
	if f == nil {
		return ""
	}
	if _, ok := o.fence.unfenced.Load(env.Key()); ok {
		return ""
	}
	return *f
}

// answered notes the result of an invocation: sent again without a fence,
// its next delivery (a re-execution is another key) has one again.
func (o *Orchestrator) answered(env *invocation.Envelope) { o.fence.unfenced.Delete(env.Key()) }

// refusedAsStale hands a sidecar's stale-owner refusal to Run's loop (from
// a dispatcher worker: it never blocks).
func (o *Orchestrator) refusedAsStale(res dispatch.Result) {
	o.fence.mu.Lock()
	o.fence.refused = append(o.fence.refused, res)
	o.fence.mu.Unlock()
	select {
	case o.fence.sig <- struct{}{}:
	default:
	}
}

// staleRefusals confirms the refusals that arrived with the checkpoint
// store: the error to stop with (wrapping checkpoint.ErrStale) when a
// newer owner claimed the checkpoint, or when the store cannot say; nil
// when the store holds no generation as high as the refusals name (no
// successor's fence): their invocations are sent again without a fence.
func (o *Orchestrator) staleRefusals(ctx context.Context) error {
	o.fence.mu.Lock()
	refused := o.fence.refused
	o.fence.refused = nil
	o.fence.mu.Unlock()
	var newest *dispatch.StaleOwnerError
	for _, res := range refused {
		var so *dispatch.StaleOwnerError
		if errors.As(res.Err, &so) && (newest == nil || so.Seen.Generation > newest.Seen.Generation) {
			newest = so
		}
	}
	if newest == nil || o.opts.Checkpoint == nil {
		return nil // never: without checkpoints no fence is sent
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.opts.SaveTimeout)
	err := o.opts.Checkpoint.Check(cctx, newest.Seen.Generation) // ErrStale: stored at or above it
	cancel()
	switch {
	case errors.Is(err, checkpoint.ErrStale):
		return fmt.Errorf("%w: %w", checkpoint.ErrStale, newest)
	case err != nil:
		o.opts.Log.Error(err, "a function's sidecar refused an invocation as from a stale owner; the checkpoint store cannot confirm it: stopping")
		return fmt.Errorf("%w: %w (unconfirmed: %v)", checkpoint.ErrStale, newest, err)
	}
	o.opts.Log.Info("a function's sidecar refused invocations as from a stale owner, but the checkpoint store holds no generation that high "+
		"(a forged fence, or one from before the store lost its data): sending them again without a fence",
		"refused", len(refused), "fence", newest.Seen.String(), "own", newest.Sent.String())
	unconfirmedRefusals.Add(float64(len(refused)))
	for _, res := range refused {
		o.fence.unfenced.Store(res.Envelope.Key(), struct{}{})
		o.queue(res.Envelope)
	}
	return nil
}

// checkFence checks that no newer owner saved the checkpoint (between
// spaced-out saves).
func (o *Orchestrator) checkFence(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, o.opts.SaveTimeout)
	defer cancel()
	return o.opts.Checkpoint.Check(cctx, o.gen+1)
}

// supersede stops Run for a newer owner: nothing it hears of later is
// applied (its next owner has it), and what waits for its saves learns
// why they will not come.
func (o *Orchestrator) supersede(err error) error {
	o.fence.superseded.Store(true)
	o.lastSave = err
	return err
}
