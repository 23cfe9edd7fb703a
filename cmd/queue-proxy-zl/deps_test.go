package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestSidecarLinksNoOperatorCode guards the sidecar's memory: every pod runs
// a queue-proxy-zl, and linking the operator's Kubernetes client stack
// (controller-runtime, client-go's typed clients and informers) once cost
// ~10 MiB of resident memory per pod, and minio-go (a whole S3 SDK for
// three calls; the sidecar has internal/dataplane/s3client) ~2.2 MiB
// (go run ./bench/sidecarmem).
func TestSidecarLinksNoOperatorCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	forbidden := []string{"sigs.k8s.io/controller-runtime", "k8s.io/client-go/kubernetes", "k8s.io/client-go/informers", "k8s.io/client-go/tools/leaderelection",
		"github.com/minio/minio-go"}
	for _, pkg := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if pkg == f || strings.HasPrefix(pkg, f+"/") {
				t.Errorf("queue-proxy-zl links %s; keep operator-only code out of the packages the sidecar imports", pkg)
			}
		}
	}
}
