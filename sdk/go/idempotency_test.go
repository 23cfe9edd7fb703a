package ziptrail

import (
	"context"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/ziptrail/ziptrail/internal/invocation"
)

// TestIdempotencyKey: a function behind a real queue-proxy-zl process sees
// its invocation's idempotency key (session/invocation/attempt); a second
// delivery of the same key is answered by the sidecar from its record, so
// the handler runs once; another attempt is another key. Without a
// sidecar the handler derives the same key.
func TestIdempotencyKey(t *testing.T) {
	shm := functionShm(t)
	var mu sync.Mutex
	var keys []string
	fn := httptest.NewServer(FunctionHandler(func(ctx context.Context, inv *Invocation) ([]byte, error) {
		mu.Lock()
		keys = append(keys, inv.IdempotencyKey)
		mu.Unlock()
		return []byte("did " + inv.IdempotencyKey), nil
	}))
	defer fn.Close()
	sc := startSidecar(t, sidecarOpts{keys: keyFile(t, "k1", 1), upstream: fn.URL, shm: shm})

	env := invocation.Envelope{Namespace: "ns", Function: "f", Session: "s", Invocation: "s.3", Attempt: 2}
	for range 2 {
		if code, body := post(t, sc.url(), env); code != 200 || body != "did s/s.3/2" {
			t.Fatalf("%d %q", code, body)
		}
	}
	env.Attempt = 3
	if code, body := post(t, sc.url(), env); code != 200 || body != "did s/s.3/3" {
		t.Fatalf("attempt 3: %d %q", code, body)
	}
	// Straight to the function (no sidecar): the key is derived the same way.
	env.Invocation, env.Attempt = "s.4", 0
	if code, body := post(t, fn.URL, env); code != 200 || body != "did s/s.4/0" {
		t.Fatalf("without a sidecar: %d %q", code, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 3 || keys[0] != "s/s.3/2" || keys[1] != "s/s.3/3" {
		t.Fatalf("the handler ran for %q: a duplicate key ran again", keys)
	}
}
