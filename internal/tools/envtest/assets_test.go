package envtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAssetsFromTheInstallCache: without KUBEBUILDER_ASSETS, the
// binaries hack/install-deps.sh installed are found in its cache (the
// newest pin), and the cache's directories go first on PATH.
func TestAssetsFromTheInstallCache(t *testing.T) {
	cache := t.TempDir()
	for _, d := range []string{"v1.35.0-etcd-v3.6.1", "v1.36.3-etcd-v3.6.16", "v1.37.0-etcd-v3.7.0-empty"} {
		dir := filepath.Join(cache, "k8s", d)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(d, "-empty") {
			if err := os.WriteFile(filepath.Join(dir, "kube-apiserver"), nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Setenv("ZIPTRAIL_CACHE", cache)
	t.Setenv("KUBEBUILDER_ASSETS", "")
	t.Setenv("PATH", "/usr/bin")
	want := filepath.Join(cache, "k8s", "v1.36.3-etcd-v3.6.16")
	if got := Assets(); got != want {
		t.Fatalf("Assets() = %q, want %q", got, want)
	}
	if os.Getenv("KUBEBUILDER_ASSETS") != want || !strings.HasPrefix(os.Getenv("PATH"), filepath.Join(cache, "bin")+":"+want+":") {
		t.Errorf("environment after: KUBEBUILDER_ASSETS=%q PATH=%q", os.Getenv("KUBEBUILDER_ASSETS"), os.Getenv("PATH"))
	}

	t.Setenv("ZIPTRAIL_CACHE", t.TempDir()) // nothing installed
	t.Setenv("KUBEBUILDER_ASSETS", "")
	if got := Assets(); got != "" {
		t.Errorf("with nothing installed: %q", got)
	}
}
