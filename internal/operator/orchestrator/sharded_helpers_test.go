package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"knative.dev/pkg/apis"
	duckv1 "knative.dev/pkg/apis/duck/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/controllers"
	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/operator/sharding"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// The Leases' timing in these tests: short, so that a killed replica's
// buckets move within seconds, but with room for an API server slowed by
// a loaded machine (a replica that cannot renew within testRenew gives its
// buckets up).
const (
	testLease = 5 * time.Second
	testRenew = 4 * time.Second
	testRetry = 500 * time.Millisecond
)

// shardedCluster is an envtest API server, a redis-server and the
// operator replicas sharing them (each: its manager with the real
// reconcilers, its bucket elections, its sharded engine).
type shardedCluster struct {
	t       *testing.T
	k8s     client.Client
	cfgEnv  *envtest.Env
	redis   *servers.Redis
	fns     *servers.Functions
	buckets int
	leaseNS string

	replicas []*replica
}

type replica struct {
	id      string
	set     *sharding.Set
	engine  *Sharded
	stop    func() // graceful: last saves, then Leases released
	stopped chan struct{}
	// crash stops the replica as a SIGKILL would: it reaches neither the
	// API server nor Redis any more, so it saves nothing and releases no
	// Lease (they expire).
	crash func()
	cut   atomic.Bool

	mu    sync.Mutex
	moves []move // OnMove calls
}

type move struct {
	bucket string
	owned  bool
	at     time.Time
}

func (r *replica) movesSince(t time.Time) []move {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []move
	for _, m := range r.moves {
		if !m.at.Before(t) {
			out = append(out, m)
		}
	}
	return out
}

func newShardedCluster(t *testing.T, fns *servers.Functions, buckets int, namespaces ...string) *shardedCluster {
	t.Helper()
	env, err := envtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	k8s, err := client.New(env.Config, client.Options{Scheme: envtest.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	c := &shardedCluster{t: t, k8s: k8s, cfgEnv: env, redis: servers.StartRedis(t), fns: fns, buckets: buckets, leaseNS: "ziptrail-system"}
	for _, ns := range append([]string{c.leaseNS}, namespaces...) {
		if err := k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("SYSTEM_NAMESPACE", c.leaseNS) // Knative's elector keeps its Leases there
	return c
}

// set is a bucket set of the cluster's configuration, for identity id.
func (c *shardedCluster) set(id string) *sharding.Set { return c.setOn(c.cfgEnv.Config, id) }

func (c *shardedCluster) setOn(cfg *rest.Config, id string) *sharding.Set {
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	s, err := sharding.New(kc, sharding.Config{Buckets: c.buckets, Identity: id, Namespace: c.leaseNS,
		LeaseDuration: testLease, RenewDeadline: testRenew, RetryPeriod: testRetry})
	if err != nil {
		c.t.Fatal(err)
	}
	return s
}

// start starts replica id; its elections begin when begin is closed.
func (c *shardedCluster) start(id string, begin <-chan struct{}) *replica {
	t := c.t
	t.Helper()
	r := &replica{id: id, stopped: make(chan struct{})}
	// The replica's own connections, which crash cuts.
	cfg := rest.CopyConfig(c.cfgEnv.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return cuttable{rt: rt, cut: &r.cut} })
	r.set = c.setOn(cfg, id)
	rdb := redis.NewClient(&redis.Options{Addr: c.redis.Addr})
	skip := true
	lease, renew, retry := testLease, testRenew, testRetry
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: envtest.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"},
		Controller:     config.Controller{SkipNameValidation: &skip},
		LeaderElection: true, LeaderElectionID: "operator.ziptrail.dev", LeaderElectionNamespace: c.leaseNS,
		LeaderElectionReleaseOnCancel: true, LeaseDuration: &lease, RenewDeadline: &renew, RetryPeriod: &retry,
		HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	r.engine, err = NewSharded(ShardedOptions{
		Options: Options{Resolver: c.fns, Log: logr.Discard(), CheckpointInterval: 20 * time.Millisecond,
			Checkpoint: &checkpoint.Store{Client: rdb, Key: "ziptrail:test:engine"}},
		Buckets: r.set, Identity: id,
		Workflows: func(ctx context.Context) ([]types.NamespacedName, error) {
			var l v1alpha1.WorkflowList
			if err := mgr.GetClient().List(ctx, &l); err != nil {
				return nil, err
			}
			out := make([]types.NamespacedName, len(l.Items))
			for i, w := range l.Items {
				out[i] = types.NamespacedName{Namespace: w.Namespace, Name: w.Name}
			}
			return out, nil
		},
		OnMove: func(bucket string, owned bool) {
			r.mu.Lock()
			r.moves = append(r.moves, move{bucket: bucket, owned: owned, at: time.Now()})
			r.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := controllers.Setup(mgr, controllers.Tiers{}, r.engine); err != nil {
		t.Fatal(err)
	}
	mgrCtx, stopMgr := context.WithCancel(context.Background())
	engCtx, stopEng := context.WithCancel(context.Background())
	electCtx, stopElect := context.WithCancel(context.Background())
	mgrDone, engDone, electDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() { defer close(mgrDone); _ = mgr.Start(mgrCtx) }()
	go func() { defer close(engDone); _ = r.engine.Run(engCtx) }()
	go func() {
		defer close(electDone)
		select {
		case <-begin:
		case <-electCtx.Done():
			return
		}
		_ = r.set.Run(electCtx, r.engine)
	}()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			stopEng() // every bucket: stop serving, last save
			<-engDone
			stopElect() // then release the Leases
			<-electDone
			stopMgr()
			<-mgrDone
			close(r.stopped)
		})
	}
	r.crash = func() {
		r.cut.Store(true)
		_ = rdb.Close()
		r.stop()
	}
	t.Cleanup(r.stop)
	c.replicas = append(c.replicas, r)
	return r
}

// owner is the replica serving workflow ns/name now, if any.
func (c *shardedCluster) owner(ns, name string) *replica {
	for _, r := range c.replicas {
		select {
		case <-r.stopped:
			continue
		default:
		}
		if r.engine.Serving(ns, name) {
			return r
		}
	}
	return nil
}

// waitSession waits for session id of workflow ns/name to end on the
// replica serving the workflow, following its bucket should it move on
// (a Lease the new owner could not renew in time on a loaded machine):
// the sharded engine's Wait then ends with gateway.ErrEngineMoving.
func (c *shardedCluster) waitSession(ctx context.Context, ns, name, id string) (*replica, sessions.Session, error) {
	var moves []string
	for {
		r := c.owner(ns, name)
		if r != nil {
			s, err := r.engine.Sessions().Wait(ctx, id)
			if err == nil || ctx.Err() != nil || !(errors.Is(err, gateway.ErrEngineMoving) || errors.Is(err, sessions.ErrNotFound)) {
				if err != nil {
					err = fmt.Errorf("%w (on %s; moves seen: %v)", err, r.id, moves)
				}
				return r, s, err
			}
			moves = append(moves, fmt.Sprintf("%s: %v", r.id, err))
		}
		select {
		case <-ctx.Done():
			return r, sessions.Session{}, fmt.Errorf("no replica serves %s/%s: %w (moves seen: %v)", ns, name, ctx.Err(), moves)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// sessionEvents is session s's progress log, one event a line.
func sessionEvents(s sessions.Session) string {
	var b strings.Builder
	for _, e := range s.Events {
		fmt.Fprintf(&b, "\t%s %s %s\n", e.Time.Format("15:04:05.000"), e.Kind, e.Message)
	}
	return b.String()
}

// settled waits until the live replicas serve every bucket, each holding
// its share (the balancer has spread them).
func (c *shardedCluster) settled(live ...*replica) {
	c.t.Helper()
	share := (c.buckets + len(live) - 1) / len(live)
	waitForLong(c.t, 3*time.Minute, fmt.Sprintf("the %d buckets spread over %d replicas", c.buckets, len(live)), func() bool {
		total := 0
		for _, r := range live {
			n := len(r.engine.OwnedBuckets())
			if n > share || len(r.set.Held()) != n {
				return false
			}
			total += n
		}
		return total == c.buckets
	})
}

// makeReady plays Knative's part for wf: its Services become ready.
func (c *shardedCluster) makeReady(ctx context.Context, wf *v1alpha1.Workflow) {
	for _, fn := range wf.Spec.Functions {
		name := wf.Name + "-" + fn.Name
		waitForLong(c.t, 60*time.Second, "the Knative Service "+name+" to be ready", func() bool {
			svc := &servingv1.Service{}
			if err := c.k8s.Get(ctx, types.NamespacedName{Namespace: wf.Namespace, Name: name}, svc); err != nil {
				return false
			}
			svc.Status.ObservedGeneration = svc.Generation
			svc.Status.Conditions = duckv1.Conditions{{Type: apis.ConditionReady, Status: corev1.ConditionTrue}}
			return c.k8s.Status().Update(ctx, svc) == nil
		})
	}
}

// cuttable fails every request once cut is set.
type cuttable struct {
	rt  http.RoundTripper
	cut *atomic.Bool
}

func (c cuttable) RoundTrip(req *http.Request) (*http.Response, error) {
	if c.cut.Load() {
		return nil, errors.New("this replica was killed")
	}
	return c.rt.RoundTrip(req)
}

func waitForLong(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
