package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ziptrail/ziptrail/internal/engine"
	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// state is what the periodic checkpoint holds: the engine's sessions and
// the gateway's view of the running ones (with result bytes, which the API
// hides). Ended sessions are written once each, in their own records
// (endedRecord), with their engine tombstones; the snapshot keeps only the
// tombstones of sessions the registry does not hold as ended. A
// checkpoint written before the records existed holds every session here:
// restore reads both.
type state struct {
	Engine   *engine.Snapshot    `json:"engine"`
	Sessions []sessions.Session  `json:"sessions"`
	Results  map[string]resultIO `json:"results,omitempty"`
	// Triggers are the triggers' counts (triggerCounts), by workflow and
	// trigger, so a new leader continues them; absent in checkpoints
	// written before they were kept (they start at 0 then).
	Triggers map[string]map[string]triggerCount `json:"triggers,omitempty"`
	// Unsent are the invocations a graceful stop left queued, never sent:
	// the next owner sends them at once (redispatch.go).
	Unsent []string `json:"unsent,omitempty"`
}

type resultIO struct {
	Inline []byte `json:"inline,omitempty"`
	Ref    string `json:"ref,omitempty"`
}

// endedRecord is an ended session's checkpoint.Record.
type endedRecord struct {
	Session sessions.Session `json:"session"`
	Result  *resultIO        `json:"result,omitempty"`
	// Tombstone is until when the engine remembers that the session
	// ended (engine.Snapshot.Tombstones).
	Tombstone *time.Time `json:"tombstone,omitempty"`
}

// tombstoneTTL is how long the engine remembers an ended session (its
// tombstone refuses the id again). The registry refuses an id it holds
// for its Retention (an hour) before the engine is asked, so the
// tombstones need not last: every save copies all of them
// (engine.Snapshot), and a short TTL keeps that to a few seconds of
// sessions instead of an hour's.
const tombstoneTTL = 10 * time.Second

// checkpointState is what the saves keep between them (Run's goroutine
// only, but ver).
type checkpointState struct {
	ver atomic.Uint64 // engine and trigger count changes (touch)
	// The versions of the last save: equal ones have nothing to write.
	saved        bool
	savedVer     uint64
	savedSession uint64
	pending      map[string]sessions.Session // ended, record not written yet
	gone         map[string]bool             // forgotten, record not deleted yet
	written      int64                       // bytes written by the last save
	// next is when the next periodic save may start (CheckpointMaxShare).
	next time.Time
	// loaded is the generation restore found stored (-1: none); the
	// claim's save is conditional on it (checkpoint.Write.Claim).
	loaded int64
}

// DefaultCheckpointMaxShare is Options.CheckpointMaxShare's default: the
// periodic saves take at most a twentieth of the time.
const DefaultCheckpointMaxShare = 0.05

// due reports whether a periodic save may start at now.
func (cp *checkpointState) due(now time.Time) bool { return !now.Before(cp.next) }

// periodicSave is a save on the checkpoint ticker: it times the save and
// puts the next one off so that saves take at most CheckpointMaxShare of
// the time (a save that wrote nothing costs a check and is not timed; a
// failed one is retried at the next tick).
func (o *Orchestrator) periodicSave(ctx context.Context) error {
	start := time.Now()
	err := o.save(ctx, false)
	if err == nil && o.cp.written > 0 {
		d := time.Since(start)
		checkpointSeconds.Observe(d.Seconds())
		o.cp.next = start.Add(time.Duration(float64(d) / o.opts.CheckpointMaxShare))
	}
	return err
}

// saveFailing is the last save's error while saves fail (nil once one
// succeeds).
func (o *Orchestrator) saveFailing() error {
	if e := o.failing.Load(); e != nil {
		return *e
	}
	return nil
}

// touch notes a change of the engine or the trigger counts, after it.
func (o *Orchestrator) touch() { o.cp.ver.Add(1) }

// save writes what changed since the last save: the snapshot of the
// running sessions (engine, registry, counts) and the records of the
// sessions that ended meanwhile, all fenced by the generation. With
// nothing changed it writes nothing, unless force (a claim), and only
// checks that no newer owner saved.
func (o *Orchestrator) save(ctx context.Context, force bool) (err error) {
	ctx, cancel := context.WithTimeout(ctx, o.opts.SaveTimeout)
	defer cancel()
	defer func() {
		if err != nil && !errors.Is(err, checkpoint.ErrStale) {
			checkpointFailures.Inc()
			o.failing.Store(&err)
		} else {
			o.failing.Store(nil)
		}
	}()
	cp := &o.cp
	if cp.pending == nil {
		cp.pending, cp.gone = map[string]sessions.Session{}, map[string]bool{}
	}
	// The snapshot is taken between applications (applyBarrier), and
	// answers the acknowledgements asked for before it (acks.go).
	o.applying.Lock()
	waiting := o.waiters.take()
	saved := false
	defer func() { o.waiters.settle(waiting, saved) }()
	ver, sver := cp.ver.Load(), o.sessions.Version()
	ended, gone := o.sessions.TakeEnded()
	for _, s := range ended {
		cp.pending[s.ID] = s
	}
	for _, id := range gone {
		delete(cp.pending, id)
		cp.gone[id] = true
	}
	if !force && cp.saved && ver == cp.savedVer && sver == cp.savedSession && len(cp.pending) == 0 && len(cp.gone) == 0 {
		o.applying.Unlock()
		cp.written = 0
		if err := o.opts.Checkpoint.Check(ctx, o.gen+1); err != nil {
			return err
		}
		saved = true // still this writer's: what it saved last holds
		return nil
	}
	snap := o.engine.Snapshot()
	// The ended sessions' tombstones go into their records, and out of
	// the snapshot.
	tombs := make(map[string]time.Time, len(cp.pending))
	for id := range cp.pending {
		if t, ok := snap.Tombstones[id]; ok {
			tombs[id] = t
		}
	}
	o.sessions.DropEnded(snap.Tombstones)
	st := state{Engine: snap, Sessions: o.sessions.Running(), Results: map[string]resultIO{}, Triggers: o.counts.export(), Unsent: o.unsent}
	o.applying.Unlock()
	var w checkpoint.Write
	wall, now := time.Now(), o.opts.Now()
	written := int64(0)
	for id, s := range cp.pending {
		rec := endedRecord{Session: s}
		if s.Result != nil {
			rec.Result = &resultIO{Inline: s.Result.Inline, Ref: s.Result.Ref}
		}
		keep := o.sessions.Retention
		if s.Ended != nil {
			keep = s.Ended.Add(o.sessions.Retention).Sub(now)
		}
		if t, ok := tombs[id]; ok {
			rec.Tombstone = &t
			keep = max(keep, t.Sub(now))
		}
		data, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		// Redis expires records by the wall clock.
		w.Put = append(w.Put, checkpoint.Record{ID: id, Data: data, Expire: wall.Add(keep)})
		written += int64(len(data))
	}
	for id := range cp.gone {
		w.Delete = append(w.Delete, id)
	}
	for _, s := range st.Sessions {
		if s.Result != nil {
			st.Results[s.ID] = resultIO{Inline: s.Result.Inline, Ref: s.Result.Ref}
		}
	}
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	w.Snapshot = data
	if force {
		w.Claim, w.From = true, cp.loaded
	}
	// The generation moves on only once a save is confirmed: a failed one
	// may have landed (a lost reply), and the next save repeats its
	// generation (the store lets a writer write its own generation again),
	// so an owner whose saves failed is never ahead of a successor that
	// claimed after its last landed save: its next save is refused.
	gen := o.gen + 1
	if err := o.opts.Checkpoint.Write(ctx, gen, w, wall); err != nil {
		return err
	}
	o.gen = gen
	clear(cp.pending)
	clear(cp.gone)
	cp.saved, cp.savedVer, cp.savedSession = true, ver, sver
	saved = true
	cp.written = written + int64(len(data))
	checkpointBytes.Set(float64(len(data)))
	checkpointWritten.Add(float64(cp.written))
	return nil
}

// restore loads the last checkpoint, if any, and continues its generations.
func (o *Orchestrator) restore(ctx context.Context) error {
	if o.opts.Checkpoint == nil {
		return nil
	}
	clear(o.cp.pending)
	clear(o.cp.gone)
	o.cp.loaded = -1
	data, gen, found, err := o.opts.Checkpoint.Load(ctx)
	if base := o.opts.Generation << 32; err == nil && o.gen < base {
		o.gen = base
	}
	if err != nil || !found {
		return err
	}
	o.cp.loaded = gen
	var st state
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("orchestrator: corrupt checkpoint: %w", err)
	}
	if st.Engine == nil {
		return fmt.Errorf("orchestrator: checkpoint without engine state")
	}
	recs, err := o.opts.Checkpoint.LoadEnded(ctx, time.Now())
	if err != nil {
		return err
	}
	ended := make(map[string]endedRecord, len(recs))
	for _, r := range recs {
		var rec endedRecord
		if err := json.Unmarshal(r.Data, &rec); err != nil || rec.Session.ID != r.ID {
			o.opts.Log.Error(err, "skipping a corrupt ended-session record", "session", r.ID)
			continue
		}
		ended[r.ID] = rec
	}
	list := o.mergeEnded(&st, ended)
	if err := o.engine.Restore(st.Engine); err != nil {
		return err
	}
	o.sessions.Import(list)
	o.counts.restore(st.Triggers)
	o.restoredUnsent = st.Unsent
	o.gen = max(gen, o.opts.Generation<<32)
	o.cp.saved = false
	o.restored = true
	o.opts.Log.Info("restored checkpoint", "generation", gen, "sessions", len(st.Engine.Sessions), "ended", len(ended))
	return nil
}

// mergeEnded combines a snapshot with the ended sessions' records into the
// registry's sessions. A record is final: a session the snapshot still has
// running ended after it was taken (the writer stopped between a record
// and its snapshot). Ended sessions in the snapshot itself (a checkpoint
// written before the records) get their records at the next save.
func (o *Orchestrator) mergeEnded(st *state, ended map[string]endedRecord) []sessions.Session {
	if o.cp.pending == nil {
		o.cp.pending, o.cp.gone = map[string]sessions.Session{}, map[string]bool{}
	}
	if len(ended) > 0 {
		kept := st.Engine.Sessions[:0]
		for _, ss := range st.Engine.Sessions {
			if _, ok := ended[ss.ID]; !ok {
				kept = append(kept, ss)
			}
		}
		st.Engine.Sessions = kept
		if st.Engine.Tombstones == nil {
			st.Engine.Tombstones = map[string]time.Time{}
		}
	}
	list := make([]sessions.Session, 0, len(st.Sessions)+len(ended))
	for _, s := range st.Sessions {
		if _, ok := ended[s.ID]; ok {
			continue
		}
		if r, ok := st.Results[s.ID]; ok && s.Result != nil {
			s.Result.Inline, s.Result.Ref = r.Inline, r.Ref
		}
		if s.State.Ended() {
			o.cp.pending[s.ID] = s
		}
		list = append(list, s)
	}
	for id, rec := range ended {
		s := rec.Session
		if rec.Result != nil && s.Result != nil {
			s.Result.Inline, s.Result.Ref = rec.Result.Inline, rec.Result.Ref
		}
		if rec.Tombstone != nil {
			st.Engine.Tombstones[id] = *rec.Tombstone
		}
		list = append(list, s)
	}
	return list
}
