// Package sidecar is the ziptrail part of queue-proxy-zl: the pod's object
// store and pull server (the producer side), the consumer client, and a handler
// wrapper that resolves references on incoming invocations (pulling the
// objects into the pod's shared memory) and turns large objects in outgoing
// function outputs into references (the bytes stay in this pod until a
// consumer pulls them). Requests without ziptrail content pass untouched.
package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/ziptrail/ziptrail/internal/dataplane/controlclient"
	"github.com/ziptrail/ziptrail/internal/dataplane/directmsg"
	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/messaging"
	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/dataplane/tier"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
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
	api := &localapi.Server{Store: s.Store, Addr: s.addr(), Sealer: localapi.SealFunc(s.withNode), Messages: s.msgs, Dir: s.cfg.ShmDir, Namespace: s.cfg.Namespace, Function: s.cfg.Function,
		TTL: s.cfg.ObjectTTL, InlineThreshold: s.cfg.InlineThreshold, MaxObjectBytes: s.cfg.MemoryLimit, PutTimeout: s.cfg.PutTimeout,
		ReleaseTaken: s.cfg.releaseTaken,
		KeySource: localapi.KeysFunc(func(ctx context.Context) (*ref.Keyring, error) {
			if err := s.waitKeys(ctx); err != nil {
				return nil, err
			}
			return s.keys.Load(), nil
		}),
		Puller: localapi.PullFunc(func(ctx context.Context, r string, dst func(size int64) (io.WriterAt, error)) (pull.Info, error) {
			if err := s.waitKeys(ctx); err != nil {
				return pull.Info{}, err
			}
			return s.pullTo(ctx, r, dst)
		}),
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
		api.Reporter = localapi.ReportFunc(func(ev *controlv1.ObjectReady) error {
			return s.ctl.Send(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_ObjectReady{ObjectReady: ev}})
		})
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
