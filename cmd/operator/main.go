// Command operator runs ziptrail's control plane: the Workflow, Bucket and
// Trigger reconcilers, and — on the elected leader only — the trigger engine
// with its dispatcher, the sidecars' control stream, the session gateway
// (Kubernetes authentication and authorization on every request) and the
// data-plane store of large session inputs. With --engine-buckets the
// engine is sharded instead: every replica runs the engine of the buckets
// it owns and serves the control stream and the gateway, sending other
// replicas' workflows to them (sharded.go, docs/sharding.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/controllers"
	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/operator/dispatch"
	"github.com/ziptrail/ziptrail/internal/operator/dispatch/direct"
	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/operator/orchestrator"
)

type config struct {
	metricsAddr, probeAddr, controlAddr, gatewayAddr string
	gatewayGRPCAddr                                  string
	leaderElect                                      bool
	leaderNS                                         string
	redisAddr, redisPassword, checkpointKey          string
	s3Endpoint, s3AccessKey, s3SecretKey, s3Bucket   string
	s3TLS                                            bool
	controlService                                   string
	ingress                                          string
	concurrency                                      int
	inputsAddr, inputsAdvertise                      string
	inputStoreBytes, maxInputBytes                   int64
	resultGrace                                      time.Duration
	keyReaders                                       string
	podWebhook                                       podWebhookConfig
	shard                                            shardConfig
	delegate, direct                                 bool
	limits                                           orchestrator.Limits
	drainTimeout, redispatchAfter, saveTimeout       time.Duration
}

func main() {
	exitHook()    // the chart's hook commands: knative-config, knative-restore
	exitNodeDir() // the chart's node-dir DaemonSet (podwebhook.go)
	var c config
	flag.StringVar(&c.metricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint (0 disables it)")
	flag.StringVar(&c.probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz (every replica; the leader is the pod labelled ziptrail.dev/leader=true)")
	flag.StringVar(&c.controlAddr, "control-bind-address", ":9443", "address of the sidecars' gRPC control stream")
	flag.StringVar(&c.keyReaders, "control-key-readers", "", "comma-separated users (system:serviceaccount:<ns>:<sa>) that may read every namespace's reference keys "+
		"from the control service: activator-ext's ServiceAccount, e.g. system:serviceaccount:knative-serving:activator (the chart sets it when activatorExt is enabled)")
	flag.StringVar(&c.gatewayAddr, "gateway-bind-address", ":8088", "address of the session gateway (HTTP)")
	flag.StringVar(&c.gatewayGRPCAddr, "gateway-grpc-bind-address", ":8089", "address of the session gateway (gRPC)")
	flag.BoolVar(&c.leaderElect, "leader-elect", false, "elect a leader so only one replica drives the trigger engine")
	flag.StringVar(&c.leaderNS, "leader-election-namespace", "", "namespace of the leader-election lease (default: the pod's namespace)")
	flag.StringVar(&c.redisAddr, "redis-addr", os.Getenv("ZIPTRAIL_REDIS_ADDR"), "host:port of Redis: fast tier and engine checkpoints (empty: both disabled)")
	flag.StringVar(&c.redisPassword, "redis-password", os.Getenv("ZIPTRAIL_REDIS_PASSWORD"), "Redis password")
	flag.StringVar(&c.checkpointKey, "checkpoint-key", "ziptrail:engine", "Redis key of the engine checkpoint")
	flag.StringVar(&c.s3Endpoint, "s3-endpoint", os.Getenv("ZIPTRAIL_S3_ENDPOINT"), "host:port of the S3-compatible slow tier (empty: tier disabled)")
	flag.StringVar(&c.s3AccessKey, "s3-access-key", os.Getenv("ZIPTRAIL_S3_ACCESS_KEY"), "S3 access key (default $ZIPTRAIL_S3_ACCESS_KEY, which the chart sets from its Secret); sent to sidecars over the authenticated control stream only")
	flag.StringVar(&c.s3SecretKey, "s3-secret-key", os.Getenv("ZIPTRAIL_S3_SECRET_KEY"), "S3 secret key (default $ZIPTRAIL_S3_SECRET_KEY); sent to sidecars over the authenticated control stream only")
	flag.StringVar(&c.s3Bucket, "s3-bucket", envOr("ZIPTRAIL_S3_BUCKET", "ziptrail"), "S3 bucket of the slow tier")
	flag.BoolVar(&c.s3TLS, "s3-tls", os.Getenv("ZIPTRAIL_S3_TLS") == "true", "reach the S3 endpoint over TLS")
	flag.StringVar(&c.controlService, "control-service-address", "", "host:port sidecars reach the control stream at (the control Service, e.g. ziptrail-control.ziptrail-system.svc:9443; the chart sets it); "+
		"written on every function's revision template as the annotation ziptrail.dev/control-addr (empty: sidecars run without an operator)")
	flag.StringVar(&c.ingress, "ingress", "", "host:port to send every invocation to, routed by Host (default: the Services' cluster-local addresses)")
	flag.IntVar(&c.concurrency, "dispatch-concurrency", 256, "invocations in flight at most")
	flag.StringVar(&c.inputsAddr, "inputs-bind-address", ":9194", "data-plane address serving large session inputs to the workflows' sidecars")
	flag.StringVar(&c.inputsAdvertise, "inputs-advertise-address", "", "host:port pods reach the inputs address at (default: $POD_IP and the port of --inputs-bind-address)")
	flag.Int64Var(&c.inputStoreBytes, "input-store-bytes", 256<<20, "memory held at most for the inputs of running sessions (inputs over 64 KiB); starts beyond it are refused with 503")
	flag.Int64Var(&c.maxInputBytes, "max-input-bytes", 64<<20, "largest session input the gateway accepts (413 beyond)")
	flag.DurationVar(&c.resultGrace, "result-grace", orchestrator.DefaultResultGrace, "how long a session's result stays readable after its first full read when its client does not acknowledge it (docs/gateway.md)")
	flag.BoolVar(&c.delegate, "delegate-triggers", false, "let producers' sidecars fire their workflow's Immediate and ByName triggers themselves, "+
		"reporting to the engine, which stays the authority (docs/design.md, 'Delegated firing')")
	flag.BoolVar(&c.direct, "direct-dispatch", true, "send each invocation straight to a ready pod of its function's revision (its queue-proxy), as Knative's activator does, "+
		"instead of through the ingress and the activator; a revision without a ready pod, with a containerConcurrency limit or split traffic, and a pod's overload, go by the route (docs/dispatch.md)")
	flag.DurationVar(&c.drainTimeout, "engine-drain-timeout", 10*time.Second, "on a graceful stop (rollout, upgrade, a demoted bucket), how long calls in flight may take before the last save "+
		"(keep it under the pod's terminationGracePeriodSeconds)")
	flag.DurationVar(&c.redispatchAfter, "engine-redispatch-after", orchestrator.DefaultRedispatchAfter, "after a restore, how long to wait for news of an invocation in flight "+
		"before sending it again with the same idempotency key")
	flag.DurationVar(&c.saveTimeout, "checkpoint-save-timeout", 5*time.Second, "bound of one checkpoint save; while saves fail, starts are answered 503")
	podWebhookFlags(&c.podWebhook)
	shardFlags(&c.shard)
	c.limits = orchestrator.DefaultLimits() // docs/limits.md
	c.limits.Flags(flag.CommandLine)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	if err := run(c); err != nil {
		fmt.Fprintf(os.Stderr, "operator: %v\n", err)
		os.Exit(1)
	}
}

func run(c config) error {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	utilruntime.Must(servingv1.AddToScheme(scheme))

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Client:                  clientOptions(), // Secrets uncached (cache.go)
		Cache:                   cache.Options{ByObject: direct.CacheOptions()},
		Metrics:                 metricsserver.Options{BindAddress: c.metricsAddr},
		HealthProbeBindAddress:  c.probeAddr,
		LeaderElection:          c.leaderElect,
		LeaderElectionID:        leaderElectionID,
		LeaderElectionNamespace: c.leaderNS,
		// The unsharded leader's Lease times as the sharded engine's
		// bucket Leases (--engine-lease-duration and its siblings): how
		// long the engine is away after its replica died.
		LeaseDuration: &c.shard.lease,
		RenewDeadline: &c.shard.renew,
		RetryPeriod:   &c.shard.retry,
		// The engine must stop at once when leadership is lost.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	log := ctrl.Log.WithName("operator")
	if c.leaderElect {
		// In a pod: the leader's pod gets LeaderLabel, which the control
		// and gateway Services select.
		l, err := newLeaderLabeler(cfg, log)
		if err != nil {
			return err
		}
		if l != nil {
			if err := l.add(mgr); err != nil {
				return err
			}
		}
	}

	var store *checkpoint.Store
	if c.redisAddr != "" {
		store = &checkpoint.Store{Client: redis.NewClient(&redis.Options{Addr: c.redisAddr, Password: c.redisPassword}), Key: c.checkpointKey}
	}
	advertise, err := advertiseAddr(c.inputsAdvertise, c.inputsAddr)
	if err != nil {
		return err
	}
	keys := &control.SecretKeys{Client: mgr.GetClient()}
	inputs := orchestrator.NewInputs(orchestrator.InputsOptions{Keys: keys, Addr: advertise, Cap: c.inputStoreBytes,
		PerNamespace: c.limits.InputBytesPerNamespace})
	// Refusals by a per-namespace limit, as Events on the workflow.
	limitEvents := &orchestrator.LimitEvents{Recorder: mgr.GetEventRecorder("ziptrail-limits"), Reader: mgr.GetClient()}
	opts := orchestrator.Options{
		Resolver:    &dispatch.CachedResolver{Resolver: dispatch.ServiceResolver{Reader: mgr.GetClient()}},
		Ingress:     c.ingress,
		Checkpoint:  store,
		Concurrency: c.concurrency,
		Log:         ctrl.Log.WithName("orchestrator"),
		Keys:        keys,
		Inputs:      inputs,
		Delegate:    c.delegate,
		Limits:      c.limits,
		LimitEvents: limitEvents,
		ResultGrace: c.resultGrace,
		// docs/guarantees.md
		DrainTimeout:    c.drainTimeout,
		RedispatchAfter: c.redispatchAfter,
		SaveTimeout:     c.saveTimeout,
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
	}
	if c.direct {
		opts.Router = &direct.Router{Reader: mgr.GetClient()}
	}
	var eng *engine
	if c.shard.buckets > 0 {
		// Every replica runs the engine of the buckets it owns, and serves
		// the control stream and the gateway (sharded.go).
		if eng, err = shardedEngine(cfg, mgr, c.shard, c.leaderNS, opts); err != nil {
			return err
		}
	} else {
		// A new leader loads the Workflows before it serves (the sharded
		// engine does so per bucket).
		opts.LoadWorkflows = func(ctx context.Context) ([]v1alpha1.Workflow, error) { return listWorkflows(ctx, mgr) }
		orch, err := orchestrator.New(opts)
		if err != nil {
			return err
		}
		eng = singleEngine(orch)
	}
	// add registers a runnable of the engine's side: on the elected leader
	// only (the default for a RunnableFunc), or on every replica when the
	// engine is sharded.
	add := func(f func(ctx context.Context) error) error {
		if eng.sharded != nil {
			return mgr.Add(everyReplica(f))
		}
		return mgr.Add(manager.RunnableFunc(f))
	}
	srv := control.NewServer(eng.events, keys)
	srv.Log = func(err error) { log.Error(err, "control stream") }
	// Every caller presents a projected service-account token for
	// control.ziptrail.dev; TokenReview verifies it (cached ≤ 1 min).
	srv.Auth = &control.TokenReviewer{Client: mgr.GetClient()}
	for _, u := range strings.Split(c.keyReaders, ",") {
		if u = strings.TrimSpace(u); u != "" {
			srv.KeyReaders = append(srv.KeyReaders, u)
		}
	}
	// The sidecars' storage tiers, sent over the authenticated stream.
	srv.Tiers = &controlv1.Tiers{RedisAddr: c.redisAddr, RedisPassword: c.redisPassword, S3Endpoint: c.s3Endpoint,
		S3AccessKey: c.s3AccessKey, S3SecretKey: c.s3SecretKey, S3Bucket: c.s3Bucket, S3Tls: c.s3TLS}
	eng.connect(srv)
	gwh := &gateway.Handler{Starter: eng.starter, Sessions: eng.sessions, Results: eng.results,
		Auth: &gateway.KubeAuth{Client: mgr.GetClient()}, MaxInput: c.maxInputBytes, Limit: c.limits.RateLimit()}
	if gwh.Limit != nil {
		gwh.Limit.Refused = func(ns, wf string, err *gateway.LimitError) {
			limitEvents.Record(ns, wf, err.Limit, "Request", err.Msg)
		}
	}
	gwg := &gateway.GRPC{}
	if p := eng.sharded; p != nil {
		// A sidecar of another replica's workflow is redirected there (after
		// authentication); gateway calls are proxied to it.
		cr, err := p.router(c.controlAddr)
		if err != nil {
			return err
		}
		srv.Route = p.controlRoute(cr)
		if gwh.Owners, err = p.router(c.gatewayAddr); err != nil {
			return err
		}
		if gwg.Owners, err = p.router(c.gatewayGRPCAddr); err != nil {
			return err
		}
	}

	if err := controllers.Setup(mgr, controllers.Tiers{Redis: c.redisAddr != "", S3: c.s3Endpoint != "", ControlAddr: c.controlService}, eng.sink); err != nil {
		return err
	}
	// Unsharded, one replica (the leader) drives the engine, serves the
	// control stream and the gateway.
	if err := add(eng.run); err != nil {
		return err
	}
	if err := add(func(ctx context.Context) error {
		gs := grpc.NewServer(srv.ServerOptions()...) // keepalive, and the guard (control.DefaultLimits)
		controlv1.RegisterControlServer(gs, srv)
		return serveUntil(ctx, c.controlAddr, func(ln net.Listener) error { return gs.Serve(srv.Listener(ln)) }, func() { gs.GracefulStop() })
	}); err != nil {
		return err
	}
	if err := add(func(ctx context.Context) error {
		return serveUntil(ctx, c.inputsAddr, inputs.Serve, func() { _ = inputs.Close() })
	}); err != nil {
		return err
	}
	// The shuffle planner's calibration: the ConfigMap `ziptrail calibrate
	// --configmap` writes in the operator's namespace, read uncached (the
	// chart grants get on that one ConfigMap, not list/watch).
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		gwh.Calibration = &gateway.ConfigMapCalibration{Reader: mgr.GetAPIReader(), Namespace: ns}
	}
	gw := gateway.New(gwh)
	gwg.H = gw
	if err := add(func(ctx context.Context) error {
		hs := &http.Server{Handler: gw, ReadHeaderTimeout: 10 * time.Second}
		return serveUntil(ctx, c.gatewayAddr, hs.Serve, func() { _ = hs.Shutdown(context.Background()) })
	}); err != nil {
		return err
	}
	if err := add(func(ctx context.Context) error {
		gs := grpc.NewServer(gwg.ServerOptions()...) // the guard (gateway.DefaultGRPCLimits) and the routing
		gatewayv1.RegisterGatewayServer(gs, gwg)
		return serveUntil(ctx, c.gatewayGRPCAddr, func(ln net.Listener) error { return gs.Serve(gwg.Listener(ln)) }, func() { gs.GracefulStop() })
	}); err != nil {
		return err
	}

	if err := setupPodWebhook(mgr, c.podWebhook); err != nil {
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

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
