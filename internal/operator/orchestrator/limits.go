package orchestrator

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/engine"
	"github.com/ziptrail/ziptrail/internal/operator/gateway"
)

// Limits are the operator's per-namespace limits (docs/limits.md): what
// one namespace may take of what every namespace shares in the operator.
// Zero (or negative) leaves a limit off; the operator's flags default to
// DefaultLimits. Each is enforced per operator replica (with the sharded
// engine, a namespace whose workflows several replicas serve may hold up
// to the limit on each).
type Limits struct {
	// SessionsPerNamespace bounds a namespace's running sessions: a start
	// beyond it is refused (429, RESOURCE_EXHAUSTED).
	SessionsPerNamespace int64
	// ObjectsPerSession, BytesPerSession, ObjectsPerNamespace and
	// BytesPerNamespace bound what the trigger engine holds for a session,
	// and for a namespace's running sessions together (engine.Limits says
	// what is counted): an object past a bound fails its session.
	ObjectsPerSession, BytesPerSession     int64
	ObjectsPerNamespace, BytesPerNamespace int64
	// InputBytesPerNamespace bounds the bytes of a namespace's inputs held
	// in the operator's input store (inputs over 64 KiB): a start beyond
	// it is refused (429).
	InputBytesPerNamespace int64
	// RequestsPerSecond and RequestBurst bound each namespace's requests
	// to the session gateway (gateway.RateLimit).
	RequestsPerSecond float64
	RequestBurst      int
	// RefusalsPerConnection paces each client connection of the session
	// gateway (HTTP and gRPC) whose requests are refused faster than this
	// a second: its next request waits (docs/hostile-input.md). Zero or
	// negative: no pacing (behind a proxy that pools many clients on one
	// connection, where one client's refusals would slow the others).
	RefusalsPerConnection float64
}

// DefaultLimits are the operator's defaults (its flags', the chart's).
func DefaultLimits() Limits {
	return Limits{
		SessionsPerNamespace:   1000,
		ObjectsPerSession:      100_000,
		BytesPerSession:        128 << 20,
		ObjectsPerNamespace:    500_000,
		BytesPerNamespace:      256 << 20,
		InputBytesPerNamespace: 128 << 20,
		// One client running short sessions one after another makes
		// ~400 requests a second (an echo session is ~5 ms): the
		// default leaves that room, and still bounds a flood.
		RequestsPerSecond:     1000,
		RequestBurst:          2000,
		RefusalsPerConnection: 10,
	}
}

// Flags registers the operator's --limit-* flags, defaulting to l.
func (l *Limits) Flags(fs *flag.FlagSet) {
	fs.Int64Var(&l.SessionsPerNamespace, "limit-sessions-per-namespace", l.SessionsPerNamespace,
		"running sessions a namespace may have; starts beyond get 429 (0: no limit)")
	fs.Int64Var(&l.ObjectsPerSession, "limit-objects-per-session", l.ObjectsPerSession,
		"objects the trigger engine holds for one session; an object beyond fails the session (0: no limit)")
	fs.Int64Var(&l.BytesPerSession, "limit-bytes-per-session", l.BytesPerSession,
		"bytes (inline contents, names, references, metadata) the trigger engine holds for one session; an object beyond fails the session (0: no limit)")
	fs.Int64Var(&l.ObjectsPerNamespace, "limit-objects-per-namespace", l.ObjectsPerNamespace,
		"objects the trigger engine holds for a namespace's running sessions together; an object beyond fails its session (0: no limit)")
	fs.Int64Var(&l.BytesPerNamespace, "limit-bytes-per-namespace", l.BytesPerNamespace,
		"bytes the trigger engine holds for a namespace's running sessions together; an object beyond fails its session (0: no limit)")
	fs.Int64Var(&l.InputBytesPerNamespace, "limit-input-bytes-per-namespace", l.InputBytesPerNamespace,
		"bytes of a namespace's session inputs held in the operator's input store; starts beyond get 429 (0: only --input-store-bytes)")
	fs.Float64Var(&l.RequestsPerSecond, "limit-requests-per-second", l.RequestsPerSecond,
		"requests a second a namespace may make to the session gateway, per operator replica; beyond get 429 (0: no limit)")
	fs.Float64Var(&l.RefusalsPerConnection, "limit-refusals-per-connection", l.RefusalsPerConnection,
		"refused requests (401, 403, 413, 429 and their gRPC codes) a second one client connection of the session gateway may have before its next request waits, at most 1 s "+
			"(0: no pacing; turn it off behind a proxy that pools many clients on one connection)")
	fs.IntVar(&l.RequestBurst, "limit-request-burst", l.RequestBurst,
		"requests a namespace may make at once to the session gateway before --limit-requests-per-second applies")
}

// Engine is the trigger engine's part of the limits.
func (l Limits) Engine() engine.Limits {
	return engine.Limits{SessionsPerNamespace: l.SessionsPerNamespace, ObjectsPerSession: l.ObjectsPerSession,
		BytesPerSession: l.BytesPerSession, ObjectsPerNamespace: l.ObjectsPerNamespace, BytesPerNamespace: l.BytesPerNamespace}
}

// RateLimit is the gateway's part of the limits (nil when off).
func (l Limits) RateLimit() *gateway.RateLimit {
	if l.RequestsPerSecond <= 0 {
		return nil
	}
	return &gateway.RateLimit{PerSecond: l.RequestsPerSecond, Burst: l.RequestBurst}
}

// ReasonLimitReached is the reason of the Kubernetes Events LimitEvents records.
const ReasonLimitReached = "LimitReached"

// LimitEvents records a Kubernetes Event (Warning, LimitReached) on the
// Workflow whose session or request a limit refused, at most one per
// workflow and limit every Every, so that a namespace flooding past a
// limit does not flood the API server with Events too (the metric
// ziptrail_limits_refused_total counts every refusal).
type LimitEvents struct {
	Recorder events.EventRecorder
	// Reader finds the Workflow (its UID, so `kubectl describe workflow`
	// shows the Event); nil, or a workflow not found: the Event names the
	// workflow by namespace and name only.
	Reader client.Reader
	Every  time.Duration // default 30s
	Now    func() time.Time

	mu   sync.Mutex
	last map[string]time.Time
}

// Record records limit's refusal of something of workflow namespace/name
// (action: what was refused, e.g. StartSession; the Event's action is
// StartSession/sessionsPerNamespace); no workflow: no Event.
func (le *LimitEvents) Record(namespace, workflow, limit, action, msg string) {
	if le == nil || le.Recorder == nil || workflow == "" {
		return
	}
	now := time.Now()
	if le.Now != nil {
		now = le.Now()
	}
	every := le.Every
	if every <= 0 {
		every = 30 * time.Second
	}
	key := namespace + "/" + workflow + "/" + limit
	le.mu.Lock()
	if le.last == nil {
		le.last = map[string]time.Time{}
	}
	if t, ok := le.last[key]; ok && now.Sub(t) < every {
		le.mu.Unlock()
		return
	}
	if len(le.last) >= 4096 {
		for k, t := range le.last {
			if now.Sub(t) >= every {
				delete(le.last, k)
			}
		}
	}
	le.last[key] = now
	le.mu.Unlock()
	// Off the caller's path (the engine's): finding the workflow may wait
	// for the manager's cache.
	go le.emit(namespace, workflow, limit, action, msg)
}

func (le *LimitEvents) emit(namespace, workflow, limit, action, msg string) {
	wf := &v1alpha1.Workflow{}
	wf.Namespace, wf.Name = namespace, workflow
	if le.Reader != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := le.Reader.Get(ctx, client.ObjectKeyFromObject(wf), wf); err != nil {
			wf = &v1alpha1.Workflow{}
			wf.Namespace, wf.Name = namespace, workflow
		}
		cancel()
	}
	wf.APIVersion, wf.Kind = v1alpha1.GroupVersion.String(), "Workflow"
	// The action names the limit: Events of one workflow with the same
	// reason and action are folded into one series (its first note kept).
	le.Recorder.Eventf(wf, nil, corev1.EventTypeWarning, ReasonLimitReached, action+"/"+limit, "%s", msg)
}

// limitRefused counts a refusal by limit and records it on the workflow
// (key namespace/name).
func (o *Orchestrator) limitRefused(key, limit, action, msg string) {
	ns, name, _ := strings.Cut(key, "/")
	gateway.CountLimit(limit, ns)
	o.opts.LimitEvents.Record(ns, name, limit, action, msg)
}

// startRefused is the gateway's error for a start a limit refused.
func (o *Orchestrator) startRefused(key string, err error) error {
	var el *engine.LimitError
	if errors.As(err, &el) {
		err = &gateway.LimitError{Limit: el.Limit, Namespace: el.Namespace, Msg: el.Error(), RetryAfter: 5 * time.Second}
	}
	var gl *gateway.LimitError
	if errors.As(err, &gl) {
		o.limitRefused(key, gl.Limit, "StartSession", gl.Msg)
	}
	return err
}

// limitFailure is the error of an event that made the engine fail its
// session for a limit (actions acts), nil otherwise: the control server
// counts and logs it as a rejected event.
func limitFailure(acts []engine.Action, session, what string) error {
	for _, a := range acts {
		if a.Kind == engine.ActSessionFailed && a.Session == session && a.Limit != "" {
			return fmt.Errorf("%s refused and session %s failed: %s", what, session, a.Reason)
		}
	}
	return nil
}
