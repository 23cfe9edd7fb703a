package app

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// The elected replica's pod gets the leader label and a high deletion
// cost; a restarted process removes both from its pod before the election.
func TestLeaderLabel(t *testing.T) {
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "zt", Name: "op-1", Labels: map[string]string{"app": "op"}}}
	cs := fake.NewSimpleClientset(pod)
	l := &leaderLabeler{cs: cs, ns: "zt", pod: "op-1"}
	for _, leader := range []bool{true, false} {
		if err := l.set(ctx, leader); err != nil {
			t.Fatal(err)
		}
		got, _ := cs.CoreV1().Pods("zt").Get(ctx, "op-1", metav1.GetOptions{})
		if _, has := got.Labels[LeaderLabel]; has != leader || got.Labels["app"] != "op" {
			t.Errorf("leader=%v: labels %v", leader, got.Labels)
		}
		// A rollout deletes the standbys first, the leader last.
		if cost, has := got.Annotations[DeletionCostAnnotation]; has != leader || (leader && cost != leaderDeletionCost) {
			t.Errorf("leader=%v: annotations %v", leader, got.Annotations)
		}
	}
}
