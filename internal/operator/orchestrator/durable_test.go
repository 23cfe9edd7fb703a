package orchestrator

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// TestStartedSessionIsCheckpointed: a start is acknowledged only once the
// checkpoint holds the session, so an owner killed right after it (before
// its next periodic save; here the interval is an hour) loses nothing the
// client was told exists: the next owner restores the running session and
// completes it. Concurrent starts share saves.
func TestStartedSessionIsCheckpointed(t *testing.T) {
	r := newCkptRig(t)
	r.interval = time.Hour
	o, done, cancel := r.start(1)
	ctx, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()

	id, err := o.StartSession(ctx, "ns", "echo", []byte("wait"))
	if err != nil {
		t.Fatal(err)
	}
	st, _ := r.snapshot()
	if !snapshotHolds(st, id) {
		t.Fatalf("session %s was acknowledged before a checkpoint held it", id)
	}
	var wg sync.WaitGroup
	ids := make([]string, 16)
	for i := range ids {
		wg.Go(func() {
			var err error
			if ids[i], err = o.StartSession(ctx, "ns", "echo", []byte("wait")); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	st, _ = r.snapshot()
	for _, id := range ids {
		if id != "" && !snapshotHolds(st, id) {
			t.Errorf("concurrent start %s was acknowledged before a checkpoint held it", id)
		}
	}

	// The next owner claims the bucket (the first one's writes are
	// refused from then on) and restores every acknowledged session.
	o2, _, _ := r.start(2)
	cancel()
	<-done
	done <- nil // as the rig's cleanup expects
	for _, id := range append(ids, id) {
		if s, err := o2.Sessions().Get(id); err != nil || s.State != sessions.Running {
			t.Errorf("the next owner lost session %s: %+v %v", id, s, err)
		}
	}
}

func snapshotHolds(st state, id string) bool {
	if st.Engine == nil {
		return false
	}
	for _, s := range st.Engine.Sessions {
		if s.ID == id {
			return true
		}
	}
	return false
}
