// Package envtest starts a real control plane (kube-apiserver + etcd through
// controller-runtime's envtest) with the ziptrail CRDs and Knative Serving's
// CRDs installed, for API, controller and e2e tests.
package envtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/ziptrail/ziptrail/internal/operator/scheme"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

// Scheme returns a scheme with the Kubernetes built-ins, the ziptrail kinds
// and Knative Serving's v1 kinds.
func Scheme() *k8sruntime.Scheme { return scheme.New() }

// KnativeServiceGVK is the kind the operator creates per function.
var KnativeServiceGVK = schema.GroupVersionKind{Group: "serving.knative.dev", Version: "v1", Kind: "Service"}

// Env is a running control plane.
type Env struct {
	*envtest.Environment
	Config *rest.Config
}

// Start launches kube-apiserver and etcd from $KUBEBUILDER_ASSETS and installs
// the CRDs. It fails with an actionable message when the binaries are absent.
func Start() (*Env, error) {
	assets := Assets()
	if assets == "" {
		return nil, fmt.Errorf("KUBEBUILDER_ASSETS is not set and %s holds no Kubernetes binaries: run hack/install-deps.sh (or `make test`, which does it)", paths.CacheDir())
	}
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, bin)); err != nil {
			return nil, fmt.Errorf("%s not found in KUBEBUILDER_ASSETS=%s: run hack/install-deps.sh", bin, assets)
		}
	}
	te := &envtest.Environment{
		CRDDirectoryPaths:     crdPaths(),
		ErrorIfCRDPathMissing: true,
		Scheme:                Scheme(),
	}
	cfg, err := te.Start()
	if err != nil {
		// Start may fail after launching the processes (e.g. a CRD the API
		// server rejects); never leave them running.
		_ = te.Stop()
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	return &Env{Environment: te, Config: cfg}, nil
}

// crdPaths are the directories of the CRDs every control plane gets: the
// ziptrail kinds and Knative Serving's.
func crdPaths() []string {
	root := paths.RepoRoot()
	return []string{filepath.Join(root, "config", "crd", "bases"), filepath.Join(root, "config", "knative")}
}

// InstallCRDs installs the CRDs Start installs into another API server (the
// full local cluster of internal/localcluster/k8s) and waits until they are served.
func InstallCRDs(cfg *rest.Config) error {
	_, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: crdPaths(), ErrorIfPathMissing: true, Scheme: Scheme()})
	if err != nil {
		return fmt.Errorf("install CRDs: %w", err)
	}
	return nil
}

// Kubeconfig writes a kubeconfig for the admin user into dir and returns its path.
func (e *Env) Kubeconfig(dir string) (string, error) {
	user, err := e.ControlPlane.AddUser(envtest.User{Name: "ziptrail-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", fmt.Errorf("add admin user: %w", err)
	}
	data, err := user.KubeConfig()
	if err != nil {
		return "", fmt.Errorf("render kubeconfig: %w", err)
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return "", err
	}
	return path, nil
}

// Assets is the directory of kube-apiserver, etcd and the other
// Kubernetes binaries: $KUBEBUILDER_ASSETS, else what hack/install-deps.sh
// installed in its cache (k8s/<version>-etcd-<version>, the newest when
// there are several), found without the user's running
// `eval "$(hack/install-deps.sh --env)"` first. The cache's directories
// then go first on this process's PATH, as that line would have put them
// (the processes it starts find kubectl, coredns, the Python venv). ""
// when neither has them.
func Assets() string {
	if a := os.Getenv("KUBEBUILDER_ASSETS"); a != "" {
		return a
	}
	cache := paths.CacheDir()
	dirs, _ := filepath.Glob(filepath.Join(cache, "k8s", "*-etcd-*"))
	var found string
	for _, d := range dirs { // sorted: the last is the newest pin
		if _, err := os.Stat(filepath.Join(d, "kube-apiserver")); err == nil {
			found = d
		}
	}
	if found == "" {
		return ""
	}
	_ = os.Setenv("KUBEBUILDER_ASSETS", found)
	path := strings.Join([]string{filepath.Join(cache, "bin"), found, filepath.Join(cache, "venv", "bin")}, string(os.PathListSeparator))
	_ = os.Setenv("PATH", path+string(os.PathListSeparator)+os.Getenv("PATH"))
	return found
}
