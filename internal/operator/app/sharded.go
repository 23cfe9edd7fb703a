package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/controllers"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/operator/orchestrator"
	"github.com/ziptrail/ziptrail/internal/operator/sharding"
)

// engine is what the operator's other parts use of the trigger engine,
// one engine on the leader or one per owned bucket.
type engine struct {
	sink     controllers.WorkflowSink
	events   control.Events
	starter  gateway.Starter
	sessions gateway.SessionStore
	results  gateway.ResultReader
	// run drives the engine; connect links the control server to it.
	run     func(ctx context.Context) error
	connect func(*control.Server)
	// sharded: set when every replica serves (its buckets).
	sharded *shardedParts
}

type shardedParts struct {
	set    *sharding.Set
	engine *orchestrator.Sharded
	srv    *control.Server // set by connect
}

func singleEngine(o *orchestrator.Orchestrator) *engine {
	return &engine{sink: o, events: o, starter: o, sessions: o.Sessions(), results: o.Results(), run: o.Run, connect: o.SetControl}
}

// shardedEngine builds the bucket elections and the sharded engine.
func shardedEngine(cfg *rest.Config, mgr manager.Manager, sc ShardConfig, leaseNS string, opts orchestrator.Options) (*engine, error) {
	if sc.Identity == "" {
		return nil, errors.New("--engine-buckets needs --engine-identity (or $POD_IP, from the downward API): the address other replicas redirect and proxy to")
	}
	if leaseNS == "" {
		leaseNS = os.Getenv("POD_NAMESPACE")
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	zl, err := zap.NewProduction()
	if err != nil {
		return nil, err
	}
	set, err := sharding.New(kc, sharding.Config{Buckets: sc.Buckets, Identity: sc.Identity, Namespace: leaseNS,
		LeaseDuration: sc.Lease, RenewDeadline: sc.Renew, RetryPeriod: sc.Retry, Log: zl.Sugar().Named("buckets"),
		Owner: podOwner(kc, leaseNS, zl.Sugar())})
	if err != nil {
		return nil, err
	}
	parts := &shardedParts{set: set}
	eng, err := orchestrator.NewSharded(orchestrator.ShardedOptions{Options: opts, Buckets: set, Identity: sc.Identity,
		Workflows: func(ctx context.Context) ([]types.NamespacedName, error) {
			// A bucket may be won before the manager's cache has synced.
			l, err := listWorkflows(ctx, mgr)
			if err != nil {
				return nil, err
			}
			out := make([]types.NamespacedName, len(l))
			for i, w := range l {
				out[i] = types.NamespacedName{Namespace: w.Namespace, Name: w.Name}
			}
			return out, nil
		},
		OnMove: func(bucket string, owned bool) {
			if owned || parts.srv == nil {
				return
			}
			// The bucket's sidecars go back to the control Service, which
			// sends them on to the new owner.
			parts.srv.Moved(func(id control.Identity) bool { return set.BucketOf(id.Namespace, id.Workflow) == bucket },
				&controlv1.Redirect{Bucket: bucket})
		},
	})
	if err != nil {
		return nil, err
	}
	parts.engine = eng
	return &engine{sink: eng, events: eng, starter: eng, sessions: eng.Sessions(), results: eng.Results(), sharded: parts,
		connect: func(s *control.Server) { parts.srv = s; eng.SetControl(s) },
		run: func(ctx context.Context) error {
			// The elections outlive the engine: its buckets are saved a
			// last time before their Leases are released.
			electCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
			elected := make(chan error, 1)
			go func() { elected <- set.Run(electCtx, eng) }()
			err := eng.Run(ctx)
			stop()
			return errors.Join(err, <-elected)
		}}, nil
}

// routers send the control stream and gateway calls of other replicas'
// workflows to them: every replica listens on the same ports.
func (p *shardedParts) router(addr string) (*sharding.Router, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("bind address %q: %w", addr, err)
	}
	return &sharding.Router{Set: p.set, Serving: p.engine.Serving, Port: port}, nil
}

// controlRoute is the control server's Router.
func (p *shardedParts) controlRoute(r *sharding.Router) control.Router {
	return func(ctx context.Context, id control.Identity) (*controlv1.Redirect, error) {
		addr, bucket, err := r.Route(ctx, id.Namespace, id.Workflow)
		if err != nil || addr == "" {
			return nil, err
		}
		return &controlv1.Redirect{Address: addr, Bucket: bucket}, nil
	}
}

// everyReplica is a runnable that runs on every replica, elected or not.
type everyReplica func(ctx context.Context) error

func (f everyReplica) Start(ctx context.Context) error { return f(ctx) }
func (everyReplica) NeedLeaderElection() bool          { return false }

// podOwner is this replica's Pod ($POD_NAME in the Leases' namespace), as
// the owner of its announcement Lease, which the garbage collector then
// deletes with the pod; nil outside a pod or when the pod cannot be read.
func podOwner(kc kubernetes.Interface, namespace string, log *zap.SugaredLogger) *metav1.OwnerReference {
	name := os.Getenv("POD_NAME")
	if name == "" || os.Getenv("POD_NAMESPACE") != namespace {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pod, err := kc.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		log.Warnw("read this replica's pod: its announcement Lease will not be deleted with it", "pod", name, "error", err)
		return nil
	}
	return &metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}
}

// listWorkflows lists every Workflow from the manager's cache, once it has
// synced (a new owner may start before it has).
func listWorkflows(ctx context.Context, mgr manager.Manager) ([]v1alpha1.Workflow, error) {
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		return nil, errors.New("the manager's cache did not sync")
	}
	var l v1alpha1.WorkflowList
	err := mgr.GetClient().List(ctx, &l)
	return l.Items, err
}
