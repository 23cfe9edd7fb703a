// Package localcluster runs the whole of ziptrail on one machine: a real
// kube-apiserver + etcd, the operator's controllers, and the local serving
// runtime that turns Knative Services into network-namespace pods with a real
// queue-proxy each, behind a host-routed ingress on loopback.
package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"google.golang.org/grpc"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/ziptrail/ziptrail/controllers"
	"github.com/ziptrail/ziptrail/internal/control"
	"github.com/ziptrail/ziptrail/internal/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/controlplane"
	"github.com/ziptrail/ziptrail/internal/dispatch"
	"github.com/ziptrail/ziptrail/internal/gateway"
	"github.com/ziptrail/ziptrail/internal/localserving"
	"github.com/ziptrail/ziptrail/internal/netns"
	"github.com/ziptrail/ziptrail/internal/orchestrator"
)

// Options configure a local cluster. Zero values get sensible defaults.
type Options struct {
	StateDir   string       // kubeconfig, logs; default $ZIPTRAIL_CACHE/local
	QueueProxy string       // queue-proxy binary run in every pod (required)
	Subnet     netip.Prefix // pod network; default 10.213.0.0/24
	NetPrefix  string       // interface/namespace name prefix; default "zt"
	Instances  int          // pods per function; default 1
	Tiers      controllers.Tiers
	SidecarEnv []string    // extra environment for every queue-proxy
	Log        io.Writer   // progress output; default io.Discard
	LogLevel   zap.Options // controller logs
}

// Cluster is a running local cluster.
type Cluster struct {
	opts         Options
	env          *controlplane.Env
	Client       client.Client
	Config       *rest.Config
	Kubeconfig   string
	Runtime      *localserving.Runtime
	IngressURL   string // http://127.0.0.1:<port>, route by Host header
	GatewayURL   string // the session gateway, http://127.0.0.1:<port>
	ControlAddr  string // the control stream, on the pod network's gateway
	Orchestrator *orchestrator.Orchestrator

	cancel  context.CancelFunc
	done    chan error
	ingress *http.Server
	gateway *http.Server
	control *grpc.Server
	network *netns.Network
}

// Up starts everything and returns once the controllers run.
func Up(ctx context.Context, opts Options) (c *Cluster, err error) {
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
	if err := os.MkdirAll(opts.StateDir, 0o755); err != nil {
		return nil, err
	}
	step := func(format string, args ...any) { fmt.Fprintf(opts.Log, "==> "+format+"\n", args...) }
	c = &Cluster{opts: opts, done: make(chan error, 1)}
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
	step("starting kube-apiserver + etcd")
	if c.env, err = controlplane.Start(); err != nil {
		return nil, err
	}
	c.Config = c.env.Config
	if c.Kubeconfig, err = c.env.Kubeconfig(opts.StateDir); err != nil {
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

	// The control stream listens on the bridge address, which pods reach;
	// every queue-proxy-zl is told where it is.
	controlLn, err := net.Listen("tcp", net.JoinHostPort(c.network.Gateway().String(), "0"))
	if err != nil {
		return nil, err
	}
	c.ControlAddr = controlLn.Addr().String()
	opts.SidecarEnv = append(opts.SidecarEnv, "ZIPTRAIL_OPERATOR_ADDR="+c.ControlAddr)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	c.IngressURL = fmt.Sprintf("http://127.0.0.1:%d", port)
	shm := filepath.Join("/dev/shm", "ziptrail-"+opts.NetPrefix)
	if err := os.RemoveAll(shm); err != nil {
		return nil, err
	}
	c.Runtime, err = localserving.New(localserving.Options{
		Network: c.network, QueueProxy: opts.QueueProxy, SidecarEnv: opts.SidecarEnv,
		IngressPort: port, Instances: opts.Instances, StateDir: opts.StateDir, ShmRoot: shm,
	})
	if err != nil {
		return nil, err
	}
	c.ingress = &http.Server{Handler: localserving.NewRouter(c.Runtime), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = c.ingress.Serve(ln) }()

	mgr, err := ctrl.NewManager(c.Config, ctrl.Options{Scheme: controlplane.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		return nil, err
	}
	if err := c.startOrchestrator(mgr, port, controlLn); err != nil {
		return nil, err
	}
	if err := controllers.Setup(mgr, opts.Tiers, c.Orchestrator); err != nil {
		return nil, err
	}
	if err := (&localserving.Reconciler{Client: mgr.GetClient(), Runtime: c.Runtime}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.cancel = cancel
	go func() { c.done <- mgr.Start(mctx) }()
	step("operator, trigger engine and local serving runtime running; gateway %s, ingress %s (logs: %s)", c.GatewayURL, c.IngressURL, opts.StateDir)
	return c, nil
}

// Down stops the controllers, every pod, the ingress and the control plane,
// and removes the pod network.
func (c *Cluster) Down(ctx context.Context) error {
	var errs []error
	if c.cancel != nil {
		c.cancel()
		if err := <-c.done; err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
		}
	}
	if c.Runtime != nil {
		errs = append(errs, c.Runtime.Shutdown(ctx))
	} else if c.network != nil {
		errs = append(errs, c.network.Cleanup(ctx))
	}
	if c.ingress != nil {
		errs = append(errs, c.ingress.Close())
	}
	if c.gateway != nil {
		errs = append(errs, c.gateway.Close())
	}
	if c.control != nil {
		c.control.Stop()
	}
	if c.env != nil {
		errs = append(errs, c.env.Stop())
	}
	return errors.Join(errs...)
}

// startOrchestrator runs the trigger engine with its dispatcher (through the
// local ingress), the control stream (on the bridge address, which pods
// reach) and the session gateway (on loopback).
func (c *Cluster) startOrchestrator(mgr ctrl.Manager, ingressPort int, cl net.Listener) error {
	keys := &control.SecretKeys{Client: mgr.GetClient()}
	var srv *control.Server
	orch, err := orchestrator.New(orchestrator.Options{
		Resolver: dispatch.ServiceResolver{Reader: mgr.GetClient()},
		Ingress:  fmt.Sprintf("127.0.0.1:%d", ingressPort),
		Log:      ctrl.Log.WithName("orchestrator"),
	})
	if err != nil {
		return err
	}
	srv = control.NewServer(orch, keys)
	orch.SetControl(srv)
	c.Orchestrator = orch
	if err := mgr.Add(manager.RunnableFunc(orch.Run)); err != nil {
		return err
	}

	c.control = grpc.NewServer()
	controlv1.RegisterControlServer(c.control, srv)
	go func() { _ = c.control.Serve(cl) }()

	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	c.GatewayURL = "http://" + gl.Addr().String()
	c.gateway = &http.Server{Handler: gateway.New(&gateway.Handler{Starter: orch, Sessions: orch.Sessions(), Results: orchestrator.Results{}}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = c.gateway.Serve(gl) }()
	return nil
}
