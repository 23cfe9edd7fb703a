package localserving

import (
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
)

// Router is the local cluster's ingress: it routes a request by its Host
// (<service>.<namespace>.<domain>) to a ready pod's queue-proxy, like
// Knative's ingress and activator do.
type Router struct {
	rt    *Runtime
	proxy *httputil.ReverseProxy
}

// NewRouter returns the ingress handler for the runtime's Services.
func NewRouter(rt *Runtime) *Router {
	r := &Router{rt: rt}
	r.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = pr.In.Context().Value(targetKey{}).(string)
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
		},
		// 0: a response of known length goes out in one write; streamed
		// ones (unknown length, text/event-stream) are still flushed at
		// once by ReverseProxy. -1 flushed headers and body separately,
		// two writes and two wake-ups of the caller per invocation.
		FlushInterval: 0,
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			http.Error(w, "ziptrail local ingress: "+err.Error(), http.StatusBadGateway)
		},
	}
	return r
}

type targetKey struct{}

func (r *Router) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	suffix := "." + r.rt.opts.Domain
	name, ns, ok := strings.Cut(strings.TrimSuffix(host, suffix), ".")
	if !strings.HasSuffix(host, suffix) || !ok || name == "" || ns == "" {
		http.Error(w, "ziptrail local ingress: host "+host+" is not <service>.<namespace>"+suffix, http.StatusNotFound)
		return
	}
	ip, ok := r.rt.pick(ns, name)
	if !ok {
		http.Error(w, "ziptrail local ingress: no ready pod for service "+ns+"/"+name, http.StatusServiceUnavailable)
		return
	}
	ctx := contextWithTarget(req, net.JoinHostPort(ip, strconv.Itoa(QueuePort)))
	r.proxy.ServeHTTP(w, req.WithContext(ctx))
}
