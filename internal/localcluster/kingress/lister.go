package kingress

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"

	"k8s.io/apimachinery/pkg/util/sets"
	"knative.dev/networking/pkg/apis/networking/v1alpha1"
	"knative.dev/networking/pkg/status"
)

// selfTargetLister implements status.ProbeTargetLister for a gateway that
// runs in this process: every rule is probed through the listener(s) that
// serve it, so an Ingress is Ready only when this process answers with its
// current spec. ExternalIP rules are probed on both listeners.
type selfTargetLister struct {
	external, local *net.TCPAddr
}

var _ status.ProbeTargetLister = (*selfTargetLister)(nil)

// probeAddr turns a listening address into one to dial: an unspecified IP
// (0.0.0.0, ::) is reached on loopback.
func probeAddr(a net.Addr) (*net.TCPAddr, error) {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return nil, fmt.Errorf("listener address %v is not TCP", a)
	}
	out := *ta
	if out.IP == nil || out.IP.IsUnspecified() {
		out.IP = net.IPv4(127, 0, 0, 1)
	}
	return &out, nil
}

func (l *selfTargetLister) ListProbeTargets(_ context.Context, ing *v1alpha1.Ingress) ([]status.ProbeTarget, error) {
	var targets []status.ProbeTarget
	add := func(a *net.TCPAddr, hosts []string) {
		t := status.ProbeTarget{
			PodIPs:  sets.New(a.IP.String()),
			PodPort: strconv.Itoa(a.Port),
			Port:    strconv.Itoa(a.Port),
		}
		for _, h := range hosts {
			t.URLs = append(t.URLs, &url.URL{Scheme: "http", Host: h, Path: "/"})
		}
		targets = append(targets, t)
	}
	for _, rule := range ing.Spec.Rules {
		hosts := rule.Hosts
		if len(hosts) == 0 {
			hosts = []string{"probe.invalid"}
		}
		add(l.local, hosts)
		if rule.Visibility != v1alpha1.IngressVisibilityClusterLocal {
			add(l.external, hosts)
		}
	}
	return targets, nil
}
