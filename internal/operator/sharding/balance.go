package sharding

import (
	"context"
	"regexp"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"knative.dev/pkg/reconciler"
)

// Balancing. Knative's standard elector lets whichever replica asks first
// win a free bucket, so the first replica to start would own them all and
// the others would only wait for it to die. Each replica therefore
// announces itself with a Lease of its own (<Component>.replica.<identity>,
// renewed every RetryPeriod), counts the live ones, and when it holds more
// than its share, ceil(buckets / live replicas), gives one bucket up: it
// stops serving it (a last checkpoint), releases its Lease and stands
// for it again only after LeaseDuration, when a replica with fewer buckets
// has taken it. One bucket per LeaseDuration at most, so ownership
// settles without churn; a replica that died is no longer counted once its
// Lease expires, and the survivors keep the buckets they took over.

// tracker passes the elector's calls on and records what this replica
// holds.
type tracker struct {
	la  reconciler.LeaderAware
	set *Set
}

func (t *tracker) Promote(b reconciler.Bucket, enq func(reconciler.Bucket, types.NamespacedName)) error {
	t.set.mu.Lock()
	t.set.owned = append(t.set.owned, b.Name())
	t.set.held[b.Name()] = b
	t.set.mu.Unlock()
	return t.la.Promote(b, enq)
}

func (t *tracker) Demote(b reconciler.Bucket) {
	t.la.Demote(b)
	t.set.mu.Lock()
	for i, n := range t.set.owned {
		if n == b.Name() {
			t.set.owned = append(t.set.owned[:i:i], t.set.owned[i+1:]...)
			break
		}
	}
	delete(t.set.held, b.Name())
	t.set.mu.Unlock()
}

// Held are the buckets whose Lease this replica holds, in the order won.
func (s *Set) Held() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.owned...)
}

var unsafeName = regexp.MustCompile(`[^a-z0-9.-]+`)

func (s *Set) memberLease() string {
	id := strings.Trim(unsafeName.ReplaceAllString(strings.ToLower(s.cfg.Identity), "-"), "-.")
	return s.cfg.Component + ".replica." + id
}

// balance announces this replica and gives buckets up beyond its share,
// until ctx ends.
func (s *Set) balance(ctx context.Context) {
	t := time.NewTicker(s.cfg.RetryPeriod)
	defer t.Stop()
	var lastShed time.Time
	shedAt := map[string]time.Time{}
	for {
		if err := s.announce(ctx); err != nil && ctx.Err() == nil {
			s.cfg.Log.Warnw("announce this replica", "lease", s.memberLease(), "error", err)
		}
		if live, err := s.liveReplicas(ctx); err == nil && live > 0 && time.Since(lastShed) > s.cfg.LeaseDuration {
			share := (s.cfg.Buckets + live - 1) / live
			if b, ok := s.surplus(share); ok && !recentlyShed(shedAt, b.Name(), s.cfg.LeaseDuration) {
				s.cfg.Log.Infow("giving a bucket up to balance", "bucket", b.Name(), "share", share, "replicas", live)
				s.shed(b)
				lastShed = time.Now()
				shedAt[b.Name()] = lastShed
			}
		}
		select {
		case <-ctx.Done():
			s.retire()
			return
		case <-t.C:
		}
	}
}

// recentlyShed: this replica gave bucket up less than 4 Lease durations
// ago and won it back, so no replica with fewer buckets was standing for
// it (one still starting, e.g. a replica restarted after a crash, already
// counted live). Giving it up again at once would only move the bucket
// back and forth, each move a restore of its sessions; it is kept until
// then.
func recentlyShed(shedAt map[string]time.Time, bucket string, lease time.Duration) bool {
	t, ok := shedAt[bucket]
	return ok && time.Since(t) < 4*lease
}

// surplus is the bucket to give up when this replica holds more than
// share (the one it won last).
func (s *Set) surplus(share int) (reconciler.Bucket, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.owned) <= share {
		return nil, false
	}
	b, ok := s.held[s.owned[len(s.owned)-1]]
	return b, ok
}

// shed stops serving bucket b first (its last checkpoint is saved while
// the Lease is still held, so no new owner restores an older one), then
// releases the Lease.
func (s *Set) shed(b reconciler.Bucket) {
	s.mu.Lock()
	la, release := s.tracked, s.release[b.Name()]
	s.mu.Unlock()
	if la != nil {
		la.Demote(b)
	}
	if release != nil {
		release()
	}
}

func (s *Set) announce(ctx context.Context) error {
	leases := s.kc.CoordinationV1().Leases(s.cfg.Namespace)
	now := metav1.NewMicroTime(time.Now())
	secs := int32(s.cfg.LeaseDuration / time.Second)
	if secs < 1 {
		secs = 1
	}
	id := s.cfg.Identity
	l, err := leases.Get(ctx, s.memberLease(), metav1.GetOptions{})
	var owners []metav1.OwnerReference
	if s.cfg.Owner != nil {
		owners = []metav1.OwnerReference{*s.cfg.Owner}
	}
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: s.memberLease(), Namespace: s.cfg.Namespace, OwnerReferences: owners},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &secs, RenewTime: &now}}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	if owners != nil {
		l.OwnerReferences = owners // e.g. a new pod with the same IP
	}
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &id, &secs, &now
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}

// retire deletes this replica's announcement (a clean stop).
func (s *Set) retire() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.kc.CoordinationV1().Leases(s.cfg.Namespace).Delete(ctx, s.memberLease(), metav1.DeleteOptions{})
}

// liveReplicas counts the announcements renewed within LeaseDuration. It
// deletes those not renewed for twice their duration: a replica killed
// for good (its pod gone with its node) never retires its own, and its
// identity (a pod IP) does not come back, so nothing else would ever
// delete it. A replica that was only cut off announces itself again.
func (s *Set) liveReplicas(ctx context.Context) (int, error) {
	list, err := s.kc.CoordinationV1().Leases(s.cfg.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	prefix := s.cfg.Component + ".replica."
	n := 0
	for _, l := range list.Items {
		if !strings.HasPrefix(l.Name, prefix) || l.Spec.RenewTime == nil {
			continue
		}
		d := s.cfg.LeaseDuration
		if l.Spec.LeaseDurationSeconds != nil {
			d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
		}
		switch age := time.Since(l.Spec.RenewTime.Time); {
		case age < d:
			n++
		case age > 2*d && l.Name != s.memberLease():
			// Only if not renewed meanwhile (the version read).
			rv := l.ResourceVersion
			if err := s.kc.CoordinationV1().Leases(s.cfg.Namespace).Delete(ctx, l.Name,
				metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				s.cfg.Log.Warnw("delete a dead replica's announcement", "lease", l.Name, "error", err)
			} else if err == nil {
				s.cfg.Log.Infow("deleted a dead replica's announcement", "lease", l.Name)
			}
		}
	}
	return n, nil
}
