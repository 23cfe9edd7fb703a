package retry

import (
	"net/http"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	now := time.Unix(0, 0)
	b := &Backoff{For: 10 * time.Second, Initial: 200 * time.Millisecond, Max: 2 * time.Second, Now: func() time.Time { return now }}
	base := 200 * time.Millisecond
	for i := range 5 {
		p, ok := b.Next(0)
		if !ok || p < base/2 || p > base {
			t.Fatalf("pause %d: %v (ok %v), want within [%v, %v]", i, p, ok, base/2, base)
		}
		base = min(2*base, 2*time.Second)
		now = now.Add(p)
	}
	// A Retry-After longer than the back-off is honoured, capped.
	if p, _ := b.Next(5 * time.Second); p != 5*time.Second {
		t.Errorf("Retry-After 5s: pause %v", p)
	}
	now = time.Unix(0, 0).Add(9 * time.Second)
	if p, ok := b.Next(time.Hour); !ok || p != time.Second {
		t.Errorf("a second of budget left, Retry-After 1h: %v %v, want 1s", p, ok)
	}
	now = now.Add(time.Second)
	if _, ok := b.Next(0); ok {
		t.Error("a retry past the budget")
	}
	if _, ok := (&Backoff{For: -1}).Next(0); ok {
		t.Error("a retry with retries off")
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{"": 0, "3": 3 * time.Second, "x": 0, "-1": 0,
		now.Add(4 * time.Second).Format(http.TimeFormat): 4 * time.Second} {
		if got := RetryAfter(http.Header{"Retry-After": {v}}, now); got != want {
			t.Errorf("Retry-After %q: %v, want %v", v, got, want)
		}
	}
}
