package k8s

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// The cluster's processes, one start function each, in the order Start runs
// them: etcd, the API server, the controllers, kube-proxy and DNS, the node
// agent.

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
