package orchestrator

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ziptrail/ziptrail/internal/operator/gateway"
)

// Starts with an idempotency key (gateway.IdempotencyKeyHeader): a client
// that lost the answer to a start sends it again with the same key and
// gets the same session instead of a second one.
//
// The session id of a keyed start is derived from its namespace, workflow
// and key (<workflow>-<12 hex digits of their SHA-256>, the usual id
// shape), so the key needs no table of its own: the session registry is
// the table, and it travels in checkpoints with the sessions. A start
// whose session exists answers it (once a checkpoint covers it, as a
// first start would); a new owner of the engine (failover, a rollout)
// knows the session if its checkpoint did, and if it did not, the first
// start was never acknowledged and starting it now is right. A key is
// remembered as long as its session is (sessions.Registry.Retention after
// it ended). Concurrent starts with one key are serialized here, so the
// second waits for the first's answer.

var startsDeduplicated = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "ziptrail_session_starts_deduplicated_total",
	Help: "Session starts answered with the session an earlier start with the same idempotency key started.",
})

func init() { metrics.Registry.MustRegister(startsDeduplicated) }

// keyedStarts are the keyed starts in progress in this process, by session
// id: a later start with the same id waits until the channel closes.
var keyedStarts = struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}{m: map[string]chan struct{}{}}

// keyedID is the session id of a start of workflow namespace/name with an
// idempotency key.
func keyedID(namespace, name, key string) string {
	sum := sha256.Sum256([]byte(namespace + "\x00" + name + "\x00" + key))
	return name + "-" + hex.EncodeToString(sum[:6])
}

// randomID is the session id of a start without a key.
func randomID(name string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return name + "-" + hex.EncodeToString(b[:])
}

// claimStart chooses the id of a session Start is asked for. Without an
// idempotency key in ctx it is a random one. With one it is the key's id,
// claimed until release is called: when a session of that id exists
// already, done is set and Start answers id (or err) without starting
// anything.
func (o *Orchestrator) claimStart(ctx context.Context, namespace, name string) (id string, done bool, release func(), err error) {
	key := gateway.IdempotencyKey(ctx)
	if key == "" {
		return randomID(name), false, func() {}, nil
	}
	id = keyedID(namespace, name, key)
	for {
		keyedStarts.mu.Lock()
		busy, ok := keyedStarts.m[id]
		if !ok {
			ch := make(chan struct{})
			keyedStarts.m[id] = ch
			keyedStarts.mu.Unlock()
			release = func() {
				keyedStarts.mu.Lock()
				delete(keyedStarts.m, id)
				keyedStarts.mu.Unlock()
				close(ch)
			}
			break
		}
		keyedStarts.mu.Unlock()
		select { // a start with the same key is under way: its answer decides
		case <-busy:
		case <-ctx.Done():
			return "", true, nil, fmt.Errorf("waiting for an earlier start with the same %s: %w", gateway.IdempotencyKeyHeader, ctx.Err())
		}
	}
	s, gerr := o.sessions.Get(id)
	if gerr != nil {
		return id, false, release, nil
	}
	release()
	if s.Namespace != namespace || s.Workflow != name {
		return "", true, nil, fmt.Errorf("%s: session %s belongs to %s/%s", gateway.IdempotencyKeyHeader, id, s.Namespace, s.Workflow)
	}
	startsDeduplicated.Inc()
	// Answered only once a checkpoint covers it, as the first start was
	// (or would have been, had its answer not been lost).
	if err := o.durable(ctx); err != nil {
		return "", true, nil, err
	}
	return id, true, nil, nil
}
