// Package admin is the Go SDK's admin client: it creates, updates, reads
// and deletes ziptrail's Buckets, Triggers and Workflows (a
// controller-runtime client with the repository's API types), and runs
// workflow sessions through the operator's session gateway (start, stream
// progress, wait for the result).
package admin

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	"google.golang.org/grpc"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// Options configure a Client.
type Options struct {
	// Namespace is used for objects and sessions that name none; default
	// "default".
	Namespace string
	// Gateway is the operator's session gateway (gRPC), host:port, e.g.
	// "ziptrail-gateway.ziptrail-system:8089". Empty disables sessions.
	// Every call carries the REST config's credentials (its bearer token,
	// token file or exec/auth-provider plugin), which the gateway checks
	// with TokenReview and SubjectAccessReview: bind the user to the
	// ClusterRole ziptrail-session-runner in the namespace.
	Gateway string
	// GatewayToken, when set, is the bearer token sent to the gateway
	// instead of the REST config's credentials (e.g. for a kubeconfig that
	// authenticates with a client certificate, which the gateway cannot
	// check: `kubectl create token <serviceaccount>`).
	GatewayToken string
	// GatewayDialOptions replace the default (plaintext) dial options; the
	// credentials are added to them.
	GatewayDialOptions []grpc.DialOption
	// RetryFor bounds how long a session call is retried while the
	// gateway cannot be reached or answers UNAVAILABLE (a rollout of the
	// operator, its engine moving between replicas): exponential back-off
	// with jitter within that budget. Default 2 minutes; negative: no
	// retries. Starts are retried safely: each carries an idempotency key,
	// so a start whose answer was lost answers the same session again.
	RetryFor time.Duration
	// OnRetry, when set, is told of each retry: the call, what failed, the
	// pause before the next try.
	OnRetry func(op string, err error, pause time.Duration)
}

// Client manages ziptrail resources and sessions. It embeds a
// controller-runtime client whose scheme knows the Kubernetes built-ins
// and ziptrail's kinds, so everything client.Client offers works; Create,
// Update, Delete and Get default the namespace and return *ziptrail.Error
// (errors.Is with ziptrail.ErrNotFound, ErrConflict, ErrInvalid) that
// still satisfy apierrors.IsNotFound and the like.
type Client struct {
	client.Client
	Namespace string

	gw      gatewayv1.GatewayClient
	conn    *grpc.ClientConn
	retry   time.Duration
	onRetry func(op string, err error, pause time.Duration)
}

// Scheme returns the scheme the client uses.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	return s
}

// Connect builds a client from the usual kubeconfig lookup (--kubeconfig,
// $KUBECONFIG, in-cluster, ~/.kube/config).
func Connect(opts Options) (*Client, error) {
	cfg, err := config.GetConfig()
	if err != nil {
		return nil, &ziptrail.Error{Kind: ziptrail.KindUnavailable, Op: "connect", Err: err}
	}
	return New(cfg, opts)
}

// New builds a client for a cluster's REST config.
func New(cfg *rest.Config, opts Options) (*Client, error) {
	kc, err := client.New(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		return nil, &ziptrail.Error{Kind: ziptrail.KindUnavailable, Op: "connect", Err: err}
	}
	c := &Client{Client: kc, Namespace: opts.Namespace, retry: opts.RetryFor, onRetry: opts.OnRetry}
	if c.Namespace == "" {
		c.Namespace = "default"
	}
	if opts.Gateway != "" {
		creds := TokenCredentials(opts.GatewayToken)
		if opts.GatewayToken == "" {
			if creds, err = NewCredentials(cfg); err != nil {
				return nil, &ziptrail.Error{Kind: ziptrail.KindInvalid, Op: "connect", Err: err}
			}
		}
		if c.conn, err = dialGateway(opts, creds); err != nil {
			return nil, &ziptrail.Error{Kind: ziptrail.KindUnavailable, Op: "connect", Err: err}
		}
		c.gw = gatewayv1.NewGatewayClient(c.conn)
	}
	return c, nil
}

// Close closes the gateway connection.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

func (c *Client) defaultNamespace(obj client.Object) {
	if obj.GetNamespace() == "" {
		obj.SetNamespace(c.Namespace)
	}
}

// Create creates obj (in the client's namespace when it names none).
func (c *Client) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.defaultNamespace(obj)
	return c.apiError(ctx, "create", obj, c.Client.Create(ctx, obj, opts...))
}

// Update replaces obj, which must carry the resourceVersion it was read at.
func (c *Client) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.defaultNamespace(obj)
	return c.apiError(ctx, "update", obj, c.Client.Update(ctx, obj, opts...))
}

// Delete deletes obj. A Workflow's deletion removes what it owns (its
// Services, Buckets and Triggers) by garbage collection.
func (c *Client) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	c.defaultNamespace(obj)
	return c.apiError(ctx, "delete", obj, c.Client.Delete(ctx, obj, opts...))
}

// Get reads the object named key (in the client's namespace when key
// names none) into obj.
func (c *Client) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if key.Namespace == "" {
		key.Namespace = c.Namespace
	}
	obj.SetName(key.Name) // for the error message, should the read fail
	obj.SetNamespace(key.Namespace)
	return c.apiError(ctx, "get", obj, c.Client.Get(ctx, key, obj, opts...))
}

// Apply creates obj, or when it exists replaces its spec, labels and
// annotations with obj's (retrying on concurrent changes). obj ends up
// holding the stored object.
func (c *Client) Apply(ctx context.Context, obj client.Object) error {
	c.defaultNamespace(obj)
	err := c.Client.Create(ctx, obj)
	if !apierrors.IsAlreadyExists(err) {
		return c.apiError(ctx, "apply", obj, err)
	}
	want := obj.DeepCopyObject().(client.Object)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Client.Get(ctx, client.ObjectKeyFromObject(want), obj); err != nil {
			return err
		}
		next := want.DeepCopyObject().(client.Object)
		next.SetResourceVersion(obj.GetResourceVersion())
		if err := c.Client.Update(ctx, next); err != nil {
			return err
		}
		return c.Client.Get(ctx, client.ObjectKeyFromObject(want), obj)
	})
	return c.apiError(ctx, "apply", obj, err)
}

// Bucket reads a Bucket of the client's namespace.
func (c *Client) Bucket(ctx context.Context, name string) (*v1alpha1.Bucket, error) {
	b := &v1alpha1.Bucket{}
	return b, c.Get(ctx, client.ObjectKey{Name: name}, b)
}

// Trigger reads a Trigger of the client's namespace.
func (c *Client) Trigger(ctx context.Context, name string) (*v1alpha1.Trigger, error) {
	t := &v1alpha1.Trigger{}
	return t, c.Get(ctx, client.ObjectKey{Name: name}, t)
}

// Workflow reads a Workflow of the client's namespace.
func (c *Client) Workflow(ctx context.Context, name string) (*v1alpha1.Workflow, error) {
	w := &v1alpha1.Workflow{}
	return w, c.Get(ctx, client.ObjectKey{Name: name}, w)
}

// WaitWorkflowReady polls a Workflow until its Ready condition is True
// (its functions are deployed and its triggers resolved) or ctx ends.
func (c *Client) WaitWorkflowReady(ctx context.Context, name string) (*v1alpha1.Workflow, error) {
	var wf *v1alpha1.Workflow
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var err error
		if wf, err = c.Workflow(ctx, name); err != nil {
			return false, err
		}
		return meta.IsStatusConditionTrue(wf.Status.Conditions, v1alpha1.ConditionReady), nil
	})
	if err != nil && ctx.Err() != nil {
		reason := "no Ready condition yet"
		if wf != nil {
			if cond := meta.FindStatusCondition(wf.Status.Conditions, v1alpha1.ConditionReady); cond != nil {
				reason = cond.Reason + ": " + cond.Message
			}
		}
		return wf, &ziptrail.Error{Kind: ziptrail.KindTimeout, Op: "wait workflow", Err: fmt.Errorf("%s/%s not ready (%s): %w", c.Namespace, name, reason, ctx.Err())}
	}
	return wf, err
}

// apiError classifies an API server error, keeping it wrapped.
func (c *Client) apiError(ctx context.Context, op string, obj client.Object, err error) error {
	if err == nil {
		return nil
	}
	var e *ziptrail.Error
	if errors.As(err, &e) {
		return err
	}
	kind := ziptrail.KindInternal
	switch {
	case apierrors.IsNotFound(err):
		kind = ziptrail.KindNotFound
	case apierrors.IsAlreadyExists(err), apierrors.IsConflict(err):
		kind = ziptrail.KindConflict
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		kind = ziptrail.KindInvalid
	case ctx.Err() != nil, apierrors.IsTimeout(err), apierrors.IsServerTimeout(err):
		kind = ziptrail.KindTimeout
	case apierrors.IsServiceUnavailable(err), apierrors.IsUnauthorized(err), apierrors.IsForbidden(err):
		kind = ziptrail.KindUnavailable
	}
	name := obj.GetNamespace() + "/" + obj.GetName()
	if gvks, _, gerr := c.Scheme().ObjectKinds(obj); gerr == nil && len(gvks) > 0 {
		name = gvks[0].Kind + " " + name
	}
	return &ziptrail.Error{Kind: kind, Op: op, Err: fmt.Errorf("%s: %w", name, err)}
}
