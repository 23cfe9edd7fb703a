package admin_test

import (
	"context"
	"fmt"
	"log"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/sdk/go/admin"
)

// Deploy a one-function workflow, run a session, follow its progress and
// print its result. Compiled, not run, by go test: it needs a cluster with
// the operator (the package's tests use envtest and an in-process gateway).
func Example() {
	ctx := context.Background()
	c, err := admin.Connect(admin.Options{Namespace: "default", Gateway: "ziptrail-gateway.ziptrail-system:8089"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Name: "hello"}, Spec: v1alpha1.WorkflowSpec{Entry: "greet",
		Functions: []v1alpha1.FunctionSpec{{Name: "greet", Image: "ghcr.io/example/greet:1"}}}}
	if err := c.Apply(ctx, wf); err != nil {
		log.Fatal(err)
	}
	if _, err := c.WaitWorkflowReady(ctx, "hello"); err != nil {
		log.Fatal(err)
	}
	s, err := c.StartSession(ctx, "hello", []byte("world"))
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		for e, err := range c.Watch(ctx, s.ID) {
			if err != nil {
				return
			}
			log.Printf("%s %s", e.Kind, e.Message)
		}
	}()
	res, err := c.Wait(ctx, s.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(res.Output))
}
