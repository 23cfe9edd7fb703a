package engine

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// limitsEngine is an engine with workflows a/wf and b/wf (namespaces a and
// b), each accumulating the objects of bucket "acc" (a batch never full,
// so the trigger holds every object) and completing on "out".
func limitsEngine(t *testing.T, l Limits) *Engine {
	t.Helper()
	e := New(8)
	e.SetPool(NewPool(l))
	for _, name := range []string{"a/wf", "b/wf"} {
		if err := e.SetWorkflow(WorkflowSpec{Name: name, Entry: "entry", OutputBucket: "out", SessionDeadline: time.Hour,
			Triggers: []TriggerSpec{{Name: "acc", Bucket: "acc", Primitive: ByBatchSize, BatchSize: 1 << 30, Targets: []string{"sink"}}}}); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func mustStart(t *testing.T, e *Engine, wf, id string) {
	t.Helper()
	if _, err := e.StartSession(wf, id, Object{Inline: []byte("in")}, t0); err != nil {
		t.Fatal(err)
	}
}

// failure returns the ActSessionFailed among acts, if any.
func failure(acts []Action) *Action {
	for i := range acts {
		if acts[i].Kind == ActSessionFailed {
			return &acts[i]
		}
	}
	return nil
}

func obj(session, key string, inline []byte) Object {
	return Object{Bucket: "acc", Key: key, Session: session, Inline: inline, Producer: "map", Invocation: session + ".0"}
}

func TestLimitObjectsPerSession(t *testing.T) {
	e := limitsEngine(t, Limits{ObjectsPerSession: 4})
	mustStart(t, e, "a/wf", "s1") // the input is its first object
	for i := range 3 {
		if f := failure(e.ObjectReady("a/wf", obj("s1", fmt.Sprint(i), nil), t0)); f != nil {
			t.Fatalf("object %d of 4 failed the session: %s", i+2, f.Reason)
		}
	}
	// Resends of accepted objects cost nothing.
	for range 10 {
		if f := failure(e.ObjectReady("a/wf", obj("s1", "0", nil), t0)); f != nil {
			t.Fatalf("a resent object failed the session: %s", f.Reason)
		}
	}
	acts := e.ObjectReady("a/wf", obj("s1", "over", nil), t0)
	f := failure(acts)
	if f == nil {
		t.Fatalf("the 5th object was accepted: %v", acts)
	}
	if f.Limit != LimitObjectsPerSession || !strings.Contains(f.Reason, "session s1 holds 4 objects") ||
		!strings.Contains(f.Reason, "the limit objectsPerSession is 4") {
		t.Errorf("failure %q (limit %q): want it to name the session, what it holds and the limit", f.Reason, f.Limit)
	}
	if got := describe(acts); strings.Join(got, ";") != "failed;drop" {
		t.Errorf("actions %v, want the failure and the drop only (nothing the object would fire)", got)
	}
	if u := e.Pool().Usage("a"); u != (Usage{}) {
		t.Errorf("namespace a still holds %+v after its only session ended", u)
	}
	// Later events of the ended session are ignored.
	if acts := e.ObjectReady("a/wf", obj("s1", "late", nil), t0); len(acts) != 0 || e.Pool().Usage("a") != (Usage{}) {
		t.Errorf("a late object of the failed session: %v, usage %+v", acts, e.Pool().Usage("a"))
	}
}

func TestLimitBytesPerSession(t *testing.T) {
	e := limitsEngine(t, Limits{BytesPerSession: 10_000})
	mustStart(t, e, "a/wf", "s1")
	big := make([]byte, 4000)
	for i := range 2 {
		if f := failure(e.ObjectReady("a/wf", obj("s1", fmt.Sprint(i), big), t0)); f != nil {
			t.Fatalf("object %d failed the session: %s", i, f.Reason)
		}
	}
	held := e.Pool().Usage("a").Bytes
	if held < 8000 || held > 8200 {
		t.Errorf("namespace a holds %d bytes, want the two objects' 8000 and their names", held)
	}
	f := failure(e.ObjectReady("a/wf", obj("s1", "over", big), t0))
	if f == nil || f.Limit != LimitBytesPerSession || !strings.Contains(f.Reason, "the limit bytesPerSession is 10000") {
		t.Fatalf("the third 4000-byte object: %+v, want the session failed by bytesPerSession", f)
	}
	// Metadata counts too: a sidecar cannot hide bytes there.
	mustStart(t, e, "a/wf", "s2")
	o := obj("s2", "meta", nil)
	o.Metadata = map[string]string{"k": string(make([]byte, 20_000))}
	if f := failure(e.ObjectReady("a/wf", o, t0)); f == nil || f.Limit != LimitBytesPerSession {
		t.Fatalf("an object with 20 kB of metadata: %+v, want bytesPerSession", f)
	}
}

// One namespace's sessions together cannot take more than the namespace
// bound, and another namespace keeps what it may hold.
func TestLimitObjectsPerNamespaceLeavesOthersAlone(t *testing.T) {
	const nsMax = 50
	e := limitsEngine(t, Limits{ObjectsPerNamespace: nsMax, ObjectsPerSession: 1000})
	mustStart(t, e, "b/wf", "b1")
	var failed []string
	for s := range 10 {
		id := fmt.Sprintf("a%d", s)
		mustStart(t, e, "a/wf", id)
		for i := range 20 {
			if f := failure(e.ObjectReady("a/wf", obj(id, fmt.Sprint(i), nil), t0)); f != nil {
				if f.Limit != LimitObjectsPerNamespace || !strings.Contains(f.Reason, "namespace a holds") {
					t.Fatalf("session %s failed by %q: %s", id, f.Limit, f.Reason)
				}
				failed = append(failed, id)
				break
			}
			if u := e.Pool().Usage("a"); u.Objects > nsMax {
				t.Fatalf("namespace a holds %d objects, over its bound %d", u.Objects, nsMax)
			}
		}
	}
	if len(failed) == 0 {
		t.Fatal("namespace a's 210 objects all fit under the bound of 50")
	}
	// Namespace b is untouched: its session takes objects up to the
	// namespace bound, then completes.
	for i := range nsMax - 2 {
		if f := failure(e.ObjectReady("b/wf", obj("b1", fmt.Sprint(i), nil), t0)); f != nil {
			t.Fatalf("namespace b's object %d failed its session: %s", i, f.Reason)
		}
	}
	acts := e.ObjectReady("b/wf", Object{Bucket: "out", Key: "r", Session: "b1", Inline: []byte("ok")}, t0)
	if got := describe(acts); len(got) == 0 || got[0] != "complete" {
		t.Fatalf("namespace b's session: %v, want it complete", got)
	}
	if u := e.Pool().Usage("b"); u != (Usage{}) {
		t.Errorf("namespace b holds %+v after its session completed", u)
	}
}

func TestLimitSessionsPerNamespace(t *testing.T) {
	e := limitsEngine(t, Limits{SessionsPerNamespace: 2})
	mustStart(t, e, "a/wf", "a1")
	mustStart(t, e, "a/wf", "a2")
	if err := e.Pool().CheckStart("a"); err == nil {
		t.Error("CheckStart admits a third session of namespace a")
	}
	_, err := e.StartSession("a/wf", "a3", Object{}, t0)
	var le *LimitError
	if !errors.As(err, &le) || le.Limit != LimitSessionsPerNamespace ||
		err.Error() != "namespace a has 2 running sessions, the limit sessionsPerNamespace is 2" {
		t.Fatalf("third start: %v", err)
	}
	mustStart(t, e, "b/wf", "b1") // another namespace starts
	// A session ending makes room.
	e.ObjectReady("a/wf", Object{Bucket: "out", Key: "r", Session: "a1", Inline: []byte{}}, t0)
	mustStart(t, e, "a/wf", "a3")
	if u := e.Pool().Usage("a"); u.Sessions != 2 {
		t.Errorf("namespace a runs %d sessions, want 2", u.Sessions)
	}
	// An expiry makes room too.
	e.Tick(t0.Add(2 * time.Hour))
	if u := e.Pool().Usage("a"); u != (Usage{}) {
		t.Errorf("after every session expired namespace a holds %+v", u)
	}
}

// Invocations the engine did not issue (a sidecar's starts under made-up
// ids) count as objects: a sidecar cannot grow a session's bookkeeping
// without bound that way either.
func TestLimitInventedInvocations(t *testing.T) {
	e := limitsEngine(t, Limits{ObjectsPerSession: 100})
	mustStart(t, e, "a/wf", "s1")
	for i := range 200 {
		acts := e.FunctionStarted("a/wf", "s1", "map", fmt.Sprintf("s1.x%d", i), []byte("args"), t0)
		if f := failure(acts); f != nil {
			if f.Limit != LimitObjectsPerSession || i < 98 {
				t.Fatalf("start %d: %s (%s)", i, f.Reason, f.Limit)
			}
			return
		}
	}
	t.Fatal("200 made-up invocations were all kept")
}

// Engines sharing a pool (a replica's engine buckets) count a namespace's
// sessions together; a restored checkpoint keeps what its sessions hold.
func TestLimitPoolSharedAndRestored(t *testing.T) {
	pool := NewPool(Limits{SessionsPerNamespace: 3, ObjectsPerNamespace: 100})
	e1, e2 := limitsEngine(t, Limits{}), limitsEngine(t, Limits{})
	e1.SetPool(pool)
	e2.SetPool(pool)
	mustStart(t, e1, "a/wf", "s1")
	mustStart(t, e2, "a/wf", "s2")
	mustStart(t, e2, "a/wf", "s3")
	if _, err := e1.StartSession("a/wf", "s4", Object{}, t0); err == nil {
		t.Fatal("a fourth session of namespace a started on the other engine")
	}
	for i := range 5 {
		e1.ObjectReady("a/wf", obj("s1", fmt.Sprint(i), []byte("xyz")), t0)
	}
	want := pool.Usage("a")
	snap := e1.Snapshot()
	data, err := snap.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := UnmarshalSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	// The same engine restored (a new owner of the bucket): s1 is given
	// back and counted again, exactly.
	if err := e1.Restore(back); err != nil {
		t.Fatal(err)
	}
	if got := pool.Usage("a"); got != want {
		t.Errorf("after restoring the same sessions the pool holds %+v, want %+v", got, want)
	}
	// A snapshot written before the counts were kept: the accepted keys count.
	for i := range back.Sessions {
		back.Sessions[i].Objects, back.Sessions[i].Bytes = 0, 0
	}
	if err := e1.Restore(back); err != nil {
		t.Fatal(err)
	}
	if got := pool.Usage("a"); got.Sessions != 3 || got.Objects < 5 {
		t.Errorf("after restoring an old snapshot the pool holds %+v, want 3 sessions and s1's 5 keys at least", got)
	}
	// An engine that stops serving (its bucket moves) gives back what its
	// sessions hold, and keeps them for its last snapshot.
	e2.Release()
	if got := pool.Usage("a"); got.Sessions != 1 {
		t.Errorf("after the other engine released its two sessions the pool holds %+v, want s1 only", got)
	}
	if n := len(e2.Snapshot().Sessions); n != 2 {
		t.Errorf("the released engine's snapshot holds %d sessions, want 2", n)
	}
	e2.ObjectReady("a/wf", obj("s2", "late", nil), t0) // nothing more reaches the pool
	e2.Tick(t0.Add(2 * time.Hour))
	if got := pool.Usage("a"); got.Sessions != 1 {
		t.Errorf("the released engine's sessions ending changed the pool: %+v", got)
	}
}

// A namespace's sidecars flooding the engine with objects: what the engine
// holds for that namespace stays under its bounds whatever they send, and
// another namespace's session runs to completion meanwhile.
func TestLimitFloodIsBounded(t *testing.T) {
	e := limitsEngine(t, Limits{ObjectsPerSession: 1000, BytesPerSession: 1 << 20, ObjectsPerNamespace: 1500, BytesPerNamespace: 2 << 20})
	mustStart(t, e, "b/wf", "b1")
	payload := make([]byte, 1024)
	failures := 0
	for s := range 20 {
		id := fmt.Sprintf("a%d", s)
		mustStart(t, e, "a/wf", id)
		for i := range 2000 {
			if f := failure(e.ObjectReady("a/wf", obj(id, fmt.Sprint(i), payload), t0)); f != nil {
				failures++
				break
			}
		}
		if i := s % 3; i == 0 { // b keeps working meanwhile
			if f := failure(e.ObjectReady("b/wf", obj("b1", fmt.Sprint(s), payload), t0)); f != nil {
				t.Fatalf("namespace b's object failed its session: %s", f.Reason)
			}
		}
		u := e.Pool().Usage("a")
		if u.Objects > 1500 || u.Bytes > 2<<20 {
			t.Fatalf("namespace a holds %+v, over its bounds", u)
		}
	}
	if failures != 20 {
		t.Errorf("%d of namespace a's 20 flooding sessions failed, want all", failures)
	}
	held := 0
	for _, ss := range e.Snapshot().Sessions {
		if strings.HasPrefix(ss.Workflow, "a/") {
			held += len(ss.Seen) + len(ss.SeenBy)
		}
	}
	if held != 0 {
		t.Errorf("the engine still keeps %d of namespace a's objects", held)
	}
	acts := e.ObjectReady("b/wf", Object{Bucket: "out", Key: "r", Session: "b1", Inline: []byte("ok")}, t0)
	if got := describe(acts); len(got) == 0 || got[0] != "complete" {
		t.Fatalf("namespace b's session: %v, want it complete", got)
	}
}
