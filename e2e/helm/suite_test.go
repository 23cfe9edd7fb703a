// Package helm is the e2e suite of ziptrail's Helm chart on the local
// cluster: real Kubernetes (internal/localcluster/k8s) with the node agent running
// pods from the image catalog (config/local/images.yaml), real Knative
// Serving (internal/localcluster/knative), and ziptrail installed, upgraded and
// uninstalled with the real `helm` CLI as a user does — the operator runs
// as the chart's Deployment, not in this process. It starts its own
// cluster, so it runs as root, and waits for the host's one local cluster
// if another suite holds it.
package helm

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	localk8s "github.com/ziptrail/ziptrail/internal/localcluster/k8s"
	"github.com/ziptrail/ziptrail/internal/localcluster/knative"
	"github.com/ziptrail/ziptrail/internal/tools/chartops"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

var (
	ctx     = context.Background()
	cluster *localk8s.Cluster
	kn      *knative.Knative
	cs      *kubernetes.Clientset
	dyn     *dynamic.DynamicClient
	k8s     client.Client
	kubectl string
	chart   = filepath.Join(paths.RepoRoot(), "charts", "ziptrail")
	// rel is the release the Describes install (one at a time), as
	// internal/tools/chartops drives it: helm, the gateway Service, tokens.
	rel *chartops.Release
)

func TestHelm(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(3 * time.Minute)
	SetDefaultEventuallyPollingInterval(500 * time.Millisecond)
	RunSpecs(t, "ziptrail's Helm chart on the local cluster e2e")
}

var _ = BeforeSuite(func() {
	var err error
	// helm and kubectl come from hack/install-deps.sh (make test puts them
	// on PATH; $ZIPTRAIL_CACHE/bin otherwise).
	Expect(paths.FindBinary("helm")).NotTo(BeEmpty(), "helm from hack/install-deps.sh: eval \"$(hack/install-deps.sh --env)\"")
	kubectl = filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
	Expect(kubectl).To(BeAnExistingFile(), "kubectl from hack/install-deps.sh")

	dir := GinkgoT().TempDir()
	bin := func(pkg string) string {
		out := filepath.Join(dir, "bin", filepath.Base(pkg))
		build := exec.Command("go", "build", "-o", out, pkg)
		build.Dir = paths.RepoRoot()
		b, err := build.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "build %s: %s", pkg, b)
		return out
	}
	agent, ingress := bin("./cmd/ziptrail-node"), bin("./cmd/ziptrail-ingress")
	cluster, err = localk8s.Start(ctx, localk8s.Options{
		StateDir: dir, Nodes: 2, NodeAgent: agent, NetPrefix: "ztkh",
		ClusterCIDR: netip.MustParsePrefix("10.228.0.0/16"), ServiceCIDR: netip.MustParsePrefix("10.105.0.0/16"),
		WaitForHost: 30 * time.Minute, // other suites may hold the host's one cluster
		Log:         GinkgoWriter,
	})
	Expect(err).NotTo(HaveOccurred())
	kn, err = knative.Install(ctx, knative.Options{
		Cluster: cluster, RepoRoot: paths.RepoRoot(), Ingress: ingress, Log: GinkgoWriter,
		// Functions scale to zero within seconds (the keep-alive specs wait
		// for it), and may start at zero.
		// activator-ext's locality decisions are read from the
		// activator's Prometheus endpoint.
		ConfigMaps: map[string]map[string]string{"config-autoscaler": {
			"stable-window": "6s", "scale-to-zero-grace-period": "6s", "allow-zero-initial-scale": "true"},
			"config-observability": {"metrics-protocol": "prometheus"}},
	})
	Expect(err).NotTo(HaveOccurred())
	cs, err = cluster.Clientset()
	Expect(err).NotTo(HaveOccurred())
	dyn, err = dynamic.NewForConfig(cluster.Config)
	Expect(err).NotTo(HaveOccurred())
	k8s, err = client.New(cluster.Config, client.Options{Scheme: envtest.Scheme()})
	Expect(err).NotTo(HaveOccurred())

	// helm as a user runs it, with its own configuration and cache.
	rel = &chartops.Release{Name: release, Namespace: releaseNS, Chart: chart, Kubeconfig: cluster.Kubeconfig,
		Clientset: cs, HelmHome: filepath.Join(dir, "helm")}
})

var _ = AfterSuite(func() {
	if cluster != nil {
		Expect(cluster.Stop(context.Background())).To(Succeed())
	}
})

// helm runs the helm CLI against the cluster; it returns its output.
func helm(args ...string) (string, error) {
	fmt.Fprintf(GinkgoWriter, "$ helm %s\n", strings.Join(args, " "))
	out, err := rel.Helm(ctx, args...)
	if args[0] != "get" || err != nil { // manifests are long
		fmt.Fprintf(GinkgoWriter, "%s\n", out)
	}
	return out, err
}

// kubectlRun runs kubectl against the cluster, with stdin; it returns its
// output.
func kubectlRun(stdin string, args ...string) (string, error) {
	cmd := exec.Command(kubectl, append([]string{"--kubeconfig", cluster.Kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
