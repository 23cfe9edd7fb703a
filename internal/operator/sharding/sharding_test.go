package sharding

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"knative.dev/pkg/hash"
)

// TestRouting reads ownership from real Leases (envtest): a live holder is
// where a workflow's traffic goes, an expired or released Lease has no
// owner, this replica's own bucket is served here or, while it is not
// served yet, nowhere; and BucketOf agrees with Knative's Bucket.Has.
func TestRouting(t *testing.T) {
	kc := leaseAPI(t)
	ctx := context.Background()
	const ns = leaseNS
	s, err := New(kc, Config{Buckets: 4, Identity: "10.0.0.1", Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}

	// The same hashing as Knative's bucketed controllers.
	names := sets.New(s.Names()...)
	for i := range 50 {
		key := types.NamespacedName{Namespace: "team-a", Name: fmt.Sprintf("wf%d", i)}
		n := 0
		for _, b := range hash.NewBucketSet(names).Buckets() {
			if b.Has(key) {
				n++
				if b.Name() != s.BucketOf(key.Namespace, key.Name) {
					t.Errorf("%s: BucketOf %s, Knative's Bucket.Has %s", key, s.BucketOf(key.Namespace, key.Name), b.Name())
				}
			}
		}
		if n != 1 {
			t.Errorf("%s is in %d buckets", key, n)
		}
	}

	lease := func(bucket, holder string, renewed time.Time, transitions int32) {
		secs := int32(15)
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: bucket, Namespace: ns},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs,
				RenewTime: &metav1.MicroTime{Time: renewed}, LeaseTransitions: &transitions}}
		_ = kc.CoordinationV1().Leases(ns).Delete(ctx, bucket, metav1.DeleteOptions{})
		if _, err := kc.CoordinationV1().Leases(ns).Create(ctx, l, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		s.Forget(bucket)
	}
	wf := func(bucket string) string { // a workflow of bucket
		for i := 0; ; i++ {
			if name := fmt.Sprintf("wf%d", i); s.BucketOf("team-a", name) == bucket {
				return name
			}
		}
	}
	b := s.Names()
	serving := map[string]bool{}
	r := &Router{Set: s, Port: "9443", Serving: func(ns, name string) bool { return serving[s.BucketOf(ns, name)] }}

	lease(b[0], "10.0.0.7", time.Now(), 2)
	if addr, bucket, err := r.Route(ctx, "team-a", wf(b[0])); err != nil || addr != "10.0.0.7:9443" || bucket != b[0] {
		t.Errorf("live holder: %q %q %v", addr, bucket, err)
	}
	if g, err := s.Generation(ctx, b[0]); err != nil || g != 2 {
		t.Errorf("generation %d %v, want the Lease's transitions (2)", g, err)
	}
	lease(b[1], "10.0.0.8", time.Now().Add(-time.Minute), 5)
	if _, _, err := r.Route(ctx, "team-a", wf(b[1])); !errors.Is(err, ErrNoOwner) {
		t.Errorf("expired Lease: %v, want ErrNoOwner", err)
	}
	lease(b[2], "", time.Now(), 1)
	if _, _, err := r.Route(ctx, "team-a", wf(b[2])); !errors.Is(err, ErrNoOwner) {
		t.Errorf("released Lease: %v, want ErrNoOwner", err)
	}
	if _, _, err := r.Route(ctx, "team-a", wf(b[3])); !errors.Is(err, ErrNoOwner) {
		t.Errorf("no Lease yet: %v, want ErrNoOwner", err)
	}
	lease(b[3], "10.0.0.1", time.Now(), 3)
	if _, _, err := r.Route(ctx, "team-a", wf(b[3])); !errors.Is(err, ErrNoOwner) {
		t.Errorf("held here, not served yet: %v, want ErrNoOwner", err)
	}
	serving[b[3]] = true
	if addr, _, err := r.Route(ctx, "team-a", wf(b[3])); err != nil || addr != "" {
		t.Errorf("served here: %q %v, want here", addr, err)
	}
	if peers, err := r.Peers(ctx); err != nil || len(peers) != 1 || peers[0] != "10.0.0.7:9443" {
		t.Errorf("peers %v %v, want the one other live owner", peers, err)
	}
}
