// Package localserving plays Knative Serving's part on one machine without a
// container runtime: for every Knative Service in the API server it runs
// "pods" — a network namespace each, holding a real queue-proxy process and
// the user container's process, found in the node agent's image catalog
// (internal/nodeagent/catalog) — reports readiness into the Service status,
// and routes requests for the Service's host to its ready pods. It exists for
// development and tests; production uses real Knative.
package localserving

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"

	"github.com/ziptrail/ziptrail/internal/netns"
	"github.com/ziptrail/ziptrail/internal/nodeagent/catalog"
)

// AnnotationInstances on a Knative Service's revision template asks the
// local runtime for at least this many pods.
const AnnotationInstances = "ziptrail.dev/local-instances"

// Options configure a Runtime.
type Options struct {
	Network          *netns.Network
	QueueProxy       string           // path of the queue-proxy binary run in every pod
	SidecarEnv       []string         // extra environment for queue-proxy (tier endpoints, operator address)
	Domain           string           // Services are served at <name>.<namespace>.<Domain>
	IngressPort      int              // port of the router, shown in Service URLs
	Instances        int              // pods per Service unless its template asks for more
	StateDir         string           // logs and state
	ShmRoot          string           // per-pod shared-memory directories, e.g. /dev/shm/ziptrail-local
	Catalog          *catalog.Catalog // how each container image runs: the node agent's image catalog (config/local/images.yaml)
	ReadyTimeout     time.Duration    // how long a pod may take to become ready
	TerminationGrace time.Duration    // SIGTERM to SIGKILL
}

// Runtime runs the pods of every Service and knows which are ready.
type Runtime struct {
	opts  Options
	seq   atomic.Uint64
	mu    sync.Mutex
	svcs  map[types.NamespacedName]*service
	onPod func(types.NamespacedName) // re-reconcile after a pod dies
	// stopping tracks pods terminating in the background (each may take
	// up to TerminationGrace while queue-proxy drains), so Shutdown can
	// wait for them before removing the network.
	stopping sync.WaitGroup
}

// service is the set of pods of one Knative Service at one generation.
type service struct {
	generation int64
	spec       podSpec
	pods       []*pod
	next       atomic.Uint64 // round-robin cursor
}

// New validates the options and returns a runtime with no pods.
func New(opts Options) (*Runtime, error) {
	if opts.Network == nil || opts.QueueProxy == "" || opts.StateDir == "" || opts.ShmRoot == "" || opts.Catalog == nil {
		return nil, errors.New("localserving: Network, QueueProxy, StateDir, ShmRoot and Catalog are required")
	}
	if opts.Domain == "" {
		opts.Domain = "ziptrail.local"
	}
	if opts.Instances <= 0 {
		opts.Instances = 1
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 60 * time.Second
	}
	if opts.TerminationGrace <= 0 {
		opts.TerminationGrace = 10 * time.Second
	}
	return &Runtime{opts: opts, svcs: map[types.NamespacedName]*service{}}, nil
}

// Host is the host name a Service is routed by.
func (r *Runtime) Host(ns, name string) string { return name + "." + ns + "." + r.opts.Domain }

// URL is what the Service status advertises.
func (r *Runtime) URL(ns, name string) string {
	u := "http://" + r.Host(ns, name)
	if r.opts.IngressPort != 0 && r.opts.IngressPort != 80 {
		u += ":" + strconv.Itoa(r.opts.IngressPort)
	}
	return u
}

// podSpecFor resolves how to run a Service's revision locally, as a node
// agent runs a pod: the user container's image is looked up in the image
// catalog, whose entrypoint, default args, working directory and env the
// container's command, args, workingDir and env override as a container
// runtime's would. Only the first container (Knative's user container) runs.
func (r *Runtime) podSpecFor(ctx context.Context, svc *servingv1.Service) (podSpec, int, error) {
	tmpl := svc.Spec.Template
	if len(tmpl.Spec.Containers) == 0 {
		return podSpec{}, 0, errors.New("the revision template has no container")
	}
	c := tmpl.Spec.Containers[0]
	if c.Image == "" {
		return podSpec{}, 0, errors.New("the revision template's container has no image")
	}
	cat := r.opts.Catalog
	img, err := cat.Lookup(c.Image)
	if err != nil {
		return podSpec{}, 0, fmt.Errorf("ErrImagePull: failed to pull image %q: %w", c.Image, err)
	}
	if len(c.EnvFrom) > 0 {
		return podSpec{}, 0, errors.New("envFrom is not supported by the local cluster's serving runtime: give the variables in env")
	}
	spec := podSpec{
		namespace: svc.Namespace,
		service:   svc.Name,
		revision:  revisionName(svc),
	}
	// The image's env lies underneath the container's (Go's exec keeps the
	// last of duplicate variables).
	for _, e := range img.Env {
		spec.env = append(spec.env, e.Name+"="+e.Value)
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			return podSpec{}, 0, fmt.Errorf("env %s uses valueFrom, which the local cluster's serving runtime cannot resolve: give it a value", e.Name)
		}
		spec.env = append(spec.env, e.Name+"="+e.Value)
	}
	proc, err := cat.Resolve(ctx, img, c.Command, c.Args, c.WorkingDir)
	if err != nil {
		return podSpec{}, 0, fmt.Errorf("ErrImagePull: failed to pull image %q: %w", c.Image, err)
	}
	if len(proc.Argv) == 0 {
		return podSpec{}, 0, fmt.Errorf("image %q has nothing to run: no command in the container and no entrypoint in %s", c.Image, cat.Path)
	}
	spec.command, spec.workingDir = proc.Argv, proc.WorkingDir
	if tmpl.Spec.ContainerConcurrency != nil {
		spec.containerConcurrency = *tmpl.Spec.ContainerConcurrency
	}
	instances := 0
	for _, key := range []string{AnnotationInstances, "autoscaling.knative.dev/min-scale"} {
		if v, err := strconv.Atoi(tmpl.Annotations[key]); err == nil && v > instances {
			instances = v
		}
	}
	return spec, instances, nil
}

// ensure makes the Service's pods match its generation: new pods are started
// and become ready before the previous generation's pods are stopped; dead
// pods are replaced. It returns the number of ready pods.
func (r *Runtime) ensure(ctx context.Context, svc *servingv1.Service) (int, error) {
	key := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	spec, instances, err := r.podSpecFor(ctx, svc)
	if err != nil {
		return 0, err
	}
	if instances < r.opts.Instances {
		instances = r.opts.Instances
	}

	r.mu.Lock()
	cur := r.svcs[key]
	r.mu.Unlock()
	var old []*pod
	if cur == nil || cur.generation != svc.Generation {
		if cur != nil {
			old = cur.pods
		}
		cur = &service{generation: svc.Generation, spec: spec}
	}

	// Replace dead pods, add missing ones.
	r.mu.Lock()
	pods := cur.pods
	r.mu.Unlock()
	var live []*pod
	for _, p := range pods {
		if isClosed(p.exited) {
			r.stopAsync(p)
			continue
		}
		live = append(live, p)
	}
	var errs []error
	for len(live) < instances {
		id := fmt.Sprintf("%s-%d", shortName(svc.Name), r.seq.Add(1))
		p, err := r.startPod(ctx, id, spec, func() {
			if r.onPod != nil {
				r.onPod(key)
			}
		})
		if err != nil {
			errs = append(errs, err)
			break
		}
		if err := p.waitReady(ctx, r.opts.ReadyTimeout); err != nil {
			p.Stop(r)
			errs = append(errs, err)
			break
		}
		live = append(live, p)
	}
	for len(live) > instances {
		r.stopAsync(live[len(live)-1])
		live = live[:len(live)-1]
	}
	r.mu.Lock()
	cur.pods = live
	r.svcs[key] = cur
	r.mu.Unlock()
	if len(live) > 0 {
		for _, p := range old {
			r.stopAsync(p)
		}
	}
	ready := 0
	for _, p := range live {
		if p.isReady() {
			ready++
		}
	}
	return ready, errors.Join(errs...)
}

// remove stops every pod of a deleted Service. The pods leave the routing
// table at once and terminate in the background, as a kubelet does: a
// reconcile worker must not wait out every pod's drain, or deleting a
// large Workflow would hold up the start of every other Service.
func (r *Runtime) remove(key types.NamespacedName) {
	r.mu.Lock()
	cur := r.svcs[key]
	delete(r.svcs, key)
	r.mu.Unlock()
	if cur == nil {
		return
	}
	for _, p := range cur.pods {
		r.stopAsync(p)
	}
}

// stopAsync terminates a pod in the background; Shutdown waits for it.
func (r *Runtime) stopAsync(p *pod) {
	r.stopping.Add(1)
	go func() {
		defer r.stopping.Done()
		p.Stop(r)
	}()
}

// Shutdown stops every pod, waits for all terminations (also those begun
// earlier) and removes the network.
func (r *Runtime) Shutdown(ctx context.Context) error {
	r.mu.Lock()
	keys := make([]types.NamespacedName, 0, len(r.svcs))
	for k := range r.svcs {
		keys = append(keys, k)
	}
	r.mu.Unlock()
	for _, k := range keys {
		r.remove(k)
	}
	r.stopping.Wait()
	return r.opts.Network.Cleanup(ctx)
}

// pick returns a ready pod's address for the Service, round robin.
func (r *Runtime) pick(ns, name string) (string, bool) {
	r.mu.Lock()
	cur := r.svcs[types.NamespacedName{Namespace: ns, Name: name}]
	var pods []*pod
	if cur != nil {
		pods = cur.pods
	}
	r.mu.Unlock()
	if len(pods) == 0 {
		return "", false
	}
	n := uint64(len(pods))
	start := cur.next.Add(1)
	for i := uint64(0); i < n; i++ {
		p := pods[(start+i)%n]
		if p.isReady() {
			return p.IP(), true
		}
	}
	return "", false
}

// Pods lists the pod IPs of a Service, for tests and the CLI.
func (r *Runtime) Pods(ns, name string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ips []string
	if cur := r.svcs[types.NamespacedName{Namespace: ns, Name: name}]; cur != nil {
		for _, p := range cur.pods {
			ips = append(ips, p.IP())
		}
	}
	return ips
}

// TerminatePod deletes the pod with the given IP as the kubelet does when
// Knative scales a revision down: it stops routing to it, sends SIGTERM to
// both containers (queue-proxy-zl backs up unread objects then) and SIGKILL
// after the grace period, and removes it; a replacement pod is started.
// It returns once the pod is gone. For fault-injection tests.
func (r *Runtime) TerminatePod(ip string) error {
	r.mu.Lock()
	var victim *pod
	var key types.NamespacedName
	for k, cur := range r.svcs {
		for i, p := range cur.pods {
			if p.IP() == ip {
				victim, key = p, k
				cur.pods = append(cur.pods[:i:i], cur.pods[i+1:]...)
				break
			}
		}
	}
	r.mu.Unlock()
	if victim == nil {
		return fmt.Errorf("no pod with IP %s", ip)
	}
	victim.Stop(r)
	if r.onPod != nil {
		r.onPod(key)
	}
	return nil
}

// KillUserProcess kills the function process of the pod with the given IP,
// as a crash would, for fault-injection tests.
func (r *Runtime) KillUserProcess(ip string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, cur := range r.svcs {
		for _, p := range cur.pods {
			if p.IP() == ip {
				return p.Kill()
			}
		}
	}
	return fmt.Errorf("no pod with IP %s", ip)
}

// shortName keeps pod ids short enough for namespace names.
func shortName(s string) string {
	if len(s) > 40 {
		return s[:40]
	}
	return s
}

// revisionName names the Service's current generation, as Knative names revisions.
func revisionName(svc *servingv1.Service) string {
	return fmt.Sprintf("%s-%05d", svc.Name, svc.Generation)
}
