//go:build e2e

// Package conformance runs Knative networking's ingress conformance suite
// (knative.dev/networking/test/conformance/ingress) against the kingress
// controller and gateway on a local cluster with a node (internal/localcluster/k8s
// and ziptrail-node, whose image catalog builds Knative's test images from
// the pinned module). Run as root:
//
//	eval "$(hack/install-deps.sh --env)"
//	go test -tags e2e -timeout 60m ./internal/localcluster/kingress/conformance/ -args --enable-beta --enable-alpha
package conformance

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"knative.dev/networking/test/conformance/ingress"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/ziptrail/ziptrail/internal/localcluster/k8s"
	"github.com/ziptrail/ziptrail/internal/localcluster/kingress"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

func TestIngressConformance(t *testing.T) {
	ingress.RunConformance(t)
}

func TestMain(m *testing.M) {
	flag.Parse()
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance setup:", err)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	if os.Geteuid() != 0 {
		return 1, fmt.Errorf("the local cluster's node agent needs root")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root := paths.RepoRoot()
	dir, err := os.MkdirTemp("", "kingress-conformance-")
	if err != nil {
		return 1, err
	}
	defer os.RemoveAll(dir)
	agent := filepath.Join(dir, "bin", "ziptrail-node")
	build := exec.Command("go", "build", "-o", agent, "./cmd/ziptrail-node")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return 1, fmt.Errorf("build ziptrail-node: %v: %s", err, out)
	}
	catalog, err := filepath.Abs("testdata/images.yaml")
	if err != nil {
		return 1, err
	}
	cluster, err := k8s.Start(ctx, k8s.Options{
		StateDir: dir, Nodes: 1, NodeAgent: agent, NetPrefix: "ztkc", Catalog: catalog,
		ClusterCIDR: netip.MustParsePrefix("10.226.0.0/16"), ServiceCIDR: netip.MustParsePrefix("10.103.0.0/16"),
		WaitForHost: 20 * time.Minute, Log: os.Stderr,
	})
	if err != nil {
		return 1, err
	}
	defer func() { _ = cluster.Stop(context.Background()) }()
	cs, err := cluster.Clientset()
	if err != nil {
		return 1, err
	}
	crd, err := ingressCRD()
	if err != nil {
		return 1, err
	}
	if _, err := envtest.InstallCRDs(cluster.Config, envtest.CRDInstallOptions{Paths: []string{crd}, ErrorIfPathMissing: true}); err != nil {
		return 1, fmt.Errorf("install the Ingress CRD: %w", err)
	}
	for _, ns := range []string{"knative-serving", "serving-tests"} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return 1, err
		}
	}
	if err := k8s.WaitDefaultServiceAccount(ctx, cs, "serving-tests"); err != nil {
		return 1, err
	}

	// The gateway runs on the host, on HostIP, which pods and the host
	// both reach; it points the Services the Ingress status names at its
	// listeners (the public one as a NodePort for --ingressendpoint).
	hostIP := cluster.State.HostIP
	ext, err := net.Listen("tcp", net.JoinHostPort(hostIP, "0"))
	if err != nil {
		return 1, err
	}
	loc, err := net.Listen("tcp", net.JoinHostPort(hostIP, "0"))
	if err != nil {
		return 1, err
	}
	sec, err := net.Listen("tcp", net.JoinHostPort(hostIP, "0"))
	if err != nil {
		return 1, err
	}
	logger, _ := zap.NewDevelopment()
	done := make(chan error, 1)
	go func() {
		done <- kingress.Run(ctx, kingress.Options{
			Config: cluster.Config, External: ext, Local: loc, HTTPS: sec,
			PublicService:  "ziptrail-ingress.knative-serving.svc.cluster.local",
			PrivateService: "ziptrail-ingress-internal.knative-serving.svc.cluster.local",
			Logger:         logger.Sugar().Named("kingress"),
			Advertise:      &kingress.Advertise{IP: hostIP, PublicType: corev1.ServiceTypeNodePort},
		})
	}()

	for name, value := range map[string]string{
		"kubeconfig": cluster.Kubeconfig, "ingressendpoint": hostIP, "ingressClass": kingress.ClassName,
		"dockerrepo": "ko.local", "tag": "latest",
	} {
		if f := flag.Lookup(name); f != nil && f.Value.String() == f.DefValue {
			if err := flag.Set(name, value); err != nil {
				return 1, err
			}
		}
	}
	code := m.Run()
	cancel()
	if err := <-done; err != nil {
		return 1, err
	}
	return code, nil
}

// ingressCRD is Knative networking's Ingress CRD from the pinned module.
func ingressCRD() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "knative.dev/networking").Output()
	if err != nil {
		return "", fmt.Errorf("locate knative.dev/networking: %w", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "config", "ingress.yaml"), nil
}
