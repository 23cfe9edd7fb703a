package localcluster

import (
	"fmt"
	"os"
	"strconv"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/invocation/call"
	"github.com/ziptrail/ziptrail/internal/invocation/podpick"
	"github.com/ziptrail/ziptrail/internal/operator/dispatch/direct"
)

// EnvDirectDispatch, set to true or false, overrides Options.RouteOnly
// (true: invocations go straight to ready pods).
const EnvDirectDispatch = "ZIPTRAIL_DIRECT_DISPATCH"

func directFromEnv(opts *Options) error {
	v := os.Getenv(EnvDirectDispatch)
	if v == "" {
		return nil
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		return fmt.Errorf("localcluster: %s=%q: want true or false", EnvDirectDispatch, v)
	}
	opts.RouteOnly = !on
	return nil
}

// DirectDispatch reports whether the operator sends invocations straight
// to ready pods (Options.RouteOnly, or the last SetDirectDispatch).
func (c *Cluster) DirectDispatch() bool { return !c.routeOnly.Load() }

// SetDirectDispatch switches direct routing on the running operator at
// once (no restart): the next invocation sent follows it. Benchmarks
// compare both routes in one run with it.
func (c *Cluster) SetDirectDispatch(on bool) { c.routeOnly.Store(!on) }

// switchedRouter is the operator's Router behind the cluster's switch.
type switchedRouter struct {
	c *Cluster
	r *direct.Router
}

// Ready passes direct.Router.Ready on (none when switched off): the
// delegated triggers' pods, sent to the producers' sidecars.
func (s switchedRouter) Ready(namespace, service string) []podpick.Pod {
	if s.c.routeOnly.Load() {
		return nil
	}
	return s.r.Ready(namespace, service)
}

func (s switchedRouter) Pick(env *invocation.Envelope, node string) (string, func(call.Verdict)) {
	if s.c.routeOnly.Load() {
		return "", nil
	}
	return s.r.Pick(env, node)
}
