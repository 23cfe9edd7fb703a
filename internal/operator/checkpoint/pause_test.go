package checkpoint

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// A write that timed out while Redis was paused is retried by the client
// (go-redis retries a timed-out command on a new connection) and both the
// first attempt and its retry land once Redis resumes: the retry finds its
// own generation stored. That is the writer's own save, not a newer
// owner's: it must not read as ErrStale (issue 32, defect 7: a 10 s
// pause ended the engine with "a newer snapshot exists" though no other
// replica existed).
func TestAWriteRetriedAcrossAPauseIsNotStale(t *testing.T) {
	r := servers.StartRedis(t)
	cl := redis.NewClient(&redis.Options{Addr: r.Addr, ReadTimeout: 200 * time.Millisecond, MaxRetries: 3,
		MinRetryBackoff: 100 * time.Millisecond, MaxRetryBackoff: 200 * time.Millisecond})
	t.Cleanup(func() { _ = cl.Close() })
	s := &Store{Client: cl, Key: "ziptrail:test"}
	ctx := context.Background()
	if err := s.Write(ctx, 1, Write{Snapshot: []byte("one")}, time.Now()); err != nil {
		t.Fatal(err)
	}
	r.Pause(t)
	done := make(chan error, 1)
	go func() { done <- s.Write(ctx, 2, Write{Snapshot: []byte("two")}, time.Now()) }()
	// Long enough for the first attempt to time out and a retry to be
	// sent; the last retry's answer arrives after the resume.
	time.Sleep(450 * time.Millisecond)
	r.Resume(t)
	if err := <-done; err != nil {
		t.Fatalf("a write retried across a pause: %v", err)
	}
	if err := s.Check(ctx, 3); err != nil {
		t.Fatalf("check after the write: %v", err)
	}
	data, gen, _, err := s.Load(ctx)
	if err != nil || gen != 2 || string(data) != "two" {
		t.Fatalf("load: %q gen %d: %v", data, gen, err)
	}
	// Another writer at the same generation is still refused.
	other := &Store{Client: cl, Key: "ziptrail:test"}
	if err := other.Write(ctx, 2, Write{Snapshot: []byte("other")}, time.Now()); err == nil {
		t.Fatal("another writer at a stored generation: accepted")
	}
}

// A new owner's claim is conditional on the generation it restored: a
// previous owner's save landing between the new owner's load and its
// claim (it does not know yet that it lost the bucket, and acknowledged
// what that save holds) fails the claim instead of being overwritten.
func TestAClaimFailsWhenAnotherOwnerSavedSinceTheLoad(t *testing.T) {
	r := servers.StartRedis(t)
	ctx := context.Background()
	old := &Store{Client: r.Client, Key: "ziptrail:test"}
	if err := old.Write(ctx, 1<<32+1, Write{Snapshot: []byte("one")}, time.Now()); err != nil {
		t.Fatal(err)
	}
	next := &Store{Client: r.Client, Key: "ziptrail:test"}
	_, loaded, _, err := next.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The previous owner saves once more (and acknowledges what it holds).
	if err := old.Write(ctx, 1<<32+2, Write{Snapshot: []byte("two")}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := next.Write(ctx, 2<<32, Write{Snapshot: []byte("claim"), Claim: true, From: loaded}, time.Now()); !errors.Is(err, ErrChanged) {
		t.Fatalf("a claim over a save made since its load: %v, want ErrChanged", err)
	}
	data, gen, _, _ := next.Load(ctx)
	if string(data) != "two" {
		t.Fatalf("after the refused claim: %q", data)
	}
	if err := next.Write(ctx, 2<<32, Write{Snapshot: []byte("claim"), Claim: true, From: gen}, time.Now()); err != nil {
		t.Fatalf("a claim over what it loaded: %v", err)
	}
	if err := old.Write(ctx, 1<<32+3, Write{Snapshot: []byte("late")}, time.Now()); !errors.Is(err, ErrStale) {
		t.Fatalf("the previous owner after the claim: %v, want ErrStale", err)
	}
	// A first claim over nothing stored expects -1.
	empty := &Store{Client: r.Client, Key: "ziptrail:test:empty"}
	if err := empty.Write(ctx, 5, Write{Snapshot: []byte("x"), Claim: true, From: -1}, time.Now()); err != nil {
		t.Fatal(err)
	}
}

// A writer repeats a failed save at the same generation (it may have
// landed): if it did, the repeat replaces it with the newer data and the
// writer's checks pass; another writer at that generation is refused.
func TestAWriterWritesItsOwnGenerationAgain(t *testing.T) {
	r := servers.StartRedis(t)
	ctx := context.Background()
	a := &Store{Client: r.Client, Key: "ziptrail:test"}
	if err := a.Write(ctx, 6, Write{Snapshot: []byte("landed, reply lost"), Put: []Record{{ID: "s1", Data: []byte("r1"), Expire: time.Now().Add(time.Hour)}}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := a.Check(ctx, 6); err != nil {
		t.Fatalf("the writer's check of its own generation: %v", err)
	}
	if err := a.Write(ctx, 6, Write{Snapshot: []byte("newer"), Put: []Record{{ID: "s2", Data: []byte("r2"), Expire: time.Now().Add(time.Hour)}}}, time.Now()); err != nil {
		t.Fatalf("the writer's repeat at its own generation: %v", err)
	}
	data, gen, _, err := a.Load(ctx)
	if err != nil || gen != 6 || string(data) != "newer" {
		t.Fatalf("load: %q gen %d: %v", data, gen, err)
	}
	recs, err := a.LoadEnded(ctx, time.Now())
	if err != nil || len(recs) != 2 {
		t.Fatalf("records: %v %v", recs, err)
	}
	b := &Store{Client: r.Client, Key: "ziptrail:test"}
	if err := b.Check(ctx, 6); !errors.Is(err, ErrStale) {
		t.Fatalf("another writer's check at a stored generation: %v, want ErrStale", err)
	}
	if err := b.Write(ctx, 6, Write{Snapshot: []byte("b")}, time.Now()); !errors.Is(err, ErrStale) {
		t.Fatalf("another writer at a stored generation: %v, want ErrStale", err)
	}
	if err := b.Save(ctx, 6, []byte("b")); !errors.Is(err, ErrStale) {
		t.Fatalf("another writer's Save at a stored generation: %v, want ErrStale", err)
	}
	if err := a.Save(ctx, 6, []byte("a again")); err != nil {
		t.Fatalf("the writer's Save at its own generation: %v", err)
	}
}
