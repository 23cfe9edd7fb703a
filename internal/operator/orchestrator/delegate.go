package orchestrator

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/internal/engine"
	"github.com/ziptrail/ziptrail/internal/invocation/podpick"
	"github.com/ziptrail/ziptrail/internal/operator/control"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// Delegated firing (docs/control-stream.md, docs/design.md): with
// Options.Delegate the workflow's Immediate and ByName triggers are handed
// to its pods' sidecars, which fire them on their functions' outputs
// themselves and say so on the objects they report; the engine records
// those firings (engine.Action.Delegated) and the orchestrator does not
// send them again.

var delegatedFirings = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "ziptrail_engine_delegated_firings_total",
	Help: "Trigger firings a producer's sidecar made itself (delegated Immediate and ByName triggers), recorded without being sent.",
})

func init() { metrics.Registry.MustRegister(delegatedFirings) }

// delegations holds the Delegations message of every workflow with
// delegation on, for the sidecars that connect.
type delegations struct {
	mu sync.RWMutex
	by map[string]*controlv1.Delegations // workflow key -> its triggers
	// src is what each workflow's set was made from, made again while
	// the targets' ready pods change (refreshDelegations).
	src map[string]delegationSource
}

// delegationSource holds the workflow's names, not the reconciler's
// Workflow: the reconciler goes on writing that object (its status) while
// refreshDelegations reads this on its own goroutine.
type delegationSource struct {
	namespace, name string
	spec            engine.WorkflowSpec
}

// readyPods is what direct routing knows of a Knative Service's ready
// pods (direct.Router.Ready): Options.Router, when it has it.
type readyPods interface {
	Ready(namespace, service string) []podpick.Pod
}

// delegationRefresh is how often the delegated targets' ready pods are
// compared with what the sidecars were sent (direct routing).
const delegationRefresh = time.Second

// refreshDelegations sends the workflows' sidecars their delegated
// triggers again when the targets' ready pods changed, until ctx ends.
func (o *Orchestrator) refreshDelegations(ctx context.Context) {
	if _, ok := o.opts.Router.(readyPods); !ok || !o.opts.Delegate {
		return
	}
	t := time.NewTicker(delegationRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		o.deleg.mu.RLock()
		srcs := make([]delegationSource, 0, len(o.deleg.src))
		for _, s := range o.deleg.src {
			srcs = append(srcs, s)
		}
		o.deleg.mu.RUnlock()
		for _, s := range srcs {
			o.setDelegations(s.namespace, s.name, s.spec, true)
		}
	}
}

// delegationTimeout bounds resolving a workflow's routes.
const delegationTimeout = 5 * time.Second

// setDelegations computes a workflow's delegable triggers with their
// targets' routes (the URLs the dispatcher invokes; with direct routing,
// the ready pods too) and sends them to its pods' sidecars, when they
// changed. A target whose route is not known yet is left out: the
// engine fires it. Without Options.Delegate, or with the workflow not
// ready, the set is empty (the sidecars fire nothing themselves).
func (o *Orchestrator) setDelegations(namespace, name string, spec engine.WorkflowSpec, ready bool) {
	key := Key(namespace, name)
	msg := &controlv1.Delegations{}
	if o.opts.Delegate && ready {
		ctx, cancel := context.WithTimeout(context.Background(), delegationTimeout)
		defer cancel()
		for _, t := range spec.Triggers {
			if !engine.Delegable(t) {
				continue
			}
			for _, target := range t.Targets {
				svc := v1alpha1ServiceName(name, target)
				u, err := o.opts.Resolver.URL(ctx, namespace, svc)
				if err != nil {
					continue
				}
				dt := &controlv1.DelegatedTrigger{Trigger: t.Name, Bucket: t.Bucket, Key: t.Key,
					Function: target, Service: svc, Url: u.String(), Ingress: o.opts.Ingress}
				if rp, ok := o.opts.Router.(readyPods); ok {
					for _, p := range rp.Ready(namespace, svc) {
						dt.Pods = append(dt.Pods, &controlv1.Pod{Addr: p.Addr, Node: p.Node})
					}
				}
				msg.Triggers = append(msg.Triggers, dt)
			}
		}
	}
	o.deleg.mu.Lock()
	if o.deleg.by == nil {
		o.deleg.by = map[string]*controlv1.Delegations{}
		o.deleg.src = map[string]delegationSource{}
	}
	if o.opts.Delegate && ready {
		o.deleg.src[key] = delegationSource{namespace: namespace, name: name, spec: spec}
	} else {
		delete(o.deleg.src, key)
	}
	old := o.deleg.by[key]
	if len(msg.Triggers) == 0 {
		delete(o.deleg.by, key)
	} else {
		o.deleg.by[key] = msg
	}
	o.deleg.mu.Unlock()
	if (old != nil || len(msg.Triggers) > 0) && !proto.Equal(old, msg) && o.opts.Control != nil {
		_ = o.opts.Control.SendWorkflow(namespace, name, &controlv1.OperatorMessage{Msg: &controlv1.OperatorMessage_Delegations{Delegations: msg}})
	}
}

// Welcome implements control.Welcomer: a sidecar whose stream was just
// accepted gets its workflow's delegated triggers (none: nothing sent).
func (o *Orchestrator) Welcome(id control.Identity) []*controlv1.OperatorMessage {
	o.deleg.mu.RLock()
	msg := o.deleg.by[Key(id.Namespace, id.Workflow)]
	o.deleg.mu.RUnlock()
	if msg == nil {
		return nil
	}
	return []*controlv1.OperatorMessage{{Msg: &controlv1.OperatorMessage_Delegations{Delegations: msg}}}
}

// returned reports an invocation's return value as the objects of its
// function's dependency buckets, as the dispatcher does from a response,
// adding their names to sent.
func (o *Orchestrator) returned(key, session, fn, inv string, ret []byte, sent map[string]bool, now time.Time) {
	info := o.workflow(key)
	if info == nil {
		return
	}
	// Every invocation's return value is an object of its own.
	rk := v1alpha1.ReturnKey(fn, strings.TrimPrefix(engine.BaseInvocation(inv), session+"."))
	for _, b := range info.outputs[fn] {
		sent[b+"/"+rk] = true
		o.objectReady(key, engine.Object{Bucket: b, Key: rk, Session: session, Size: int64(len(ret)), Inline: nonNil(ret),
			Producer: fn, Invocation: inv}, now)
	}
}
