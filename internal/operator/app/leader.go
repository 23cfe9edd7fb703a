package app

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// LeaderElectionID names the operator's leader-election Lease.
const LeaderElectionID = "operator.ziptrail.dev"

// LeaderLabel is set to "true" on the pod of the elected replica. The
// control-stream and gateway Services select it: only the leader serves
// them, while every replica is Ready (a standby is healthy, and a
// Deployment whose pods were never Ready could not roll out).
const LeaderLabel = "ziptrail.dev/leader"

// leaderLabeler labels the operator's own pod ($POD_NAME in
// $POD_NAMESPACE, from the downward API) as the leader once elected (and
// gives it a high deletion cost, DeletionCostAnnotation), and
// removes a stale label when the process starts (a restarted container of
// the old leader keeps its pod). Outside a pod (no $POD_NAME) it does
// nothing.
type leaderLabeler struct {
	cs      kubernetes.Interface
	ns, pod string
	log     logr.Logger
}

func newLeaderLabeler(cfg *rest.Config, log logr.Logger) (*leaderLabeler, error) {
	pod, ns := os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE")
	if pod == "" || ns == "" {
		return nil, nil
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &leaderLabeler{cs: cs, ns: ns, pod: pod, log: log}, nil
}

// DeletionCostAnnotation is the ReplicaSet controller's pod deletion cost
// (Kubernetes ≥ 1.22, beta, on by default): of a ReplicaSet's pods, those
// of lower cost are deleted first when it scales down.
const DeletionCostAnnotation = "controller.kubernetes.io/pod-deletion-cost"

// leaderDeletionCost is the leader pod's deletion cost: a rollout (the old
// ReplicaSet scaling down one pod at a time) takes the standbys first and
// the leader last, so the engine moves once, to a pod of the new
// ReplicaSet, instead of once to an old standby and again from it.
const leaderDeletionCost = "1000"

func (l *leaderLabeler) set(ctx context.Context, leader bool) error {
	var v any // null removes the label and the annotation
	var cost any
	if leader {
		v, cost = "true", leaderDeletionCost
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"labels":      map[string]any{LeaderLabel: v},
		"annotations": map[string]any{DeletionCostAnnotation: cost},
	}})
	if err != nil {
		return err
	}
	// Retried: the API may be briefly unreachable when the pod starts.
	var last error
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, last = l.cs.CoreV1().Pods(l.ns).Patch(ctx, l.pod, types.MergePatchType, patch, metav1.PatchOptions{})
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("label pod %s/%s %s=%v: %w (last: %v)", l.ns, l.pod, LeaderLabel, leader, err, last)
	}
	return nil
}

// add registers with mgr: the label is removed before the election (when
// the manager starts its non-leader runnables) and set once elected.
func (l *leaderLabeler) add(mgr manager.Manager) error {
	if err := l.set(context.Background(), false); err != nil {
		return err
	}
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		if err := l.set(ctx, true); err != nil {
			return err
		}
		l.log.Info("elected: pod labelled", "pod", l.ns+"/"+l.pod, "label", LeaderLabel)
		<-ctx.Done()
		return nil
	}))
}
