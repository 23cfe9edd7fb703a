// Package e2e is ziptrail's end-to-end suite. One suite, two targets:
//
//	E2E_TARGET=local (default) starts the local cluster on this machine
//	  (internal/localcluster): Kubernetes with the node agent (two nodes),
//	  real Knative Serving with queue-proxy-zl as its queue sidecar, and
//	  ziptrail's operator; it runs as root, one cluster per host;
//	E2E_TARGET=kind uses $KUBECONFIG (a kind cluster with Knative Serving and
//	  ziptrail installed by hack/kind-e2e.sh) and $E2E_INGRESS (host:port of
//	  Knative's ingress, e.g. a kubectl port-forward of kourier).
package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/ziptrail/ziptrail/internal/localcluster"
	localk8s "github.com/ziptrail/ziptrail/internal/localcluster/k8s"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
)

var (
	ctx     = context.Background()
	k8s     client.Client
	ingress string // base URL; requests are routed by Host header
	cluster *localcluster.Cluster
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "ziptrail e2e ("+target()+")")
}

func target() string {
	if t := os.Getenv("E2E_TARGET"); t != "" {
		return t
	}
	return "local"
}

var _ = BeforeSuite(func() {
	switch target() {
	case "local":
		dir := GinkgoT().TempDir()
		var err error
		cluster, err = localcluster.Up(ctx, localcluster.Options{
			StateDir: dir, Nodes: 2,
			// Two pods per function (as the specs of fault tolerance and
			// fan-out expect), kept through Knative's cluster-wide default.
			Knative: map[string]map[string]string{"config-autoscaler": {"min-scale": "2"}},
			Kubernetes: localk8s.Options{NetPrefix: "zte",
				ClusterCIDR: netip.MustParsePrefix("10.216.0.0/16"), ServiceCIDR: netip.MustParsePrefix("10.103.0.0/16"),
				WaitForHost: 45 * time.Minute}, // other suites may hold the host's one cluster
			Log: GinkgoWriter,
		})
		Expect(err).NotTo(HaveOccurred())
		k8s, ingress = cluster.Client, cluster.IngressURL
	case "kind":
		ctrl.SetLogger(zap.New(zap.WriteTo(GinkgoWriter)))
		cfg, err := ctrl.GetConfig()
		Expect(err).NotTo(HaveOccurred())
		k8s, err = client.New(cfg, client.Options{Scheme: envtest.Scheme()})
		Expect(err).NotTo(HaveOccurred())
		ingress = "http://" + os.Getenv("E2E_INGRESS")
		Expect(os.Getenv("E2E_INGRESS")).NotTo(BeEmpty(), "set E2E_INGRESS to Knative's ingress host:port")
	default:
		Fail(fmt.Sprintf("unknown E2E_TARGET %q (want local or kind)", target()))
	}
})

var _ = AfterSuite(func() {
	if cluster != nil {
		Expect(cluster.Down(context.Background())).To(Succeed())
	}
})

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
