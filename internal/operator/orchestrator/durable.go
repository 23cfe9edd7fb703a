package orchestrator

import (
	"context"
	"errors"
	"fmt"

	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/gateway"
)

// A started session is acknowledged (the gateway's 201) only once a
// checkpoint holds it: an owner that dies right after the start, before
// its next periodic save, would otherwise lose a session its client was
// told exists. Starts that arrive together share one save: Run's loop
// takes every waiting request and saves once for all of them.

// durable waits until a checkpoint saved after this call (so holding what
// the caller changed) is written. Without checkpoints there is nothing to
// wait for; before Run serves, the wait starts once it does. The save's
// refusal because another replica owns the bucket now, or its failure
// (the checkpoint store unreachable), is the caller's error: the session
// will not be found by the next owner, so it is not acknowledged (503,
// the start is safe to send again).
func (o *Orchestrator) durable(ctx context.Context) error {
	if o.opts.Checkpoint == nil {
		return nil
	}
	select {
	case <-o.serving:
	case <-o.stopped:
		return o.stoppedErr()
	case <-ctx.Done():
		return ctx.Err()
	}
	done := make(chan error, 1)
	select {
	case o.saveNow <- done:
	case <-o.stopped:
		return o.stoppedErr()
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		if errors.Is(err, checkpoint.ErrStale) {
			return fmt.Errorf("%w: %v", gateway.ErrEngineMoving, err)
		}
		if err != nil {
			return fmt.Errorf("%w: the checkpoint store: %v", gateway.ErrNotSaved, err)
		}
		return nil
	case <-o.stopped:
		return o.stoppedErr()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stoppedErr answers a start Run stopped under: its last save holds the
// session, or the session is not kept (503: retry on the next owner).
func (o *Orchestrator) stoppedErr() error {
	if o.lastSave == nil {
		return nil
	}
	return fmt.Errorf("%w: the engine stopped: %v", gateway.ErrEngineMoving, o.lastSave)
}

// saveFor saves once for req and every other request waiting, and answers
// them all.
func (o *Orchestrator) saveFor(ctx context.Context, req chan error) error {
	reqs := []chan error{req}
	for more := true; more; {
		select {
		case r := <-o.saveNow:
			reqs = append(reqs, r)
		default:
			more = false
		}
	}
	err := o.save(ctx, false)
	for _, r := range reqs {
		r <- err
	}
	return err
}
