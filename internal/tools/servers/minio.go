package servers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/ziptrail/ziptrail/internal/dataplane/s3client"
	"github.com/ziptrail/ziptrail/internal/dataplane/tier"
)

// MinIO is a running S3-compatible server.
type MinIO struct {
	Endpoint             string
	AccessKey, SecretKey string
	Client               *minio.Client
}

// StartMinIO runs the MinIO server that hack/install-deps.sh built.
func StartMinIO(t TB) *MinIO {
	t.Helper()
	bin, err := exec.LookPath("minio")
	if err != nil {
		cache := os.Getenv("ZIPTRAIL_CACHE")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache", "ziptrail")
		}
		bin = filepath.Join(cache, "bin", "minio")
		if _, err := os.Stat(bin); err != nil {
			t.Fatal("minio not found: run hack/install-deps.sh")
		}
	}
	port, console := FreePort(t), FreePort(t)
	m := &MinIO{Endpoint: fmt.Sprintf("127.0.0.1:%d", port), AccessKey: "ziptrail-test", SecretKey: "ziptrail-test-secret"}
	cmd := exec.Command(bin, "server", "--quiet", "--address", m.Endpoint, "--console-address", fmt.Sprintf("127.0.0.1:%d", console), t.TempDir())
	cmd.Env = append(os.Environ(), "MINIO_ROOT_USER="+m.AccessKey, "MINIO_ROOT_PASSWORD="+m.SecretKey, "MINIO_BROWSER=off")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	waitUntil(t, "minio", func() bool {
		resp, err := http.Get("http://" + m.Endpoint + "/minio/health/live")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	// Live is not ready: MinIO serves its root user at once but
	// initializes its IAM sub-system in the background, and until then any
	// other access key gets 503 XMinioIAMNotInitialized instead of its
	// answer (a test of an unknown key failed so under load). Ready when
	// an unknown key is refused as unknown.
	probe, err := s3client.New(s3client.Config{Endpoint: m.Endpoint, AccessKey: "ziptrail-iam-probe", SecretKey: m.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "minio's IAM", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := probe.Get(ctx, "ziptrail-iam-probe", "k")
		var se *s3client.Error
		return errors.As(err, &se) && se.Code == "InvalidAccessKeyId"
	})
	m.Client, err = minio.New(m.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(m.AccessKey, m.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Bucket creates a bucket and returns its name.
func (m *MinIO) Bucket(t TB, name string) string {
	t.Helper()
	if err := m.Client.MakeBucket(context.Background(), name, minio.MakeBucketOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// Tier is the sidecar's slow tier (its own S3 client) on a bucket of this
// server, objects under prefix.
func (m *MinIO) Tier(t TB, bucket, prefix string) *tier.S3 {
	t.Helper()
	c, err := s3client.New(s3client.Config{Endpoint: m.Endpoint, AccessKey: m.AccessKey, SecretKey: m.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	return &tier.S3{Client: c, Bucket: bucket, Prefix: prefix}
}
