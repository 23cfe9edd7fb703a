package kingress

import (
	"fmt"
	"net/http"
	"sort"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"knative.dev/networking/pkg/apis/networking/v1alpha1"
	"knative.dev/networking/pkg/ingress"
)

// ingressRoutes is the translation of one Ingress: hosts → routes for each
// listener. It is immutable.
type ingressRoutes struct {
	key      types.NamespacedName
	external map[string][]*route
	local    map[string][]*route
	// tls maps the hosts of spec.tls to their certificate's Secret.
	tls map[string]types.NamespacedName
}

// translate turns an Ingress (defaulted, with the probe paths inserted) into
// routes. ExternalIP rules are served on both listeners, ClusterLocal rules
// only on the cluster-local one. Cluster-local hosts are expanded the way
// Knative expects (name.ns.svc.cluster.local also answers as name.ns.svc and
// name.ns).
func translate(ing *v1alpha1.Ingress, backends *Backends) (*ingressRoutes, error) {
	key := types.NamespacedName{Namespace: ing.Namespace, Name: ing.Name}
	out := &ingressRoutes{key: key, external: map[string][]*route{}, local: map[string][]*route{}, tls: map[string]types.NamespacedName{}}
	for _, t := range ing.Spec.TLS {
		ns := t.SecretNamespace
		if ns == "" {
			ns = ing.Namespace
		}
		for _, h := range t.Hosts {
			out.tls[normalizeHost(h)] = types.NamespacedName{Namespace: ns, Name: t.SecretName}
		}
	}
	redirect := ing.Spec.HTTPOption == v1alpha1.HTTPOptionRedirected
	for i, rule := range ing.Spec.Rules {
		if rule.HTTP == nil {
			return nil, fmt.Errorf("rule %d has no http block", i)
		}
		routes := make([]*route, 0, len(rule.HTTP.Paths))
		for j, p := range rule.HTTP.Paths {
			rt, err := translatePath(key, &p, backends)
			if err != nil {
				return nil, fmt.Errorf("rule %d path %d: %w", i, j, err)
			}
			rt.redirectHTTP = redirect && rule.Visibility != v1alpha1.IngressVisibilityClusterLocal
			routes = append(routes, rt)
		}
		hosts := sets.List(ingress.ExpandedHosts(sets.New(rule.Hosts...)))
		if len(rule.Hosts) == 0 {
			hosts = []string{wildcardHost}
		}
		for _, h := range hosts {
			h = normalizeHost(h)
			out.local[h] = append(out.local[h], routes...)
			if rule.Visibility != v1alpha1.IngressVisibilityClusterLocal {
				out.external[h] = append(out.external[h], routes...)
			}
		}
	}
	return out, nil
}

func translatePath(key types.NamespacedName, p *v1alpha1.HTTPIngressPath, backends *Backends) (*route, error) {
	if len(p.Splits) == 0 {
		return nil, fmt.Errorf("no splits")
	}
	rt := &route{
		ingress:       key,
		path:          p.Path,
		rewriteHost:   p.RewriteHost,
		appendHeaders: headerList(p.AppendHeaders),
	}
	if rt.path == "" {
		rt.path = "/"
	}
	for name, m := range p.Headers {
		rt.headers = append(rt.headers, headerKV{name: http.CanonicalHeaderKey(name), value: m.Exact})
	}
	sort.Slice(rt.headers, func(i, j int) bool { return rt.headers[i].name < rt.headers[j].name })
	for _, s := range p.Splits {
		if s.Percent < 0 {
			return nil, fmt.Errorf("split to %s/%s has a negative percent", s.ServiceNamespace, s.ServiceName)
		}
		ns := s.ServiceNamespace
		if ns == "" {
			ns = key.Namespace
		}
		rt.splits = append(rt.splits, split{
			backend:       backends.get(ns, s.ServiceName, s.ServicePort),
			percent:       s.Percent,
			appendHeaders: headerList(s.AppendHeaders),
		})
		rt.totalPercent += s.Percent
	}
	return rt, nil
}

// headerList returns the headers in a stable order, names canonical.
func headerList(m map[string]string) []headerKV {
	if len(m) == 0 {
		return nil
	}
	out := make([]headerKV, 0, len(m))
	for k, v := range m {
		out = append(out, headerKV{name: http.CanonicalHeaderKey(k), value: v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// hostsOf lists the hosts an ingress claims on each listener.
func (ir *ingressRoutes) hostsOf() (external, local []string) {
	for h := range ir.external {
		external = append(external, h)
	}
	for h := range ir.local {
		local = append(local, h)
	}
	return external, local
}
