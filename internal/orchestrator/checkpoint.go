package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/ziptrail/ziptrail/internal/engine"
	"github.com/ziptrail/ziptrail/internal/sessions"
)

// state is what a checkpoint holds: the engine's sessions and the gateway's
// view of them (with result bytes, which the API hides).
type state struct {
	Engine   *engine.Snapshot    `json:"engine"`
	Sessions []sessions.Session  `json:"sessions"`
	Results  map[string]resultIO `json:"results,omitempty"`
	// Triggers are the triggers' counts (triggerCounts), by workflow and
	// trigger, so a new leader continues them; absent in checkpoints
	// written before they were kept (they start at 0 then).
	Triggers map[string]map[string]triggerCount `json:"triggers,omitempty"`
}

type resultIO struct {
	Inline []byte `json:"inline,omitempty"`
	Ref    string `json:"ref,omitempty"`
}

func (o *Orchestrator) save(ctx context.Context) error {
	st := state{Engine: o.engine.Snapshot(), Sessions: o.sessions.Export(), Results: map[string]resultIO{}, Triggers: o.counts.export()}
	for _, s := range st.Sessions {
		if s.Result != nil {
			st.Results[s.ID] = resultIO{Inline: s.Result.Inline, Ref: s.Result.Ref}
		}
	}
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	o.gen++
	if err := o.opts.Checkpoint.Save(ctx, o.gen, data); err != nil {
		return err
	}
	checkpointBytes.Set(float64(len(data)))
	return nil
}

// restore loads the last checkpoint, if any, and continues its generations.
func (o *Orchestrator) restore(ctx context.Context) error {
	if o.opts.Checkpoint == nil {
		return nil
	}
	data, gen, found, err := o.opts.Checkpoint.Load(ctx)
	if base := o.opts.Generation << 32; err == nil && o.gen < base {
		o.gen = base
	}
	if err != nil || !found {
		return err
	}
	var st state
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("orchestrator: corrupt checkpoint: %w", err)
	}
	if st.Engine == nil {
		return fmt.Errorf("orchestrator: checkpoint without engine state")
	}
	if err := o.engine.Restore(st.Engine); err != nil {
		return err
	}
	for i := range st.Sessions {
		if r, ok := st.Results[st.Sessions[i].ID]; ok && st.Sessions[i].Result != nil {
			st.Sessions[i].Result.Inline, st.Sessions[i].Result.Ref = r.Inline, r.Ref
		}
	}
	o.sessions.Import(st.Sessions)
	o.counts.restore(st.Triggers)
	o.gen = max(gen, o.opts.Generation<<32)
	o.opts.Log.Info("restored checkpoint", "generation", gen, "sessions", len(st.Engine.Sessions))
	return nil
}
