package kingress

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"knative.dev/networking/pkg/apis/networking/v1alpha1"
	ingressreconciler "knative.dev/networking/pkg/client/injection/reconciler/networking/v1alpha1/ingress"
	"knative.dev/networking/pkg/ingress"
	"knative.dev/networking/pkg/status"
	"knative.dev/pkg/logging"
	pkgreconciler "knative.dev/pkg/reconciler"
)

// ClassName is the ingress class this implementation serves (the value of
// the networking.knative.dev/ingress.class annotation, and of
// config-network's ingress-class to make Knative Serving use it).
const ClassName = "ziptrail.ingress.networking.knative.dev"

// Reconciler programs the proxies from Ingresses and reports readiness.
type Reconciler struct {
	backends        *Backends
	external, local *Proxy
	// secure serves the external routes over HTTPS with certs (optional).
	secure *Proxy
	certs  *certStore
	prober interface {
		IsReady(context.Context, *v1alpha1.Ingress) (bool, error)
		CancelIngressProbingByKey(types.NamespacedName)
	}
	publicLB, privateLB []v1alpha1.LoadBalancerIngressStatus

	// enqueue re-reconciles an Ingress (the controller's EnqueueKey).
	enqueue func(types.NamespacedName)

	mu         sync.Mutex
	programmed map[types.NamespacedName]*ingressRoutes
	// conflicted are the Ingresses refused for a host another one holds;
	// they are retried when an Ingress goes away.
	conflicted map[types.NamespacedName]bool
}

var (
	_ ingressreconciler.Interface       = (*Reconciler)(nil)
	_ ingressreconciler.Finalizer       = (*Reconciler)(nil)
	_ pkgreconciler.OnDeletionInterface = (*Reconciler)(nil)
	_ status.Manager                    = (*status.Prober)(nil)
)

// ReconcileKind translates the Ingress, publishes the new route tables and
// marks the load balancer ready once the prober saw both listeners serve this
// spec (the hash of the spec before the probe paths are inserted).
func (r *Reconciler) ReconcileKind(ctx context.Context, ing *v1alpha1.Ingress) pkgreconciler.Event {
	ing.SetDefaults(ctx)
	before := ing.DeepCopy()
	if err := r.program(ing); err != nil {
		if conflict, ok := err.(*domainConflict); ok {
			ing.Status.MarkLoadBalancerFailed("DomainConflict", conflict.Error())
			return nil
		}
		ing.Status.MarkIngressNotReady("ReconcileIngressFailed", err.Error())
		return err
	}
	ing.Status.MarkNetworkConfigured()
	ready, err := r.prober.IsReady(ctx, before)
	if err != nil {
		ing.Status.MarkIngressNotReady("ProbeFailed", err.Error())
		return fmt.Errorf("probing ingress %s/%s: %w", ing.Namespace, ing.Name, err)
	}
	if ready {
		ing.Status.MarkLoadBalancerReady(r.publicLB, r.privateLB)
	} else {
		ing.Status.MarkLoadBalancerNotReady()
	}
	return nil
}

// FinalizeKind removes the Ingress's routes.
func (r *Reconciler) FinalizeKind(ctx context.Context, ing *v1alpha1.Ingress) pkgreconciler.Event {
	r.ObserveDeletion(ctx, types.NamespacedName{Namespace: ing.Namespace, Name: ing.Name})
	return nil
}

// ObserveDeletion removes the routes of an Ingress that is gone.
func (r *Reconciler) ObserveDeletion(ctx context.Context, key types.NamespacedName) error {
	r.prober.CancelIngressProbingByKey(key)
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.conflicted, key)
	if _, ok := r.programmed[key]; ok {
		delete(r.programmed, key)
		r.publishLocked()
		logging.FromContext(ctx).Infow("ingress removed", "ingress", key.String())
		for k := range r.conflicted {
			r.enqueue(k)
		}
	}
	return nil
}

type domainConflict struct{ host, owner string }

func (d *domainConflict) Error() string {
	return fmt.Sprintf("host %q is already served by ingress %s", d.host, d.owner)
}

// program translates ing (a copy gets the probe paths) and publishes it,
// unless one of its hosts belongs to another Ingress.
func (r *Reconciler) program(ing *v1alpha1.Ingress) error {
	work := ing.DeepCopy()
	if _, err := ingress.InsertProbe(work); err != nil {
		return err
	}
	// Translate under the lock: publishLocked forgets unused Backends, and
	// must not drop one a concurrent translation has just taken.
	r.mu.Lock()
	defer r.mu.Unlock()
	ir, err := translate(work, r.backends)
	if err != nil {
		return err
	}
	ext, loc := ir.hostsOf()
	for k, other := range r.programmed {
		if k == ir.key {
			continue
		}
		for _, h := range ext {
			if _, ok := other.external[h]; ok {
				r.conflicted[ir.key] = true
				return &domainConflict{host: h, owner: k.String()}
			}
		}
		for _, h := range loc {
			if _, ok := other.local[h]; ok {
				r.conflicted[ir.key] = true
				return &domainConflict{host: h, owner: k.String()}
			}
		}
	}
	delete(r.conflicted, ir.key)
	r.programmed[ir.key] = ir
	r.publishLocked()
	return nil
}

// publishLocked rebuilds both tables from every programmed Ingress and
// forgets the Backends none of them uses.
func (r *Reconciler) publishLocked() {
	keys := make([]types.NamespacedName, 0, len(r.programmed))
	for k := range r.programmed {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return strings.Compare(keys[i].String(), keys[j].String()) < 0 })
	ext := make([]map[string][]*route, 0, len(keys))
	loc := make([]map[string][]*route, 0, len(keys))
	used := map[*Backend]bool{}
	for _, k := range keys {
		ir := r.programmed[k]
		ext = append(ext, ir.external)
		loc = append(loc, ir.local)
		for _, rs := range ir.local {
			for _, rt := range rs {
				for _, s := range rt.splits {
					used[s.backend] = true
				}
			}
		}
	}
	extTable := newTable(ext...)
	r.external.SetTable(extTable)
	r.local.SetTable(newTable(loc...))
	if r.secure != nil {
		r.secure.SetTable(extTable)
	}
	if r.certs != nil {
		hosts := map[string]types.NamespacedName{}
		for _, k := range keys {
			for h, s := range r.programmed[k].tls {
				hosts[h] = s
			}
		}
		r.certs.set(hosts)
	}
	r.backends.retain(used)
}
