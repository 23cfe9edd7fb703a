// Package sharding divides the operator's workflows into buckets owned by
// operator replicas, with Knative's own bucket leader election
// (knative.dev/pkg/leaderelection, the standard builder: one Lease per
// bucket, each held by one replica, taken over by another when its holder
// stops renewing it). A workflow namespace/name belongs to the bucket that
// hash.BucketSet.Owner (consistent hashing over the bucket names) names,
// which is what reconciler.Bucket.Has answers.
//
// A replica's identity is the host other replicas and the sidecars reach it
// at (its pod IP): the holder of a bucket's Lease is therefore where that
// bucket's control streams and gateway calls go (Owner). The Lease's
// leaseTransitions, which grows each time the holder changes, fences the
// bucket's checkpoints (Generation).
package sharding

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"knative.dev/pkg/hash"
	"knative.dev/pkg/leaderelection"
	"knative.dev/pkg/logging"
	"knative.dev/pkg/reconciler"
	"knative.dev/pkg/system"
)

// Config describes the buckets and this replica.
type Config struct {
	// Component prefixes the Lease names: <Component>.<i>-of-<Buckets>
	// (default "ziptrail-engine").
	Component string
	// Buckets is how many buckets the workflows are hashed to (≥ 1).
	Buckets int
	// Identity is this replica's host as others reach it (its pod IP).
	Identity string
	// Namespace holds the Leases (the operator's namespace).
	Namespace string
	// LeaseDuration, RenewDeadline and RetryPeriod are the Leases' timing
	// (defaults 15s, 10s, 2s, as Knative's components use).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Log receives the elector's messages (default: none).
	Log *zap.SugaredLogger
	// Owner, when set, owns this replica's announcement Lease (its Pod):
	// the garbage collector deletes the announcement with the pod, also
	// when the replica cannot (`helm uninstall` deletes the operator's
	// RBAC while its pods are still stopping).
	Owner *metav1.OwnerReference
}

// Set is the buckets of one installation, seen from one replica.
type Set struct {
	cfg   Config
	kc    kubernetes.Interface
	names []string
	set   *hash.BucketSet

	mu      sync.Mutex
	leases  map[string]leaseInfo          // by bucket, cached for LookupTTL
	release map[string]context.CancelFunc // by bucket: stop standing for it
	owned   []string                      // buckets held, in the order won
	held    map[string]reconciler.Bucket  // by name
	tracked reconciler.LeaderAware
}

type leaseInfo struct {
	holder      string
	transitions int32
	read        time.Time
}

// LookupTTL is how long a Lease read for Owner is reused.
const LookupTTL = 500 * time.Millisecond

// New builds the bucket set; Run takes part in the elections.
func New(kc kubernetes.Interface, cfg Config) (*Set, error) {
	if cfg.Buckets < 1 {
		return nil, fmt.Errorf("sharding: %d buckets: at least 1 is needed", cfg.Buckets)
	}
	if cfg.Buckets > 1000 {
		return nil, fmt.Errorf("sharding: %d buckets: at most 1000 (one Lease each)", cfg.Buckets)
	}
	if cfg.Identity == "" {
		return nil, errors.New("sharding: the replica's identity (its pod IP) is required: it is where other replicas redirect and proxy to")
	}
	if cfg.Namespace == "" {
		return nil, errors.New("sharding: the Leases' namespace is required")
	}
	if cfg.Component == "" {
		cfg.Component = "ziptrail-engine"
	}
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration = 15 * time.Second
	}
	if cfg.RenewDeadline <= 0 {
		cfg.RenewDeadline = 10 * time.Second
	}
	if cfg.RetryPeriod <= 0 {
		cfg.RetryPeriod = 2 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop().Sugar()
	}
	s := &Set{cfg: cfg, kc: kc, leases: map[string]leaseInfo{}, release: map[string]context.CancelFunc{},
		held: map[string]reconciler.Bucket{}}
	names := sets.New[string]()
	for i := range cfg.Buckets {
		names.Insert(s.leaseName(uint32(i)))
	}
	s.set = hash.NewBucketSet(names)
	s.names = s.set.BucketList()
	return s, nil
}

func (s *Set) leaseName(i uint32) string {
	return fmt.Sprintf("%s.%02d-of-%02d", s.cfg.Component, i, s.cfg.Buckets)
}

// Identity is this replica's.
func (s *Set) Identity() string { return s.cfg.Identity }

// Names are the buckets' names (their Leases'), sorted.
func (s *Set) Names() []string { return append([]string(nil), s.names...) }

// BucketOf names the bucket of workflow namespace/name.
func (s *Set) BucketOf(namespace, name string) string {
	return s.set.Owner(types.NamespacedName{Namespace: namespace, Name: name}.String())
}

// Run takes part in every bucket's election until ctx ends, calling
// la.Promote when this replica wins a bucket and la.Demote when it loses
// one. Each bucket has its own Knative standard elector (its Lease renewed
// every RetryPeriod, released when ctx ends), so that a replica holding
// more than its share can give one bucket up (balance.go).
func (s *Set) Run(ctx context.Context, la reconciler.LeaderAware) error {
	// The standard builder keeps its Leases in system.Namespace().
	if cur := os.Getenv(system.NamespaceEnvKey); cur == "" {
		if err := os.Setenv(system.NamespaceEnvKey, s.cfg.Namespace); err != nil {
			return err
		}
	} else if cur != s.cfg.Namespace {
		return fmt.Errorf("sharding: $%s is %q but the Leases belong in %q", system.NamespaceEnvKey, cur, s.cfg.Namespace)
	}
	ctx = logging.WithLogger(ctx, s.cfg.Log)
	tracked := &tracker{la: la, set: s}
	s.mu.Lock()
	s.tracked = tracked
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, name := range s.names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.elect(ctx, name, tracked)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.balance(ctx)
	}()
	wg.Wait()
	return nil
}

// elect runs bucket's election until ctx ends; when the balancer gives the
// bucket up it waits LeaseDuration (another replica takes it meanwhile)
// before standing again.
func (s *Set) elect(ctx context.Context, bucket string, la reconciler.LeaderAware) {
	for ctx.Err() == nil {
		ectx, cancel := context.WithCancel(ctx)
		s.mu.Lock()
		s.release[bucket] = cancel
		s.mu.Unlock()
		bctx := leaderelection.WithStandardLeaderElectorBuilder(ectx, s.kc, leaderelection.ComponentConfig{
			Component: s.cfg.Component, Buckets: 1,
			LeaseDuration: s.cfg.LeaseDuration, RenewDeadline: s.cfg.RenewDeadline, RetryPeriod: s.cfg.RetryPeriod,
			LeaseName: func(uint32) string { return bucket }, Identity: s.cfg.Identity,
		})
		el, err := leaderelection.BuildElector(bctx, la, "engine", func(reconciler.Bucket, types.NamespacedName) {})
		if err != nil {
			s.cfg.Log.Errorw("build the bucket's elector", "bucket", bucket, "error", err)
		} else {
			el.Run(ectx) // until ectx ends: the Lease is released then
		}
		cancel()
		select {
		case <-ctx.Done():
		case <-time.After(s.cfg.LeaseDuration):
		}
	}
}

// ErrNoOwner means a bucket's Lease has no live holder (being taken over).
var ErrNoOwner = errors.New("the bucket has no owner at the moment (being taken over); retry")

// Owner is the identity of the replica holding bucket's Lease (read at
// most LookupTTL ago), or ErrNoOwner when it is free or expired.
func (s *Set) Owner(ctx context.Context, bucket string) (string, error) {
	li, err := s.lease(ctx, bucket, false)
	if err != nil {
		return "", err
	}
	if li.holder == "" {
		return "", ErrNoOwner
	}
	return li.holder, nil
}

// Generation is the bucket's Lease transitions, read fresh: the holder
// that just won it has the largest one there has been, so checkpoints
// written under it outrank every earlier holder's.
func (s *Set) Generation(ctx context.Context, bucket string) (int64, error) {
	li, err := s.lease(ctx, bucket, true)
	if err != nil {
		return 0, err
	}
	return int64(li.transitions), nil
}

// Forget drops the cached Lease of bucket (a redirect or proxy to its
// holder failed).
func (s *Set) Forget(bucket string) {
	s.mu.Lock()
	delete(s.leases, bucket)
	s.mu.Unlock()
}

func (s *Set) lease(ctx context.Context, bucket string, fresh bool) (leaseInfo, error) {
	now := time.Now()
	s.mu.Lock()
	li, ok := s.leases[bucket]
	s.mu.Unlock()
	if ok && !fresh && now.Sub(li.read) < LookupTTL {
		return li, nil
	}
	l, err := s.kc.CoordinationV1().Leases(s.cfg.Namespace).Get(ctx, bucket, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return leaseInfo{read: now}, nil
	}
	if err != nil {
		return leaseInfo{}, fmt.Errorf("sharding: read Lease %s/%s: %w", s.cfg.Namespace, bucket, err)
	}
	li = leaseInfo{read: now}
	if l.Spec.LeaseTransitions != nil {
		li.transitions = *l.Spec.LeaseTransitions
	}
	if h := l.Spec.HolderIdentity; h != nil && l.Spec.RenewTime != nil {
		d := s.cfg.LeaseDuration
		if l.Spec.LeaseDurationSeconds != nil {
			d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
		}
		if now.Before(l.Spec.RenewTime.Add(d)) {
			li.holder = *h
		}
	}
	s.mu.Lock()
	s.leases[bucket] = li
	s.mu.Unlock()
	return li, nil
}
