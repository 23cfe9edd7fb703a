package sessions

import (
	"context"
	"testing"
	"time"
)

func TestRegistryLifecycle(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := NewRegistry()
	r.Now = func() time.Time { return now }
	r.MaxEvents = 3
	if err := r.Start("s1", "ns", "wf"); err != nil {
		t.Fatal(err)
	}
	if err := r.Start("s1", "ns", "wf"); err == nil {
		t.Error("a duplicate session id was accepted")
	}
	for i := 0; i < 4; i++ {
		r.Log("s1", "Invoked", "f%d", i)
	}
	s, _ := r.Get("s1")
	if len(s.Events) != 3 || s.FirstEvent != 2 || s.Events[2].Message != "f3" {
		t.Errorf("bounded log: first=%d events=%v", s.FirstEvent, s.Events)
	}

	// A waiter wakes when the session ends; a second ending is ignored.
	done := make(chan Session)
	go func() {
		s, err := r.Wait(context.Background(), "s1")
		if err != nil {
			t.Error(err)
		}
		done <- s
	}()
	now = now.Add(time.Minute)
	if err := r.Finish("s1", Completed, &Result{Bucket: "out", Key: "k", Inline: []byte("42")}, ""); err != nil {
		t.Fatal(err)
	}
	_ = r.Finish("s1", Expired, nil, "late")
	s = <-done
	if s.State != Completed || string(s.Result.Inline) != "42" || !s.Ended.Equal(now) {
		t.Errorf("ended session: %+v", s)
	}
	if c := r.Counts("ns", "wf"); c[Completed] != 1 {
		t.Errorf("counts %v", c)
	}

	// Waiting on a running session honours the context.
	_ = r.Start("s2", "ns", "wf")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if s, err := r.Wait(ctx, "s2"); err == nil || s.State != Running {
		t.Errorf("cancelled wait: %v %v", s.State, err)
	}
	if _, err := r.Get("nope"); err != ErrNotFound {
		t.Errorf("unknown: %v", err)
	}

	// Ended sessions are forgotten after the retention.
	now = now.Add(2 * time.Hour)
	if n := r.Prune(); n != 1 {
		t.Errorf("pruned %d, want 1", n)
	}
	if len(r.List("ns", "")) != 1 {
		t.Errorf("running session must survive pruning")
	}
}

// The workflow's status shows its last failure and why (issue 15, item 8).
func TestLastFailed(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := NewRegistry()
	r.Now = func() time.Time { return now }
	if _, ok := r.LastFailed("ns", "wf"); ok {
		t.Fatal("a failure before any session")
	}
	for _, id := range []string{"a", "b", "c", "other"} {
		wf := "wf"
		if id == "other" {
			wf = "wf2"
		}
		if err := r.Start(id, "ns", wf); err != nil {
			t.Fatal(err)
		}
	}
	_ = r.Finish("a", Failed, nil, "function f failed: first")
	now = now.Add(time.Second)
	_ = r.Finish("b", Failed, nil, "function g failed: second")
	now = now.Add(time.Second)
	_ = r.Finish("c", Completed, nil, "")
	_ = r.Finish("other", Failed, nil, "another workflow's")
	s, ok := r.LastFailed("ns", "wf")
	if !ok || s.ID != "b" || s.Error != "function g failed: second" {
		t.Fatalf("last failure %+v %v, want b's", s, ok)
	}
	if _, ok := r.LastFailed("other-ns", "wf"); ok {
		t.Error("a failure leaked into another namespace")
	}
}

// What a checkpoint writes (TakeEnded): sessions that ended or changed
// after ending, once each, and the ids Prune forgot; Version moves with
// every change.
func TestTakeEnded(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := NewRegistry()
	r.Now = func() time.Time { return now }
	r.Checkpointed = true
	v := r.Version()
	_ = r.Start("a", "ns", "wf")
	_ = r.Start("b", "ns", "wf")
	if r.Version() == v {
		t.Error("Start did not move the version")
	}
	if ended, gone := r.TakeEnded(); len(ended)+len(gone) != 0 {
		t.Errorf("nothing ended yet: %v %v", ended, gone)
	}
	_ = r.Finish("a", Completed, &Result{Inline: []byte("x")}, "")
	ended, _ := r.TakeEnded()
	if len(ended) != 1 || ended[0].ID != "a" || string(ended[0].Result.Inline) != "x" {
		t.Errorf("ended %+v", ended)
	}
	if ended, _ := r.TakeEnded(); len(ended) != 0 {
		t.Errorf("taken twice: %+v", ended)
	}
	r.Log("a", "Late", "an event after the end")
	if ended, _ := r.TakeEnded(); len(ended) != 1 || ended[0].Events[len(ended[0].Events)-1].Kind != "Late" {
		t.Errorf("a change after the end: %+v", ended)
	}
	if run := r.Running(); len(run) != 1 || run[0].ID != "b" {
		t.Errorf("running %+v", run)
	}
	m := map[string]time.Time{"a": now, "b": now, "c": now}
	r.DropEnded(m)
	if _, ok := m["a"]; ok || len(m) != 2 {
		t.Errorf("DropEnded left %v, want b and c", m)
	}
	now = now.Add(2 * time.Hour)
	v = r.Version()
	r.Prune()
	if _, gone := r.TakeEnded(); len(gone) != 1 || gone[0] != "a" || r.Version() == v {
		t.Errorf("pruned: %v (version %d -> %d)", gone, v, r.Version())
	}

	// Without Checkpointed nothing accumulates.
	q := NewRegistry()
	_ = q.Start("a", "ns", "wf")
	_ = q.Finish("a", Failed, nil, "x")
	q.Retention = 0
	q.Prune()
	if ended, gone := q.TakeEnded(); len(ended)+len(gone) != 0 {
		t.Errorf("kept without Checkpointed: %v %v", ended, gone)
	}
}
