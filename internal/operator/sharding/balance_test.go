package sharding

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestDeadReplicasAnnouncementIsDeleted: a replica SIGKILLed for good (its
// pod gone, its IP never back) leaves its announcement Lease, which no
// clean stop retires and the chart's uninstall hook cannot name; the live
// replicas delete it once it has not been renewed for twice its duration,
// and keep counting only the live ones (real Leases, envtest).
func TestDeadReplicasAnnouncementIsDeleted(t *testing.T) {
	kc := leaseAPI(t)
	ctx := context.Background()
	const ns = leaseNS
	s, err := New(kc, Config{Buckets: 4, Identity: "10.0.0.1", Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	lease := func(name string, renewed time.Time) {
		secs, holder := int32(15), "x"
		if _, err := kc.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, RenewTime: &metav1.MicroTime{Time: renewed}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	lease("ziptrail-engine.replica.10-0-0-1", now)                      // this replica
	lease("ziptrail-engine.replica.10-0-0-8", now)                      // a live one
	lease("ziptrail-engine.replica.10-0-0-7", now.Add(-20*time.Second)) // expired a moment ago
	lease("ziptrail-engine.replica.10-0-0-9", now.Add(-time.Minute))    // dead for good
	lease("ziptrail-engine.00-of-04", now.Add(-time.Minute))            // a bucket's: not an announcement

	n, err := s.liveReplicas(ctx)
	if err != nil || n != 2 {
		t.Fatalf("live replicas %d %v, want 2", n, err)
	}
	for name, want := range map[string]bool{
		"ziptrail-engine.replica.10-0-0-1": true, "ziptrail-engine.replica.10-0-0-8": true,
		"ziptrail-engine.replica.10-0-0-7": true, "ziptrail-engine.replica.10-0-0-9": false,
		"ziptrail-engine.00-of-04": true,
	} {
		_, err := kc.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
		if got := err == nil; got != want || (err != nil && !apierrors.IsNotFound(err)) {
			t.Errorf("Lease %s exists %v (%v), want %v", name, got, err, want)
		}
	}
}

// TestAnnouncementIsOwnedByThePod: a replica's announcement Lease names its
// Pod as owner, so the garbage collector deletes it with the pod even when
// the replica could not retire it (`helm uninstall` deletes the operator's
// RBAC while its pods are still stopping: the chart's e2e found all three
// announcements left behind); a Lease left by an earlier pod with the same
// IP is taken over with its owner.
func TestAnnouncementIsOwnedByThePod(t *testing.T) {
	kc := leaseAPI(t)
	ctx := context.Background()
	const ns = leaseNS
	owned := func(pod string, uid types.UID) []metav1.OwnerReference {
		s, err := New(kc, Config{Buckets: 2, Identity: "10.0.0.1", Namespace: ns,
			Owner: &metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: pod, UID: uid}})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.announce(ctx); err != nil {
			t.Fatal(err)
		}
		l, err := kc.CoordinationV1().Leases(ns).Get(ctx, s.memberLease(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l.OwnerReferences
	}
	if refs := owned("op-a", "uid-a"); len(refs) != 1 || refs[0].Kind != "Pod" || refs[0].Name != "op-a" || refs[0].UID != "uid-a" {
		t.Errorf("announcement's owners %+v, want pod op-a", refs)
	}
	if refs := owned("op-b", "uid-b"); len(refs) != 1 || refs[0].Name != "op-b" || refs[0].UID != "uid-b" {
		t.Errorf("announcement renewed by a new pod with the same IP: owners %+v, want pod op-b", refs)
	}
}
