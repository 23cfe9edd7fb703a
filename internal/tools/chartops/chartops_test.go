package chartops

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func lease(name, holder string, renewed time.Time) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "zs", Name: name},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &metav1.MicroTime{Time: renewed}}}
}

func pod(name, ip string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "zs", Name: name,
		Labels: map[string]string{"app.kubernetes.io/instance": "zt", "app.kubernetes.io/component": "operator"}},
		Status: corev1.PodStatus{PodIP: ip}}
}

func TestLeaderAndBucketOwners(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	cs := fake.NewClientset(
		lease(LeaderLease, "zt-operator-b_1234-uuid", now),
		lease("ziptrail-engine.00-of-02", "10.0.0.1", now),
		lease("ziptrail-engine.01-of-02", "10.0.0.2", now.Add(-time.Minute)), // expired
		lease("something-else", "x", now),
		pod("zt-operator-a", "10.0.0.1"), pod("zt-operator-b", "10.0.0.2"))
	r := &Release{Name: "zt", Namespace: "zs", Clientset: cs}

	p, err := r.Leader(ctx)
	if err != nil || p.Name != "zt-operator-b" {
		t.Fatalf("Leader = %v, %v; want zt-operator-b", p, err)
	}
	owners, err := r.BucketOwners(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"ziptrail-engine.00-of-02": "10.0.0.1", "ziptrail-engine.01-of-02": ""}
	if len(owners) != len(want) || owners["ziptrail-engine.00-of-02"] != "10.0.0.1" || owners["ziptrail-engine.01-of-02"] != "" {
		t.Fatalf("BucketOwners = %v, want %v", owners, want)
	}
	if p, err := r.PodByIP(ctx, "10.0.0.1"); err != nil || p.Name != "zt-operator-a" {
		t.Fatalf("PodByIP = %v, %v", p, err)
	}
	if _, err := r.PodByIP(ctx, "10.9.9.9"); err == nil {
		t.Fatal("PodByIP of an unknown IP: no error")
	}
}
