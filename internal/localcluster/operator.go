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

	"github.com/ziptrail/ziptrail/internal/operator/app"
	"github.com/ziptrail/ziptrail/internal/operator/checkpoint"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
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

// startOperator runs the operator as the chart's does (internal/operator/app),
// with the controllers and the trigger engine with its dispatcher (through
// the local ingress), the control stream (on cl, the bridge address, which
// pods reach) and the session gateway.
func (c *Cluster) startOperator(ctx context.Context, cl net.Listener) error {
	mgr, err := newManager(c.Config)
	if err != nil {
		cl.Close()
		return err
	}
	inputsLn, err := net.Listen("tcp", c.InputsAddr)
	if err != nil {
		cl.Close()
		return err
	}
	cfg := app.DefaultConfig() // the chart's defaults, limits included (docs/limits.md)
	// Invocations go to the functions' cluster-local URLs
	// (<service>.<namespace>.svc.cluster.local), which Knative routes
	// through the cluster-local gateway.
	cfg.Ingress = strings.TrimPrefix(c.Knative.IngressLocalURL, "http://")
	cfg.InputsAddr, cfg.InputsAdvertise = c.InputsAddr, c.InputsAddr
	// Delegated firing (docs/design.md), as the chart's
	// engine.delegateTriggers.
	cfg.Delegate = c.DelegateTriggers()
	cfg.RedisAddr, cfg.S3Endpoint = c.RedisAddr, c.S3Endpoint
	cfg.ControlService = serviceHost(controlService, controlPort)
	opts := app.Options{
		// Straight to ready pods, as the chart's operator (its
		// --direct-dispatch); the switch is the cluster's, for benchmarks.
		Router: switchedRouter{c: c, r: &direct.Router{Reader: mgr.GetClient()}},
		// The sidecars' tiers, over the authenticated stream: the Services
		// that lead to this host's redis-server and MinIO (advertised in Up).
		Tiers: &controlv1.Tiers{},
		// The shuffle planner reads the calibration where the chart's
		// operator would: `ziptrail calibrate --configmap ziptrail-system/…`
		// on this cluster.
		Calibration: &gateway.ConfigMapCalibration{Reader: mgr.GetAPIReader(), Namespace: SystemNamespace},
	}
	if c.RedisAddr != "" {
		opts.Tiers.RedisAddr = serviceHost(redisService, redisPort)
	}
	if c.S3Endpoint != "" {
		opts.Tiers.S3Endpoint, opts.Tiers.S3AccessKey, opts.Tiers.S3SecretKey, opts.Tiers.S3Bucket =
			serviceHost(s3Service, s3Port), s3AccessKey, s3SecretKey, s3Bucket
	}
	if c.tiers.redis != nil {
		opts.Checkpoint = &checkpoint.Store{Client: c.tiers.redis, Key: cfg.CheckpointKey}
		opts.CheckpointInterval = CheckpointInterval
	}
	// Sidecars present the projected token Knative mounts for the audience
	// in config-deployment's queue-sidecar-token-audiences (set in Up).
	op, err := app.New(mgr, c.Config, cfg, opts)
	if err != nil {
		cl.Close()
		_ = inputsLn.Close()
		return err
	}
	go func() { _ = op.Inputs.Serve(inputsLn) }()
	gs := app.NewControlServer(op.Control)
	go func() { _ = gs.Serve(op.Control.Listener(cl)) }()
	var gen int64
	if opts.Checkpoint != nil {
		if _, gen, _, err = opts.Checkpoint.Load(ctx); err != nil {
			gs.Stop()
			_ = op.Inputs.Close()
			return fmt.Errorf("read the engine checkpoint: %w", err)
		}
	}
	c.operator = &operatorRun{runner: start(ctx, mgr), orch: op.Orchestrator, control: gs, srv: op.Control, inputs: op.Inputs}
	go c.supervise(c.operator)
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
	c.gw.Store(op.Gateway)
	return nil
}
