package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestReadsTTLAndSessions(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	s := New(1<<20, c.now)
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.Put(ctx, Meta{ID: "two", Session: "s1", Reads: 2, Expires: c.t.Add(time.Minute)}, []byte("hello")))
	must(s.Put(ctx, Meta{ID: "ttl", Session: "s1", Expires: c.t.Add(time.Second)}, []byte("x")))
	must(s.Put(ctx, Meta{ID: "other", Session: "s2", Expires: c.t.Add(time.Minute)}, []byte("y")))

	for i := 0; i < 2; i++ {
		l, err := s.Read("two")
		if err != nil || string(l.Data) != "hello" {
			t.Fatalf("read %d: %v", i, err)
		}
		l.Release()
	}
	// After the allowed reads the object is freed, and a further read is
	// told why.
	if _, err := s.Read("two"); !errors.Is(err, ErrExhausted) {
		t.Errorf("read after the allowed reads: %v, want exhausted", err)
	}
	if _, _, ok := s.Peek("two"); ok {
		t.Error("an exhausted object is still held")
	}

	c.t = c.t.Add(time.Second)
	if _, err := s.Read("ttl"); !errors.Is(err, ErrExpired) {
		t.Errorf("expired: %v", err)
	}
	if n := s.DropSession("s2"); n != 1 {
		t.Errorf("dropped %d", n)
	}
	if s.Used() != 0 || s.Len() != 0 {
		t.Errorf("left %d bytes in %d objects", s.Used(), s.Len())
	}
	// The exhausted marker lives as long as the object would have.
	c.t = c.t.Add(time.Minute)
	s.Sweep()
	if _, err := s.Read("two"); !errors.Is(err, ErrNotFound) {
		t.Errorf("exhausted marker outlived the object's expiry: %v", err)
	}
}

func TestExhaustedWhileLeased(t *testing.T) {
	s := New(1<<20, nil)
	_ = s.Put(context.Background(), Meta{ID: "o", Reads: 1, Expires: time.Now().Add(time.Hour)}, []byte("data"))
	l, err := s.Read("o")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Read("o"); !errors.Is(err, ErrExhausted) {
		t.Errorf("second read: %v", err)
	}
	// Still readable by the holder of the lease until it releases.
	if string(l.Data) != "data" || s.Used() != 4 {
		t.Errorf("lease data %q used %d", l.Data, s.Used())
	}
	l.Release()
	if s.Used() != 0 {
		t.Errorf("not freed after the last release")
	}
}

func TestMemoryCapBackPressure(t *testing.T) {
	s := New(10, nil)
	ctx := context.Background()
	exp := time.Now().Add(time.Hour)
	if err := s.Put(ctx, Meta{ID: "big", Expires: exp}, make([]byte, 11)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("too large: %v", err)
	}
	if err := s.Put(ctx, Meta{ID: "a", Expires: exp}, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := s.Put(short, Meta{ID: "b", Expires: exp}, make([]byte, 8)); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("put over the cap without a reader: %v", err)
	}
	// A waiting put proceeds as soon as a read frees memory.
	done := make(chan error, 1)
	go func() { done <- s.Put(ctx, Meta{ID: "c", Expires: exp}, make([]byte, 8)) }()
	l, err := s.Read("a")
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s.Used() != 8 {
		t.Errorf("used %d", s.Used())
	}
}
