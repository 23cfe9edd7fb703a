//go:build pins

// Package pins keeps the module's pinned dependencies in go.mod while the
// packages that use them are still being written; `go mod tidy` considers
// every build tag, so these imports hold the pins in place. It is never built.
package pins

import (
	_ "github.com/minio/minio-go/v7"
	_ "github.com/onsi/ginkgo/v2"
	_ "github.com/onsi/gomega"
	_ "github.com/redis/go-redis/v9"
	_ "google.golang.org/grpc"
	_ "knative.dev/serving/pkg/queue/sharedmain"
	_ "sigs.k8s.io/controller-runtime"
	_ "sigs.k8s.io/controller-runtime/pkg/envtest"
)
