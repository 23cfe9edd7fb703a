// Package knative installs Knative Serving on the local Kubernetes
// cluster (internal/localcluster/k8s): Knative's own controller, webhook,
// autoscaler and activator, from the manifests in the config/ directories
// of the knative.dev modules go.mod pins, run as pods by the node agent
// (the image catalog maps their images to the modules' commands), plus
// ziptrail-ingress as the networking layer (KIngress), run on the host.
//
// Why pods and not host processes: Knative's components listen on fixed
// ports (8080, 8443, 8012, 9090…) that would collide on one host, they find
// each other through Services and cluster DNS, the webhook is reached by
// the API server through its Service's endpoints, and the autoscaler
// scrapes pods by IP — in pods all of that is Knative's own code path, as
// on any cluster. The gateway is the exception: it runs on the host so that
// the host (tests, `curl`) reaches it at a fixed address, and advertises
// itself to the cluster through selectorless Services.
package knative

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/ziptrail/ziptrail/internal/localcluster/k8s"
	"github.com/ziptrail/ziptrail/internal/localcluster/kingress"
)

// Namespace is where Knative Serving runs.
const Namespace = "knative-serving"

// DefaultQueueSidecarImage is queue-proxy-zl's image in the catalog.
const DefaultQueueSidecarImage = "ghcr.io/ziptrail/queue-proxy-zl:latest"

// DefaultDomain is the domain of Knative Services' external URLs.
const DefaultDomain = "ziptrail.local"

// fieldManager owns what the installer applies (server-side apply).
const fieldManager = "ziptrail-local"

// Options configure an installation.
type Options struct {
	// Cluster is the running local cluster (with its node agent).
	Cluster *k8s.Cluster
	// RepoRoot is the repository whose go.mod pins the knative.dev modules.
	RepoRoot string
	// Ingress is the ziptrail-ingress binary (required).
	Ingress string
	// IngressPort is the port of the external gateway on the cluster's
	// host address (0: a free port).
	IngressPort int
	// Domain of external URLs; default DefaultDomain.
	Domain string
	// QueueSidecarImage is config-deployment's queue-sidecar-image;
	// default DefaultQueueSidecarImage.
	QueueSidecarImage string
	// ConfigMaps are set on top of Knative's config maps, e.g.
	// {"config-autoscaler": {"stable-window": "6s"}} for short test windows.
	ConfigMaps map[string]map[string]string
	// Timeout bounds the installation; default 6 minutes (first starts
	// build Knative's commands for the image catalog).
	Timeout time.Duration
	Log     io.Writer // progress; default io.Discard
}

// Knative is an installed Knative Serving.
type Knative struct {
	// IngressURL is the external gateway, http://<host IP>:<port>; route
	// with the Host header (<service>.<namespace>.<Domain>).
	IngressURL string
	// IngressLocalURL is the cluster-local gateway (ClusterLocal and
	// external rules).
	IngressLocalURL string
	Domain          string
	Version         string // knative.dev/serving's version
}

// Install applies Knative Serving's manifests, waits for its components,
// starts ziptrail-ingress and waits until Knative's webhook admits and
// rejects Services.
func Install(ctx context.Context, o Options) (*Knative, error) {
	if o.Cluster == nil || o.RepoRoot == "" || o.Ingress == "" {
		return nil, errors.New("localknative: Cluster, RepoRoot and Ingress are required")
	}
	if o.Domain == "" {
		o.Domain = DefaultDomain
	}
	if o.QueueSidecarImage == "" {
		o.QueueSidecarImage = DefaultQueueSidecarImage
	}
	if o.Timeout == 0 {
		o.Timeout = 6 * time.Minute
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	step := func(format string, args ...any) { fmt.Fprintf(o.Log, "==> "+format+"\n", args...) }
	start := time.Now()

	src, err := FindSource(ctx, o.RepoRoot)
	if err != nil {
		return nil, err
	}
	objs, err := Load(src, Settings{ImageTag: src.Version, ConfigMaps: settings(o)})
	if err != nil {
		return nil, err
	}
	step("Knative Serving %s: applying %d objects from %s/config/core", src.Version, len(objs), ServingModule)
	if err := apply(ctx, o.Cluster, objs); err != nil {
		return nil, err
	}
	cs, err := o.Cluster.Clientset()
	if err != nil {
		return nil, err
	}
	step("Knative Serving: waiting for controller, webhook, autoscaler and activator (first start builds them)")
	if err := waitDeployments(ctx, cs, []string{"controller", "webhook", "autoscaler", "activator"}); err != nil {
		return nil, err
	}
	kn, err := startIngress(ctx, o, step)
	if err != nil {
		return nil, err
	}
	kn.Domain, kn.Version = o.Domain, src.Version
	step("Knative Serving: waiting for its webhook to admit Services")
	if err := waitWebhook(ctx, o.Cluster); err != nil {
		return nil, err
	}
	step("Knative Serving %s ready in %s; ingress %s (Host: <service>.<namespace>.%s)", src.Version, time.Since(start).Round(time.Second), kn.IngressURL, o.Domain)
	return kn, nil
}

// settings are the local cluster's changes to Knative's configuration.
func settings(o Options) map[string]map[string]string {
	set := map[string]map[string]string{
		"config-deployment": {
			"queue-sidecar-image": o.QueueSidecarImage,
			// No registry is reachable: the node agent's catalog, not a
			// digest, says what an image runs.
			"registries-skipping-tag-resolving": "kind.local,ko.local,dev.local,ghcr.io,ziptrail.dev,knative.dev,docker.io,index.docker.io",
		},
		"config-network": {"ingress-class": kingress.ClassName},
		"config-domain":  {o.Domain: ""},
	}
	for name, data := range o.ConfigMaps {
		if set[name] == nil {
			set[name] = map[string]string{}
		}
		for k, v := range data {
			set[name][k] = v
		}
	}
	return set
}

// apply server-side-applies the objects in order, waiting for CRDs to be
// established before the custom resources that need them.
func apply(ctx context.Context, c *k8s.Cluster, objs []*unstructured.Unstructured) error {
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(c.Config)
	if err != nil {
		return err
	}
	ext, err := apiextensionsclient.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	var crds []string
	for i, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" && len(crds) > 0 {
			if err := waitCRDs(ctx, ext, crds); err != nil {
				return err
			}
			crds = nil
			mapper.Reset()
		}
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("apply %s %s: %w", gvk.Kind, o.GetName(), err)
		}
		var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			r = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		if _, err := r.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: fieldManager, Force: true}); err != nil {
			return fmt.Errorf("apply %s %s/%s (object %d of %d): %w", gvk.Kind, o.GetNamespace(), o.GetName(), i+1, len(objs), err)
		}
		if o.GetKind() == "CustomResourceDefinition" {
			crds = append(crds, o.GetName())
		}
	}
	return nil
}

func waitCRDs(ctx context.Context, ext apiextensionsclient.Interface, names []string) error {
	for _, name := range names {
		err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			crd, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			for _, c := range crd.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", name, err)
		}
	}
	return nil
}

// waitDeployments waits until each Deployment in Namespace is Available,
// reporting the pods' states when it gives up.
func waitDeployments(ctx context.Context, cs kubernetes.Interface, names []string) error {
	for _, name := range names {
		var last string
		err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			d, err := cs.AppsV1().Deployments(Namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				last = err.Error()
				return false, nil
			}
			for _, c := range d.Status.Conditions {
				if c.Type == appsv1.DeploymentAvailable && c.Status == "True" && d.Status.ObservedGeneration == d.Generation {
					return true, nil
				}
			}
			last = fmt.Sprintf("%d of %d replicas available", d.Status.AvailableReplicas, d.Status.Replicas)
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("Knative Serving's %s is not available (%s): %w; pods: %s", name, last, err, podStates(context.WithoutCancel(ctx), cs, name))
		}
	}
	return nil
}

func podStates(ctx context.Context, cs kubernetes.Interface, app string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pods, err := cs.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		return err.Error()
	}
	var parts []string
	for _, p := range pods.Items {
		s := p.Name + " " + string(p.Status.Phase)
		for _, c := range p.Status.ContainerStatuses {
			switch {
			case c.State.Waiting != nil:
				s += fmt.Sprintf(" [%s waiting: %s %s]", c.Name, c.State.Waiting.Reason, c.State.Waiting.Message)
			case c.State.Terminated != nil:
				s += fmt.Sprintf(" [%s terminated: %s %s]", c.Name, c.State.Terminated.Reason, c.State.Terminated.Message)
			default:
				s += fmt.Sprintf(" [%s ready=%v restarts=%d]", c.Name, c.Ready, c.RestartCount)
			}
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}

// startIngress runs ziptrail-ingress on the host as a component of the
// cluster: the external gateway on the host address at IngressPort, the
// cluster-local one on the host IP, both advertised to the cluster through
// the Services Knative's Ingress status names.
func startIngress(ctx context.Context, o Options, step func(string, ...any)) (*Knative, error) {
	host := o.Cluster.State.HostIP
	ports, err := freePorts(host, 3)
	if err != nil {
		return nil, err
	}
	ext, local, admin := ports[0], ports[1], ports[2]
	if o.IngressPort != 0 {
		ext = o.IngressPort
	}
	args := []string{
		"--kubeconfig", o.Cluster.Kubeconfig,
		// The host address only: reachable from this host and its pods,
		// not from the machine's other networks.
		"--http-address", net.JoinHostPort(host, strconv.Itoa(ext)),
		"--cluster-local-address", net.JoinHostPort(host, strconv.Itoa(local)),
		"--admin-address", net.JoinHostPort(host, strconv.Itoa(admin)),
		"--advertise-ip", host,
	}
	step("ziptrail-ingress (KIngress class %s) on %s:%d", kingress.ClassName, host, ext)
	health := "http://" + net.JoinHostPort(host, strconv.Itoa(admin)) + "/readyz"
	if err := o.Cluster.Launch(ctx, "ziptrail-ingress", o.Ingress, args, health, 2*time.Minute); err != nil {
		return nil, err
	}
	return &Knative{
		IngressURL:      "http://" + net.JoinHostPort(host, strconv.Itoa(ext)),
		IngressLocalURL: "http://" + net.JoinHostPort(host, strconv.Itoa(local)),
	}, nil
}

func freePorts(host string, n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

var serviceGVR = schema.GroupVersionResource{Group: "serving.knative.dev", Version: "v1", Resource: "services"}

// waitWebhook waits until Knative's webhook serves (it publishes its own
// certificate into the webhook configurations when it starts): a
// server-side dry run of an invalid Service is denied by Knative's
// validation webhook.
func waitWebhook(ctx context.Context, c *k8s.Cluster) error {
	cfg := rest.CopyConfig(c.Config)
	cfg.WarningHandler = rest.NoWarnings{} // Knative's warnings about the probe Service's securityContext
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	bad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "serving.knative.dev/v1", "kind": "Service",
		"metadata": map[string]any{"name": "webhook-check", "namespace": Namespace},
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
			"containerConcurrency": int64(-1), "containers": []any{map[string]any{"image": "ziptrail.dev/e2e/echo:latest"}}}}},
	}}
	var last error
	err = wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := dyn.Resource(serviceGVR).Namespace(Namespace).Create(ctx, bad, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		last = err
		return err != nil && strings.Contains(err.Error(), `admission webhook "validation.webhook.serving.knative.dev" denied the request`), nil
	})
	if err != nil {
		return fmt.Errorf("Knative's webhook does not validate Services (last answer: %v): %w", last, err)
	}
	return nil
}
