// Package localk8s runs a complete Kubernetes cluster on this machine, as
// processes: etcd, kube-apiserver (with a service-account issuer, RBAC, the
// ServiceAccount admission plugin, aggregator routing and a kubelet client
// certificate), kube-controller-manager, kube-scheduler, kube-proxy in
// iptables mode, CoreDNS serving cluster.local, and the ziptrail node agent
// (cmd/ziptrail-node), a virtual-kubelet node that runs pods as Linux
// namespaces. Every component logs into the state directory; the state file
// records their pids so that Down works after the starting process is gone.
//
// One cluster per host: kube-proxy owns the host's KUBE-* iptables chains.
package localk8s

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ziptrail/ziptrail/internal/controlplane"
)

// Options configure a cluster. Zero values get the defaults of `ziptrail
// local up`.
type Options struct {
	StateDir string // required: kubeconfig, pki, logs, etcd data, state file
	// Assets holds kube-apiserver, etcd, kube-controller-manager,
	// kube-scheduler and kube-proxy; default $KUBEBUILDER_ASSETS.
	Assets string
	// CoreDNS is the coredns binary; default $ZIPTRAIL_CACHE/bin/coredns.
	CoreDNS string
	// ClusterCIDR is the pod range: node i gets its i-th /24, the host the
	// last /24. Default 10.220.0.0/16.
	ClusterCIDR netip.Prefix
	// ServiceCIDR is the ClusterIP range; DNS takes its 10th address.
	// Default 10.96.0.0/16.
	ServiceCIDR netip.Prefix
	// NetPrefix (1-5 characters) names the host interface, and the node
	// agent's bridges and namespaces. Default "ztk".
	NetPrefix string
	// Nodes is the number of nodes the agent registers (node-1, node-2, …);
	// 0 runs no node agent.
	Nodes int
	// NodeAgent is the ziptrail-node binary (required when Nodes > 0).
	NodeAgent string
	// Catalog is the image catalog for the agent; default
	// <repo>/config/local/images.yaml.
	Catalog string
	// WaitForHost, when positive, waits up to this long for another
	// cluster running on this host (there can be one) to stop, instead of
	// failing at once. Test suites that may run in parallel set it.
	WaitForHost time.Duration
	// ClusterDomain defaults to cluster.local.
	ClusterDomain string
	Log           io.Writer // progress; default io.Discard
}

// Cluster is a running cluster.
type Cluster struct {
	// Config is the admin's (system:masters) client configuration.
	Config     *rest.Config
	Kubeconfig string // the admin kubeconfig, <state dir>/kubeconfig
	State      State
	opts       Options
	comps      []*Component
	proxy      *Component
	pki        *pki
}

// State is what the state file (<state dir>/k8s/state.json) records.
type State struct {
	Owner         int          `json:"owner"`    // pid of the process that started the cluster
	OwnerExe      string       `json:"ownerExe"` // and its executable
	StateDir      string       `json:"stateDir"`
	Kubeconfig    string       `json:"kubeconfig"`
	NetPrefix     string       `json:"netPrefix"`
	HostIP        string       `json:"hostIP"`
	ClusterCIDR   string       `json:"clusterCIDR"`
	ServiceCIDR   string       `json:"serviceCIDR"`
	DNSIP         string       `json:"dnsIP"`
	ClusterDomain string       `json:"clusterDomain"`
	Nodes         []string     `json:"nodes"` // name=podCIDR
	Components    []*Component `json:"components"`
	// AgentCleanup is the node agent's command line with --cleanup.
	AgentCleanup []string `json:"agentCleanup,omitempty"`
	KubeProxy    string   `json:"kubeProxy"`
}

func k8sDir(stateDir string) string { return filepath.Join(stateDir, "k8s") }

// StateFile is where a cluster started with stateDir records its State.
func StateFile(stateDir string) string { return filepath.Join(k8sDir(stateDir), "state.json") }

// ownerFile names the state directory of the cluster that runs on this host.
const ownerFile = "/run/ziptrail-localk8s"

// ReadState reads the state of the cluster started with stateDir.
func ReadState(stateDir string) (*State, error) {
	data, err := os.ReadFile(StateFile(stateDir))
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", StateFile(stateDir), err)
	}
	return &st, nil
}

func (o *Options) defaults() error {
	if o.StateDir == "" {
		return errors.New("localk8s: StateDir is required")
	}
	if o.Assets == "" {
		o.Assets = os.Getenv("KUBEBUILDER_ASSETS")
	}
	if o.Assets == "" {
		return errors.New("KUBEBUILDER_ASSETS is not set: run `eval \"$(hack/install-deps.sh --env)\"`")
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"} {
		if _, err := os.Stat(filepath.Join(o.Assets, b)); err != nil {
			return fmt.Errorf("%s not found in %s: run hack/install-deps.sh", b, o.Assets)
		}
	}
	if o.CoreDNS == "" {
		o.CoreDNS = controlplane.FindBinary("coredns")
	}
	if o.CoreDNS == "" {
		return errors.New("coredns not found on PATH or in $ZIPTRAIL_CACHE/bin: run hack/install-deps.sh")
	}
	if !o.ClusterCIDR.IsValid() {
		o.ClusterCIDR = netip.MustParsePrefix("10.220.0.0/16")
	}
	if !o.ServiceCIDR.IsValid() {
		o.ServiceCIDR = netip.MustParsePrefix("10.96.0.0/16")
	}
	if !o.ServiceCIDR.Addr().Is4() || o.ServiceCIDR.Bits() > 24 {
		return fmt.Errorf("service CIDR %s must be IPv4 and /24 or larger", o.ServiceCIDR)
	}
	if o.NetPrefix == "" {
		o.NetPrefix = "ztk"
	}
	if len(o.NetPrefix) > 5 {
		return fmt.Errorf("net prefix %q is longer than 5 characters", o.NetPrefix)
	}
	if o.ClusterDomain == "" {
		o.ClusterDomain = "cluster.local"
	}
	if o.Nodes > 0 && o.NodeAgent == "" {
		return errors.New("localk8s: NodeAgent (the ziptrail-node binary) is required with Nodes > 0")
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	return nil
}

// nthAddr returns the n-th address of p.
func nthAddr(p netip.Prefix, n int) netip.Addr {
	a := p.Masked().Addr()
	for range n {
		a = a.Next()
	}
	return a
}

// Start brings the cluster up and returns once every component is healthy
// and, with nodes, every Node is Ready. On error everything started is
// removed again.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errNotRoot
	}
	cidrs, hostIP, err := nodeCIDRs(opts.ClusterCIDR, opts.Nodes)
	if err != nil {
		return nil, err
	}
	if err := claimHost(ctx, opts.StateDir, opts.WaitForHost, opts.Log); err != nil {
		return nil, err
	}
	dir := k8sDir(opts.StateDir)
	// Leftovers of an earlier run with this state directory.
	if st, err := ReadState(opts.StateDir); err == nil {
		st.down(ctx)
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		return nil, err
	}
	step := func(format string, args ...any) { fmt.Fprintf(opts.Log, "==> "+format+"\n", args...) }
	exe, _ := os.Executable()
	c := &Cluster{opts: opts, State: State{
		Owner: os.Getpid(), OwnerExe: exe, StateDir: opts.StateDir, NetPrefix: opts.NetPrefix, HostIP: hostIP.String(),
		ClusterCIDR: opts.ClusterCIDR.Masked().String(), ServiceCIDR: opts.ServiceCIDR.Masked().String(),
		DNSIP: nthAddr(opts.ServiceCIDR, 10).String(), ClusterDomain: opts.ClusterDomain,
		KubeProxy: filepath.Join(opts.Assets, "kube-proxy"),
	}}
	for i, p := range cidrs {
		c.State.Nodes = append(c.State.Nodes, fmt.Sprintf("node-%d=%s", i+1, p))
	}
	defer func() {
		if err != nil {
			c.State.down(context.WithoutCancel(ctx))
		}
	}()
	if err := c.writeState(); err != nil {
		return nil, err
	}

	step("host network: %s on %s, services %s routed to it", hostIP, hostIface(opts.NetPrefix), opts.ServiceCIDR)
	if err := setupHostNetwork(ctx, opts.NetPrefix, hostIP, opts.ServiceCIDR); err != nil {
		return nil, err
	}
	if err := c.makePKI(); err != nil {
		return nil, err
	}
	hc := healthClient(c.pki.caPEM())
	for _, start := range []func(context.Context, *http.Client, func(string, ...any)) error{
		c.startEtcd, c.startAPIServer, c.bootstrap, c.startControllers, c.startProxyAndDNS, c.startAgent, c.waitProxy,
	} {
		if err := start(ctx, hc, step); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// claimHost records that the cluster of stateDir runs on this host. A
// cluster whose starting process still runs is an error (two kube-proxies
// would fight over the KUBE-* iptables chains), or, with wait, waited for;
// the leftovers of one whose starting process is gone are removed.
func claimHost(ctx context.Context, stateDir string, wait time.Duration, log io.Writer) error {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(wait)
	for said := false; ; {
		other, st := hostOwner()
		if st == nil {
			break
		}
		if !st.OwnerAlive() {
			st.down(ctx) // a crashed run's processes, rules and interfaces
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("a local Kubernetes cluster (state dir %s, started by pid %d) is already running on this host; stop it first (`ziptrail local down --state-dir %s`)", other, st.Owner, other)
		}
		if !said {
			fmt.Fprintf(log, "==> waiting for the local Kubernetes cluster of %s (pid %d) to stop: one cluster per host\n", other, st.Owner)
			said = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return os.WriteFile(ownerFile, []byte(abs+"\n"), 0o644)
}

// hostOwner returns the state directory and state of the cluster recorded
// as running on this host, if any.
func hostOwner() (string, *State) {
	data, err := os.ReadFile(ownerFile)
	if err != nil {
		return "", nil
	}
	dir := strings.TrimSpace(string(data))
	st, err := ReadState(dir)
	if err != nil {
		return dir, nil
	}
	return dir, st
}

func (c *Cluster) dir(parts ...string) string {
	return filepath.Join(append([]string{k8sDir(c.opts.StateDir)}, parts...)...)
}

func (c *Cluster) writeState() error {
	c.State.Components = c.comps
	data, err := json.MarshalIndent(c.State, "", "  ")
	if err != nil {
		return err
	}
	tmp := StateFile(c.opts.StateDir) + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, StateFile(c.opts.StateDir))
}

// makePKI issues the CA, the serving certificates and one client
// certificate (and kubeconfig) per component.
func (c *Cluster) makePKI() error {
	var err error
	if c.pki, err = newPKI(c.dir("pki")); err != nil {
		return err
	}
	host := c.State.HostIP
	svc := nthAddr(c.opts.ServiceCIDR, 1).String() // the kubernetes Service
	d := c.opts.ClusterDomain
	if err := c.pki.serving("apiserver", host, svc, "127.0.0.1", "localhost", "kubernetes", "kubernetes.default",
		"kubernetes.default.svc", "kubernetes.default.svc."+d); err != nil {
		return err
	}
	for _, s := range []string{"controller-manager-serving", "scheduler-serving"} {
		if err := c.pki.serving(s, "127.0.0.1", "localhost"); err != nil {
			return err
		}
	}
	clients := []struct{ name, user, group string }{
		{"admin", "ziptrail-admin", "system:masters"},
		{"controller-manager", "system:kube-controller-manager", ""},
		{"scheduler", "system:kube-scheduler", ""},
		{"kube-proxy", "system:kube-proxy", ""},
		{"coredns", "system:ziptrail:coredns", ""},
		{"node-agent", "system:ziptrail:node-agent", "system:nodes"},
		{"kubelet-client", "kube-apiserver-kubelet-client", "system:masters"},
		{"front-proxy-client", "front-proxy-client", ""},
	}
	for _, cl := range clients {
		var groups []string
		if cl.group != "" {
			groups = []string{cl.group}
		}
		if err := c.pki.client(cl.name, cl.user, groups...); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) component(name, binary string, args []string, health string) *Component {
	comp := &Component{Name: name, Binary: binary, Args: args, Log: c.dir("logs", name+".log"), Health: health}
	return comp
}

// launch starts comp, records it in the state file and waits until it is healthy.
func (c *Cluster) launch(ctx context.Context, hc *http.Client, comp *Component, timeout time.Duration, env ...string) error {
	if err := comp.start(env); err != nil {
		return err
	}
	c.comps = append(c.comps, comp)
	if err := c.writeState(); err != nil {
		return err
	}
	return comp.waitHealthy(ctx, hc, timeout)
}

// Launch starts another host process as a component of the cluster (the
// Knative installer's ingress gateway): recorded in the state file, so that
// Stop and `ziptrail local down` stop it first, and waited for until its
// health URL answers 200 (https health URLs are checked against the
// cluster's CA).
func (c *Cluster) Launch(ctx context.Context, name, binary string, args []string, health string, timeout time.Duration, env ...string) error {
	return c.launch(ctx, healthClient(c.pki.caPEM()), c.component(name, binary, args, health), timeout, env...)
}

func (c *Cluster) startEtcd(ctx context.Context, hc *http.Client, step func(string, ...any)) error {
	cp, err := freePort("127.0.0.1")
	if err != nil {
		return err
	}
	pp, err := freePort("127.0.0.1")
	if err != nil {
		return err
	}
	client, peer := "http://"+hostPort("127.0.0.1", cp), "http://"+hostPort("127.0.0.1", pp)
	c.State.Kubeconfig = filepath.Join(c.opts.StateDir, "kubeconfig")
	t := time.Now()
	comp := c.component("etcd", filepath.Join(c.opts.Assets, "etcd"), []string{
		"--name=local", "--data-dir=" + c.dir("etcd"),
		"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer, "--initial-cluster=local=" + peer,
		// A local cluster's data is disposable: no fsync.
		"--unsafe-no-fsync=true", "--log-level=warn",
	}, client+"/health")
	if err := c.launch(ctx, hc, comp, 30*time.Second); err != nil {
		return err
	}
	step("etcd on %s (%s)", client, time.Since(t).Round(time.Millisecond))
	return nil
}

func (c *Cluster) etcdURL() string {
	return strings.TrimSuffix(c.comps[0].Health, "/health")
}

func (c *Cluster) startAPIServer(ctx context.Context, hc *http.Client, step func(string, ...any)) error {
	port, err := freePort(c.State.HostIP)
	if err != nil {
		return err
	}
	p := c.pki.path
	server := "https://" + hostPort(c.State.HostIP, port)
	t := time.Now()
	comp := c.component("kube-apiserver", filepath.Join(c.opts.Assets, "kube-apiserver"), []string{
		"--etcd-servers=" + c.etcdURL(),
		"--bind-address=" + c.State.HostIP, "--advertise-address=" + c.State.HostIP, "--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + p("apiserver.crt"), "--tls-private-key-file=" + p("apiserver.key"),
		"--cert-dir=" + c.dir("pki"),
		"--client-ca-file=" + p("ca.crt"),
		"--authorization-mode=RBAC",
		"--allow-privileged=true",
		"--service-cluster-ip-range=" + c.State.ServiceCIDR,
		// Service-account tokens: TokenRequest, projected tokens, TokenReview.
		"--service-account-issuer=https://kubernetes.default.svc." + c.opts.ClusterDomain,
		"--service-account-key-file=" + p("sa.pub"),
		"--service-account-signing-key-file=" + p("sa.key"),
		// Webhooks and aggregated APIs are called at their endpoints' pod
		// IPs, not through a ClusterIP (the API server has no kube-proxy).
		"--enable-aggregator-routing=true",
		"--proxy-client-cert-file=" + p("front-proxy-client.crt"), "--proxy-client-key-file=" + p("front-proxy-client.key"),
		"--requestheader-client-ca-file=" + p("ca.crt"), "--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		// kubectl logs/exec/port-forward reach the node agent's kubelet API.
		"--kubelet-client-certificate=" + p("kubelet-client.crt"), "--kubelet-client-key=" + p("kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--profiling=false",
	}, server+"/readyz")
	if err := c.launch(ctx, hc, comp, 90*time.Second); err != nil {
		return err
	}
	if _, err := c.pki.kubeconfig(c.opts.StateDir, "admin", server); err != nil {
		return err
	}
	// <state dir>/kubeconfig is the admin's, as for the envtest control plane.
	if err := os.Rename(filepath.Join(c.opts.StateDir, "admin.kubeconfig"), c.State.Kubeconfig); err != nil {
		return err
	}
	for _, name := range []string{"controller-manager", "scheduler", "kube-proxy", "coredns", "node-agent"} {
		if _, err := c.pki.kubeconfig(c.dir(), name, server); err != nil {
			return err
		}
	}
	c.Kubeconfig = c.State.Kubeconfig
	if c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		return err
	}
	step("kube-apiserver on %s (%s; kubeconfig %s)", server, time.Since(t).Round(time.Millisecond), c.Kubeconfig)
	return c.writeState()
}

func (c *Cluster) startControllers(ctx context.Context, hc *http.Client, step func(string, ...any)) error {
	p := c.pki.path
	t := time.Now()
	kc := c.dir("controller-manager.kubeconfig")
	port, err := freePort("127.0.0.1")
	if err != nil {
		return err
	}
	cm := c.component("kube-controller-manager", filepath.Join(c.opts.Assets, "kube-controller-manager"), []string{
		"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + p("controller-manager-serving.crt"), "--tls-private-key-file=" + p("controller-manager-serving.key"),
		"--client-ca-file=" + p("ca.crt"),
		"--controllers=*", "--leader-elect=false", "--use-service-account-credentials=true",
		// The token controller signs with the API server's key; pods get
		// the CA as kube-root-ca.crt.
		"--service-account-private-key-file=" + p("sa.key"), "--root-ca-file=" + p("ca.crt"),
		"--cluster-signing-cert-file=" + p("ca.crt"), "--cluster-signing-key-file=" + p("ca.key"),
		// The node agent sets each Node's podCIDR itself.
		"--allocate-node-cidrs=false", "--cluster-cidr=" + c.State.ClusterCIDR,
		"--service-cluster-ip-range=" + c.State.ServiceCIDR,
		"--profiling=false",
	}, "https://"+hostPort("127.0.0.1", port)+"/healthz")
	if err := c.launch(ctx, hc, cm, 60*time.Second); err != nil {
		return err
	}
	kc = c.dir("scheduler.kubeconfig")
	if port, err = freePort("127.0.0.1"); err != nil {
		return err
	}
	sched := c.component("kube-scheduler", filepath.Join(c.opts.Assets, "kube-scheduler"), []string{
		"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + p("scheduler-serving.crt"), "--tls-private-key-file=" + p("scheduler-serving.key"),
		"--client-ca-file=" + p("ca.crt"),
		"--leader-elect=false", "--profiling=false",
	}, "https://"+hostPort("127.0.0.1", port)+"/healthz")
	if err := c.launch(ctx, hc, sched, 60*time.Second); err != nil {
		return err
	}
	step("kube-controller-manager and kube-scheduler running (%s)", time.Since(t).Round(time.Millisecond))
	return nil
}

func (c *Cluster) startProxyAndDNS(ctx context.Context, hc *http.Client, step func(string, ...any)) error {
	t := time.Now()
	hp, err := freePort("127.0.0.1")
	if err != nil {
		return err
	}
	mp, err := freePort("127.0.0.1")
	if err != nil {
		return err
	}
	node := "node-1" // kube-proxy serves the host, which all nodes share
	if len(c.State.Nodes) > 0 {
		node, _, _ = strings.Cut(c.State.Nodes[0], "=")
	}
	proxy := c.component("kube-proxy", c.State.KubeProxy, []string{
		"--kubeconfig=" + c.dir("kube-proxy.kubeconfig"),
		"--proxy-mode=iptables", "--cluster-cidr=" + c.State.ClusterCIDR,
		"--hostname-override=" + node, "--bind-address=" + c.State.HostIP,
		"--healthz-bind-address=" + hostPort("127.0.0.1", hp), "--metrics-bind-address=" + hostPort("127.0.0.1", mp),
		// Leave the host's conntrack table size and localhost routing alone.
		"--conntrack-max-per-core=0", "--iptables-localhost-nodeports=false",
		"--profiling=false",
	}, "http://"+hostPort("127.0.0.1", hp)+"/livez")
	// kube-proxy waits up to 30 s for its Node before it serves: it is
	// started now and checked once the agent has registered the nodes.
	if err := proxy.start(nil); err != nil {
		return err
	}
	c.comps = append(c.comps, proxy)
	c.proxy = proxy
	if err := c.writeState(); err != nil {
		return err
	}
	dns, err := c.coreDNS()
	if err != nil {
		return err
	}
	if err := c.launch(ctx, hc, dns, 60*time.Second); err != nil {
		return err
	}
	step("CoreDNS on %s, Service kube-system/kube-dns %s (%s)", hostPort(c.State.HostIP, dnsPort), c.State.DNSIP, time.Since(t).Round(time.Millisecond))
	return nil
}

// waitProxy waits until kube-proxy has synced its rules.
func (c *Cluster) waitProxy(ctx context.Context, hc *http.Client, step func(string, ...any)) error {
	t := time.Now()
	if err := c.proxy.waitHealthy(ctx, hc, 60*time.Second); err != nil {
		return err
	}
	step("kube-proxy (iptables mode) synced (%s)", time.Since(t).Round(time.Millisecond))
	return nil
}

// Clientset returns an admin clientset.
func (c *Cluster) Clientset() (*kubernetes.Clientset, error) {
	return kubernetes.NewForConfig(c.Config)
}

// agentHealthPort is the port of the node agent's /healthz on the host
// address (200 once every node is Ready). Each node's kubelet API listens on
// its InternalIP, the gateway of its bridge, port 10250.
const agentHealthPort = 10248

func (c *Cluster) startAgent(ctx context.Context, hc *http.Client, step func(string, ...any)) error {
	if c.opts.Nodes == 0 {
		return nil
	}
	catalog := c.opts.Catalog
	if catalog == "" {
		catalog = filepath.Join(repoRoot(), "config", "local", "images.yaml")
	}
	t := time.Now()
	args := []string{
		"--kubeconfig=" + c.dir("node-agent.kubeconfig"), "--state-dir=" + c.dir("node"), "--catalog=" + catalog,
		"--node=" + strings.Join(c.State.Nodes, ","), "--net-prefix=" + c.opts.NetPrefix,
		"--cluster-dns=" + c.State.DNSIP, "--cluster-domain=" + c.opts.ClusterDomain,
		"--listen-address=" + c.State.HostIP, "--healthz-port=" + strconv.Itoa(agentHealthPort),
		// The API server's kubelet client certificate is issued by the
		// cluster CA: kubectl logs is authenticated and authorized.
		"--client-ca-file=" + c.pki.caFile(),
	}
	c.State.AgentCleanup = append([]string{c.opts.NodeAgent}, append(args, "--cleanup")...)
	agent := c.component("ziptrail-node", c.opts.NodeAgent, args, "http://"+hostPort(c.State.HostIP, agentHealthPort)+"/healthz")
	if err := c.launch(ctx, hc, agent, 60*time.Second); err != nil {
		return err
	}
	if err := c.waitNodesReady(ctx, agent, 60*time.Second); err != nil {
		return err
	}
	step("node agent running %d nodes (%s): Ready (%s)", len(c.State.Nodes), strings.Join(c.State.Nodes, " "), time.Since(t).Round(time.Millisecond))
	return nil
}

// waitNodesReady waits until every Node the agent registers is Ready.
func (c *Cluster) waitNodesReady(ctx context.Context, agent *Component, timeout time.Duration) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		notReady := c.nodesNotReady(ctx, cs)
		if len(notReady) == 0 {
			return nil
		}
		select {
		case <-agent.done:
			return fmt.Errorf("ziptrail-node exited (%v); end of %s:\n%s", agent.err, agent.Log, tail(agent.Log, 2048))
		case <-ctx.Done():
			return fmt.Errorf("nodes %v not Ready after %s; end of %s:\n%s", notReady, timeout, agent.Log, tail(agent.Log, 2048))
		case <-tick.C:
		}
	}
}

func (c *Cluster) nodesNotReady(ctx context.Context, cs kubernetes.Interface) []string {
	var out []string
	for _, n := range c.State.Nodes {
		name, _, _ := strings.Cut(n, "=")
		node, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil || !nodeReady(node) {
			out = append(out, name)
		}
	}
	return out
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Stop stops every component and removes what the cluster made on the host.
func (c *Cluster) Stop(ctx context.Context) error {
	c.State.Components = c.comps
	c.State.down(ctx)
	return nil
}

// Down stops the cluster recorded in stateDir (also when the process that
// started it is gone) and removes what it made on the host: processes, the
// node agent's pods, namespaces, bridges and mounts (ziptrail-node
// --cleanup), kube-proxy's iptables rules (kube-proxy --cleanup) and the
// host interface. It reports whether there was a cluster to stop.
func Down(ctx context.Context, stateDir string) (bool, error) {
	st, err := ReadState(stateDir)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	st.down(ctx)
	return true, nil
}

// down stops the components in reverse order and cleans up the host.
func (st *State) down(ctx context.Context) {
	for i := len(st.Components) - 1; i >= 0; i-- {
		comp := st.Components[i]
		grace := 10 * time.Second
		if comp.Name == "ziptrail-node" {
			grace = 30 * time.Second // it stops its pods
		}
		comp.stop(grace)
	}
	if len(st.AgentCleanup) > 0 {
		if err := run(ctx, st.AgentCleanup[0], st.AgentCleanup[1:]...); err != nil {
			fmt.Fprintf(os.Stderr, "localk8s: node agent cleanup: %v\n", err)
		}
	}
	if st.KubeProxy != "" {
		// Exit status 1 only says that some proxy mode had nothing to clean.
		_ = exec.CommandContext(ctx, st.KubeProxy, "--cleanup").Run()
	}
	svc, _ := netip.ParsePrefix(st.ServiceCIDR)
	cleanupHostNetwork(ctx, st.NetPrefix, svc)
	_ = os.Remove(StateFile(st.StateDir))
	if data, err := os.ReadFile(ownerFile); err == nil {
		if abs, _ := filepath.Abs(st.StateDir); strings.TrimSpace(string(data)) == abs {
			_ = os.Remove(ownerFile)
		}
	}
}

// OwnerAlive reports whether the process that started the cluster still
// runs (checked against its executable, so a reused pid does not count).
func (st *State) OwnerAlive() bool {
	owner := Component{PID: st.Owner, Binary: st.OwnerExe}
	return owner.alive()
}

// Health is one component's state for `ziptrail local status`.
type Health struct {
	Name    string
	PID     int
	Running bool
	Err     error // nil when healthy
	Log     string
}

// Status checks every component of the cluster recorded in stateDir, and
// each Node's Ready condition.
func Status(ctx context.Context, stateDir string) ([]Health, error) {
	st, err := ReadState(stateDir)
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(filepath.Join(k8sDir(stateDir), "pki", "ca.crt"))
	if err != nil {
		return nil, err
	}
	hc := healthClient(ca)
	var out []Health
	for _, comp := range st.Components {
		h := Health{Name: comp.Name, PID: comp.PID, Running: comp.alive(), Log: comp.Log}
		if !h.Running {
			h.Err = errors.New("not running")
		} else {
			h.Err = comp.check(ctx, hc)
		}
		out = append(out, h)
	}
	if len(st.Nodes) > 0 && st.Kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", st.Kubeconfig)
		if err != nil {
			return out, err
		}
		cfg.Timeout = 3 * time.Second
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return out, err
		}
		for _, n := range st.Nodes {
			name, _, _ := strings.Cut(n, "=")
			h := Health{Name: "node " + name, Running: true}
			node, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			switch {
			case err != nil:
				h.Err = err
			case !nodeReady(node):
				h.Err = fmt.Errorf("not Ready: %s", readyMessage(node))
			}
			out = append(out, h)
		}
	}
	return out, nil
}

func readyMessage(n *corev1.Node) string {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Reason + " " + c.Message
		}
	}
	return "no Ready condition"
}
