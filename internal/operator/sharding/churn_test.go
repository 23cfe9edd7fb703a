package sharding

import (
	"context"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"knative.dev/pkg/reconciler"
)

// moves counts a replica's promotions and demotions.
type moves struct {
	mu               sync.Mutex
	promoted, demote []time.Time
	held             map[string]bool
}

func (m *moves) Promote(b reconciler.Bucket, _ func(reconciler.Bucket, types.NamespacedName)) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.promoted = append(m.promoted, time.Now())
	m.held[b.Name()] = true
	return nil
}

func (m *moves) Demote(b reconciler.Bucket) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.demote = append(m.demote, time.Now())
	delete(m.held, b.Name())
}

// TestShedBucketNobodyTakesIsKept: a replica counted live that does not
// stand for buckets yet (one restarted after a crash, still starting: the
// chart's e2e saw it) makes the replica holding both buckets give one up;
// nobody takes it, the replica wins it back a Lease duration later, and
// keeps it for 4 Lease durations instead of giving it up again at once —
// every move is a restore of the bucket's sessions (real Leases, envtest).
func TestShedBucketNobodyTakesIsKept(t *testing.T) {
	kc := leaseAPI(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = leaseNS
	t.Setenv("SYSTEM_NAMESPACE", ns)
	const lease = 2 * time.Second
	// The other replica: announced and renewed, standing for nothing.
	go func() {
		secs, holder := int32(lease/time.Second), "10.0.0.2"
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "ziptrail-engine.replica.10-0-0-2", Namespace: ns},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs}}
		for ctx.Err() == nil {
			l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
			if cur, err := kc.CoordinationV1().Leases(ns).Get(ctx, l.Name, metav1.GetOptions{}); err == nil {
				l.ResourceVersion = cur.ResourceVersion
				_, _ = kc.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{})
			} else {
				_, _ = kc.CoordinationV1().Leases(ns).Create(ctx, l, metav1.CreateOptions{})
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	s, err := New(kc, Config{Buckets: 2, Identity: "10.0.0.1", Namespace: ns,
		LeaseDuration: lease, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m := &moves{held: map[string]bool{}}
	go func() { _ = s.Run(ctx, m) }()

	count := func() (promoted, demoted, held int) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.promoted), len(m.demote), len(m.held)
	}
	// Both won, one given up (share 1 of 2 live), won back.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		p, d, h := count()
		if p >= 3 && d >= 1 && h == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("promoted %d, demoted %d, holding %d: want both buckets won, one given up and won back", p, d, h)
		}
		time.Sleep(50 * time.Millisecond)
	}
	m.mu.Lock()
	firstShed := m.demote[0]
	m.mu.Unlock()
	// Kept until 4 Lease durations after it was given up.
	time.Sleep(time.Until(firstShed.Add(4*lease - lease/2)))
	// (A bucket given up is demoted twice: by the balancer, then by its
	// elector stopping; count the wins.)
	if p, _, h := count(); p != 3 || h != 2 {
		t.Errorf("won buckets %d times, holding %d within 4 Lease durations of giving a bucket up nobody took: want 3 (both, then the one given up, once) and 2", p, h)
	}
}
