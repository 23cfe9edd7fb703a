// Package sidecar is the ziptrail part of queue-proxy-zl: the pod's object
// store and pull server (the producer side), the consumer client, and a handler
// wrapper that resolves references on incoming invocations (pulling the
// objects into the pod's shared memory) and turns large objects in outgoing
// function outputs into references (the bytes stay in this pod until a
// consumer pulls them). Requests without ziptrail content pass untouched.
package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/ziptrail/ziptrail/internal/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/controlclient"
	"github.com/ziptrail/ziptrail/internal/dataplane/directmsg"
	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/messaging"
	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/dataplane/tier"
	"github.com/ziptrail/ziptrail/internal/invocation"
)

// Sidecar is one pod's data plane.
type Sidecar struct {
	cfg    Config
	Store  *store.Store
	keys   atomic.Pointer[ref.Keyring]
	server *pull.Server
	client *pull.Client
	ctl    *controlclient.Client
	api    *localapi.Server
	// apiFiles is api once it runs, for the message streams' readers
	// (their large messages' files come from its pool).
	apiFiles atomic.Pointer[localapi.Server]
	msgLn    net.Listener // the messaging fast path's socket
	msgs     *messaging.Router
	seq      atomic.Uint64
	ready    chan struct{} // closed once keys are known
	once     sync.Once

	outputsOnce sync.Once
	outputs     *semaphore.Weighted // bytes of function outputs being read

	backedUp chan struct{}
	// Shutdown (shutdown.go): SIGTERM's early backup runs once; what it
	// backed up is not uploaded again by the final one; stopped closes
	// when the servers are closed.
	terminating sync.Once
	backedUpIDs sync.Map // object id → struct{}
	stopped     chan struct{}

	// sameNode serves this pod's objects to consumers on its node (samenode.go).
	sameNode *samenode.Server
	// direct brokers same-node direct channels (direct.go).
	direct *directmsg.Broker

	deleg delegator // the triggers this sidecar fires itself (delegate.go)

	records *records // outcomes by idempotency key (idempotency.go)
	fences  *fences  // the engine owners' fences seen (fence.go)

	// The tiers in use: the Config's, or the operator's (setTiers).
	redis    atomic.Pointer[tier.Redis]
	s3       atomic.Pointer[tier.S3]
	tiersSet atomic.Bool
}

// New prepares a sidecar; Start runs its servers.
func New(cfg Config) *Sidecar {
	s := &Sidecar{cfg: cfg, Store: store.New(cfg.MemoryLimit, nil), ready: make(chan struct{}), backedUp: make(chan struct{}),
		stopped: make(chan struct{}), records: newRecords(cfg.IdempotencyMaxKeys, cfg.IdempotencyMaxBytes, cfg.ObjectTTL),
		fences: newFences(maxFenceKeys)}
	if cfg.Redis != nil {
		s.redis.Store(cfg.Redis)
		s.Store.Spill = s.spill
	}
	if cfg.S3 != nil {
		s.s3.Store(cfg.S3)
	}
	s.msgs = s.newRouter()
	return s
}

// live reports whether the tiers may still arrive from the operator, so
// the servers must look them up on every use.
func (s *Sidecar) live() bool {
	return s.cfg.OperatorAddr != "" && s.cfg.Redis == nil && s.cfg.S3 == nil
}

// tiers is the read-through chain: Redis, then S3.
func (s *Sidecar) tiers() tier.Chain {
	var c tier.Chain
	if r := s.redis.Load(); r != nil {
		c = append(c, r)
	}
	if t := s.s3.Load(); t != nil {
		c = append(c, t)
	}
	return c
}

// Backup copies every unread object to the slow tier (S3), so consumers
// can still read them after this pod is gone; objects an earlier Backup
// copied are skipped. It runs on SIGTERM and again at the end of the
// drain (shutdown.go).
func (s *Sidecar) Backup(ctx context.Context) (int, error) {
	s3 := s.s3.Load()
	if s3 == nil {
		return 0, nil
	}
	n := 0
	var errs []error
	for _, m := range s.Store.Unread() {
		if _, done := s.backedUpIDs.Load(m.ID); done {
			continue
		}
		lease, ok := s.Store.Hold(m.ID)
		if !ok {
			continue
		}
		data, err := lease.Data, error(nil)
		if lease.Owned() {
			// A shared-memory file the function handed over: copied
			// safely before the S3 client reads it.
			data, err = store.Clone(data)
		}
		if err == nil {
			err = s3.Put(ctx, m.ID, data, 0)
		}
		lease.Release()
		backups.WithLabelValues(result(err)).Inc()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.backedUpIDs.Store(m.ID, struct{}{})
		n++
	}
	return n, errors.Join(errs...)
}

// BackedUp is closed once the final shutdown backup finished.
func (s *Sidecar) BackedUp() <-chan struct{} { return s.backedUp }

// DataplanePort is the data plane's port: the configured one, or after
// Start the one the system chose for port 0.
func (s *Sidecar) DataplanePort() int { return s.cfg.DataplanePort }

// Start listens for consumers, connects to the operator (or loads the key
// file) and runs until ctx ends.
func (s *Sidecar) Start(ctx context.Context) error {
	if err := s.cfg.Validate(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if s.cfg.KeyFile != "" {
		if err := s.loadKeyFile(); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(s.cfg.DataplanePort)))
	if err != nil {
		return fmt.Errorf("data plane listener: %w", err)
	}
	if s.cfg.DataplanePort == 0 {
		// Port 0 (tests on loopback): the port the system chose is the
		// one references and the directory announce, so the router New
		// made with port 0 is made again (nothing used it before Start).
		s.cfg.DataplanePort = ln.Addr().(*net.TCPAddr).Port
		s.msgs = s.newRouter()
	}
	s.server = &pull.Server{Store: s.Store, Streams: s.msgs.ServeStream, StreamMagic: messaging.StreamMagic,
		Opens: s.tcpOpens(), OpenMagic: directmsg.TCPMagic}
	s.startSameNode()
	s.startDirect()
	switch {
	case s.live():
		s.server.Fallback = tier.Chain{s.liveRedis()}
	case s.cfg.Redis != nil:
		s.server.Fallback = tier.Chain{s.cfg.Redis}
	}
	go func() {
		<-s.ready
		s.server.Keys = s.keys.Load()
		_ = s.server.Serve(ln)
	}()
	ctlCtx, stopCtl := context.WithCancel(context.WithoutCancel(ctx))
	if s.cfg.OperatorAddr != "" {
		tokenFile := s.cfg.TokenFile
		if tokenFile == "" {
			tokenFile = controlclient.DefaultTokenFile
		}
		s.ctl = controlclient.NewClient(s.cfg.OperatorAddr, controlclient.FileToken(tokenFile), &controlv1.Hello{Namespace: s.cfg.Namespace, Workflow: s.cfg.Workflow,
			Function: s.cfg.Function, Pod: s.cfg.Pod, DataplaneAddr: s.addr(), Node: s.cfg.SameNode.Node},
			controlclient.Commands{
				Tiers: s.setTiers,
				Keys: func(k *controlv1.Keys) {
					// Keys start every stream; its operator sends the
					// delegated triggers after them, if any.
					s.setDelegations(nil)
					_ = s.setKeys(k)
					// Keys start every stream: a new stream's operator
					// learns this pod's group members again.
					go s.msgs.Resync()
				},
				GroupView:       s.msgs.View,
				GroupJoinResult: s.msgs.JoinResult,
				Delegations:     s.setDelegations,
				Drop: func(d *controlv1.DropObjects) {
					s.Store.DropSession(d.Session)
					if len(d.Keys) == 0 { // the session is collected: its keys can come no more
						s.records.drop(d.Session)
					}
				},
				KeepAlive: func(k *controlv1.KeepAlive) {
					for _, r := range k.Refs {
						if kr := s.keys.Load(); kr != nil {
							if rec, err := kr.Open(r, time.Now()); err == nil {
								s.Store.Extend(rec.Key, time.Now().Add(time.Duration(k.ExtendMs)*time.Millisecond))
							}
						}
					}
				}})
		s.ctl.Log = s.cfg.Log
		s.ctl.KeepFor = s.cfg.KeepReportsFor
		// The stream outlives SIGTERM (ctx) until the shutdown below is
		// done: the operator must not take the pod's live group members
		// for dead while Knative drains it.
		go func() { _ = s.ctl.Run(ctlCtx) }()
	}
	stopMetrics := func() {}
	if s.cfg.MetricsPort != 0 {
		if stopMetrics, err = s.serveMetrics(); err != nil {
			_ = ln.Close()
			stopCtl()
			return fmt.Errorf("metrics listener: %w", err)
		}
	}
	if s.cfg.APISocket != "" {
		if err := s.serveLocalAPI(); err != nil {
			_ = ln.Close()
			stopMetrics()
			stopCtl()
			return err
		}
	}
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				s.shutdown(func() {
					stopCtl()
					_ = ln.Close()
					s.stopSameNode()
					s.stopDirect()
					if s.api != nil {
						s.api.Stop()
						_ = s.msgLn.Close()
					}
					stopMetrics()
				})
				return
			case <-t.C:
				s.Store.Sweep()
				s.records.sweep(time.Now())
				s.sweepSameNode()
			}
		}
	}()
	return nil
}

// serveLocalAPI starts the function container's API on its unix socket;
// object files go through the shared-memory directory.
func (s *Sidecar) serveLocalAPI() error {
	if err := os.MkdirAll(s.cfg.ShmDir, 0o777); err != nil {
		return fmt.Errorf("shared-memory directory: %w", err)
	}
	api := &localapi.Server{Store: s.Store, Addr: s.addr(), Sealing: s.withNode, Messages: s.msgs, Dir: s.cfg.ShmDir, Namespace: s.cfg.Namespace, Function: s.cfg.Function,
		TTL: s.cfg.ObjectTTL, InlineThreshold: s.cfg.InlineThreshold, MaxObjectBytes: s.cfg.MemoryLimit, PutTimeout: s.cfg.PutTimeout,
		Keys: func(ctx context.Context) (*ref.Keyring, error) {
			if err := s.waitKeys(ctx); err != nil {
				return nil, err
			}
			return s.keys.Load(), nil
		},
		Pull: func(ctx context.Context, r string, dst func(size int64) (io.WriterAt, error)) (pull.Info, error) {
			if err := s.waitKeys(ctx); err != nil {
				return pull.Info{}, err
			}
			return s.pullTo(ctx, r, dst)
		},
	}
	switch {
	case s.live():
		api.Spilled, api.Persist, api.Fast = tier.Chain{s.liveRedis()}, s.liveS3(), s.liveRedis()
	default:
		if s.cfg.Redis != nil {
			api.Spilled, api.Fast = tier.Chain{s.cfg.Redis}, s.cfg.Redis
		}
		if s.cfg.S3 != nil {
			api.Persist = s.cfg.S3
		}
	}
	if s.ctl != nil {
		api.Report = func(ev *controlv1.ObjectReady) error {
			return s.ctl.Send(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_ObjectReady{ObjectReady: ev}})
		}
	}
	ln, err := localapi.Listen(s.cfg.APISocket)
	if err != nil {
		return err
	}
	// Messages' Send and Recv also have the fast path's socket.
	mln, err := localapi.Listen(localapi.MessageSocket(s.cfg.APISocket))
	if err != nil {
		_ = ln.Close()
		return err
	}
	s.api, s.msgLn = api, mln
	s.apiFiles.Store(api)
	go func() { _ = api.Serve(ln) }()
	go func() { _ = api.ServeMessages(mln) }()
	s.serveObjects(api) // samenode.go
	return nil
}

func (s *Sidecar) putTimeout() time.Duration {
	if s.cfg.PutTimeout > 0 {
		return s.cfg.PutTimeout
	}
	return 30 * time.Second
}

func (s *Sidecar) addr() string {
	return net.JoinHostPort(s.cfg.PodIP, strconv.Itoa(s.cfg.DataplanePort))
}

func (s *Sidecar) setKeys(k *controlv1.Keys) error {
	keys := map[string][]byte{}
	for _, key := range k.Keys {
		keys[key.Id] = key.Secret
	}
	if kr := s.keys.Load(); kr != nil {
		return kr.Set(keys, k.ActiveKeyId)
	}
	kr, err := ref.NewKeyring(s.cfg.Namespace, keys, k.ActiveKeyId)
	if err != nil {
		return err
	}
	s.keys.Store(kr)
	client := &pull.Client{Keys: kr, Timeouts: s.cfg.PullTimeouts}
	if chain := s.tiers(); len(chain) > 0 {
		client.Fallback = chain
	}
	s.client = client
	s.once.Do(func() { close(s.ready) })
	return nil
}

func (s *Sidecar) loadKeyFile() error {
	data, err := os.ReadFile(s.cfg.KeyFile)
	if err != nil {
		return fmt.Errorf("key file: %w", err)
	}
	var f struct {
		Active string            `json:"active"`
		Keys   map[string][]byte `json:"keys"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return fmt.Errorf("key file %s: %w", s.cfg.KeyFile, err)
	}
	k := &controlv1.Keys{ActiveKeyId: f.Active}
	for id, secret := range f.Keys {
		k.Keys = append(k.Keys, &controlv1.Key{Id: id, Secret: secret})
	}
	return s.setKeys(k)
}

// waitKeys blocks until the operator sent the namespace's keys.
func (s *Sidecar) waitKeys(ctx context.Context) error {
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("no reference keys from the operator yet: %w", ctx.Err())
	}
}

// Wrap returns the handler chain extension: resolve inputs on the way in,
// turn large outputs into references on the way out.
//
// Trust: an envelope from outside the pod must not name files (it is
// refused with 400); the inputs this sidecar pulls get fresh random names
// in the object directory, the only paths the SDKs open.
//
// Memory: a response passes through as the function writes it, except a
// 200 with outputs (OutputsContentType), which is read whole to rewrite
// its large objects into references: at most MaxOutputsBytes each, and all
// of them together at most the larger of MemoryLimit and MaxOutputsBytes,
// waiting up to PutTimeout for room.
func (s *Sidecar) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !invocation.IsEnvelope(r.Header.Get("Content-Type")) {
			next.ServeHTTP(w, r) // a stock request: exactly as queue-proxy does
			return
		}
		// A superseded engine owner's invocation is refused before
		// anything else (fence.go): its body is not read, the function
		// does not run, its key is not recorded.
		if !s.checkFence(w, r) {
			return
		}
		env, err := invocation.Decode(r.Body)
		if err == nil {
			err = env.RefusePaths()
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		// The key is this sidecar's to derive (idempotency.go): the
		// function gets it, and every answer echoes it, which tells the
		// caller this sidecar answers a duplicate from its record.
		key := env.Key()
		env.IdempotencyKey = key
		w.Header().Set(invocation.HeaderIdempotencyKey, key)
		rec, out, unrecorded, err := s.records.acquire(r.Context(), env.Session, key)
		if err != nil {
			return // its caller left while it waited for the delivery that runs the key
		}
		if rec == nil {
			replay(w, key, out, unrecorded)
			return
		}
		recorded := false
		defer func() {
			if !recorded {
				// A panic below (the function's answer was cut): the key
				// ran and its answer is unknown; its end is reported
				// failed, for the engine's re-execution rules.
				s.records.finish(rec, nil, time.Now())
				s.reportOutcome(env, http.StatusBadGateway, nil, nil, 0, "the function's answer was cut off")
			}
		}()
		s.reportStarted(env)
		ctx, cancel := s.invocationContext(r, env)
		defer cancel()
		files, err := s.resolve(ctx, env)
		defer removeAll(files) // the function is done with its inputs
		if err != nil {
			// The function did not run: a later delivery of the key may.
			recorded = true
			s.records.abandon(rec)
			// 424: the invocation cannot run without its inputs; the
			// header names the error class for the caller's SDK.
			if reason := localapi.ReasonOf(err); reason != "" {
				w.Header().Set(invocation.HeaderErrorReason, reason)
			}
			http.Error(w, "ziptrail: resolve inputs: "+err.Error(), http.StatusFailedDependency)
			return
		}
		body, err := json.Marshal(env)
		if err != nil {
			recorded = true
			s.records.abandon(rec)
			http.Error(w, "ziptrail: encode the envelope: "+err.Error(), http.StatusInternalServerError)
			return
		}
		// The body is sent again, whole, if the function's process dies
		// before it answers (crash.go): each attempt reads it anew.
		r2 := r.Clone(ctx)
		r2.Body = io.NopCloser(bytes.NewReader(body))
		r2.ContentLength = int64(len(body))
		r2.Header.Set("Content-Length", strconv.Itoa(len(body)))
		rw := &recorder{w: w}
		s.serveFunction(rw, r2, body, next, env)
		recorded = true
		s.records.finish(rec, rw.outcome(), time.Now())
		// The invocation's group memberships end with it.
		s.msgs.InvocationEnded(env.Invocation, ctx.Err() != nil)
	})
}

// invocationContext is the context an invocation runs in: not its
// request's, since an outcome must not depend on its caller's connection
// (the operator's HTTP client may go away on a restart or a handover, a
// delegated invocation's producer pod may be terminated once its outputs
// are safe), but one that ends at the revision's timeout. The function
// finishes, its outcome is recorded under its idempotency key and, with a
// control stream, reported to whichever operator owns the session.
func (s *Sidecar) invocationContext(r *http.Request, env *invocation.Envelope) (context.Context, context.CancelFunc) {
	timeout := s.cfg.RevisionTimeout
	if timeout <= 0 {
		timeout = 300 * time.Second
	}
	return context.WithTimeout(context.WithoutCancel(r.Context()), timeout)
}

// serveFunction runs the function's handler, streaming its response or,
// for outputs, buffering (bounded) and rewriting it. r's body is body; a
// function whose process died before it answered gets r again (crash.go).
func (s *Sidecar) serveFunction(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler, env *invocation.Envelope) {
	// Every invocation's outcome is reported over the control stream: a
	// delegated one's because the operator does not read its response
	// (delegate.go), an engine-dispatched one's so that the operator that
	// owns the session learns it even when the HTTP client that sent it
	// is gone (a restart, a handover); the engine applies the outcome
	// once, whichever arrives first. An engine-dispatched one's report is
	// kept unsent, named in the answer, until the operator releases it
	// (controlclient/kept.go): the dispatcher's answer is the first copy.
	report := s.ctl != nil
	rep := &outcomeReport{}
	defer rep.end(s) // an answer that ended before its report: nothing kept
	ow := &outputsWriter{w: w, ctx: r.Context(), limit: s.maxOutputs(), budget: s.outputsBudget(), wait: s.putTimeout(), all: report,
		// Objects the function sent through the local API are reported on
		// their own: the response says how many, so none is missed.
		head: func(h http.Header) {
			h.Del(invocation.HeaderStaleOwner) // this sidecar's to say, not the function's
			h.Del(invocation.HeaderOutcomeKept)
			s.api.MarkOutputsSent(h, env.Session, env.Invocation)
			if report {
				h.Set(headerReported, "1")
				if !env.Delegated && r.Header.Get(invocation.HeaderKeepReport) != "" {
					rep.kept = s.ctl.Reserve()
					h.Set(invocation.HeaderOutcomeKept, invocation.FormatKept(s.cfg.Pod, rep.kept))
				}
			}
		}}
	defer ow.release()
	fail := func(code int, msg string) {
		w.Header().Del("Content-Length")
		w.Header().Del("Content-Type")
		w.Header().Del(invocation.HeaderOutcomeKept) // a failure is reported at once
		http.Error(w, msg, code)
		if report {
			s.reportOutcome(env, code, nil, nil, 0, msg)
		}
	}
	for died := 0; ; {
		at := newAttemptWriter(ow)
		func() {
			// A reverse proxy aborts (panics with ErrAbortHandler) when a
			// write fails; for outputs this sidecar refused, the caller
			// still gets the reason below.
			defer func() {
				if v := recover(); v != nil && (v != http.ErrAbortHandler || ow.err == nil) {
					panic(v)
				}
			}()
			next.ServeHTTP(at, at.request(r, body))
		}()
		if !at.died() {
			break
		}
		// The function's process died before it answered.
		died++
		if r.Context().Err() != nil || s.crashRetries() == 0 {
			at.pass() // the revision's timeout, or no retries: the proxy's answer
			break
		}
		cause := ""
		if why := at.reason(); why != "" {
			cause = ": " + why
		}
		if died > s.crashRetries() {
			fail(http.StatusBadGateway, fmt.Sprintf("ziptrail: the function's process exited before answering (%s)%s", attempts(died), cause))
			return
		}
		if err := waitAccepting(r.Context(), at.trace.target(), s.restartWait()); err != nil {
			fail(http.StatusBadGateway, fmt.Sprintf("ziptrail: the function's process exited before answering (%s)%s; "+
				"waiting for it to restart: %v", attempts(died), cause, err))
			return
		}
		functionCrashRetries.Inc()
	}
	if !ow.buffering {
		if !ow.wroteHeader {
			ow.WriteHeader(http.StatusOK)
		}
		if report {
			rep.outcome(s, env, ow.code, nil, nil, 0)
		}
		return
	}
	if ow.err != nil {
		code := http.StatusBadGateway
		if errors.Is(ow.err, errOutputsWait) {
			code = http.StatusInsufficientStorage
		}
		fail(code, "ziptrail: function outputs: "+ow.err.Error())
		return
	}
	sentLocally := invocation.OutputsSent(w.Header())
	if !invocation.IsOutputs(w.Header().Get("Content-Type")) { // a delegated invocation's plain return value
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(ow.buf.Bytes())
		rep.outcome(s, env, http.StatusOK, nil, ow.buf.Bytes(), sentLocally)
		return
	}
	outs, err := invocation.DecodeOutputs(ow.buf.Bytes())
	if err != nil {
		fail(http.StatusBadGateway, "ziptrail: function outputs: "+err.Error())
		return
	}
	// What was fired locally is this sidecar's to say, not the function's.
	forged := false
	for i := range outs.Objects {
		if outs.Objects[i].FiredLocally != nil {
			outs.Objects[i].FiredLocally, forged = nil, true
		}
	}
	out, err := s.externalize(r.Context(), env, outs, ow.buf.Bytes())
	if err != nil {
		fail(http.StatusInsufficientStorage, "ziptrail: store outputs: "+err.Error())
		return
	}
	if s.fireDelegated(env, outs) || forged {
		if out, err = json.Marshal(outs); err != nil {
			fail(http.StatusInternalServerError, "ziptrail: encode outputs: "+err.Error())
			return
		}
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
	if report {
		rep.outcome(s, env, http.StatusOK, outs, nil, sentLocally)
	}
}

func removeAll(paths []string) {
	for _, p := range paths {
		_ = os.Remove(p)
	}
}

// maxOutputs is the cap of one response with outputs: MaxOutputsBytes,
// default invocation.MaxEnvelopeBytes.
func (s *Sidecar) maxOutputs() int64 {
	if s.cfg.MaxOutputsBytes > 0 {
		return s.cfg.MaxOutputsBytes
	}
	return invocation.MaxEnvelopeBytes
}

// outputsBudget bounds the bytes of all responses with outputs being read
// at once: the pod's object memory, or one response's cap if that is more
// (a pod with a fast tier spills outputs larger than its memory).
func (s *Sidecar) outputsBudget() *semaphore.Weighted {
	s.outputsOnce.Do(func() { s.outputs = semaphore.NewWeighted(max(s.cfg.MemoryLimit, s.maxOutputs())) })
	return s.outputs
}

// resolve pulls every referenced input into a file of its own, with a
// fresh random name, in the object directory; it returns the files made.
func (s *Sidecar) resolve(ctx context.Context, env *invocation.Envelope) ([]string, error) {
	var refs []int
	for i, o := range env.Objects {
		if o.Ref != "" && o.Inline == nil {
			refs = append(refs, i)
		}
	}
	if len(refs) == 0 {
		return nil, nil
	}
	if err := s.waitKeys(ctx); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(s.cfg.ShmDir, 0o755); err != nil {
		return nil, fmt.Errorf("object directory: %w", err)
	}
	files := make([]string, len(refs))
	for n, i := range refs {
		env.Objects[i].Path = invocation.NewInputName()
		files[n] = filepath.Join(s.cfg.ShmDir, env.Objects[i].Path)
	}
	errs := make(chan error, len(refs))
	for n, i := range refs {
		go func() {
			o := &env.Objects[i]
			f, err := os.OpenFile(files[n], os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644) // read-write: the pull maps it
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			_, err = s.pullTo(ctx, o.Ref, func(size int64) (io.WriterAt, error) { return f, f.Truncate(size) })
			if err != nil {
				errs <- fmt.Errorf("%s/%s: %w", o.Bucket, o.Key, err)
				return
			}
			errs <- nil
		}()
	}
	var all []error
	for range refs {
		all = append(all, <-errs)
	}
	return files, errors.Join(all...)
}

// externalize moves large inline outputs into the store and references them.
// body is returned unchanged when no object needs it. On failure nothing
// stays stored (the caller gets an error, not the references).
func (s *Sidecar) externalize(ctx context.Context, env *invocation.Envelope, outs *invocation.Outputs, body []byte) (_ []byte, err error) {
	var stored []string
	defer func() {
		if err != nil {
			for _, id := range stored {
				s.Store.Remove(id)
			}
		}
	}()
	changed := false
	for i := range outs.Objects {
		o := &outs.Objects[i]
		if len(o.Inline) <= s.cfg.InlineThreshold {
			continue
		}
		if err := s.waitKeys(ctx); err != nil {
			return nil, err
		}
		id := fmt.Sprintf("%s/%s/%s/%d", env.Session, o.Bucket, o.Key, s.seq.Add(1))
		exp := time.Now().Add(s.cfg.ObjectTTL)
		putCtx, cancel := context.WithTimeout(ctx, s.putTimeout())
		// Outputs may be read by several targets: they live until the
		// session is collected or the TTL passes.
		err := s.Store.Put(putCtx, store.Meta{ID: id, Session: env.Session, Bucket: o.Bucket, Key: o.Key, Reads: math.MaxUint32, Expires: exp}, o.Inline)
		cancel()
		if err != nil {
			return nil, err
		}
		stored = append(stored, id)
		r, err := s.keys.Load().Seal(s.withNode(ref.Record{Addr: s.addr(), Key: id, Expires: exp, Reads: math.MaxUint32}))
		if err != nil {
			return nil, err
		}
		o.Size, o.Ref, o.Inline = int64(len(o.Inline)), r, nil
		changed = true
	}
	if !changed {
		return body, nil
	}
	return json.Marshal(outs)
}
