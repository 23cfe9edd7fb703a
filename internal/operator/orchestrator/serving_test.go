package orchestrator

import (
	"context"
	"errors"
	"testing"

	"github.com/go-logr/logr"

	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// TestAStartBeforeTheReconcilerRanIsRetried: a start that reaches a new
// leader before its reconciler handed it the workflow was answered 404
// "workflow not found" (the chaos checker's rollout and upgrade phases);
// a workflow that exists is answered 503 (retry), one that does not 404.
func TestAStartBeforeTheReconcilerRanIsRetried(t *testing.T) {
	exists := map[string]bool{"ns/there": true}
	o, err := New(Options{Resolver: &servers.Functions{}, Log: logr.Discard(), WorkflowExists: func(_ context.Context, ns, name string) (bool, error) {
		return exists[ns+"/"+name], nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.StartSession(context.Background(), "ns", "there", nil); !errors.Is(err, gateway.ErrEngineMoving) {
		t.Errorf("start of a workflow not loaded yet: %v, want ErrEngineMoving (503)", err)
	}
	if _, err := o.StartSession(context.Background(), "ns", "gone", nil); !errors.Is(err, gateway.ErrWorkflowNotFound) {
		t.Errorf("start of a workflow that does not exist: %v, want ErrWorkflowNotFound (404)", err)
	}
}
