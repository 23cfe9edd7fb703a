package nodeagent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/ziptrail/ziptrail/internal/localcluster/netns"
	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/catalog"
	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/cgroups"
	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/sandbox"
)

// providerConfig is what a node's provider shares with the agent.
type providerConfig struct {
	NodeName   string
	NodeIP     string
	Network    *netns.Network
	PodsDir    string
	DNS        sandbox.DNS
	Catalog    *catalog.Catalog
	Client     kubernetes.Interface
	Recorder   record.EventRecorder
	ConfigMaps corev1listers.ConfigMapLister
	Secrets    corev1listers.SecretLister
	Services   corev1listers.ServiceLister
	Log        *slog.Logger
	Backoff    Backoff
	// NodePaths: hostPaths that are this node's own (volumes.Sources).
	NodePaths map[string]string
	// Cgroup is the node's cgroup, where its pods get theirs (nil: pods
	// run without resource limits).
	Cgroup *cgroups.Group
}

// Backoff is the restart back-off of crashed containers (kubelet: 10 s
// doubling to 5 min, reset after 10 min of running).
type Backoff struct {
	Initial, Max, Reset time.Duration
}

// DefaultBackoff is the kubelet's.
var DefaultBackoff = Backoff{Initial: 10 * time.Second, Max: 5 * time.Minute, Reset: 10 * time.Minute}

// Provider is the virtual-kubelet provider of one node: it runs the pods
// bound to the node as sandboxes and pushes their status through the
// PodNotifier callback. Pods are keyed by namespace/name and by UID.
type Provider struct {
	cfg         providerConfig
	allocatable corev1.ResourceList
	startTime   time.Time

	mu      sync.Mutex
	closing bool                      // shutting down: no new pods
	pods    map[string]*podRuntime    // namespace/name -> current pod
	byUID   map[types.UID]*podRuntime // every pod with a sandbox, including terminating ones

	notifyMu sync.Mutex
	notifyCb func(*corev1.Pod)
	dirty    map[types.UID]*podRuntime
	wake     chan struct{}
	muted    bool // shutting down: statuses are no longer pushed
}

func newProvider(cfg providerConfig, allocatable corev1.ResourceList) *Provider {
	if cfg.Backoff == (Backoff{}) {
		cfg.Backoff = DefaultBackoff
	}
	return &Provider{cfg: cfg, allocatable: allocatable, startTime: time.Now(),
		pods: map[string]*podRuntime{}, byUID: map[types.UID]*podRuntime{},
		dirty: map[types.UID]*podRuntime{}, wake: make(chan struct{}, 1)}
}

func key(ns, name string) string { return ns + "/" + name }

// CreatePod starts the pod's sandbox and containers in the background; it
// returns at once (the status is pushed as it progresses).
func (p *Provider) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		// Not an error: the core would mark the pod failed. The next run
		// of the agent starts it.
		return nil
	}
	k := key(pod.Namespace, pod.Name)
	if cur, ok := p.pods[k]; ok {
		if cur.uid == pod.UID {
			return nil
		}
		// The name now belongs to a new pod: the old one is gone from the API.
		cur.terminate(2*time.Second, "replaced by a new pod with the same name")
	}
	pr := newPodRuntime(p, pod)
	p.pods[k] = pr
	p.byUID[pod.UID] = pr
	go pr.run()
	return nil
}

// UpdatePod applies metadata changes (labels and annotations feed the
// downward API volumes).
func (p *Provider) UpdatePod(ctx context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	pr, ok := p.pods[key(pod.Namespace, pod.Name)]
	p.mu.Unlock()
	if !ok || pr.uid != pod.UID {
		return p.CreatePod(ctx, pod)
	}
	pr.update(ctx, pod)
	return nil
}

// DeletePod starts the pod's graceful termination (preStop hooks, SIGTERM,
// the grace period, SIGKILL) and returns; the terminal status is pushed when
// it is done.
func (p *Provider) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	pr, ok := p.byUID[pod.UID]
	if !ok {
		pr, ok = p.pods[key(pod.Namespace, pod.Name)]
		if ok && pod.UID != "" && pr.uid != pod.UID {
			ok = false
		}
	}
	p.mu.Unlock()
	if !ok {
		return errdefs.NotFoundf("pod %s/%s is not running on node %s", pod.Namespace, pod.Name, p.cfg.NodeName)
	}
	grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		grace = *pod.Spec.TerminationGracePeriodSeconds
	}
	why := ""
	switch {
	case pod.DeletionGracePeriodSeconds != nil:
		grace = *pod.DeletionGracePeriodSeconds
	case pod.DeletionTimestamp == nil:
		// The pod vanished from the API (force-deleted): like the kubelet,
		// give it the minimum grace period.
		grace, why = 2, "the pod was removed from the API"
	}
	if pod.DeletionTimestamp != nil {
		pr.mu.Lock()
		pr.apiDeletion = true
		pr.mu.Unlock()
	}
	pr.terminate(time.Duration(grace)*time.Second, why)
	return nil
}

// removeFromAPI deletes a pod whose containers have all stopped after its
// deletion was requested, with no further grace (its UID must still
// match), as the kubelet's status manager does. Without it the pod would
// stay in the API, Succeeded or Failed, until its deletion deadline — up to
// a Knative revision's 300 s — and Deployments would count it meanwhile.
func (p *Provider) removeFromAPI(ns, name string, uid types.UID) {
	if p.cfg.Client == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	zero := int64(0)
	err := p.cfg.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		p.cfg.Log.Warn("remove terminated pod from the API", "pod", ns+"/"+name, "err", err)
	}
}

// forget drops a terminated pod.
func (p *Provider) forget(pr *podRuntime) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pods[pr.key] == pr {
		delete(p.pods, pr.key)
	}
	if p.byUID[pr.uid] == pr {
		delete(p.byUID, pr.uid)
	}
}

func (p *Provider) lookup(ns, name string) (*podRuntime, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr, ok := p.pods[key(ns, name)]
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s is not known to node %s", ns, name, p.cfg.NodeName)
	}
	return pr, nil
}

// GetPod returns a copy of the pod with its current status.
func (p *Provider) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	pr, err := p.lookup(namespace, name)
	if err != nil {
		return nil, err
	}
	return pr.snapshot(), nil
}

// GetPodStatus returns the pod's current status.
func (p *Provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods returns every pod the node runs.
func (p *Provider) GetPods(ctx context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	prs := make([]*podRuntime, 0, len(p.pods))
	for _, pr := range p.pods {
		prs = append(prs, pr)
	}
	p.mu.Unlock()
	pods := make([]*corev1.Pod, len(prs))
	for i, pr := range prs {
		pods[i] = pr.snapshot()
	}
	return pods, nil
}

// NotifyPods registers the status callback; statuses are pushed from one
// goroutine, always the latest state of a pod.
func (p *Provider) NotifyPods(ctx context.Context, cb func(*corev1.Pod)) {
	p.notifyMu.Lock()
	p.notifyCb = cb
	p.notifyMu.Unlock()
	go p.notifyLoop(ctx)
}

// changed marks a pod's status for pushing; it never blocks.
func (p *Provider) changed(pr *podRuntime) {
	p.notifyMu.Lock()
	p.dirty[pr.uid] = pr
	p.notifyMu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *Provider) notifyLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		p.notifyMu.Lock()
		dirty, cb, muted := p.dirty, p.notifyCb, p.muted
		p.dirty = map[types.UID]*podRuntime{}
		p.notifyMu.Unlock()
		if muted || cb == nil {
			continue
		}
		for _, pr := range dirty {
			cb(pr.snapshot())
		}
	}
}

// shutdown stops every pod (bounded by maxGrace) without pushing statuses:
// the pods stay bound to the node and are started again by the next run.
func (p *Provider) shutdown(maxGrace time.Duration) {
	p.notifyMu.Lock()
	p.muted = true
	p.notifyMu.Unlock()
	p.mu.Lock()
	p.closing = true
	prs := make([]*podRuntime, 0, len(p.byUID))
	for _, pr := range p.byUID {
		prs = append(prs, pr)
	}
	p.mu.Unlock()
	for _, pr := range prs {
		grace := pr.graceFromSpec()
		if grace > maxGrace {
			grace = maxGrace
		}
		pr.terminate(grace, "the node agent is shutting down")
	}
	for _, pr := range prs {
		<-pr.done
	}
}

// GetContainerLogs serves `kubectl logs` (with --tail, --limit-bytes,
// --previous and -f).
func (p *Provider) GetContainerLogs(ctx context.Context, namespace, podName, containerName string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	pr, err := p.lookup(namespace, podName)
	if err != nil {
		return nil, err
	}
	return pr.logs(ctx, containerName, opts)
}

// RunInContainer serves `kubectl exec` (without a TTY): the command runs in
// the container's namespaces, mounts and environment.
func (p *Provider) RunInContainer(ctx context.Context, namespace, podName, containerName string, cmd []string, attach api.AttachIO) error {
	pr, err := p.lookup(namespace, podName)
	if err != nil {
		return err
	}
	return pr.exec(ctx, containerName, cmd, attach)
}

// AttachToContainer is not supported: container output goes to log files.
func (p *Provider) AttachToContainer(ctx context.Context, namespace, podName, containerName string, attach api.AttachIO) error {
	return errdefs.InvalidInput("ziptrail-node does not support attach; use kubectl logs -f or kubectl exec")
}

// PortForward connects the stream to the pod's port.
func (p *Provider) PortForward(ctx context.Context, namespace, podName string, port int32, stream io.ReadWriteCloser) error {
	pr, err := p.lookup(namespace, podName)
	if err != nil {
		return err
	}
	ip := pr.podIP()
	if ip == "" {
		return errdefs.InvalidInputf("pod %s/%s has no IP yet", namespace, podName)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(ip, strconv.Itoa(int(port))))
	if err != nil {
		return err
	}
	defer conn.Close()
	defer stream.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(conn, stream); done <- struct{}{} }()
	go func() { _, _ = io.Copy(stream, conn); done <- struct{}{} }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return nil
}

// GetStatsSummary reports the node and its pods; the agent does not meter
// CPU or memory, so usage fields are absent.
func (p *Provider) GetStatsSummary(ctx context.Context) (*statsv1alpha1.Summary, error) {
	s := &statsv1alpha1.Summary{Node: statsv1alpha1.NodeStats{NodeName: p.cfg.NodeName, StartTime: metav1.NewTime(p.startTime)}}
	pods, _ := p.GetPods(ctx)
	for _, pod := range pods {
		ps := statsv1alpha1.PodStats{PodRef: statsv1alpha1.PodReference{Name: pod.Name, Namespace: pod.Namespace, UID: string(pod.UID)}}
		if pod.Status.StartTime != nil {
			ps.StartTime = *pod.Status.StartTime
		}
		s.Pods = append(s.Pods, ps)
	}
	return s, nil
}

// GetMetricsResource: the agent does not meter resource usage.
func (p *Provider) GetMetricsResource(ctx context.Context) ([]*dto.MetricFamily, error) {
	return nil, errdefs.InvalidInput(fmt.Sprintf("node %s (ziptrail-node) does not collect resource metrics", p.cfg.NodeName))
}
