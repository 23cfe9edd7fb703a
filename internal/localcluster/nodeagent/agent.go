// Package nodeagent is ziptrail's local Kubernetes node: a virtual-kubelet
// provider that registers one or more Nodes and runs every Pod bound to them
// as a sandbox of Linux namespaces instead of containers. Each pod gets a
// network namespace with its own IP from its node's podCIDR (a veth on the
// node's bridge) and, per container, a mount namespace with what a kubelet
// gives a container: volumes (emptyDir, ConfigMap, Secret, downward API,
// projected service-account tokens), /dev/shm, /etc/hosts and resolv.conf,
// and cgroups with the pod's and each container's resource limits
// (cgroup.go).
// Images are mapped to local programs by an image catalog (package catalog).
// Probes, restart back-off, lifecycle hooks, graceful termination, pod
// status pushed through the PodNotifier, `kubectl logs` and `kubectl exec`
// follow the kubelet's behaviour.
package nodeagent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
	vkslog "github.com/virtual-kubelet/virtual-kubelet/log/slog"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/ziptrail/ziptrail/internal/localcluster/netns"
	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/catalog"
	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/cgroups"
	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/sandbox"
)

// NodeSpec is one node the agent registers.
type NodeSpec struct {
	Name    string
	PodCIDR netip.Prefix
}

// Config configures the agent (the command line of ziptrail-node).
type Config struct {
	Kubeconfig    string
	StateDir      string
	CatalogPath   string
	Nodes         []NodeSpec
	NetPrefix     string // 1-5 characters; node i uses <prefix><i> for its bridge and namespaces
	ClusterDNS    string
	ClusterDomain string
	// ListenAddress is where /healthz is served (port HealthzPort).
	ListenAddress string
	HealthzPort   int
	// KubeletPort is the kubelet API port on each node's InternalIP (the
	// gateway address of its bridge).
	KubeletPort int
	// ClientCAFile, when set, turns on the kubelet's webhook auth: client
	// certificates signed by this CA (the API server's
	// --kubelet-client-certificate) and bearer tokens are authenticated
	// (TokenReview) and authorized (SubjectAccessReview on nodes/proxy…).
	// Without it the kubelet API allows anonymous access.
	ClientCAFile string
	// ShutdownGracePeriod caps the grace period of pods stopped because
	// the agent exits.
	ShutdownGracePeriod time.Duration
	// Backoff overrides the restart back-off (tests); zero means the kubelet's.
	Backoff Backoff
	Log     *slog.Logger
}

func (c *Config) defaults() error {
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.ClusterDomain == "" {
		c.ClusterDomain = "cluster.local"
	}
	if c.KubeletPort == 0 {
		c.KubeletPort = 10250
	}
	if c.HealthzPort == 0 {
		c.HealthzPort = 10248
	}
	if c.ListenAddress == "" {
		c.ListenAddress = "127.0.0.1"
	}
	if c.ShutdownGracePeriod == 0 {
		c.ShutdownGracePeriod = 10 * time.Second
	}
	if len(c.NetPrefix) == 0 || len(c.NetPrefix) > 5 {
		return fmt.Errorf("--net-prefix %q must be 1-5 characters", c.NetPrefix)
	}
	if len(c.Nodes) == 0 {
		return errors.New("give at least one --node <name>=<podCIDR>")
	}
	if len(c.Nodes) > 10 {
		return errors.New("at most 10 nodes")
	}
	if c.StateDir == "" {
		return errors.New("--state-dir is required")
	}
	seen := map[string]bool{}
	for i, n := range c.Nodes {
		if n.Name == "" || seen[n.Name] {
			return fmt.Errorf("node %d: empty or duplicate name %q", i, n.Name)
		}
		seen[n.Name] = true
		for _, m := range c.Nodes[:i] {
			if m.PodCIDR.Overlaps(n.PodCIDR) {
				return fmt.Errorf("the podCIDRs of nodes %s and %s overlap", m.Name, n.Name)
			}
		}
	}
	return nil
}

// ParseNodes parses `name=cidr[,name=cidr...]`.
func ParseNodes(s string) ([]NodeSpec, error) {
	var nodes []NodeSpec
	for _, part := range strings.Split(s, ",") {
		name, cidr, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("--node %q: want <name>=<podCIDR>", part)
		}
		p, err := netip.ParsePrefix(cidr)
		if err != nil {
			return nil, fmt.Errorf("--node %s: %w", name, err)
		}
		if !p.Addr().Is4() || p.Bits() > 24 {
			return nil, fmt.Errorf("--node %s: podCIDR %s must be IPv4 and /24 or larger", name, p)
		}
		nodes = append(nodes, NodeSpec{Name: name, PodCIDR: p.Masked()})
	}
	return nodes, nil
}

func (c *Config) podsDir() string { return filepath.Join(c.StateDir, "pods") }

func (c *Config) network(i int) (*netns.Network, error) {
	return netns.New(c.NetPrefix+strconv.Itoa(i), c.Nodes[i].PodCIDR)
}

// Cleanup removes every namespace, bridge, mount and mount point a crashed
// run with this configuration's prefix left behind.
func Cleanup(ctx context.Context, cfg Config) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	var errs []error
	// Processes of the pods: whatever still runs inside our namespaces.
	errs = append(errs, killNamespaces(ctx, cfg.NetPrefix))
	for i := range cfg.Nodes {
		n, err := cfg.network(i)
		if err != nil {
			return err
		}
		errs = append(errs, n.Cleanup(ctx))
	}
	errs = append(errs, sweepLinks(ctx, cfg.NetPrefix))
	errs = append(errs, sandbox.CleanupDir(cfg.podsDir()))
	errs = append(errs, cleanupCgroups(cfg))
	return errors.Join(errs...)
}

// nsPattern matches the namespaces and bridges of any node of the prefix.
func nsPattern(prefix string) *regexp.Regexp {
	return regexp.MustCompile("^" + regexp.QuoteMeta(prefix) + `[0-9]-`)
}

// killNamespaces SIGKILLs every process in the prefix's pod namespaces.
func killNamespaces(ctx context.Context, prefix string) error {
	out, err := exec.CommandContext(ctx, "ip", "netns", "list").Output()
	if err != nil {
		return fmt.Errorf("ip netns list: %w", err)
	}
	re := nsPattern(prefix)
	var errs []error
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if !re.MatchString(name) {
			continue
		}
		pids, _ := exec.CommandContext(ctx, "ip", "netns", "pids", name).Output()
		for _, f := range strings.Fields(string(pids)) {
			if pid, err := strconv.Atoi(f); err == nil {
				if p, err := os.FindProcess(pid); err == nil {
					_ = p.Kill()
				}
			}
		}
		if err := exec.CommandContext(ctx, "ip", "netns", "del", name).Run(); err != nil {
			errs = append(errs, fmt.Errorf("ip netns del %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// sweepLinks removes bridges of the prefix's nodes beyond the configured ones.
func sweepLinks(ctx context.Context, prefix string) error {
	out, err := exec.CommandContext(ctx, "ip", "-o", "link", "show").Output()
	if err != nil {
		return err
	}
	re := regexp.MustCompile("^" + regexp.QuoteMeta(prefix) + `[0-9](br0|v[0-9]+)$`)
	var errs []error
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if re.MatchString(name) {
			if out, err := exec.CommandContext(ctx, "ip", "link", "del", name).CombinedOutput(); err != nil {
				// A veth goes by itself (asynchronously) once its
				// namespace is deleted: only a link that is still
				// there is an error.
				if exec.CommandContext(ctx, "ip", "link", "show", name).Run() == nil {
					errs = append(errs, fmt.Errorf("ip link del %s: %w: %s", name, err, strings.TrimSpace(string(out))))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// Agent is a running node agent.
type Agent struct {
	cfg       Config
	nodes     []*nodeutil.Node
	providers []*Provider
	networks  []*netns.Network
	mu        sync.Mutex
	ready     map[string]bool
	health    *http.Server
	cancel    context.CancelFunc // stops the nodes' controllers
	running   []*nodeutil.Node
	brokers   []record.EventBroadcaster
	// cgroups is the host's cgroup hierarchy (nil when it is not usable:
	// pods then run without resource limits); cgroupsErr says why.
	cgroups    *cgroups.Hierarchy
	cgroupsErr error
}

// Run registers the nodes, serves their kubelet APIs and runs their pods
// until ctx ends; then it stops the pods and removes namespaces, bridges
// and mounts. It returns once everything is cleaned up.
func Run(ctx context.Context, cfg Config) error {
	a, err := Start(ctx, cfg)
	if err != nil {
		return err
	}
	<-ctx.Done()
	return a.Stop()
}

// Start sets up the networks and starts the nodes; Ready reports when they
// are all Ready.
func Start(ctx context.Context, cfg Config) (*Agent, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	vklog.L = vkslog.FromSlog(cfg.Log.With("component", "virtual-kubelet"))
	klog.SetSlogLogger(cfg.Log.With("component", "client-go"))
	// nodeutil.NewNode builds a default client from $KUBECONFIG before our
	// client replaces it; point it at the same file so it does not complain.
	_ = os.Setenv("KUBECONFIG", cfg.Kubeconfig)
	if err := Cleanup(ctx, cfg); err != nil {
		cfg.Log.Warn("cleaning up an earlier run", "err", err)
	}
	for _, sysctl := range []string{"net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables"} {
		if err := os.WriteFile("/proc/sys/"+sysctl, []byte("1"), 0o644); err != nil {
			cfg.Log.Warn("cannot enable "+strings.ReplaceAll(sysctl, "/", "."), "err", err)
		}
	}
	cat, err := catalog.Load(cfg.CatalogPath, filepath.Join(cfg.StateDir, "images"))
	if err != nil {
		return nil, err
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	restCfg.QPS, restCfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, err
	}
	nodeCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a := &Agent{cfg: cfg, ready: map[string]bool{}, cancel: cancel}
	a.detectCgroups()
	ok := false
	defer func() {
		if !ok {
			_ = a.Stop()
		}
	}()
	if err := a.serveHealth(); err != nil {
		return nil, err
	}
	for i, ns := range cfg.Nodes {
		network, err := cfg.network(i)
		if err != nil {
			return nil, err
		}
		if err := network.Setup(ctx); err != nil {
			return nil, fmt.Errorf("node %s: create bridge %s for %s (needs root): %w", ns.Name, network.Bridge(), ns.PodCIDR, err)
		}
		a.networks = append(a.networks, network)
		n, p, err := a.newNode(ns, network, cat, client)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", ns.Name, err)
		}
		a.nodes = append(a.nodes, n)
		a.providers = append(a.providers, p)
	}
	for i, n := range a.nodes {
		name := cfg.Nodes[i].Name
		a.running = append(a.running, n)
		go func() {
			if err := n.Run(nodeCtx); err != nil && !errors.Is(err, context.Canceled) {
				cfg.Log.Error("node stopped", "node", name, "err", err)
			}
		}()
		go func() {
			if err := n.WaitReady(ctx, 0); err != nil {
				return
			}
			a.mu.Lock()
			a.ready[name] = true
			a.mu.Unlock()
			cfg.Log.Info("node is Ready", "node", name, "podCIDR", cfg.Nodes[i].PodCIDR.String(),
				"internalIP", a.networks[i].Gateway().String(), "kubeletAPI", net.JoinHostPort(a.networks[i].Gateway().String(), strconv.Itoa(cfg.KubeletPort)))
		}()
	}
	ok = true
	return a, nil
}

// Ready reports whether every node is Ready.
func (a *Agent) Ready() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.ready) == len(a.cfg.Nodes)
}

func (a *Agent) serveHealth() error {
	l, err := net.Listen("tcp", net.JoinHostPort(a.cfg.ListenAddress, strconv.Itoa(a.cfg.HealthzPort)))
	if err != nil {
		return fmt.Errorf("health endpoint: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		var notReady []string
		for _, n := range a.cfg.Nodes {
			if !a.ready[n.Name] {
				notReady = append(notReady, n.Name)
			}
		}
		a.mu.Unlock()
		if len(notReady) > 0 {
			http.Error(w, "nodes not ready: "+strings.Join(notReady, ", "), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	a.health = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = a.health.Serve(l) }()
	return nil
}

// Stop stops every pod (bounded by the shutdown grace period), the nodes'
// controllers, and removes the bridges, namespaces and mounts.
func (a *Agent) Stop() error {
	var wg sync.WaitGroup
	for _, p := range a.providers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.shutdown(a.cfg.ShutdownGracePeriod)
		}()
	}
	wg.Wait()
	a.cancel()
	for _, n := range a.running {
		<-n.Done()
	}
	for _, eb := range a.brokers {
		eb.Shutdown()
	}
	if a.health != nil {
		_ = a.health.Close()
	}
	ctx := context.Background()
	var errs []error
	// Nothing of ours may outlive the agent.
	errs = append(errs, killNamespaces(ctx, a.cfg.NetPrefix))
	for _, n := range a.networks {
		errs = append(errs, n.Cleanup(ctx))
	}
	sandbox.RemovePendingMountPoints()
	errs = append(errs, sandbox.CleanupDir(a.cfg.podsDir()))
	errs = append(errs, a.removeCgroups())
	return errors.Join(errs...)
}

func (a *Agent) newNode(ns NodeSpec, network *netns.Network, cat *catalog.Catalog, client kubernetes.Interface) (*nodeutil.Node, *Provider, error) {
	cfg := a.cfg
	nodeIP := network.Gateway().String()
	eb := record.NewBroadcaster()
	eb.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	a.brokers = append(a.brokers, eb)
	recorder := eb.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: ns.Name})
	cert, err := selfSignedCert(ns.Name, nodeIP)
	if err != nil {
		return nil, nil, err
	}
	var auth nodeutil.Auth
	var prov *Provider
	mux := http.NewServeMux()
	nodePaths, err := nodeDirs(cfg.StateDir, ns.Name)
	if err != nil {
		return nil, nil, err
	}
	nodeCgroup := a.nodeCgroup(ns.Name, recorder)
	newProvider := func(pc nodeutil.ProviderConfig) (nodeutil.Provider, node.NodeProvider, error) {
		alloc := configureNode(pc.Node, ns, nodeIP, cfg.KubeletPort)
		prov = newProvider(providerConfig{
			NodeName: ns.Name, NodeIP: nodeIP, Network: network, PodsDir: cfg.podsDir(),
			DNS: sandbox.DNS{Server: cfg.ClusterDNS, Domain: cfg.ClusterDomain}, Catalog: cat, Client: client,
			Recorder: recorder, ConfigMaps: pc.ConfigMaps, Secrets: pc.Secrets, Services: pc.Services,
			Log: cfg.Log, Backoff: cfg.Backoff, NodePaths: nodePaths, Cgroup: nodeCgroup,
		}, alloc)
		return prov, nil, nil
	}
	if cfg.ClientCAFile != "" {
		ca, err := os.ReadFile(cfg.ClientCAFile)
		if err != nil {
			return nil, nil, fmt.Errorf("--client-ca-file: %w", err)
		}
		caProvider, err := dynamiccertificates.NewStaticCAContent("client-ca", ca)
		if err != nil {
			return nil, nil, fmt.Errorf("--client-ca-file %s: %w", cfg.ClientCAFile, err)
		}
		auth, err = nodeutil.WebhookAuth(client, ns.Name, func(c *nodeutil.WebhookAuthConfig) error {
			c.AuthnConfig.ClientCertificateCAContentProvider = caProvider
			return nil
		})
		if err != nil {
			return nil, nil, err
		}
	} else {
		cfg.Log.Warn("no --client-ca-file: the kubelet API allows anonymous access", "node", ns.Name)
		auth = nodeutil.NoAuth()
	}
	n, err := nodeutil.NewNode(ns.Name, newProvider,
		nodeutil.WithClient(StatusOnly(client)), // statusonly.go
		nodeutil.AttachProviderRoutes(mux),
		nodeutil.WithTLSConfig(func(c *tls.Config) error {
			c.Certificates = []tls.Certificate{cert}
			return nil
		}),
		func(c *nodeutil.NodeConfig) error {
			c.SkipDownwardAPIResolution = true
			c.HTTPListenAddr = net.JoinHostPort(nodeIP, strconv.Itoa(cfg.KubeletPort))
			c.Handler = nodeutil.WithAuth(auth, mux)
			c.EventRecorder = recorder
			c.NumWorkers = 4
			return nil
		},
	)
	if err != nil {
		return nil, nil, err
	}
	return n, prov, nil
}

// configureNode fills the Node object: labels, podCIDR, addresses, kubelet
// port, capacity and the conditions other than Ready (set when the
// controllers run). It returns the allocatable resources.
func configureNode(n *corev1.Node, ns NodeSpec, ip string, port int) corev1.ResourceList {
	n.Labels["kubernetes.io/os"] = "linux"
	n.Labels["kubernetes.io/arch"] = runtime.GOARCH
	n.Labels["node.ziptrail.dev/agent"] = "ziptrail-node"
	delete(n.Labels, "kubernetes.io/role")
	n.Labels["type"] = "ziptrail-node"
	n.Spec.PodCIDR = ns.PodCIDR.String()
	n.Spec.PodCIDRs = []string{ns.PodCIDR.String()}
	hostPods := int64(1)<<(32-ns.PodCIDR.Bits()) - 3
	pods := min(hostPods, 250)
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:              *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory:           *resource.NewQuantity(memTotal(), resource.BinarySI),
		corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
		corev1.ResourcePods:             *resource.NewQuantity(pods, resource.DecimalSI),
	}
	n.Status.Capacity = capacity
	n.Status.Allocatable = capacity.DeepCopy()
	// Only the InternalIP: the node's name does not resolve, and the API
	// server's default --kubelet-preferred-address-types tries Hostname first.
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	n.Status.DaemonEndpoints = corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(port)}}
	n.Status.NodeInfo = corev1.NodeSystemInfo{
		OperatingSystem: "linux", Architecture: runtime.GOARCH, KubeletVersion: "v1.35.7-ziptrail",
		ContainerRuntimeVersion: "ziptrail-node://namespaces", OSImage: "ziptrail-node (host processes in namespaces)",
		KernelVersion: kernelVersion(),
	}
	now := metav1.Now()
	n.Status.Conditions = []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady", Message: "starting", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", Message: "kubelet has no disk pressure", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID", Message: "kubelet has sufficient PID available", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse, Reason: "RouteCreated", Message: "ziptrail-node created the node's bridge and route", LastHeartbeatTime: now, LastTransitionTime: now},
	}
	return n.Status.Allocatable
}

func memTotal() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil {
					return kb * 1024
				}
			}
		}
	}
	return 4 << 30
}

func kernelVersion() string {
	data, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// selfSignedCert is the kubelet's serving certificate when none is given
// (the kubelet also self-signs by default).
func selfSignedCert(name, ip string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name + "@ziptrail-node"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{name},
		IPAddresses:  []net.IP{net.ParseIP(ip)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
