package orchestrator

import (
	"context"
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// TestFailedSessionInWorkflowStatus runs the real Workflow reconciler
// (envtest: kube-apiserver and etcd) with the orchestrator as its sink: a
// session whose function fails with no re-execution rule shows up in the
// Workflow's status with its reason (issue 15, item 8).
func TestFailedSessionInWorkflowStatus(t *testing.T) {
	fns := &servers.Functions{}
	fns.Add(t, "status-boom", ziptrail.FunctionHandler(func(context.Context, *ziptrail.Invocation) ([]byte, error) {
		return nil, errors.New("disk on fire")
	}))
	const ns = "status-test"
	ctx, k8s, o := withReconcilers(t, fns, ns)
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "status"},
		Spec: v1alpha1.WorkflowSpec{Entry: "boom", Functions: []v1alpha1.FunctionSpec{{Name: "boom", Image: "example.com/boom"}}}}
	id, s := runReconciled(t, ctx, k8s, o, wf)
	if s.State != sessions.Failed {
		t.Fatalf("session %s: %s, want Failed", id, s.State)
	}

	// The status as kubectl sees it.
	var reason, session string
	var failed int64
	waitFor(t, "the failure in the Workflow's status", func() bool {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("Workflow"))
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(wf), u); err != nil {
			return false
		}
		failed, _, _ = unstructured.NestedInt64(u.Object, "status", "sessions", "failed")
		session, _, _ = unstructured.NestedString(u.Object, "status", "sessions", "lastFailure", "session")
		reason, _, _ = unstructured.NestedString(u.Object, "status", "sessions", "lastFailure", "reason")
		return failed == 1 && reason != ""
	})
	if session != id || !strings.Contains(reason, "boom") || !strings.Contains(reason, "disk on fire") {
		t.Errorf("status.sessions.lastFailure: session %q reason %q, want %s failing in boom with its error", session, reason, id)
	}
}
