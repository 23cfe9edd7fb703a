package kingress

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"knative.dev/networking/pkg/apis/networking/v1alpha1"
	netclient "knative.dev/networking/pkg/client/clientset/versioned"
	"knative.dev/networking/pkg/http/probe"
	"knative.dev/pkg/apis"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// The suite shares one API server and one running ingress controller.
var (
	restCfg *rest.Config
	kube    kubernetes.Interface
	netcs   netclient.Interface
	extAddr string // external listener
	locAddr string // cluster-local listener
	tlsAddr string // external HTTPS listener
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		fmt.Fprintln(os.Stderr, "KUBEBUILDER_ASSETS is not set: run `eval \"$(hack/install-deps.sh --env)\"` first")
		return 1
	}
	crd, err := ingressCRD()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	te := &envtest.Environment{CRDDirectoryPaths: []string{crd}, ErrorIfCRDPathMissing: true}
	restCfg, err = te.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start control plane:", err)
		_ = te.Stop()
		return 1
	}
	defer func() { _ = te.Stop() }()
	if hostIP, err = localIP(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	kube = kubernetes.NewForConfigOrDie(restCfg)
	netcs = netclient.NewForConfigOrDie(restCfg)

	ext, _ := net.Listen("tcp", "127.0.0.1:0")
	loc, _ := net.Listen("tcp", "127.0.0.1:0")
	sec, _ := net.Listen("tcp", "127.0.0.1:0")
	extAddr, locAddr, tlsAddr = ext.Addr().String(), loc.Addr().String(), sec.Addr().String()
	logger, _ := zap.NewDevelopment(zap.IncreaseLevel(zap.WarnLevel))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{
			Config: restCfg, External: ext, Local: loc, HTTPS: sec,
			PublicService:  "ziptrail-ingress.knative-serving.svc.cluster.local",
			PrivateService: "ziptrail-ingress-internal.knative-serving.svc.cluster.local",
			Logger:         logger.Sugar(),
		})
	}()
	code := m.Run()
	cancel()
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "kingress.Run:", err)
		code = 1
	}
	return code
}

// hostIP is the address test backends listen on: EndpointSlices may not
// hold loopback addresses, so it is one of this host's other IPv4 addresses.
var hostIP string

func localIP() (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, i := range ifs {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
				return n.IP.String(), nil
			}
		}
	}
	return "", fmt.Errorf("no non-loopback IPv4 address on this host for test backends (EndpointSlices refuse loopback)")
}

// ingressCRD is Knative networking's own Ingress CRD file, from the module
// this package builds against.
func ingressCRD() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "knative.dev/networking").Output()
	if err != nil {
		return "", fmt.Errorf("locate knative.dev/networking: %w", err)
	}
	p := filepath.Join(strings.TrimSpace(string(out)), "config", "ingress.yaml")
	if _, err := os.Stat(p); err != nil {
		return "", err
	}
	return p, nil
}

// echo is what a test backend answers.
type echo struct {
	Name    string      `json:"name"`
	Host    string      `json:"host"`
	Path    string      `json:"path"`
	Headers http.Header `json:"headers"`
}

// backend is a real HTTP server on loopback behind a Service and an
// EndpointSlice; it answers Knative's probes as the activator and
// queue-proxy do (networking's probe handler).
type backend struct {
	name string
	srv  *http.Server
	addr *net.TCPAddr
	mu   sync.Mutex
	// probeGate, when set, makes probes wait for it (and count).
	probeHashes []string
	probeHold   chan struct{}
}

func newBackend(t testing.TB, name string, handler http.Handler) *backend {
	t.Helper()
	b := startBackend(t, name, handler)
	t.Cleanup(func() { _ = b.srv.Close() })
	return b
}

// startBackend is newBackend for a backend that lives until the process ends.
func startBackend(t testing.TB, name string, handler http.Handler) *backend {
	t.Helper()
	b := &backend{name: name}
	if handler == nil {
		handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(echo{Name: name, Host: r.Host, Path: r.URL.Path, Headers: r.Header})
		})
	}
	inner := probe.NewHandler(handler)
	l, err := net.Listen("tcp", net.JoinHostPort(hostIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	b.addr = l.Addr().(*net.TCPAddr)
	b.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("K-Network-Probe") == "probe" {
			b.mu.Lock()
			b.probeHashes = append(b.probeHashes, r.Header.Get("K-Network-Hash"))
			hold := b.probeHold
			b.mu.Unlock()
			if hold != nil {
				select {
				case <-hold:
				default:
					http.Error(w, "held by the test", http.StatusServiceUnavailable)
					return
				}
			}
		}
		inner.ServeHTTP(w, r)
	})}
	go func() { _ = b.srv.Serve(l) }()
	return b
}

// probes returns the hashes the backend's probes carried so far.
func (b *backend) probes() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.probeHashes...)
}

// publish creates the Service ns/name (port 80 "http", no selector) and an
// EndpointSlice with the given endpoints (ip:port of the "http" port).
func publish(t testing.TB, ns, name string, ready bool, addrs ...*net.TCPAddr) {
	t.Helper()
	ctx := context.Background()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8012)}}},
	}
	if _, err := kube.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service: %v", err)
	}
	setEndpoints(t, ns, name, ready, addrs...)
}

// setEndpoints creates or replaces the EndpointSlice of the Service.
func setEndpoints(t testing.TB, ns, name string, ready bool, addrs ...*net.TCPAddr) {
	t.Helper()
	ctx := context.Background()
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	portName := "http"
	for _, a := range addrs {
		port := int32(a.Port)
		// One slice holds one port set; distinct ports get their own slice.
		if len(slice.Ports) == 0 {
			slice.Ports = []discoveryv1.EndpointPort{{Name: &portName, Port: &port}}
		}
		r := ready
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{a.IP.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &r}})
	}
	cur, err := kube.DiscoveryV1().EndpointSlices(ns).Get(ctx, slice.Name, metav1.GetOptions{})
	if err == nil {
		slice.ResourceVersion = cur.ResourceVersion
		_, err = kube.DiscoveryV1().EndpointSlices(ns).Update(ctx, slice, metav1.UpdateOptions{})
	} else {
		_, err = kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatalf("endpointslice: %v", err)
	}
}

// endpointSlice is one slice of the Service svc with one endpoint.
func endpointSlice(ns, name, svc, portName string, port int32, ip string, ready bool) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	}
}

var nsCount atomic.Int32

// namespace creates a fresh namespace for one test (also with -count=N).
func namespace(t testing.TB) string {
	t.Helper()
	ns := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(ns) > 50 {
		ns = ns[:50]
	}
	ns = fmt.Sprintf("%s-%d", strings.Trim(ns, "-"), nsCount.Add(1))
	if _, err := kube.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	return ns
}

// split is a one-backend split of percent to the Service's port 80.
func splitTo(ns, svc string, percent int, appendHeaders map[string]string) v1alpha1.IngressBackendSplit {
	return v1alpha1.IngressBackendSplit{
		IngressBackend: v1alpha1.IngressBackend{ServiceNamespace: ns, ServiceName: svc, ServicePort: intstr.FromInt32(80)},
		Percent:        percent, AppendHeaders: appendHeaders,
	}
}

// createIngress creates an Ingress of our class with the given rules.
func createIngress(t testing.TB, ns, name string, rules ...v1alpha1.IngressRule) *v1alpha1.Ingress {
	t.Helper()
	ing := &v1alpha1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Annotations: map[string]string{"networking.knative.dev/ingress.class": ClassName}},
		Spec: v1alpha1.IngressSpec{Rules: rules},
	}
	out, err := netcs.NetworkingV1alpha1().Ingresses(ns).Create(context.Background(), ing, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create ingress: %v", err)
	}
	deleteAtEnd(t, ns, name)
	return out
}

// deleteAtEnd deletes the Ingress when the test ends, so that its hosts
// are free for the next test (or the next -count run).
func deleteAtEnd(t testing.TB, ns, name string) {
	t.Cleanup(func() {
		_ = netcs.NetworkingV1alpha1().Ingresses(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// waitReady waits until the Ingress is Ready for its current generation.
func waitReady(t testing.TB, ns, name string) *v1alpha1.Ingress {
	t.Helper()
	var ing *v1alpha1.Ingress
	NewWithT(t).Eventually(func(g Gomega) {
		var err error
		ing, err = netcs.NetworkingV1alpha1().Ingresses(ns).Get(context.Background(), name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(ing.IsReady()).To(BeTrue(), "status: %+v", ing.Status)
	}).WithTimeout(60 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
	return ing
}

func rule(vis v1alpha1.IngressVisibility, hosts []string, paths ...v1alpha1.HTTPIngressPath) v1alpha1.IngressRule {
	return v1alpha1.IngressRule{Hosts: hosts, Visibility: vis, HTTP: &v1alpha1.HTTPIngressRuleValue{Paths: paths}}
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}

// get sends GET path with Host host to the listener at addr.
func get(t testing.TB, addr, host, path string, hdr map[string]string) (int, echo, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s%s: %v", host, path, err)
	}
	defer resp.Body.Close()
	var body strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		body.Write(buf[:n])
		if err != nil {
			break
		}
	}
	var e echo
	_ = json.Unmarshal([]byte(body.String()), &e)
	return resp.StatusCode, e, body.String()
}

var _ = apis.ConditionReady
