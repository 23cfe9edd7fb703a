// Package knative is the e2e suite of real Knative Serving on the local
// cluster: Knative's controller, webhook, autoscaler and activator
// (internal/localcluster/knative) with ziptrail-ingress as the KIngress, on the
// local Kubernetes cluster (internal/localcluster/k8s) — plain Knative Services of
// the echo test image, no ziptrail. It starts its own cluster, so it runs as
// root, and not while `ziptrail local up` runs (one cluster per host).
package knative

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	netclient "knative.dev/networking/pkg/client/clientset/versioned"
	servingclient "knative.dev/serving/pkg/client/clientset/versioned"

	"github.com/ziptrail/ziptrail/internal/localcluster/k8s"
	localknative "github.com/ziptrail/ziptrail/internal/localcluster/knative"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

var (
	ctx     = context.Background()
	cluster *k8s.Cluster
	kn      *localknative.Knative
	cs      *kubernetes.Clientset
	serving *servingclient.Clientset
	netcs   *netclient.Clientset
	kubectl string
	// httpc talks to the ingress; no keep-alive reuse across specs'
	// measurements is needed, but connections are pooled for load.
	httpc = &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
)

// Autoscaler windows short enough for a test run (Knative's minimums):
// the KPA decides on 6 s of metrics and a revision with no traffic goes
// to zero after the grace period.
var autoscaler = map[string]string{
	"stable-window":                      "6s",
	"scale-to-zero-grace-period":         "6s",
	"scale-to-zero-pod-retention-period": "0s",
	"allow-zero-initial-scale":           "true",
}

func TestKnative(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(2 * time.Minute)
	SetDefaultEventuallyPollingInterval(250 * time.Millisecond)
	RunSpecs(t, "real Knative Serving on the local cluster e2e")
}

var _ = BeforeSuite(func() {
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
	var err error
	cluster, err = k8s.Start(ctx, k8s.Options{
		StateDir: dir, Nodes: 2, NodeAgent: agent, NetPrefix: "ztkn",
		ClusterCIDR: netip.MustParsePrefix("10.226.0.0/16"), ServiceCIDR: netip.MustParsePrefix("10.102.0.0/16"),
		WaitForHost: 45 * time.Minute, // other suites may hold the host's one cluster
		Log:         GinkgoWriter,
	})
	Expect(err).NotTo(HaveOccurred())
	kn, err = localknative.Install(ctx, localknative.Options{
		Cluster: cluster, RepoRoot: paths.RepoRoot(), Ingress: ingress,
		ConfigMaps: map[string]map[string]string{"config-autoscaler": autoscaler},
		Log:        GinkgoWriter,
	})
	Expect(err).NotTo(HaveOccurred())
	cs, err = cluster.Clientset()
	Expect(err).NotTo(HaveOccurred())
	serving, err = servingclient.NewForConfig(cluster.Config)
	Expect(err).NotTo(HaveOccurred())
	netcs, err = netclient.NewForConfig(cluster.Config)
	Expect(err).NotTo(HaveOccurred())
	kubectl = filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
	Expect(kubectl).To(BeAnExistingFile(), "kubectl from hack/install-deps.sh")

	// The node agent builds the echo image (a Go package in the catalog)
	// on its first pod: do that here, so that the specs' numbers are
	// Knative's and not the build's.
	ns := "warmup"
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	out, err := kubectlApply(ns, service("warmup", nil, ""))
	Expect(err).NotTo(HaveOccurred(), out)
	waitReady(ns, "warmup")
	Expect(serving.ServingV1().Services(ns).Delete(ctx, "warmup", metav1.DeleteOptions{})).To(Succeed())
})

var _ = AfterSuite(func() {
	if cluster != nil {
		Expect(cluster.Stop(context.Background())).To(Succeed())
	}
})

// newNamespace makes a namespace for one spec and deletes it afterwards.
func newNamespace(prefix string) string {
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() {
		_ = cs.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

// kubectlApply applies a manifest as a user would; it returns kubectl's
// output and error.
func kubectlApply(ns, manifest string) (string, error) {
	cmd := exec.Command(kubectl, "--kubeconfig", cluster.Kubeconfig, "-n", ns, "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(manifest)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// host is the external host name of a Service (or of one of its tags).
func host(name, ns string) string { return fmt.Sprintf("%s.%s.%s", name, ns, kn.Domain) }

// get sends GET path to the external gateway with the Host header.
func get(hostname, path string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, kn.IngressURL+path, nil)
	if err != nil {
		return 0, "", err
	}
	req.Host = hostname
	resp, err := httpc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
