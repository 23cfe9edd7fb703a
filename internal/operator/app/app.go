// Package app assembles the operator: the Workflow, Bucket and Trigger
// reconcilers, the trigger engine (one on the elected leader, or sharded
// across the replicas) with its dispatcher, the sidecars' control stream,
// the session gateway and the store of large session inputs. cmd/operator
// runs it (Run); the local cluster and the Python SDK's test environment
// build the same parts on their own manager (New), so that an option is
// wired once.
package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/controllers"
	"github.com/ziptrail/ziptrail/internal/invocation/call"
	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/operator/control/guard"
	"github.com/ziptrail/ziptrail/internal/operator/dispatch"
	"github.com/ziptrail/ziptrail/internal/operator/dispatch/direct"
	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/operator/orchestrator"
	"github.com/ziptrail/ziptrail/internal/operator/scheme"
)

// Options are what a process running the operator supplies instead of
// what Config says. Zero values take Config's.
type Options struct {
	// Router picks the pod an invocation goes to; nil: Config.Direct's
	// (direct.Router, or the route).
	Router call.Router
	// Checkpoint is the engine's checkpoint store; nil: Config.RedisAddr's.
	Checkpoint *checkpoint.Store
	// CheckpointInterval, when set, is the engine's between saves.
	CheckpointInterval time.Duration
	// Tiers are the storage tiers sent to the sidecars; nil: Config's.
	Tiers *controlv1.Tiers
	// Calibration is the shuffle planner's; nil: the ConfigMap
	// `ziptrail calibrate --configmap` writes in $POD_NAMESPACE, if set.
	Calibration gateway.CalibrationSource
	// Log is the operator's logger; without a sink (the zero Logger, and
	// logr.Discard()) controller-runtime's (ctrl.Log).
	Log logr.Logger
	// InlineInputs sends every session input inline in its invocation,
	// for functions served without a sidecar to pull large ones from the
	// input store (the Python SDK's test environment).
	InlineInputs bool
}

// Operator is the operator's parts, built on a manager by New.
type Operator struct {
	// Orchestrator is the unsharded engine; nil when it is sharded.
	Orchestrator *orchestrator.Orchestrator
	// Control is the sidecars' control-stream server (serve it with
	// ServeControl, or as the process serves gRPC).
	Control *control.Server
	// Inputs serves large session inputs to the sidecars; nil with
	// Options.InlineInputs.
	Inputs *orchestrator.Inputs
	// Gateway is the session gateway's HTTP handler, GatewayGRPC its
	// gRPC service.
	Gateway     *gateway.Handler
	GatewayGRPC *gateway.GRPC

	mgr manager.Manager
	c   Config
	eng *engine
}

// Scheme is the operator's: Kubernetes' built-ins, the ziptrail kinds and
// Knative Serving's v1 kinds.
func Scheme() *runtime.Scheme { return scheme.New() }

// Run runs the operator of c in its pod until a signal stops it.
func Run(c Config) error {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ManagerOptions(c))
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	if c.LeaderElect {
		// In a pod: the leader's pod gets LeaderLabel, which the control
		// and gateway Services select.
		l, err := newLeaderLabeler(cfg, ctrl.Log.WithName("operator"))
		if err != nil {
			return err
		}
		if l != nil {
			if err := l.add(mgr); err != nil {
				return err
			}
		}
	}
	op, err := New(mgr, cfg, c, Options{})
	if err != nil {
		return err
	}
	if err := op.AddServers(); err != nil {
		return err
	}
	if err := setupPodWebhook(mgr, c.PodWebhook); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	// Every replica is ready: a standby is healthy, waiting for the lease.
	// The control-stream and gateway Services route to the leader's pod
	// only, by LeaderLabel (leader.go).
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}

// ManagerOptions are the operator's manager's in its pod.
func ManagerOptions(c Config) ctrl.Options {
	return ctrl.Options{
		Scheme:                  Scheme(),
		Client:                  clientOptions(), // Secrets uncached (cache.go)
		Cache:                   cache.Options{ByObject: direct.CacheOptions()},
		Metrics:                 metricsserver.Options{BindAddress: c.MetricsAddr},
		HealthProbeBindAddress:  c.ProbeAddr,
		PprofBindAddress:        c.PprofAddr,
		LeaderElection:          c.LeaderElect,
		LeaderElectionID:        LeaderElectionID,
		LeaderElectionNamespace: c.LeaderNamespace,
		// The unsharded leader's Lease times as the sharded engine's
		// bucket Leases (--engine-lease-duration and its siblings): how
		// long the engine is away after its replica died.
		LeaseDuration: &c.Shard.Lease,
		RenewDeadline: &c.Shard.Renew,
		RetryPeriod:   &c.Shard.Retry,
		// The engine must stop at once when leadership is lost.
		LeaderElectionReleaseOnCancel: true,
	}
}

// New builds the operator's parts on mgr and registers the reconcilers
// and the engine with it (the engine runs on the elected leader, or on
// every replica when sharded). The servers are the caller's: AddServers
// serves them on Config's addresses.
func New(mgr manager.Manager, cfg *rest.Config, c Config, o Options) (*Operator, error) {
	log := o.Log
	if log.GetSink() == nil {
		log = ctrl.Log.WithName("operator")
	}
	store := o.Checkpoint
	if store == nil && c.RedisAddr != "" {
		store = &checkpoint.Store{Client: redis.NewClient(&redis.Options{Addr: c.RedisAddr, Password: c.RedisPassword}), Key: c.CheckpointKey}
	}
	keys := &control.SecretKeys{Client: mgr.GetClient()}
	var inputs *orchestrator.Inputs
	if !o.InlineInputs {
		advertise, err := advertiseAddr(c.InputsAdvertise, c.InputsAddr)
		if err != nil {
			return nil, err
		}
		inputs = orchestrator.NewInputs(orchestrator.InputsOptions{Keys: keys, Addr: advertise, Cap: c.InputStoreBytes,
			PerNamespace: c.Limits.InputBytesPerNamespace})
	}
	// Refusals by a per-namespace limit, as Events on the workflow.
	limitEvents := &orchestrator.LimitEvents{Recorder: mgr.GetEventRecorder("ziptrail-limits"), Reader: mgr.GetClient()}
	opts := orchestrator.Options{
		Resolver:           &dispatch.CachedResolver{Resolver: dispatch.ServiceResolver{Reader: mgr.GetClient()}},
		Ingress:            c.Ingress,
		Checkpoint:         store,
		CheckpointInterval: o.CheckpointInterval,
		Concurrency:        c.Concurrency,
		Log:                log.WithName("orchestrator"),
		Keys:               keys,
		Inputs:             inputs,
		Delegate:           c.Delegate,
		Limits:             c.Limits,
		LimitEvents:        limitEvents,
		ResultGrace:        c.ResultGrace,
		// docs/guarantees.md
		DrainTimeout:    c.DrainTimeout,
		RedispatchAfter: c.RedispatchAfter,
		SaveTimeout:     c.SaveTimeout,
		// A start that reaches a new owner before its reconciler handed
		// it the workflow is answered 503, not 404.
		WorkflowExists: func(ctx context.Context, namespace, name string) (bool, error) {
			var wf v1alpha1.Workflow
			err := mgr.GetClient().Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &wf)
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return err == nil && wf.DeletionTimestamp.IsZero(), err
		},
		Router: o.Router,
	}
	if opts.Router == nil && c.Direct {
		opts.Router = &direct.Router{Reader: mgr.GetClient()}
	}
	op := &Operator{mgr: mgr, c: c, Inputs: inputs}
	if c.Shard.Buckets > 0 {
		// Every replica runs the engine of the buckets it owns, and serves
		// the control stream and the gateway (sharded.go).
		eng, err := shardedEngine(cfg, mgr, c.Shard, c.LeaderNamespace, opts)
		if err != nil {
			return nil, err
		}
		op.eng = eng
	} else {
		// A new leader loads the Workflows before it serves (the sharded
		// engine does so per bucket): the engine expires restored
		// sessions whose workflow it does not know.
		opts.LoadWorkflows = func(ctx context.Context) ([]v1alpha1.Workflow, error) { return listWorkflows(ctx, mgr) }
		orch, err := orchestrator.New(opts)
		if err != nil {
			return nil, err
		}
		op.Orchestrator = orch
		op.eng = singleEngine(orch)
	}
	eng := op.eng

	srv := control.NewServer(eng.events, keys)
	srv.Log = func(err error) { log.Error(err, "control stream") }
	// Every caller presents a projected service-account token for
	// control.ziptrail.dev; TokenReview verifies it (cached ≤ 1 min).
	srv.Auth = &control.TokenReviewer{Client: mgr.GetClient()}
	srv.KeyReaders = append(srv.KeyReaders, c.KeyReaders...)
	// The sidecars' storage tiers, sent over the authenticated stream.
	srv.Tiers = o.Tiers
	if srv.Tiers == nil {
		srv.Tiers = &controlv1.Tiers{RedisAddr: c.RedisAddr, RedisPassword: c.RedisPassword, S3Endpoint: c.S3Endpoint,
			S3AccessKey: c.S3AccessKey, S3SecretKey: c.S3SecretKey, S3Bucket: c.S3Bucket, S3Tls: c.S3TLS}
	}
	eng.connect(srv)
	op.Control = srv

	gwh := &gateway.Handler{Starter: eng.starter, Sessions: eng.sessions, Results: eng.results,
		Auth: &gateway.KubeAuth{Client: mgr.GetClient()}, MaxInput: c.MaxInputBytes, Limit: c.Limits.RateLimit(),
		Calibration: o.Calibration, RefusalsPerSecond: refusalsPaced(c.Limits.RefusalsPerConnection)}
	if gwh.Limit != nil {
		gwh.Limit.Refused = func(ns, wf string, err *gateway.LimitError) {
			limitEvents.Record(ns, wf, err.Limit, "Request", err.Msg)
		}
	}
	// The shuffle planner's calibration: the ConfigMap `ziptrail calibrate
	// --configmap` writes in the operator's namespace, read uncached (the
	// chart grants get on that one ConfigMap, not list/watch).
	if ns := os.Getenv("POD_NAMESPACE"); gwh.Calibration == nil && ns != "" {
		gwh.Calibration = &gateway.ConfigMapCalibration{Reader: mgr.GetAPIReader(), Namespace: ns}
	}
	gwg := &gateway.GRPC{Limits: guard.Limits{RefusalsPerSecond: refusalsPaced(c.Limits.RefusalsPerConnection)}}
	if p := eng.sharded; p != nil {
		// A sidecar of another replica's workflow is redirected there (after
		// authentication); gateway calls are proxied to it.
		cr, err := p.router(c.ControlAddr)
		if err != nil {
			return nil, err
		}
		srv.Route = p.controlRoute(cr)
		if gwh.Owners, err = p.router(c.GatewayAddr); err != nil {
			return nil, err
		}
		if gwg.Owners, err = p.router(c.GatewayGRPCAddr); err != nil {
			return nil, err
		}
	}
	gw := gateway.New(gwh)
	gwg.H = gw
	op.Gateway, op.GatewayGRPC = gw, gwg

	if err := controllers.Setup(mgr, controllers.Tiers{Redis: c.RedisAddr != "", S3: c.S3Endpoint != "", ControlAddr: c.ControlService}, eng.sink); err != nil {
		return nil, err
	}
	// Unsharded, one replica (the leader) drives the engine, serves the
	// control stream and the gateway.
	if err := op.add(eng.run); err != nil {
		return nil, err
	}
	return op, nil
}

// add registers a runnable of the engine's side: on the elected leader
// only (the default for a RunnableFunc), or on every replica when the
// engine is sharded.
func (op *Operator) add(f func(ctx context.Context) error) error {
	if op.eng.sharded != nil {
		return op.mgr.Add(everyReplica(f))
	}
	return op.mgr.Add(manager.RunnableFunc(f))
}

// AddServers serves the control stream, the session inputs and the
// gateway (HTTP and gRPC) on Config's addresses, beside the engine.
func (op *Operator) AddServers() error {
	c, srv, gwg := op.c, op.Control, op.GatewayGRPC
	if err := op.add(func(ctx context.Context) error {
		gs := NewControlServer(srv)
		return serveUntil(ctx, c.ControlAddr, func(ln net.Listener) error { return gs.Serve(srv.Listener(ln)) }, func() { gs.GracefulStop() })
	}); err != nil {
		return err
	}
	if op.Inputs != nil {
		if err := op.add(func(ctx context.Context) error {
			return serveUntil(ctx, c.InputsAddr, op.Inputs.Serve, func() { _ = op.Inputs.Close() })
		}); err != nil {
			return err
		}
	}
	if err := op.add(func(ctx context.Context) error {
		hs := &http.Server{Handler: op.Gateway, ReadHeaderTimeout: 10 * time.Second, ConnContext: op.Gateway.ConnContext}
		return serveUntil(ctx, c.GatewayAddr, hs.Serve, func() { _ = hs.Shutdown(context.Background()) })
	}); err != nil {
		return err
	}
	return op.add(func(ctx context.Context) error {
		gs := grpc.NewServer(gwg.ServerOptions()...) // the guard (gateway.DefaultGRPCLimits) and the routing
		gatewayv1.RegisterGatewayServer(gs, gwg)
		return serveUntil(ctx, c.GatewayGRPCAddr, func(ln net.Listener) error { return gs.Serve(gwg.Listener(ln)) }, func() { gs.GracefulStop() })
	})
}

// NewControlServer is the gRPC server of the control stream: keepalive,
// and the guard (control.DefaultLimits). Serve it on srv.Listener(ln).
func NewControlServer(srv *control.Server) *grpc.Server {
	gs := grpc.NewServer(srv.ServerOptions()...)
	controlv1.RegisterControlServer(gs, srv)
	return gs
}

// advertiseAddr is the address pods reach a listener at: the flag, or the
// pod's IP ($POD_IP, from the downward API) with the listener's port.
func advertiseAddr(flagValue, bind string) (string, error) {
	if flagValue != "" {
		return flagValue, nil
	}
	_, port, err := net.SplitHostPort(bind)
	if err != nil {
		return "", fmt.Errorf("--inputs-bind-address %q: %w", bind, err)
	}
	ip := os.Getenv("POD_IP")
	if ip == "" {
		return "", errors.New("set --inputs-advertise-address (or $POD_IP): the address the workflows' sidecars pull large session inputs from")
	}
	return net.JoinHostPort(ip, port), nil
}

// serveUntil listens on addr and serves until ctx ends.
func serveUntil(ctx context.Context, addr string, serve func(net.Listener) error, stop func()) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- serve(ln) }()
	select {
	case <-ctx.Done():
		stop()
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) || errors.Is(err, grpc.ErrServerStopped) {
			return nil
		}
		return err
	}
}

// refusalsPaced is the gateway's pacing rate of a limit's value, where
// zero (no pacing) is the gateway's negative (its zero takes its default).
func refusalsPaced(perConnection float64) float64 {
	if perConnection <= 0 {
		return -1
	}
	return perConnection
}
