package localcluster

// The in-process operator of a local cluster: its incarnations, their
// supervision and restarts, and how one is started.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/api/meta"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/controllers"
	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/operator/dispatch"
	"github.com/ziptrail/ziptrail/internal/operator/dispatch/direct"
	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/orchestrator"
)

// operatorRun is one incarnation of the operator: controllers, trigger
// engine, control stream. It can be stopped and replaced, as a rolling
// update of the operator's Deployment would.
type operatorRun struct {
	*runner
	orch    *orchestrator.Orchestrator
	control *grpc.Server
	srv     *control.Server
	inputs  *orchestrator.Inputs
}

// Orchestrator is the running operator's trigger engine adapter.
// Nil on a cluster without the in-process operator (Options.NoOperator).
func (c *Cluster) Orchestrator() *orchestrator.Orchestrator {
	if op := c.op(); op != nil {
		return op.orch
	}
	return nil
}

// op is the running operator (nil while it restarts, or without one).
func (c *Cluster) op() *operatorRun {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	return c.operator
}

// supervise restarts the operator when its manager stops on its own (its
// trigger engine failed, say): as the kubelet restarts a Deployment's pod
// whose process exited. A stop by stopOperator is not restarted.
func (c *Cluster) supervise(op *operatorRun) {
	<-op.ended
	c.opMu.Lock()
	defer c.opMu.Unlock()
	if c.operator != op {
		return // stopped on purpose (Down, RestartOperator)
	}
	fmt.Fprintf(c.opts.Log, "==> the operator stopped (%v); restarting it, as the kubelet would\n", op.err)
	_ = c.stopOperator()
	for backoff := time.Second; ; backoff = min(2*backoff, 30*time.Second) {
		ln, err := net.Listen("tcp", c.ControlAddr)
		if err == nil {
			if err = c.startOperator(context.Background(), ln); err == nil {
				c.restarts.Add(1)
				return
			}
		}
		fmt.Fprintf(c.opts.Log, "==> restarting the operator: %v; again in %s\n", err, backoff)
		time.Sleep(backoff)
		if c.down {
			return
		}
	}
}

// OperatorRestarts is how many times the operator was restarted because it
// stopped on its own (supervise).
func (c *Cluster) OperatorRestarts() int64 { return c.restarts.Load() }

// RestartOperator stops the operator — controllers, trigger engine, control
// stream — the way a rolling update of its Deployment does (the engine saves
// a last checkpoint, in-flight invocations are abandoned), and starts a new
// one, which restores the engine's sessions from the checkpoint in Redis.
// Pods keep running; their sidecars reconnect to the control stream.
func (c *Cluster) RestartOperator(ctx context.Context) error {
	if c.opts.NoOperator {
		return errors.New("localcluster: no operator runs in this process (Options.NoOperator): the chart's operator is a Deployment; delete its pods instead")
	}
	if c.RedisAddr == "" {
		return errors.New("localcluster: restarting the operator needs Redis for the engine checkpoint (redis-server is not installed)")
	}
	c.opMu.Lock()
	defer c.opMu.Unlock()
	if c.operator != nil {
		if err := c.stopOperator(); err != nil {
			return err
		}
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
	// The per-namespace limits at the chart's defaults (docs/limits.md).
	limits := orchestrator.DefaultLimits()
	limitEvents := &orchestrator.LimitEvents{Recorder: mgr.GetEventRecorder("ziptrail-limits"), Reader: mgr.GetClient()}
	inputs := orchestrator.NewInputs(orchestrator.InputsOptions{Keys: keys, Addr: c.InputsAddr, PerNamespace: limits.InputBytesPerNamespace})
	go func() { _ = inputs.Serve(inputsLn) }()
	started := false
	defer func() {
		if !started { // else stopOperator closes it
			_ = inputsLn.Close()
			_ = inputs.Close()
		}
	}()
	opts := orchestrator.Options{
		Resolver: &dispatch.CachedResolver{Resolver: dispatch.ServiceResolver{Reader: mgr.GetClient()}},
		// Invocations go to the functions' cluster-local URLs
		// (<service>.<namespace>.svc.cluster.local), which Knative routes
		// through the cluster-local gateway.
		Ingress: strings.TrimPrefix(c.Knative.IngressLocalURL, "http://"),
		Log:     ctrl.Log.WithName("orchestrator"),
		Keys:    keys,
		Inputs:  inputs,
		// Delegated firing (docs/design.md), as the chart's
		// engine.delegateTriggers.
		Delegate: c.opts.DelegateTriggers,
		// Straight to ready pods, as the chart's operator (its
		// --direct-dispatch); the switch is the cluster's, for benchmarks.
		Router:      switchedRouter{c: c, r: &direct.Router{Reader: mgr.GetClient()}},
		Limits:      limits,
		LimitEvents: limitEvents,
	}
	if c.tiers.redis != nil {
		opts.Checkpoint = &checkpoint.Store{Client: c.tiers.redis, Key: "ziptrail:engine"}
		opts.CheckpointInterval = CheckpointInterval
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
	// Sidecars present the projected token Knative mounts for the audience
	// in config-deployment's queue-sidecar-token-audiences (set in Up).
	srv.Auth = &control.TokenReviewer{Client: mgr.GetClient()}
	// The sidecars' tiers, over the authenticated stream: the Services that
	// lead to this host's redis-server and MinIO (advertised in Up).
	srv.Tiers = &controlv1.Tiers{}
	if c.RedisAddr != "" {
		srv.Tiers.RedisAddr = serviceHost(redisService, redisPort)
	}
	if c.S3Endpoint != "" {
		srv.Tiers.S3Endpoint, srv.Tiers.S3AccessKey, srv.Tiers.S3SecretKey, srv.Tiers.S3Bucket =
			serviceHost(s3Service, s3Port), s3AccessKey, s3SecretKey, s3Bucket
	}
	orch.SetControl(srv)
	if err := mgr.Add(manager.RunnableFunc(orch.Run)); err != nil {
		cl.Close()
		return err
	}
	tiers := controllers.Tiers{Redis: c.RedisAddr != "", S3: c.S3Endpoint != "", ControlAddr: serviceHost(controlService, controlPort)}
	if err := controllers.Setup(mgr, tiers, orch); err != nil {
		cl.Close()
		return err
	}
	gs := grpc.NewServer(srv.ServerOptions()...)
	controlv1.RegisterControlServer(gs, srv)
	go func() { _ = gs.Serve(srv.Listener(cl)) }()
	var gen int64
	if opts.Checkpoint != nil {
		if _, gen, _, err = opts.Checkpoint.Load(ctx); err != nil {
			gs.Stop()
			return fmt.Errorf("read the engine checkpoint: %w", err)
		}
	}
	c.operator = &operatorRun{runner: start(ctx, mgr), orch: orch, control: gs, srv: srv, inputs: inputs}
	go c.supervise(c.operator)
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
	rate := limits.RateLimit() // the gateway's requests per namespace
	rate.Refused = func(ns, wf string, err *gateway.LimitError) {
		limitEvents.Record(ns, wf, err.Limit, "Request", err.Msg)
	}
	// The shuffle planner reads the calibration where the chart's operator
	// would: `ziptrail calibrate --configmap ziptrail-system/…` on this cluster.
	c.gw.Store(gateway.New(&gateway.Handler{Starter: orch, Sessions: orch.Sessions(), Results: orch.Results(),
		Auth:        &gateway.KubeAuth{Client: mgr.GetClient()},
		Calibration: &gateway.ConfigMapCalibration{Reader: mgr.GetAPIReader(), Namespace: SystemNamespace},
		Limit:       rate}))
	return nil
}
