package sidecar

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

// TestDuplicateWaitsForTheRunningDelivery: a second delivery of a key
// that arrives while the first still runs waits for it (single flight)
// and gets its answer; the function runs once.
func TestDuplicateWaitsForTheRunningDelivery(t *testing.T) {
	s := workflowSidecar(t, controlServer(t, &orderedEvents{}), "p", "work")
	waiting := make(chan string, 1)
	s.records.waiting = func(key string) { waiting <- key }
	running := make(chan struct{}, 2)
	release := make(chan struct{})
	var mu sync.Mutex
	runs := 0
	u := behindProxy(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		runs++
		mu.Unlock()
		running <- struct{}{}
		<-release
		_, _ = w.Write([]byte("once"))
	}))
	env := invocation.Envelope{Namespace: "ns", Workflow: "wf", Function: "wf-work", Session: "s1", Invocation: "s1.0"}
	type answer struct {
		code   int
		body   string
		replay string
	}
	answers := make(chan answer, 2)
	deliver := func() {
		resp, body := post(t, u, env)
		answers <- answer{resp.StatusCode, string(body), resp.Header.Get(invocation.HeaderReplayed)}
	}
	go deliver()
	<-running
	go deliver()
	if key := <-waiting; key != "s1/s1.0/0" {
		t.Fatalf("waiting for %q", key)
	}
	close(release)
	got := map[string]int{}
	for range 2 {
		select {
		case a := <-answers:
			if a.code != http.StatusOK || a.body != "once" {
				t.Fatalf("answer %+v", a)
			}
			got[a.replay]++
		case <-time.After(time.Minute):
			t.Fatal("a delivery was never answered")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if runs != 1 || got[""] != 1 || got["1"] != 1 {
		t.Fatalf("the function ran %d times; answers fresh/replayed %v", runs, got)
	}
}

// TestRecordsAreBounded: records are per session, freed when the session
// is dropped, after their TTL, and oldest first past the key or byte cap;
// a delivery that did not run the function leaves the key free; an
// answer too large to record is not run again either.
func TestRecordsAreBounded(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	r := newRecords(3, 1<<20, time.Minute)
	run := func(session, key string) bool {
		rec, _, _, err := r.acquire(ctx, session, key)
		if err != nil {
			t.Fatal(err)
		}
		if rec != nil {
			r.finish(rec, &outcome{status: 200, header: http.Header{}, body: []byte(key)}, now)
		}
		return rec != nil
	}
	if !run("a", "1") || !run("a", "2") || !run("b", "1") {
		t.Fatal("a first delivery did not run")
	}
	if run("a", "1") || run("b", "1") {
		t.Fatal("a duplicate ran")
	}
	// Sessions are apart: dropping one frees only its keys.
	r.drop("a")
	if !run("a", "1") || run("b", "1") {
		t.Fatal("drop freed the wrong session")
	}
	// Past the cap of 3 keys the oldest go: b/1 was recorded first.
	run("c", "1")
	run("c", "2")
	if n, _ := r.usage(); n != 3 {
		t.Fatalf("%d keys held, cap 3", n)
	}
	if !run("b", "1") {
		t.Fatal("the oldest record outlived the cap")
	}
	// A TTL later everything is free.
	r.sweep(now.Add(2 * time.Minute))
	if n, b := r.usage(); n != 0 || b != 0 {
		t.Fatalf("%d keys, %d bytes after the TTL", n, b)
	}
	// Abandoned (the function did not run): the next delivery runs.
	rec, _, _, _ := r.acquire(ctx, "d", "1")
	r.abandon(rec)
	if !run("d", "1") {
		t.Fatal("an abandoned key was not run again")
	}
	// Ran, but its answer could not be recorded: never run again.
	rec, _, _, _ = r.acquire(ctx, "d", "2")
	r.finish(rec, nil, now)
	rec, out, unrecorded, _ := r.acquire(ctx, "d", "2")
	if rec != nil || out != nil || !unrecorded {
		t.Fatal("an unrecorded key ran again")
	}
	// The byte cap holds too.
	r = newRecords(100, 3000, time.Minute)
	for _, k := range []string{"1", "2", "3"} {
		rec, _, _, _ := r.acquire(ctx, "s", k)
		r.finish(rec, &outcome{status: 200, body: bytes.Repeat([]byte("x"), 1000)}, now)
	}
	if n, b := r.usage(); n != 2 || b > 3000 {
		t.Fatalf("%d keys, %d bytes held, cap 3000 bytes", n, b)
	}
}
