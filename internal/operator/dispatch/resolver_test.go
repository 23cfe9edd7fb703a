package dispatch

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"
)

// countingResolver answers from a table and counts its lookups.
type countingResolver struct {
	urls  map[string]string
	calls int
}

func (r *countingResolver) URL(_ context.Context, ns, svc string) (*url.URL, error) {
	r.calls++
	s, ok := r.urls[ns+"/"+svc]
	if !ok {
		return nil, errors.New("knative service " + ns + "/" + svc + " has no URL yet (not ready)")
	}
	return url.Parse(s)
}

func TestCachedResolver(t *testing.T) {
	now := time.Unix(1000, 0)
	inner := &countingResolver{urls: map[string]string{"a/f": "http://f.a.svc.cluster.local"}}
	c := &CachedResolver{Resolver: inner, TTL: time.Second, Now: func() time.Time { return now }}
	ctx := context.Background()

	for i := 0; i < 3; i++ {
		u, err := c.URL(ctx, "a", "f")
		if err != nil || u.String() != "http://f.a.svc.cluster.local" {
			t.Fatalf("URL: %v, %v", u, err)
		}
		u.Host = "changed.by.the.caller" // the caller's copy
	}
	if inner.calls != 1 {
		t.Fatalf("%d lookups for three calls within the TTL, want 1", inner.calls)
	}
	now = now.Add(time.Second)
	if _, err := c.URL(ctx, "a", "f"); err != nil || inner.calls != 2 {
		t.Fatalf("after the TTL: %v, %d lookups, want 2", err, inner.calls)
	}
	// A service of another namespace with the same name is its own entry;
	// a failed lookup is never kept.
	for i := 0; i < 2; i++ {
		if _, err := c.URL(ctx, "b", "f"); err == nil {
			t.Fatal("b/f resolved")
		}
	}
	if inner.calls != 4 {
		t.Fatalf("%d lookups, want 4: failures are asked again", inner.calls)
	}
	inner.urls["b/f"] = "http://f.b.svc.cluster.local"
	if u, err := c.URL(ctx, "b", "f"); err != nil || u.Host != "f.b.svc.cluster.local" {
		t.Fatalf("b/f once ready: %v, %v", u, err)
	}
	// Bounded: a flood of names keeps at most maxCachedURLs entries.
	for i := 0; i < maxCachedURLs+10; i++ {
		inner.urls["c/"+string(rune('a'+i%26))+time.Duration(i).String()] = "http://x"
		_, _ = c.URL(ctx, "c", string(rune('a'+i%26))+time.Duration(i).String())
	}
	if n := len(c.urls); n > maxCachedURLs {
		t.Fatalf("%d entries, want at most %d", n, maxCachedURLs)
	}
}
