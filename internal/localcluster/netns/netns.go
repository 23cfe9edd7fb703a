// Package netns gives each local "pod" its own Linux network namespace,
// connected by a veth pair to a host bridge, so every pod has its own IP and
// its own port space (Knative's queue-proxy binds fixed ports). It drives
// iproute2's `ip`, which needs root or CAP_NET_ADMIN.
package netns

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
)

// Network is a bridge on the host plus the pods attached to it. Names carry
// Prefix, so leftovers of a crashed run can be found and removed.
type Network struct {
	Prefix string       // name prefix of the bridge, namespaces and veths, e.g. "zt"
	Subnet netip.Prefix // e.g. 10.213.0.0/16; the bridge takes the first address

	mu   sync.Mutex
	next netip.Addr
	free []netip.Addr
}

// Pod is one network namespace with an address on the bridge.
type Pod struct {
	Name string // namespace name, usable with `ip netns exec`
	IP   netip.Addr
	veth string
}

// New returns a network; call Setup before adding pods.
func New(prefix string, subnet netip.Prefix) (*Network, error) {
	if len(prefix) == 0 || len(prefix) > 6 {
		return nil, fmt.Errorf("netns: prefix %q must be 1-6 characters (interface names are limited to 15)", prefix)
	}
	if !subnet.Addr().Is4() || subnet.Bits() > 24 {
		return nil, fmt.Errorf("netns: subnet %s must be IPv4 and /24 or larger", subnet)
	}
	subnet = subnet.Masked()
	return &Network{Prefix: prefix, Subnet: subnet, next: subnet.Addr().Next().Next()}, nil
}

// Bridge is the host bridge's name.
func (n *Network) Bridge() string { return n.Prefix + "br0" }

// Gateway is the bridge's address, reachable from every pod.
func (n *Network) Gateway() netip.Addr { return n.Subnet.Addr().Next() }

// Setup removes leftovers of an earlier run with the same prefix and creates
// the bridge.
func (n *Network) Setup(ctx context.Context) error {
	if err := n.Cleanup(ctx); err != nil {
		return err
	}
	gw := netip.PrefixFrom(n.Gateway(), n.Subnet.Bits())
	return run(ctx,
		[]string{"link", "add", n.Bridge(), "type", "bridge"},
		[]string{"addr", "add", gw.String(), "dev", n.Bridge()},
		[]string{"link", "set", n.Bridge(), "up"},
	)
}

// Cleanup deletes every namespace and the bridge carrying the prefix.
func (n *Network) Cleanup(ctx context.Context) error {
	out, err := output(ctx, "netns", "list")
	if err != nil {
		return err
	}
	var errs []error
	for _, line := range strings.Split(out, "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if strings.HasPrefix(name, n.Prefix+"-") {
			errs = append(errs, run(ctx, []string{"netns", "del", name}))
		}
	}
	if _, err := output(ctx, "link", "show", n.Bridge()); err == nil {
		errs = append(errs, run(ctx, []string{"link", "del", n.Bridge()}))
	}
	return errors.Join(errs...)
}

// AddPod creates a namespace named <prefix>-<id> with loopback up and an
// address on the bridge, default route through the gateway.
func (n *Network) AddPod(ctx context.Context, id string) (*Pod, error) {
	ip, err := n.allocate()
	if err != nil {
		return nil, err
	}
	p := &Pod{Name: n.Prefix + "-" + id, IP: ip, veth: fmt.Sprintf("%sv%d", n.Prefix, hostIndex(n.Subnet, ip))}
	peer := p.veth + "p"
	cidr := netip.PrefixFrom(ip, n.Subnet.Bits()).String()
	err = run(ctx,
		[]string{"netns", "add", p.Name},
		[]string{"-n", p.Name, "link", "set", "lo", "up"},
		[]string{"link", "add", p.veth, "type", "veth", "peer", "name", peer},
		[]string{"link", "set", peer, "netns", p.Name},
		[]string{"link", "set", p.veth, "master", n.Bridge()},
		[]string{"link", "set", p.veth, "up"},
		[]string{"-n", p.Name, "link", "set", peer, "name", "eth0"},
		[]string{"-n", p.Name, "addr", "add", cidr, "dev", "eth0"},
		[]string{"-n", p.Name, "link", "set", "eth0", "up"},
		[]string{"-n", p.Name, "route", "add", "default", "via", n.Gateway().String()},
	)
	if err != nil {
		_ = n.DeletePod(context.WithoutCancel(ctx), p)
		return nil, fmt.Errorf("netns: create pod %s: %w", p.Name, err)
	}
	return p, nil
}

// DeletePod removes the namespace (which removes its veth end too) and
// releases the address.
func (n *Network) DeletePod(ctx context.Context, p *Pod) error {
	err := run(ctx, []string{"netns", "del", p.Name})
	_ = run(ctx, []string{"link", "del", p.veth}) // gone with the namespace unless creation failed half-way
	n.mu.Lock()
	n.free = append(n.free, p.IP)
	n.mu.Unlock()
	return err
}

// HostVeth is the name of the pod's veth end on the host (attached to the bridge).
func (p *Pod) HostVeth() string { return p.veth }

// Command returns cmd prepared to run inside the pod's namespace.
func (p *Pod) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", p.Name, name}, args...)...)
}

func (n *Network) allocate() (netip.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	// Fresh addresses first, then the longest-free one, as Kubernetes'
	// host-local IPAM does: a replacement pod must not take the address of
	// the pod it replaces while references to that pod are still around.
	ip := n.next
	if n.Subnet.Contains(ip.Next()) { // keep the broadcast address free
		n.next = ip.Next()
		return ip, nil
	}
	if len(n.free) == 0 {
		return netip.Addr{}, fmt.Errorf("netns: subnet %s is exhausted", n.Subnet)
	}
	ip = n.free[0]
	n.free = n.free[1:]
	return ip, nil
}

// hostIndex numbers an address within its subnet, for short unique names.
func hostIndex(subnet netip.Prefix, ip netip.Addr) uint32 {
	a, b := subnet.Addr().As4(), ip.As4()
	var x, y uint32
	for i := 0; i < 4; i++ {
		x, y = x<<8|uint32(a[i]), y<<8|uint32(b[i])
	}
	return y - x
}

func run(ctx context.Context, cmds ...[]string) error {
	for _, args := range cmds {
		if _, err := output(ctx, args...); err != nil {
			return err
		}
	}
	return nil
}

func output(ctx context.Context, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
