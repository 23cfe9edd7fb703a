package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/engine"
	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// ckptRig runs orchestrators of one workflow, "ns/echo" (its function
// sends its input back as the result, or waits for release when the input
// is "wait"), on one checkpoint in a real redis-server.
type ckptRig struct {
	t       *testing.T
	redis   *servers.Redis
	store   *checkpoint.Store
	fns     *servers.Functions
	wf      *v1alpha1.Workflow
	release chan struct{}
	// interval is the orchestrators' CheckpointInterval (default 20 ms).
	interval time.Duration
}

func newCkptRig(t *testing.T) *ckptRig {
	r := &ckptRig{t: t, redis: servers.StartRedis(t), fns: &servers.Functions{}, release: make(chan struct{})}
	r.store = &checkpoint.Store{Client: r.redis.Client, Key: "ziptrail:test:engine:b0"}
	r.fns.Add(t, "echo-run", ziptrail.FunctionHandler(func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		in := inv.Objects[0].Bytes()
		if string(in) == "wait" {
			select {
			case <-r.release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return nil, ziptrail.SendObject(ctx, "output", "result", append([]byte("out:"), in...), nil)
	}))
	t.Cleanup(func() { close(r.release) }) // before the servers close
	r.wf = &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "echo"},
		Spec: v1alpha1.WorkflowSpec{Entry: "run", Functions: []v1alpha1.FunctionSpec{{Name: "run", Image: "example.com/run"}}}}
	return r
}

// start runs an orchestrator claiming the checkpoint at Lease generation gen.
func (r *ckptRig) start(gen int64) (*Orchestrator, chan error, context.CancelFunc) {
	interval := r.interval
	if interval == 0 {
		interval = 20 * time.Millisecond
	}
	o, err := New(Options{Resolver: r.fns, Checkpoint: r.store, CheckpointInterval: interval, Log: logr.Discard(),
		Generation: gen, Claim: true})
	if err != nil {
		r.t.Fatal(err)
	}
	if err := o.SetWorkflow(r.wf, true, ""); err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx) }()
	r.t.Cleanup(func() { cancel(); <-done; done <- nil })
	waitFor(r.t, "the claim", func() bool { _, g, _, _ := r.store.Load(context.Background()); return g>>32 >= gen })
	return o, done, cancel
}

// complete runs n sessions to their end and returns their ids.
func (r *ckptRig) complete(o *Orchestrator, n int) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var ids []string
	for i := range n {
		id, err := o.StartSession(ctx, "ns", "echo", []byte("in-"+strconv.Itoa(i)))
		if err != nil {
			r.t.Fatal(err)
		}
		if s, err := o.Sessions().Wait(ctx, id); err != nil || s.State != sessions.Completed {
			r.t.Fatalf("session %s: %+v %v", id, s, err)
		}
		ids = append(ids, id)
	}
	return ids
}

// snapshot is the stored snapshot, decoded, with its size.
func (r *ckptRig) snapshot() (state, int) {
	data, _, _, err := r.store.Load(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	var st state
	if err := json.Unmarshal(data, &st); err != nil {
		r.t.Fatal(err)
	}
	return st, len(data)
}

// persisted waits until the n sessions that ended have their records and
// the snapshot holds running sessions only. (It waited for "a save after
// the call": a save that came before the call, the last one with nothing
// changed since, left it waiting for ever; CI met it under load.)
func (r *ckptRig) persisted(n int64) {
	waitFor(r.t, fmt.Sprintf("%d ended sessions' records and a snapshot of running sessions only", n), func() bool {
		if r.records() != n {
			return false
		}
		st, _ := r.snapshot()
		for _, s := range st.Sessions {
			if s.State != sessions.Running {
				return false
			}
		}
		return true
	})
}

func (r *ckptRig) records() int64 {
	n, err := r.redis.Client.HLen(context.Background(), r.store.Key+":ended").Result()
	if err != nil {
		r.t.Fatal(err)
	}
	return n
}

// netInput is what clients sent redis-server so far (INFO stats).
func (r *ckptRig) netInput() int64 {
	info, err := r.redis.Client.Info(context.Background(), "stats").Result()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "total_net_input_bytes:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				r.t.Fatal(err)
			}
			return n
		}
	}
	r.t.Fatal("no total_net_input_bytes in INFO stats")
	return 0
}

func readResult(t *testing.T, s sessions.Session) string {
	t.Helper()
	if s.State != sessions.Completed || s.Result == nil {
		t.Fatalf("session %s: %s %q, no result", s.ID, s.State, s.Error)
	}
	rc, err := Results{}.OpenResult(context.Background(), s.Namespace, s.Result)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, _ := io.ReadAll(rc)
	return string(b)
}

// After a failover (a new owner at a higher Lease generation claims the
// bucket while the old one still runs) and after a restart, every ended
// session's result is still readable, restored from its own record; the
// snapshot holds none of them.
func TestCheckpointEndedSessionsSurviveFailover(t *testing.T) {
	r := newCkptRig(t)
	first, _, stop := r.start(3)
	const n = 30
	ids := r.complete(first, n)
	waitFor(t, "the ended sessions' records", func() bool { return r.records() == n })
	waitFor(t, "a snapshot without them", func() bool { st, _ := r.snapshot(); return len(st.Sessions) == 0 })
	if st, _ := r.snapshot(); len(st.Engine.Tombstones) != 0 {
		t.Errorf("the snapshot still holds %d tombstones of ended sessions", len(st.Engine.Tombstones))
	}

	heir, _, _ := r.start(4) // the failover: the old owner has not stopped
	check := func(o *Orchestrator) {
		for i, id := range ids {
			s, err := o.Sessions().Get(id)
			if err != nil {
				t.Fatalf("session %s after the failover: %v", id, err)
			}
			if got, want := readResult(t, s), "out:in-"+strconv.Itoa(i); got != want {
				t.Errorf("session %s: result %q, want %q", id, got, want)
			}
		}
	}
	check(heir)
	stop()

	// A restart of the heir's bucket (a later generation) restores them too.
	more := r.complete(heir, 5)
	waitFor(t, "their records", func() bool { return r.records() == n+5 })
	third, _, _ := r.start(5)
	check(third)
	for _, id := range more {
		if s, err := third.Sessions().Get(id); err != nil || !strings.HasPrefix(readResult(t, s), "out:in-") {
			t.Errorf("session %s after the restart: %+v %v", id, s, err)
		}
	}
}

// A demoted owner (its function ends a session after the next owner
// claimed the bucket) cannot write that session's record: its next save
// (a start's) is refused (checkpoint.ErrStale) and it stops; the heir
// keeps the session running. The old owner's periodic saves are an hour
// apart: its fence check at each of them would otherwise stop it as soon
// as the heir claims, before the session ends there.
func TestCheckpointDemotedOwnerWritesNoRecord(t *testing.T) {
	r := newCkptRig(t)
	r.interval = time.Hour
	old, oldDone, _ := r.start(3)
	done := r.complete(old, 2)
	id, err := old.StartSession(context.Background(), "ns", "echo", []byte("wait")) // its save writes the records
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the records", func() bool { return r.records() == 2 })
	waitFor(t, "the running session in the snapshot", func() bool { st, _ := r.snapshot(); return len(st.Sessions) == 1 })

	r.interval = 0
	heir, _, _ := r.start(4)
	r.release <- struct{}{} // the old owner's function returns: its session completes there
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if s, err := old.Sessions().Wait(ctx, id); err != nil || s.State != sessions.Completed {
		t.Fatalf("the old owner's session: %+v %v", s, err)
	}
	if _, err := old.StartSession(ctx, "ns", "echo", []byte("late")); err == nil { // a save, with the record
		t.Fatal("the demoted owner acknowledged a start")
	}
	select {
	case err := <-oldDone:
		oldDone <- err
		if !errors.Is(err, checkpoint.ErrStale) {
			t.Fatalf("the old owner stopped with %v, want checkpoint.ErrStale", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the old owner still runs after the heir claimed the bucket")
	}
	if ok, _ := r.redis.Client.HExists(context.Background(), r.store.Key+":ended", id).Result(); ok {
		t.Errorf("the demoted owner wrote ended session %s's record", id)
	}
	if n := r.records(); n != 2 {
		t.Errorf("%d records, want the 2 written before the failover", n)
	}
	if s, err := heir.Sessions().Get(id); err != nil || s.State != sessions.Running {
		t.Errorf("the heir's session %s: %+v %v", id, s, err)
	}
	for _, d := range done {
		if s, err := heir.Sessions().Get(d); err != nil || readResult(t, s) == "" {
			t.Errorf("the heir lost ended session %s: %v", d, err)
		}
	}
}

// What a save writes does not grow with the sessions that ended: the
// snapshot stays the running sessions' size, a change costs the same
// bytes after 10 ended sessions as after 150, and with nothing changed
// nothing is written (Redis's own count of the bytes clients sent).
func TestCheckpointSaveBytesDoNotGrowWithEndedSessions(t *testing.T) {
	r := newCkptRig(t)
	o, _, _ := r.start(1)
	if _, err := o.StartSession(context.Background(), "ns", "echo", []byte("wait")); err != nil { // one running session throughout
		t.Fatal(err)
	}
	// changeCost starts a session that keeps running and returns the
	// bytes sent to Redis until a snapshot with it is stored.
	changeCost := func() (int64, int) {
		_, g0, _, _ := r.store.Load(context.Background())
		in0 := r.netInput()
		wid, err := o.StartSession(context.Background(), "ns", "echo", []byte("wait"))
		if err != nil {
			t.Fatal(err)
		}
		var size int
		waitFor(t, "a snapshot with the new session", func() bool {
			_, g, _, _ := r.store.Load(context.Background())
			st, n := r.snapshot()
			size = n
			for _, s := range st.Sessions {
				if s.ID == wid && g > g0 {
					return true
				}
			}
			return false
		})
		return r.netInput() - in0, size
	}
	r.complete(o, 10)
	r.persisted(10)
	few, fewSize := changeCost()
	r.complete(o, 150)
	r.persisted(160)
	many, manySize := changeCost()
	t.Logf("a change after 10 ended sessions: %d B sent, snapshot %d B; after 160: %d B, snapshot %d B", few, fewSize, many, manySize)
	// The second snapshot holds one more running session (~1 KB): 150
	// ended sessions in it would be ~130 KB.
	if manySize > fewSize+4<<10 {
		t.Errorf("the snapshot grew from %d to %d B with 150 more ended sessions", fewSize, manySize)
	}
	// Polling the snapshot (this test's reads) counts too: both sides
	// poll about as much, the ended sessions would add ~130 KB.
	if many > 2*few+32<<10 {
		t.Errorf("a change cost %d B to save after 160 ended sessions, %d B after 10", many, few)
	}

	// Idle: 50 save intervals with nothing changed send fence checks only.
	in0 := r.netInput()
	time.Sleep(50 * 20 * time.Millisecond)
	if idle := r.netInput() - in0; idle > 50*256 {
		t.Errorf("%d B sent to Redis in 50 idle save intervals, want fence checks only (< %d)", idle, 50*256)
	}
}

// A checkpoint written before ended sessions had their own records (the
// whole registry in one snapshot) restores: its ended sessions' results
// are readable, its tombstones kept, and the next save moves them into
// records.
func TestCheckpointRestoresOldFormat(t *testing.T) {
	r := newCkptRig(t)
	now := time.Now().UTC().Truncate(time.Second)
	started, ended, tomb := now.Add(-2*time.Minute).Format(time.RFC3339), now.Add(-time.Minute).Format(time.RFC3339), now.Add(59*time.Minute).Format(time.RFC3339)
	// As the previous version wrote it (state with every session).
	old := fmt.Sprintf(`{"engine":{"version":1,"sessions":null,"tombstones":{"echo-0ld000000001":%q,"echo-0ld000000002":%q}},`+
		`"sessions":[`+
		`{"id":"echo-0ld000000001","namespace":"ns","workflow":"echo","state":"Completed","started":%q,"ended":%q,"invocations":1,"objects":1,"result":{"bucket":"output","key":"result","size":9},"events":[{"time":%q,"kind":"Started","message":"session started"},{"time":%q,"kind":"Completed","message":"Completed"}]},`+
		`{"id":"echo-0ld000000002","namespace":"ns","workflow":"echo","state":"Failed","started":%q,"ended":%q,"invocations":1,"objects":0,"error":"function run failed: boom"}],`+
		`"results":{"echo-0ld000000001":{"inline":"b3V0Om9sZC0x"}},`+
		`"triggers":{"ns/echo":{"entry":{"firings":3}}}}`,
		tomb, tomb, started, ended, started, ended, started, ended)
	if err := r.store.Save(context.Background(), 2<<32+7, []byte(old)); err != nil {
		t.Fatal(err)
	}
	o, _, _ := r.start(3)
	s, err := o.Sessions().Get("echo-0ld000000001")
	if err != nil {
		t.Fatal(err)
	}
	if got := readResult(t, s); got != "out:old-1" {
		t.Errorf("old session's result %q, want out:old-1", got)
	}
	if len(s.Events) != 2 {
		t.Errorf("old session's events %+v", s.Events)
	}
	if f, err := o.Sessions().Get("echo-0ld000000002"); err != nil || f.State != sessions.Failed || f.Error != "function run failed: boom" {
		t.Errorf("old failed session: %+v %v", f, err)
	}
	if _, err := o.Engine().StartSession("ns/echo", "echo-0ld000000001", sessionsInput("x"), time.Now()); err == nil {
		t.Error("the old tombstone was lost: the engine accepted the ended session again")
	}
	waitFor(t, "the old ended sessions' records", func() bool { return r.records() == 2 })
	waitFor(t, "a snapshot without them", func() bool { st, _ := r.snapshot(); return len(st.Sessions) == 0 && len(st.Engine.Tombstones) == 0 })
	// And from the new format once more.
	heir, _, _ := r.start(4)
	if s, err := heir.Sessions().Get("echo-0ld000000001"); err != nil || readResult(t, s) != "out:old-1" {
		t.Errorf("after a second restore: %+v %v", s, err)
	}
	if _, err := heir.Engine().StartSession("ns/echo", "echo-0ld000000002", sessionsInput("x"), time.Now()); err == nil {
		t.Error("the tombstone moved into the record was lost")
	}
}

func sessionsInput(s string) engine.Object {
	return engine.Object{Bucket: "input", Key: "input", Inline: []byte(s), Size: int64(len(s))}
}

// TestPeriodicSavesTakeAtMostTheirShare: a periodic save that wrote puts
// the next one off by its own time divided by CheckpointMaxShare; one
// that had nothing to write puts nothing off. The check is on the times
// the orchestrator computes, not on how long anything took.
func TestPeriodicSavesTakeAtMostTheirShare(t *testing.T) {
	r := newCkptRig(t)
	// its own client, closed below to make a save fail
	rc := redis.NewClient(&redis.Options{Addr: r.redis.Addr})
	t.Cleanup(func() { _ = rc.Close() })
	store := &checkpoint.Store{Client: rc, Key: r.store.Key}
	o, err := New(Options{Resolver: r.fns, Checkpoint: store, CheckpointMaxShare: 0.25, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.SetWorkflow(r.wf, true, ""); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	before := time.Now()
	if !o.cp.due(before) {
		t.Fatal("the first save is not due")
	}
	if err := o.periodicSave(ctx); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	if o.cp.written == 0 {
		t.Fatal("the first save wrote nothing")
	}
	// the save took d ≤ after−before and started at ≥ before: the next is
	// at start + 4·d, after the save's end and at most 4·(after−before)
	// past before
	next := o.cp.next
	if !next.After(before) || next.After(before.Add(4*after.Sub(before))) {
		t.Fatalf("next save at %v, want in (%v, %v]", next.Sub(before), time.Duration(0), 4*after.Sub(before))
	}
	if o.cp.due(next.Add(-time.Nanosecond)) || !o.cp.due(next) {
		t.Fatalf("due before %v or not at it", next.Sub(before))
	}
	if err := o.periodicSave(ctx); err != nil {
		t.Fatal(err)
	}
	if o.cp.written != 0 || !o.cp.next.Equal(next) {
		t.Fatalf("an unchanged state: wrote %d bytes, next save moved by %v", o.cp.written, o.cp.next.Sub(next))
	}
	if d := DefaultCheckpointMaxShare; o.opts.CheckpointMaxShare != 0.25 || d <= 0 || d > 1 {
		t.Fatalf("share %v, default %v", o.opts.CheckpointMaxShare, d)
	}
	// a change to save, and a save that fails: retried at the next tick,
	// not put off
	o.touch()
	_ = rc.Close()
	if err := o.periodicSave(ctx); err == nil {
		t.Fatal("a save through a closed client succeeded")
	}
	if !o.cp.next.Equal(next) {
		t.Fatalf("a failed save moved the next one by %v", o.cp.next.Sub(next))
	}
}
