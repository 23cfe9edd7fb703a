// Package k8s runs a complete Kubernetes cluster on this machine, as
// processes: etcd, kube-apiserver (with a service-account issuer, RBAC, the
// ServiceAccount admission plugin, aggregator routing and a kubelet client
// certificate), kube-controller-manager, kube-scheduler, kube-proxy in
// iptables mode, CoreDNS serving cluster.local, and the ziptrail node agent
// (cmd/ziptrail-node), a virtual-kubelet node that runs pods as Linux
// namespaces. Every component logs into the state directory; the state file
// records their pids so that Down works after the starting process is gone.
//
// One cluster per host: kube-proxy owns the host's KUBE-* iptables chains.
package k8s

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ziptrail/ziptrail/internal/tools/envtest"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
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

// ownerFile names the state directory of the cluster that runs on this host.
const ownerFile = "/run/ziptrail-localk8s"

func (o *Options) defaults() error {
	if o.StateDir == "" {
		return errors.New("localk8s: StateDir is required")
	}
	if o.Assets == "" {
		o.Assets = envtest.Assets()
	}
	if o.Assets == "" {
		return errors.New("KUBEBUILDER_ASSETS is not set and hack/install-deps.sh's cache holds no Kubernetes binaries: run hack/install-deps.sh")
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"} {
		if _, err := os.Stat(filepath.Join(o.Assets, b)); err != nil {
			return fmt.Errorf("%s not found in %s: run hack/install-deps.sh", b, o.Assets)
		}
	}
	if o.CoreDNS == "" {
		o.CoreDNS = paths.FindBinary("coredns")
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

func (c *Cluster) dir(parts ...string) string {
	return filepath.Join(append([]string{k8sDir(c.opts.StateDir)}, parts...)...)
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

// Clientset returns an admin clientset.
func (c *Cluster) Clientset() (*kubernetes.Clientset, error) {
	return kubernetes.NewForConfig(c.Config)
}

// agentHealthPort is the port of the node agent's /healthz on the host
// address (200 once every node is Ready). Each node's kubelet API listens on
// its InternalIP, the gateway of its bridge, port 10250.
const agentHealthPort = 10248

// Stop stops every component and removes what the cluster made on the host.
func (c *Cluster) Stop(ctx context.Context) error {
	c.State.Components = c.comps
	c.State.down(ctx)
	return nil
}
