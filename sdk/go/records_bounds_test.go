package ziptrail

import (
	"bytes"
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// TestFunctionRecordsWaitForTheRunningKey: a delivery of a key that runs
// waits for that run (seen by the records' hook), and gets its answer.
func TestFunctionRecordsWaitForTheRunningKey(t *testing.T) {
	f := newRecordingFunction()
	records := newFnRecords()
	waiting := make(chan string, 1)
	records.waiting = func(key string) { waiting <- key }
	srv := httptest.NewServer(functionHandler(f.handle, records))
	defer srv.Close()

	env := keyed("s.1", 0, "block")
	answers := make(chan answer, 2)
	for range 2 {
		go func() {
			a, err := deliver(http.MethodPost, srv.URL, env, nil)
			if err != nil {
				t.Error(err)
			}
			answers <- a
		}()
	}
	<-f.started
	if key := <-waiting; key != "s/s.1/0" {
		t.Fatalf("waiting for %q", key)
	}
	close(f.release)
	a, b := <-answers, <-answers
	if !a.same(b) || a.code != 200 || (a.header.Get("Ziptrail-Idempotent-Replay") == "") == (b.header.Get("Ziptrail-Idempotent-Replay") == "") {
		t.Fatalf("answers\n%v\n%v", a, b)
	}
	if got := f.ran(); !slices.Equal(got, []string{"s/s.1/0"}) {
		t.Fatalf("runs %q", got)
	}
}

// TestFunctionRecordsAPanicIsForgotten: a run that ended without an answer
// (its handler panicked) leaves no record: the next delivery runs.
func TestFunctionRecordsAPanicIsForgotten(t *testing.T) {
	var runs atomic.Int32
	srv := httptest.NewUnstartedServer(FunctionHandler(func(ctx context.Context, inv *Invocation) ([]byte, error) {
		if runs.Add(1) == 1 {
			panic("the first run dies")
		}
		return []byte("second"), nil
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	defer srv.Close()
	if _, err := deliver(http.MethodPost, srv.URL, keyed("s.1", 0, ""), nil); err == nil {
		t.Fatal("an answer from a handler that panicked")
	}
	if a := mustDeliver(t, srv.URL, keyed("s.1", 0, "")); a.code != 200 || string(a.body) != "second" || runs.Load() != 2 {
		t.Fatalf("%v after %d runs", a, runs.Load())
	}
}

func TestFunctionRecordsBounds(t *testing.T) {
	now := time.Unix(1000, 0)
	mk := func(keys int, bytes int64) *fnRecords {
		r := newFnRecords()
		r.maxKeys, r.maxBytes, r.maxAnswer, r.now = keys, bytes, 400, func() time.Time { return now }
		return r
	}
	ans := func(body []byte) *fnAnswer { return &fnAnswer{status: 200, header: http.Header{}, body: body} }
	ctx := context.Background()
	var r *fnRecords
	run := func(key string, body []byte) {
		t.Helper()
		rec, old := r.acquire(ctx, key)
		if rec == nil {
			t.Fatalf("%s is recorded: %v", key, old)
		}
		r.finish(rec, ans(body))
	}
	recorded := func(key string) bool { // without acquiring it
		r.mu.Lock()
		defer r.mu.Unlock()
		rec := r.keys[key]
		return rec != nil && rec.elem != nil
	}

	r = mk(3, 1000)
	for _, k := range []string{"a", "b", "c"} {
		run(k, []byte("0123456789"))
	}
	if rec, a := r.acquire(ctx, "a"); rec != nil || a == nil || string(a.body) != "0123456789" {
		t.Fatalf("a: %v %v", rec, a)
	}
	run("d", []byte("y")) // a fourth key: the oldest (a) goes
	if recorded("a") || !recorded("b") || !recorded("d") {
		t.Fatal("the oldest key is not the one evicted")
	}
	// Bytes: three answers of 200 (+64) fit, a fourth evicts the oldest.
	r = mk(100, 1000)
	for _, k := range []string{"p", "q", "r", "s"} {
		run(k, bytes.Repeat([]byte("z"), 200))
	}
	if _, b := r.usage(); recorded("p") || !recorded("q") || !recorded("s") || b > 1000 {
		t.Fatalf("bytes: %d", b)
	}
	// An answer over the per-answer cap is not recorded: the key runs again...
	run("big", bytes.Repeat([]byte("b"), 401))
	if rec, _ := r.acquire(ctx, "big"); rec == nil {
		t.Fatal("an answer over the cap was recorded")
	} else {
		r.abandon(rec)
	}
	// ...but a delivery that waited for it gets it.
	rec, _ := r.acquire(ctx, "big2")
	got, waits := make(chan *fnAnswer), make(chan string, 1)
	r.waiting = func(key string) { waits <- key }
	go func() {
		_, a := r.acquire(ctx, "big2")
		got <- a
	}()
	<-waits
	r.finish(rec, ans(bytes.Repeat([]byte("b"), 401)))
	if a := <-got; a == nil || len(a.body) != 401 {
		t.Fatalf("the waiter got %v", a)
	}
	// A waiter whose caller leaves stops waiting.
	rec, _ = r.acquire(ctx, "slow")
	cctx, cancel := context.WithCancel(ctx)
	r.waiting = func(string) { cancel() }
	if w, a := r.acquire(cctx, "slow"); w != nil || a != nil {
		t.Fatalf("a waiter whose caller left: %v %v", w, a)
	}
	r.waiting = nil
	r.finish(rec, ans([]byte("s")))
	// Running keys are never evicted (their duplicates wait for them).
	r = mk(2, 1000)
	var running []*fnRecord
	for _, k := range []string{"u", "v", "w"} {
		rec, _ := r.acquire(ctx, k)
		running = append(running, rec)
	}
	if n, _ := r.usage(); n != 3 {
		t.Fatalf("%d keys running", n)
	}
	for _, rec := range running {
		r.finish(rec, ans([]byte(".")))
	}
	if n, _ := r.usage(); n != 2 || recorded("u") || !recorded("v") || !recorded("w") {
		t.Fatalf("after the runs: %d keys", n)
	}
	// TTL: ten minutes after the run ended.
	run("t", []byte("t"))
	now = now.Add(recordTTL - time.Second)
	if rec, _ := r.acquire(ctx, "t"); rec != nil {
		t.Fatal("expired before its TTL")
	}
	now = now.Add(2 * time.Second)
	if rec, _ := r.acquire(ctx, "t"); rec == nil {
		t.Fatal("not expired after its TTL")
	}
}
