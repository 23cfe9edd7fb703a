package nodeagent

import (
	"context"
	"errors"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/cgroups"
	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/limits"
)

// Resource limits: each node has a cgroup below the agent's own, each pod
// one below its node's with the pod's limits, each container one below its
// pod's with its own (package limits computes them as the kubelet does,
// package cgroups writes them). A container's init joins its cgroup before
// it execs the command (package sandbox). Without usable cgroups pods run
// without limits; they are never failed for it.
//
//	<agent's own cgroup>/ziptrail-nodeagent-<node>/pod<uid>/<container>

// cgroupRemoveTimeout bounds waiting for killed processes to leave a cgroup.
const cgroupRemoveTimeout = 10 * time.Second

// detectCgroups finds the host's cgroup hierarchy once; it logs whether
// pods get their limits.
func (a *Agent) detectCgroups() {
	a.cgroups, a.cgroupsErr = cgroups.Detect()
	if a.cgroupsErr != nil {
		a.cfg.Log.Warn("cgroups are not usable: pods run without resource limits", "err", a.cgroupsErr)
		return
	}
	a.cfg.Log.Info("pods get their resource limits in cgroups", "version", a.cgroups.Version(),
		"controllers", strings.Join(a.cgroups.Controllers(), ","), "below", strings.Join(a.cgroups.Own().Dirs(), ","))
}

// nodeCgroup creates the node's cgroup below the agent's own, where its
// pods get theirs. Without one (no usable cgroups, or it cannot be made)
// the node's pods run without resource limits, as a Warning event on the
// Node says.
func (a *Agent) nodeCgroup(node string, recorder record.EventRecorder) *cgroups.Group {
	why := a.cgroupsErr
	if a.cgroups != nil {
		g, err := a.cgroups.Own().Child(cgroups.NodeGroup(node), cgroups.Limits{})
		if err == nil {
			return g
		}
		why = err
		a.cfg.Log.Warn("cannot create the node's cgroup: its pods run without resource limits", "node", node, "err", err)
	}
	recorder.Eventf(nodeRef(node), corev1.EventTypeWarning, "CgroupsUnavailable",
		"Resource limits are not enforced on this node (pods run without cgroups): %v", why)
	return nil
}

// removeCgroups removes the nodes' cgroups and whatever still runs in them.
func (a *Agent) removeCgroups() error {
	var errs []error
	for _, p := range a.providers {
		if p.cfg.Cgroup != nil {
			errs = append(errs, removeCgroup(p.cfg.Cgroup))
		}
	}
	return errors.Join(errs...)
}

// cleanupCgroups removes the cgroups a crashed run of the configuration's
// nodes left, killing what still runs in them.
func cleanupCgroups(cfg Config) error {
	h, err := cgroups.Detect()
	if err != nil {
		return nil // nothing can have been left
	}
	var errs []error
	for _, n := range cfg.Nodes {
		errs = append(errs, removeCgroup(h.Own().Sub(cgroups.NodeGroup(n.Name))))
	}
	return errors.Join(errs...)
}

// removeCgroup kills what runs in a cgroup and removes it (and below).
func removeCgroup(g *cgroups.Group) error {
	ctx, cancel := context.WithTimeout(context.Background(), cgroupRemoveTimeout)
	defer cancel()
	return g.Remove(ctx)
}

// nodeRef is the object reference of a node's events, as the kubelet
// makes it.
func nodeRef(node string) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node)}
}

// createCgroup gives the pod its cgroup, with the pod's limits. When it
// cannot be made the pod runs without limits and a Warning event says so.
func (pr *podRuntime) createCgroup() {
	node := pr.p.cfg.Cgroup
	if node == nil {
		return
	}
	pr.mu.Lock()
	l := limits.Pod(pr.pod)
	pr.mu.Unlock()
	g, err := node.Child(cgroups.PodGroup(string(pr.uid)), l)
	if err != nil {
		pr.event(corev1.EventTypeWarning, "FailedResourceLimits", "The pod runs without resource limits: %v", err)
		if err := removeCgroup(node.Sub(cgroups.PodGroup(string(pr.uid)))); err != nil {
			pr.p.cfg.Log.Warn("remove the pod's cgroup", "pod", pr.key, "err", err)
		}
		return
	}
	pr.mu.Lock()
	pr.cgroup = g
	pr.mu.Unlock()
}

// removeCgroup kills whatever is left in the pod's cgroup (processes that
// left their container's process group) and removes it.
func (pr *podRuntime) removeCgroup() {
	pr.mu.Lock()
	g := pr.cgroup
	pr.mu.Unlock()
	if g == nil {
		return
	}
	if err := removeCgroup(g); err != nil {
		pr.p.cfg.Log.Warn("remove the pod's cgroup", "pod", pr.key, "err", err)
	}
}

// cgroup creates (or applies again, on a restart) the container's cgroup
// with its limits for a run, and reads the cgroup's OOM-kill count, which
// tells after the run whether the kernel killed it. Without a pod cgroup,
// or when this one cannot be made, the run has none: the container then
// runs without limits, and a Warning event says why.
func (c *ctrRuntime) cgroup(run *ctrRun) {
	c.pr.mu.Lock()
	pod := c.pr.cgroup
	c.pr.mu.Unlock()
	if pod == nil {
		return
	}
	g, err := pod.Child(c.spec.Name, limits.Container(&c.spec))
	if err != nil {
		c.event(corev1.EventTypeWarning, "FailedResourceLimits", "Container %s runs without resource limits: %v", c.spec.Name, err)
		return
	}
	run.cgroup = g
	if n, err := g.OOMKills(); err == nil {
		run.oomBase, run.oomCounted = n, true
	} else if !errors.Is(err, cgroups.ErrNoOOMCount) {
		c.pr.p.cfg.Log.Warn("read the container's OOM kills", "pod", c.pr.key, "container", c.spec.Name, "err", err)
	}
}

// oomKilled reports whether the memory cgroup's OOM killer killed a
// process of the run's container since it started. The kernel counts a
// kill before it sends the SIGKILL, so once the process has been reaped
// the count is final.
func (r *ctrRun) oomKilled() bool {
	if r.cgroup == nil || !r.oomCounted {
		return false
	}
	n, err := r.cgroup.OOMKills()
	return err == nil && n > r.oomBase
}

// reportOOM records an OOM kill as the node's kernel monitor does
// (reason OOMKilling), on the pod and on the node.
func (c *ctrRuntime) reportOOM() {
	limit := "none"
	c.pr.mu.Lock()
	if m, ok := c.spec.Resources.Limits[corev1.ResourceMemory]; ok {
		limit = m.String()
	} else if m, ok := limits.PodMemory(c.pr.pod); ok {
		limit = resource.NewQuantity(m, resource.BinarySI).String() + " (the pod's)"
	}
	pod := c.pr.pod.Namespace + "/" + c.pr.pod.Name
	c.pr.mu.Unlock()
	c.event(corev1.EventTypeWarning, "OOMKilling", "Memory cgroup out of memory: container %s was killed (memory limit %s)", c.spec.Name, limit)
	c.pr.p.cfg.Recorder.Eventf(nodeRef(c.pr.p.cfg.NodeName), corev1.EventTypeWarning, "OOMKilling",
		"Memory cgroup out of memory: killed container %s of pod %s", c.spec.Name, pod)
}
