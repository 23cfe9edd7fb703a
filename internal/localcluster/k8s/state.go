package k8s

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// The cluster's state on disk: which process owns the host, how to stop a
// cluster another process started, and its health.

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
