package k8s

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
)

// The host side of the cluster network. The API server, CoreDNS and the node
// agent's kubelet endpoints listen on one address of this host, HostIP, held
// by a portless bridge interface (<prefix>host), so that they have an address that is
// the same for the host and for every pod (pods reach it through their
// bridge's gateway) and that does not depend on the machine's own interfaces.
// The service range is routed to the same interface: a host without a default
// route can still connect to ClusterIPs, which kube-proxy's iptables rules
// then rewrite to an endpoint.

func hostIface(prefix string) string { return prefix + "host" }

// setupHostNetwork creates the host interface with hostIP, routes the
// service range to it and turns on what kube-proxy's iptables mode needs on
// a host whose pods sit on Linux bridges: IP forwarding (between node
// bridges) and bridge-nf-call-iptables (so that traffic between two pods on
// the same bridge passes the service NAT rules, including hairpin traffic).
func setupHostNetwork(ctx context.Context, prefix string, hostIP netip.Addr, serviceCIDR netip.Prefix) error {
	if os.Geteuid() != 0 {
		return errNotRoot
	}
	ifc := hostIface(prefix)
	cleanupHostNetwork(ctx, prefix, serviceCIDR)
	steps := [][]string{
		{"ip", "link", "add", ifc, "type", "bridge"}, // a bridge without ports: dummy is not in every kernel
		{"ip", "addr", "add", netip.PrefixFrom(hostIP, 32).String(), "dev", ifc},
		{"ip", "link", "set", ifc, "up"},
		{"ip", "route", "replace", serviceCIDR.String(), "dev", ifc, "src", hostIP.String()},
	}
	for _, s := range steps {
		if err := run(ctx, s[0], s[1:]...); err != nil {
			return fmt.Errorf("host network: %w", err)
		}
	}
	if _, err := os.Stat("/proc/sys/net/bridge"); err != nil {
		if err := run(ctx, "modprobe", "br_netfilter"); err != nil {
			return fmt.Errorf("kube-proxy needs the br_netfilter kernel module (bridged pod traffic through iptables): %w", err)
		}
	}
	for _, s := range []string{"net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables"} {
		if err := os.WriteFile("/proc/sys/"+s, []byte("1"), 0o644); err != nil {
			return fmt.Errorf("set %s=1: %w", strings.ReplaceAll(s, "/", "."), err)
		}
	}
	return nil
}

// cleanupHostNetwork removes what setupHostNetwork made. The sysctls stay
// on: other bridges on this host may depend on them by now.
func cleanupHostNetwork(ctx context.Context, prefix string, serviceCIDR netip.Prefix) {
	ifc := hostIface(prefix)
	if serviceCIDR.IsValid() {
		_ = exec.CommandContext(ctx, "ip", "route", "del", serviceCIDR.String(), "dev", ifc).Run()
	}
	_ = exec.CommandContext(ctx, "ip", "link", "del", ifc).Run()
}

// nodeCIDRs splits the cluster range into one /24 per node, leaving the last
// /24 of the range to the host (HostIP is its first address).
func nodeCIDRs(cluster netip.Prefix, n int) ([]netip.Prefix, netip.Addr, error) {
	cluster = cluster.Masked()
	if !cluster.Addr().Is4() || cluster.Bits() > 22 {
		return nil, netip.Addr{}, fmt.Errorf("cluster CIDR %s must be IPv4 and /22 or larger", cluster)
	}
	slots := 1 << (24 - cluster.Bits())
	if n > slots-1 {
		return nil, netip.Addr{}, fmt.Errorf("cluster CIDR %s has room for %d nodes, not %d", cluster, slots-1, n)
	}
	base := cluster.Addr().As4()
	at := func(i int) netip.Prefix {
		b := base
		v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
		v += uint32(i) << 8
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), 24)
	}
	out := make([]netip.Prefix, n)
	for i := range out {
		out[i] = at(i)
	}
	return out, at(slots - 1).Addr().Next(), nil
}
