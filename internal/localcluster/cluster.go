// Package localcluster runs the whole of ziptrail on one machine: a real
// kube-apiserver + etcd, the operator's controllers, and the local serving
// runtime that turns Knative Services into network-namespace pods with a real
// queue-proxy each, behind a host-routed ingress on loopback.
package localcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/controllers"
	"github.com/ziptrail/ziptrail/internal/checkpoint"
	"github.com/ziptrail/ziptrail/internal/control"
	"github.com/ziptrail/ziptrail/internal/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/controlplane"
	"github.com/ziptrail/ziptrail/internal/dispatch"
	"github.com/ziptrail/ziptrail/internal/gateway"
	"github.com/ziptrail/ziptrail/internal/localk8s"
	"github.com/ziptrail/ziptrail/internal/localserving"
	"github.com/ziptrail/ziptrail/internal/netns"
	"github.com/ziptrail/ziptrail/internal/nodeagent/catalog"
	"github.com/ziptrail/ziptrail/internal/orchestrator"
)

// Options configure a local cluster. Zero values get sensible defaults.
type Options struct {
	StateDir   string       // kubeconfig, logs; default $ZIPTRAIL_CACHE/local
	QueueProxy string       // queue-proxy binary run in every pod (required)
	Subnet     netip.Prefix // pod network; default 10.213.0.0/24
	NetPrefix  string       // interface/namespace name prefix; default "zt"
	Instances  int          // pods per function; default 1
	// Catalog is the image catalog that says how each container image runs
	// as a local process (docs/local-cluster.md, "Image catalog"); default
	// <repo>/config/local/images.yaml. Go packages it names are built into
	// <StateDir>/images.
	Catalog string
	// NoTiers keeps redis-server and MinIO off even when installed.
	NoTiers    bool
	SidecarEnv []string // extra environment for every queue-proxy
	// Kubernetes, when set, runs a full Kubernetes cluster
	// (internal/localk8s: kube-controller-manager, kube-scheduler,
	// kube-proxy, CoreDNS and the node agent with its nodes) in place of
	// envtest's kube-apiserver + etcd. Its StateDir defaults to StateDir.
	Kubernetes *localk8s.Options
	Log        io.Writer   // progress output; default io.Discard
	LogLevel   zap.Options // controller logs
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

// Cluster is a running local cluster.
type Cluster struct {
	opts        Options
	env         *controlplane.Env
	k8s         *localk8s.Cluster
	Client      client.Client
	Config      *rest.Config
	Kubeconfig  string
	Runtime     *localserving.Runtime
	IngressURL  string // http://127.0.0.1:<port>, route by Host header
	GatewayURL  string // the session gateway, http://127.0.0.1:<port>
	ControlAddr string // the control stream, on the pod network's gateway
	RedisAddr   string // fast tier and checkpoints; empty when not installed
	S3Endpoint  string // slow tier; empty when not installed
	S3AccessKey string
	S3SecretKey string
	S3Bucket    string
	// GatewayToken is a bearer token (of ServiceAccount
	// kube-system/ziptrail-admin, a cluster admin) that the gateway
	// accepts; Kubeconfig's user carries it too.
	GatewayToken string
	InputsAddr   string // large session inputs, on the pod network's gateway

	ingressPort int
	serving     *runner // the local serving runtime's reconciler: "Knative"
	operator    *operatorRun
	gw          atomic.Pointer[gateway.Handler]
	ingress     *http.Server
	gateway     *http.Server
	network     *netns.Network
	tiers       *tierServers
}

// runner is a controller manager running until cancelled.
type runner struct {
	cancel context.CancelFunc
	done   chan error
}

func (r *runner) stop() error {
	r.cancel()
	if err := <-r.done; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// operatorRun is one incarnation of the operator: controllers, trigger
// engine, control stream. It can be stopped and replaced, as a rolling
// update of the operator's Deployment would.
type operatorRun struct {
	runner
	orch    *orchestrator.Orchestrator
	control *grpc.Server
	inputs  *orchestrator.Inputs
}

// Up starts everything and returns once the controllers run.
func Up(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if opts.QueueProxy == "" {
		return nil, errors.New("localcluster: QueueProxy (path of the queue-proxy binary) is required")
	}
	if opts.StateDir == "" {
		cache := os.Getenv("ZIPTRAIL_CACHE")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache", "ziptrail")
		}
		opts.StateDir = filepath.Join(cache, "local")
	}
	if !opts.Subnet.IsValid() {
		opts.Subnet = netip.MustParsePrefix("10.213.0.0/24")
	}
	if opts.NetPrefix == "" {
		opts.NetPrefix = "zt"
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	if opts.Catalog == "" {
		opts.Catalog = filepath.Join(controlplane.RepoRoot(), "config", "local", "images.yaml")
	}
	if err := os.MkdirAll(opts.StateDir, 0o755); err != nil {
		return nil, err
	}
	images, err := catalog.Load(opts.Catalog, filepath.Join(opts.StateDir, "images"))
	if err != nil {
		return nil, err
	}
	step := func(format string, args ...any) { fmt.Fprintf(opts.Log, "==> "+format+"\n", args...) }
	c := &Cluster{opts: opts}
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

	t := time.Now()
	if err := c.startControlPlane(ctx, step); err != nil {
		return nil, err
	}
	if c.Client, err = client.New(c.Config, client.Options{Scheme: controlplane.Scheme()}); err != nil {
		return nil, err
	}
	step("control plane up in %s (kubeconfig: %s)", time.Since(t).Round(time.Millisecond), c.Kubeconfig)

	step("creating the pod network %s on bridge %sbr0", opts.Subnet, opts.NetPrefix)
	if c.network, err = netns.New(opts.NetPrefix, opts.Subnet); err != nil {
		return nil, err
	}
	if err := c.network.Setup(ctx); err != nil {
		return nil, fmt.Errorf("pod network (needs root or CAP_NET_ADMIN): %w", err)
	}

	c.tiers = &tierServers{}
	if !opts.NoTiers {
		c.tiers, err = startTiers(ctx, opts.StateDir, c.network.Gateway().String(), step)
		if err != nil {
			return nil, err
		}
		c.RedisAddr, c.S3Endpoint = c.tiers.redisAddr, c.tiers.s3Endpoint
		if c.S3Endpoint != "" {
			c.S3AccessKey, c.S3SecretKey, c.S3Bucket = s3AccessKey, s3SecretKey, s3Bucket
		}
		opts.SidecarEnv = append(opts.SidecarEnv, c.tiers.sidecarEnv()...)
	}

	// The control stream listens on the bridge address, which pods reach;
	// every queue-proxy-zl is told where it is.
	controlLn, err := net.Listen("tcp", net.JoinHostPort(c.network.Gateway().String(), "0"))
	if err != nil {
		return nil, err
	}
	c.ControlAddr = controlLn.Addr().String()
	opts.SidecarEnv = append(opts.SidecarEnv, "ZIPTRAIL_OPERATOR_ADDR="+c.ControlAddr)
	// Large session inputs are served to the pods from the bridge address
	// too, at a port that stays across operator restarts.
	inputsLn, err := net.Listen("tcp", net.JoinHostPort(c.network.Gateway().String(), "0"))
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

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		controlLn.Close()
		return nil, err
	}
	c.ingressPort = ln.Addr().(*net.TCPAddr).Port
	c.IngressURL = fmt.Sprintf("http://127.0.0.1:%d", c.ingressPort)
	shm := filepath.Join("/dev/shm", "ziptrail-"+opts.NetPrefix)
	if err := os.RemoveAll(shm); err != nil {
		controlLn.Close()
		return nil, err
	}
	c.Runtime, err = localserving.New(localserving.Options{
		Network: c.network, QueueProxy: opts.QueueProxy, SidecarEnv: opts.SidecarEnv,
		IngressPort: c.ingressPort, Instances: opts.Instances, StateDir: opts.StateDir, ShmRoot: shm,
		Catalog: images,
	})
	if err != nil {
		controlLn.Close()
		return nil, err
	}
	c.ingress = &http.Server{Handler: localserving.NewRouter(c.Runtime), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = c.ingress.Serve(ln) }()

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

	// Knative's part runs in its own manager, so the operator can restart
	// without touching the pods.
	mgr, err := newManager(c.Config)
	if err != nil {
		controlLn.Close()
		return nil, err
	}
	if err := (&localserving.Reconciler{Client: mgr.GetClient(), Runtime: c.Runtime}).SetupWithManager(mgr); err != nil {
		controlLn.Close()
		return nil, err
	}
	c.serving = start(ctx, mgr)

	if err := c.startOperator(ctx, controlLn); err != nil {
		return nil, err
	}
	if err := c.writeState(); err != nil {
		return nil, err
	}
	step("operator, trigger engine and local serving runtime running; gateway %s, ingress %s (logs: %s)", c.GatewayURL, c.IngressURL, opts.StateDir)
	return c, nil
}

// startControlPlane starts envtest's kube-apiserver + etcd, or with
// Options.Kubernetes the full local Kubernetes cluster, and installs the CRDs.
func (c *Cluster) startControlPlane(ctx context.Context, step func(string, ...any)) (err error) {
	if c.opts.Kubernetes == nil {
		step("starting kube-apiserver + etcd")
		if c.env, err = controlplane.Start(); err != nil {
			return err
		}
		c.Config = c.env.Config
		c.Kubeconfig, err = c.env.Kubeconfig(c.opts.StateDir)
		return err
	}
	ko := *c.opts.Kubernetes
	if ko.StateDir == "" {
		ko.StateDir = c.opts.StateDir
	}
	if ko.Log == nil {
		ko.Log = c.opts.Log
	}
	if ko.Catalog == "" { // the nodes run images as the Knative stand-in does
		ko.Catalog = c.opts.Catalog
	}
	step("starting Kubernetes: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, CoreDNS, %d node(s)", ko.Nodes)
	if c.k8s, err = localk8s.Start(ctx, ko); err != nil {
		return err
	}
	c.Config, c.Kubeconfig = c.k8s.Config, c.k8s.Kubeconfig
	return controlplane.InstallCRDs(c.Config)
}

func newManager(cfg *rest.Config) (ctrl.Manager, error) {
	return ctrl.NewManager(cfg, ctrl.Options{Scheme: controlplane.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"},
		// A restarted operator registers its controllers again in this process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
}

func start(ctx context.Context, mgr ctrl.Manager) *runner {
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &runner{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- mgr.Start(mctx) }()
	return r
}

func (c *Cluster) writeState() error {
	data, err := json.MarshalIndent(State{PID: os.Getpid(), Kubeconfig: c.Kubeconfig, GatewayURL: c.GatewayURL, IngressURL: c.IngressURL}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(StateFile(c.opts.StateDir), append(data, '\n'), 0o644)
}

// Orchestrator is the running operator's trigger engine adapter.
func (c *Cluster) Orchestrator() *orchestrator.Orchestrator { return c.operator.orch }

// Down stops the controllers, every pod, the ingress and the control plane,
// and removes the pod network.
func (c *Cluster) Down(ctx context.Context) error {
	var errs []error
	if c.operator != nil {
		errs = append(errs, c.stopOperator())
	}
	if c.serving != nil {
		errs = append(errs, c.serving.stop())
	}
	if c.Runtime != nil {
		errs = append(errs, c.Runtime.Shutdown(ctx))
	} else if c.network != nil {
		errs = append(errs, c.network.Cleanup(ctx))
	}
	if c.tiers != nil {
		c.tiers.stop(c.opts.StateDir)
	}
	if c.ingress != nil {
		errs = append(errs, c.ingress.Close())
	}
	if c.gateway != nil {
		errs = append(errs, c.gateway.Close())
	}
	if c.env != nil {
		errs = append(errs, c.env.Stop())
	}
	if c.k8s != nil {
		errs = append(errs, c.k8s.Stop(ctx))
	}
	if err := os.Remove(StateFile(c.opts.StateDir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// RestartOperator stops the operator — controllers, trigger engine, control
// stream — the way a rolling update of its Deployment does (the engine saves
// a last checkpoint, in-flight invocations are abandoned), and starts a new
// one, which restores the engine's sessions from the checkpoint in Redis.
// Pods keep running; their sidecars reconnect to the control stream.
func (c *Cluster) RestartOperator(ctx context.Context) error {
	if c.RedisAddr == "" {
		return errors.New("localcluster: restarting the operator needs Redis for the engine checkpoint (redis-server is not installed)")
	}
	if err := c.stopOperator(); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.ControlAddr)
	if err != nil {
		return err
	}
	return c.startOperator(ctx, ln)
}

func (c *Cluster) stopOperator() error {
	op := c.operator
	c.operator = nil
	c.gw.Store(nil)
	err := op.stop()
	op.control.Stop()
	_ = op.inputs.Close()
	return err
}

// serveGateway serves the running operator's session gateway, or 503 while
// it restarts (as a Service with no ready endpoint would).
func (c *Cluster) serveGateway(w http.ResponseWriter, r *http.Request) {
	h := c.gw.Load()
	if h == nil {
		w.Header().Set("Retry-After", "1")
		http.Error(w, `{"error":"the operator is restarting"}`, http.StatusServiceUnavailable)
		return
	}
	h.ServeHTTP(w, r)
}

// startOperator runs the controllers and the trigger engine with its
// dispatcher (through the local ingress), the control stream (on cl, the
// bridge address, which pods reach) and the session gateway.
func (c *Cluster) startOperator(ctx context.Context, cl net.Listener) error {
	mgr, err := newManager(c.Config)
	if err != nil {
		cl.Close()
		return err
	}
	keys := &control.SecretKeys{Client: mgr.GetClient()}
	inputsLn, err := net.Listen("tcp", c.InputsAddr)
	if err != nil {
		cl.Close()
		return err
	}
	inputs := orchestrator.NewInputs(orchestrator.InputsOptions{Keys: keys, Addr: c.InputsAddr})
	go func() { _ = inputs.Serve(inputsLn) }()
	started := false
	defer func() {
		if !started { // else stopOperator closes it
			_ = inputsLn.Close()
			_ = inputs.Close()
		}
	}()
	opts := orchestrator.Options{
		Resolver: dispatch.ServiceResolver{Reader: mgr.GetClient()},
		Ingress:  fmt.Sprintf("127.0.0.1:%d", c.ingressPort),
		Log:      ctrl.Log.WithName("orchestrator"),
		Keys:     keys,
		Inputs:   inputs,
	}
	if c.tiers.redis != nil {
		opts.Checkpoint = &checkpoint.Store{Client: c.tiers.redis, Key: "ziptrail:engine"}
		// Frequent checkpoints: a restart loses at most this much progress.
		opts.CheckpointInterval = 250 * time.Millisecond
	}
	orch, err := orchestrator.New(opts)
	if err != nil {
		cl.Close()
		return err
	}
	// Load the Workflows before the engine runs: it expires restored
	// sessions whose workflow it does not know on its first tick, and the
	// Workflow reconciler may not have run by then.
	var wfs v1alpha1.WorkflowList
	if err := c.Client.List(ctx, &wfs); err != nil {
		cl.Close()
		return err
	}
	for i := range wfs.Items {
		wf := &wfs.Items[i]
		_ = orch.SetWorkflow(wf, meta.IsStatusConditionTrue(wf.Status.Conditions, v1alpha1.ConditionReady), "") // the reconciler reports errors
	}
	srv := control.NewServer(orch, keys)
	orch.SetControl(srv)
	if err := mgr.Add(manager.RunnableFunc(orch.Run)); err != nil {
		cl.Close()
		return err
	}
	tiers := controllers.Tiers{Redis: c.RedisAddr != "", S3: c.S3Endpoint != ""}
	if err := controllers.Setup(mgr, tiers, orch); err != nil {
		cl.Close()
		return err
	}
	gs := grpc.NewServer()
	controlv1.RegisterControlServer(gs, srv)
	go func() { _ = gs.Serve(cl) }()
	var gen int64
	if opts.Checkpoint != nil {
		if _, gen, _, err = opts.Checkpoint.Load(ctx); err != nil {
			gs.Stop()
			return fmt.Errorf("read the engine checkpoint: %w", err)
		}
	}
	c.operator = &operatorRun{runner: *start(ctx, mgr), orch: orch, control: gs, inputs: inputs}
	started = true
	if opts.Checkpoint != nil {
		// The engine restores the checkpoint before it saves its first one;
		// until then the gateway would not know the restored sessions.
		if err := waitFor(ctx, "the operator's first checkpoint", func() bool {
			_, g, _, err := opts.Checkpoint.Load(ctx)
			return err == nil && g > gen
		}); err != nil {
			return err
		}
	}
	c.gw.Store(gateway.New(&gateway.Handler{Starter: orch, Sessions: orch.Sessions(), Results: orch.Results(),
		Auth: &gateway.KubeAuth{Client: mgr.GetClient()}}))
	return nil
}
