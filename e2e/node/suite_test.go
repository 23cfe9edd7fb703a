// Package node is the e2e suite of the local Kubernetes cluster itself
// (internal/localcluster/k8s): plain Kubernetes objects only, no Knative and no
// ziptrail. It starts its own cluster — etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, kube-proxy, CoreDNS and the node
// agent with two nodes — so it runs as root, and not while `ziptrail local
// up` runs (one kube-proxy per host).
package node

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/kubernetes"

	"github.com/ziptrail/ziptrail/internal/localcluster/k8s"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

var (
	ctx     = context.Background()
	cluster *k8s.Cluster
	cs      *kubernetes.Clientset
	kubectl string // path of kubectl
)

func TestNode(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(90 * time.Second)
	SetDefaultEventuallyPollingInterval(250 * time.Millisecond)
	RunSpecs(t, "local Kubernetes cluster e2e")
}

var _ = BeforeSuite(func() {
	dir := GinkgoT().TempDir()
	agent := filepath.Join(dir, "bin", "ziptrail-node")
	build := exec.Command("go", "build", "-o", agent, "./cmd/ziptrail-node")
	build.Dir = paths.RepoRoot()
	out, err := build.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "build ziptrail-node: %s", out)
	cluster, err = k8s.Start(ctx, k8s.Options{
		StateDir: dir, Nodes: 2, NodeAgent: agent, NetPrefix: "zten",
		ClusterCIDR: netip.MustParsePrefix("10.224.0.0/16"), ServiceCIDR: netip.MustParsePrefix("10.101.0.0/16"),
		// Another suite (internal/localcluster/k8s) may hold the host's one cluster.
		WaitForHost: 45 * time.Minute, // the e2e suites, each with its own cluster, take turns
		Log:         GinkgoWriter,
	})
	Expect(err).NotTo(HaveOccurred())
	cs, err = cluster.Clientset()
	Expect(err).NotTo(HaveOccurred())
	kubectl = filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
	Expect(kubectl).To(BeAnExistingFile(), "kubectl from hack/install-deps.sh")
})

var _ = AfterSuite(func() {
	if cluster != nil {
		Expect(cluster.Stop(context.Background())).To(Succeed())
	}
})
