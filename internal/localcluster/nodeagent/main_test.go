package nodeagent_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent"
	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/sandbox"
	ztenv "github.com/ziptrail/ziptrail/internal/tools/envtest"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

// The suite runs one agent with two nodes against a real kube-apiserver.
// Its pod network (prefix "ztn", 10.221.0.0/23) is used by no other suite.
const netPrefix = "ztn"

var (
	nodes = []nodeagent.NodeSpec{
		{Name: "ztn-node-0", PodCIDR: netip.MustParsePrefix("10.221.0.0/24")},
		{Name: "ztn-node-1", PodCIDR: netip.MustParsePrefix("10.221.1.0/24")},
	}
	client     kubernetes.Interface
	restConfig *rest.Config
	stateDir   string
	catalogDir string
	clientCA   string // signs the API server's kubelet client certificate
)

// testBackoff keeps restart tests short; the kubelet's doubling applies.
var testBackoff = nodeagent.Backoff{Initial: 2 * time.Second, Max: 8 * time.Second, Reset: 10 * time.Minute}

func TestMain(m *testing.M) {
	sandbox.MaybeRunInit() // containers of the in-process agent re-exec this binary
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "nodeagent tests need root (network namespaces, mounts): run them as root")
		return 1
	}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		fmt.Fprintln(os.Stderr, "KUBEBUILDER_ASSETS is not set: run `eval \"$(hack/install-deps.sh --env)\"` first")
		return 1
	}
	dir, err := os.MkdirTemp("", "nodeagent-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	stateDir = filepath.Join(dir, "state")
	catalogDir = dir

	certs := filepath.Join(dir, "certs")
	if err := writeKubeletClientCerts(certs); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	clientCA = filepath.Join(certs, "ca.crt")
	env := &envtest.Environment{}
	env.ControlPlane.GetAPIServer().Configure().
		Set("kubelet-client-certificate", filepath.Join(certs, "client.crt")).
		Set("kubelet-client-key", filepath.Join(certs, "client.key"))
	restConfig, err = env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start kube-apiserver:", err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	cp := &ztenv.Env{Environment: env, Config: restConfig}
	kubeconfig, err := cp.Kubeconfig(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	client = kubernetes.NewForConfigOrDie(restConfig)

	catalogPath := filepath.Join(dir, "images.yaml")
	if err := os.WriteFile(catalogPath, []byte(fmt.Sprintf(`root: %s
images:
  - image: ziptrail.dev/e2e/echo:latest
    goPackage: ./e2e/images/echo
  - image: ziptrail.dev/test/shell
    entrypoint: [sh, -c]
    workingDir: /
`, paths.RepoRoot())), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Free ports, not fixed ones: another run of these tests (or anything
	// else on the host) may hold a fixed port.
	kubeletPort = freePort()
	ctx, cancel := context.WithCancel(context.Background())
	cfg := nodeagent.Config{
		Kubeconfig: kubeconfig, StateDir: stateDir, CatalogPath: catalogPath, Nodes: nodes,
		NetPrefix: netPrefix, ClusterDNS: "10.0.0.10", ClusterDomain: "cluster.local",
		ListenAddress: "127.0.0.1", HealthzPort: freePort(), KubeletPort: kubeletPort, ClientCAFile: clientCA,
		Backoff: testBackoff, ShutdownGracePeriod: 5 * time.Second,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	agent, err := nodeagent.Start(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "start the node agent:", err)
		cancel()
		return 1
	}
	deadline := time.Now().Add(60 * time.Second)
	for !agent.Ready() {
		if time.Now().After(deadline) {
			fmt.Fprintln(os.Stderr, "the nodes did not become Ready")
			cancel()
			_ = agent.Stop()
			return 1
		}
		time.Sleep(100 * time.Millisecond)
	}
	code := m.Run()
	cancel()
	if err := agent.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop the agent:", err)
		code = 1
	}
	return code
}

// writeKubeletClientCerts makes a CA and the API server's client
// certificate for kubelets (user kube-apiserver-kubelet-client, group
// system:masters, as kubeadm issues it).
func writeKubeletClientCerts(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ztn-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2),
		Subject:   pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"ca.crt":     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		"client.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"client.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// newNamespace creates a namespace (with its default ServiceAccount, which
// no controller creates here) and deletes it after the test.
func newNamespace(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "ztn-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().ServiceAccounts(ns.Name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Pods first, so their sandboxes go before the test ends.
		pods, _ := client.CoreV1().Pods(ns.Name).List(context.Background(), metav1.ListOptions{})
		zero := int64(0)
		for _, p := range pods.Items {
			_ = client.CoreV1().Pods(ns.Name).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		}
		_ = client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

// kubeletPort is the agent's kubelet API port, chosen free in TestMain.
var kubeletPort int

// freePort returns a TCP port that was free a moment ago.
func freePort() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
