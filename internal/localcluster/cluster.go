// Package localcluster runs the whole of ziptrail on one machine: the local
// Kubernetes cluster (internal/localcluster/k8s: control plane, node agent), real
// Knative Serving on it (internal/localcluster/knative) with queue-proxy-zl as its
// queue sidecar, and ziptrail's operator — controllers, trigger engine,
// control stream, session gateway — in this process, with redis-server and
// MinIO as the storage tiers.
package localcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ziptrail/ziptrail/internal/localcluster/k8s"
	"github.com/ziptrail/ziptrail/internal/localcluster/knative"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/dispatch/direct"
	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

// CheckpointInterval is how often the local cluster's engine saves its
// state to Redis: frequent checkpoints, so that a restart loses at most
// this much progress (ziptrail calibrate --local measures the engine at
// the same interval).
const CheckpointInterval = 250 * time.Millisecond

// Options configure a local cluster. Zero values get sensible defaults.
type Options struct {
	StateDir string // kubeconfig, logs; default $ZIPTRAIL_CACHE/local
	// Nodes is the number of nodes of the node agent; default 1.
	Nodes int
	// NoTiers keeps redis-server and MinIO off even when installed.
	NoTiers bool
	// NoOperator leaves ziptrail itself out: the cluster runs Kubernetes,
	// Knative Serving (without ziptrail's settings, except its queue
	// sidecar image: the image catalog has no stock queue-proxy, and the
	// chart sets the same) and the storage tiers, and ziptrail is installed on it with its Helm chart
	// (HelmValues), as on any cluster. No CRDs, operator, control Service
	// or gateway here; GatewayURL stays empty.
	NoOperator bool
	// SidecarEnv is extra environment for every queue-proxy-zl (through
	// the image catalog, see writeCatalog): test overrides only; a cluster
	// configures the sidecar through podinfo and the control stream.
	SidecarEnv []string
	// Knative is set on top of Knative Serving's config maps, e.g.
	// {"config-autoscaler": {"stable-window": "6s"}}.
	Knative map[string]map[string]string
	// Kubernetes holds the local Kubernetes cluster's network options
	// (ClusterCIDR, ServiceCIDR, NetPrefix) and WaitForHost; its StateDir,
	// Nodes, NodeAgent, Catalog and Log are set from the fields above.
	Kubernetes k8s.Options
	// Catalog is the image catalog the node agent's is made from
	// (docs/local-cluster.md, "Image catalog"); default
	// <repo>/config/local/images.yaml.
	Catalog string
	// EngineFiresAll turns off the operator's delegated firing (its
	// --delegate-triggers=false, orchestrator.Options.Delegate), which is
	// on by default as in the chart: the producers' sidecars fire
	// Immediate and ByName triggers themselves. See SetDelegateTriggers
	// to switch it on a running cluster. The environment's
	// ZIPTRAIL_DELEGATE_TRIGGERS (true or false), when set, overrides it:
	// a suite runs with either setting unchanged.
	EngineFiresAll bool
	// RouteOnly sends every invocation of the operator through the
	// ingress and the activator, as the operator's --direct-dispatch=false
	// does; by default invocations go straight to a ready pod
	// (dispatch/direct). The environment's ZIPTRAIL_DIRECT_DISPATCH (true
	// or false), when set, overrides it. SetDirectDispatch switches it on
	// a running cluster.
	RouteOnly bool
	Log       io.Writer   // progress output; default io.Discard
	LogLevel  zap.Options // controller logs
}

// State is what a running cluster writes to <state dir>/cluster.json, so
// that other commands (`ziptrail run`, `ziptrail sessions`) find it.
type State struct {
	PID        int    `json:"pid"`
	Kubeconfig string `json:"kubeconfig"`
	GatewayURL string `json:"gatewayURL"`
	IngressURL string `json:"ingressURL"`
}

// StateFile is where a cluster started with stateDir records its State.
func StateFile(stateDir string) string { return filepath.Join(stateDir, "cluster.json") }

// ReadState reads the State of the cluster running with stateDir.
func ReadState(stateDir string) (State, error) {
	var st State
	data, err := os.ReadFile(StateFile(stateDir))
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(data, &st)
}

// Cluster is a running local cluster: Kubernetes (internal/localcluster/k8s),
// Knative Serving (internal/localcluster/knative), ziptrail's operator in this
// process, the session gateway and the storage tiers.
type Cluster struct {
	opts       Options
	K8s        *k8s.Cluster
	Knative    *knative.Knative
	Client     client.Client
	Clientset  *kubernetes.Clientset
	Config     *rest.Config
	Kubeconfig string
	IngressURL string // Knative's external gateway; route by Host header
	GatewayURL string // the session gateway, http://127.0.0.1:<port>
	// ControlAddr is the control stream on the host address; pods reach it
	// as the Service ziptrail-operator.ziptrail-system:9090.
	ControlAddr string
	RedisAddr   string // fast tier and checkpoints; empty when not installed
	S3Endpoint  string // slow tier; empty when not installed
	S3AccessKey string
	S3SecretKey string
	S3Bucket    string
	// GatewayToken is a bearer token (of ServiceAccount
	// kube-system/ziptrail-admin, a cluster admin) that the gateway
	// accepts; Kubeconfig's user carries it too.
	GatewayToken string
	InputsAddr   string // large session inputs, on the host address

	// opMu guards operator, which the supervisor replaces (supervise).
	opMu sync.Mutex
	// routeOnly: the operator sends every invocation by the route
	// (Options.RouteOnly, SetDirectDispatch).
	routeOnly atomic.Bool
	operator  *operatorRun
	down      bool // Down began: the supervisor restarts nothing
	restarts  atomic.Int64
	gw        atomic.Pointer[gateway.Handler]
	gateway   *http.Server
	tiers     *tierServers
	// podWebhook gives queue-proxy the same-node directory (samenode.go).
	podWebhook *http.Server
}

// runner is a controller manager running until cancelled.
type runner struct {
	cancel context.CancelFunc
	done   chan error
	// ended is closed when the manager has stopped, err saying why.
	ended chan struct{}
	err   error
}

func (r *runner) stop() error {
	r.cancel()
	if err := <-r.done; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// Up starts everything and returns once the controllers run.
func Up(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if opts.StateDir == "" {
		cache := os.Getenv("ZIPTRAIL_CACHE")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache", "ziptrail")
		}
		opts.StateDir = filepath.Join(cache, "local")
	}
	if opts.Nodes <= 0 {
		opts.Nodes = 1
	}
	if err := directFromEnv(&opts); err != nil {
		return nil, err
	}
	if err := delegateFromEnv(&opts); err != nil {
		return nil, err
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	if opts.Catalog == "" {
		opts.Catalog = filepath.Join(paths.RepoRoot(), "config", "local", "images.yaml")
	}
	if err := os.MkdirAll(filepath.Join(opts.StateDir, "bin"), 0o755); err != nil {
		return nil, err
	}
	step := func(format string, args ...any) { fmt.Fprintf(opts.Log, "==> "+format+"\n", args...) }
	c := &Cluster{opts: opts}
	c.routeOnly.Store(opts.RouteOnly)
	defer func() {
		if err != nil {
			_ = c.Down(context.WithoutCancel(ctx))
		}
	}()

	logFile, err := os.Create(filepath.Join(opts.StateDir, "operator.log"))
	if err != nil {
		return nil, err
	}
	lo := opts.LogLevel
	lo.DestWriter = logFile
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&lo)))

	step("building ziptrail-node and ziptrail-ingress")
	bin := filepath.Join(opts.StateDir, "bin")
	agent, err := buildCommand(ctx, bin, "./cmd/ziptrail-node", opts.Log)
	if err != nil {
		return nil, err
	}
	ingress, err := buildCommand(ctx, bin, "./cmd/ziptrail-ingress", opts.Log)
	if err != nil {
		return nil, err
	}
	// queue-proxy-zl finds the operator through the revision's podinfo
	// annotations (the Workflow controller writes the control Service,
	// advertised below) and gets the tiers from the operator over the
	// authenticated control stream: nothing ziptrail-specific goes into
	// its environment. SidecarEnv is only for tests that need an override.
	env := opts.SidecarEnv
	catalogFile := filepath.Join(opts.StateDir, "images.yaml")
	if err := writeCatalog(opts.Catalog, catalogFile, env); err != nil {
		return nil, err
	}

	t := time.Now()
	ko := opts.Kubernetes
	ko.StateDir, ko.Nodes, ko.NodeAgent, ko.Catalog = opts.StateDir, opts.Nodes, agent, catalogFile
	if ko.Log == nil {
		ko.Log = opts.Log
	}
	step("starting Kubernetes: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, CoreDNS, %d node(s)", ko.Nodes)
	if c.K8s, err = k8s.Start(ctx, ko); err != nil {
		return nil, err
	}
	c.Config, c.Kubeconfig = c.K8s.Config, c.K8s.Kubeconfig
	if !opts.NoOperator { // else the chart installs them
		if err := envtest.InstallCRDs(c.Config); err != nil {
			return nil, err
		}
	}
	if c.Client, err = client.New(c.Config, client.Options{Scheme: envtest.Scheme()}); err != nil {
		return nil, err
	}
	if c.Clientset, err = c.K8s.Clientset(); err != nil {
		return nil, err
	}
	step("Kubernetes up in %s (kubeconfig: %s)", time.Since(t).Round(time.Millisecond), c.Kubeconfig)

	knCfg := map[string]map[string]string{
		// queue-proxy-zl reads the revision's annotations (the Workflow
		// controller's per-function settings) from the podinfo volume.
		// Functions may pin their pods to nodes (a revision template's
		// nodeSelector; e2e places a producer and a consumer apart).
		"config-features": {"queueproxy.mount-podinfo": "enabled", "kubernetes.podspec-nodeselector": "enabled"},
		// Knative mounts a token for this audience into queue-proxy
		// (/var/run/secrets/tokens/<audience>); the control stream
		// authenticates sidecars with it (docs/control-stream.md).
		"config-deployment": {"queue-sidecar-token-audiences": control.Audience},
	}
	if opts.NoOperator {
		// The chart's post-install hook sets these (and the queue sidecar
		// image), and its uninstall hook restores Knative's values.
		knCfg = map[string]map[string]string{}
	}
	for name, data := range opts.Knative {
		if knCfg[name] == nil {
			knCfg[name] = map[string]string{}
		}
		for k, v := range data {
			knCfg[name][k] = v
		}
	}
	if c.Knative, err = knative.Install(ctx, knative.Options{
		Cluster: c.K8s, RepoRoot: paths.RepoRoot(), Ingress: ingress,
		QueueSidecarImage: QueueProxyImage + ":latest", ConfigMaps: knCfg, Log: opts.Log,
	}); err != nil {
		return nil, err
	}
	c.IngressURL = c.Knative.IngressURL

	host := c.K8s.State.HostIP
	if _, err := c.Clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: SystemNamespace}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("namespace %s: %w", SystemNamespace, err)
	}
	c.tiers = &tierServers{}
	if !opts.NoTiers {
		c.tiers, err = startTiers(ctx, opts.StateDir, host, step)
		if err != nil {
			return nil, err
		}
		c.RedisAddr, c.S3Endpoint = c.tiers.redisAddr, c.tiers.s3Endpoint
		if c.RedisAddr != "" {
			if err := advertise(ctx, c.Clientset, redisService, redisPort, host, portOf(c.RedisAddr)); err != nil {
				return nil, err
			}
		}
		if c.S3Endpoint != "" {
			c.S3AccessKey, c.S3SecretKey, c.S3Bucket = s3AccessKey, s3SecretKey, s3Bucket
			if err := advertise(ctx, c.Clientset, s3Service, s3Port, host, portOf(c.S3Endpoint)); err != nil {
				return nil, err
			}
		}
	}

	if opts.NoOperator {
		if err := c.adminCredentials(ctx); err != nil {
			return nil, err
		}
		if err := c.writeState(); err != nil {
			return nil, err
		}
		step("Kubernetes, Knative Serving and the storage tiers running; install ziptrail with its Helm chart (Knative ingress %s, logs: %s)", c.IngressURL, opts.StateDir)
		return c, nil
	}

	// The control stream listens on the host address, behind the Service
	// every queue-proxy-zl is told about.
	controlLn, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, err
	}
	c.ControlAddr = controlLn.Addr().String()
	if err := advertise(ctx, c.Clientset, controlService, controlPort, host, portOf(c.ControlAddr)); err != nil {
		controlLn.Close()
		return nil, err
	}
	// Large session inputs are served to the pods from the host address
	// too, at a port that stays across operator restarts.
	inputsLn, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		controlLn.Close()
		return nil, err
	}
	c.InputsAddr = inputsLn.Addr().String()
	inputsLn.Close()
	if err := c.gatewayCredentials(ctx); err != nil {
		controlLn.Close()
		return nil, err
	}

	// The session gateway outlives operator restarts (its address is in the
	// state file); it serves whichever operator runs.
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		controlLn.Close()
		return nil, err
	}
	c.GatewayURL = "http://" + gl.Addr().String()
	c.gateway = &http.Server{Handler: http.HandlerFunc(c.serveGateway), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = c.gateway.Serve(gl) }()

	// Before any function's pod: queue-proxy-zl's same-node directory.
	if err := c.startPodWebhook(ctx); err != nil {
		controlLn.Close()
		return nil, fmt.Errorf("pod webhook: %w", err)
	}
	c.opMu.Lock()
	err = c.startOperator(ctx, controlLn)
	c.opMu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := c.writeState(); err != nil {
		return nil, err
	}
	step("operator and trigger engine running; gateway %s, Knative ingress %s (logs: %s)", c.GatewayURL, c.IngressURL, opts.StateDir)
	return c, nil
}

// HelmValues are the `helm install charts/ziptrail` values (--set) that
// connect the chart's operator to this cluster's storage tiers: the
// Services in SystemNamespace that lead to redis-server and MinIO on the
// host. Empty for a tier that does not run.
func (c *Cluster) HelmValues() []string {
	var v []string
	if c.RedisAddr != "" {
		v = append(v, "tiers.redis.address="+serviceHost(redisService, redisPort))
	}
	if c.S3Endpoint != "" {
		v = append(v, "tiers.s3.endpoint="+serviceHost(s3Service, s3Port), "tiers.s3.accessKey="+c.S3AccessKey,
			"tiers.s3.secretKey="+c.S3SecretKey, "tiers.s3.bucket="+c.S3Bucket)
	}
	return v
}

func portOf(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return n
}

func newManager(cfg *rest.Config) (ctrl.Manager, error) {
	return ctrl.NewManager(cfg, ctrl.Options{Scheme: envtest.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"},
		Cache: cache.Options{ByObject: direct.CacheOptions()},
		// A restarted operator registers its controllers again in this process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
}

func start(ctx context.Context, mgr ctrl.Manager) *runner {
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &runner{cancel: cancel, done: make(chan error, 1), ended: make(chan struct{})}
	go func() {
		r.err = mgr.Start(mctx)
		close(r.ended)
		r.done <- r.err
	}()
	return r
}

func (c *Cluster) writeState() error {
	data, err := json.MarshalIndent(State{PID: os.Getpid(), Kubeconfig: c.Kubeconfig, GatewayURL: c.GatewayURL, IngressURL: c.IngressURL}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(StateFile(c.opts.StateDir), append(data, '\n'), 0o644)
}

// Down stops the operator, the gateway, the tiers and the Kubernetes
// cluster (which stops Knative's pods and the functions' with it).
func (c *Cluster) Down(ctx context.Context) error {
	var errs []error
	c.opMu.Lock()
	c.down = true
	if c.operator != nil {
		errs = append(errs, c.stopOperator())
	}
	c.opMu.Unlock()
	if c.gateway != nil {
		errs = append(errs, c.gateway.Close())
	}
	errs = append(errs, c.stopPodWebhook())
	if c.K8s != nil {
		errs = append(errs, c.K8s.Stop(ctx))
	}
	if c.tiers != nil {
		c.tiers.stop(c.opts.StateDir)
	}
	if err := os.Remove(StateFile(c.opts.StateDir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
