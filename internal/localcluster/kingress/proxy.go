package kingress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Proxy is the data path of one listener (external or cluster-local): it
// routes by the Table published last and forwards to the backends' ready
// endpoints. Its zero Table answers 404 to everything.
type Proxy struct {
	name string
	// redirects makes routes with redirectHTTP answer 301 to https: set
	// on the plain-HTTP external listener only.
	redirects bool
	table     atomic.Pointer[Table]
	h1, h2    *httputil.ReverseProxy
	logger    *zap.SugaredLogger
}

// target is what ServeHTTP decided, handed to the reverse proxy's Rewrite
// and to the dialer through the request context.
type target struct {
	addrs []string
	first int
	host  string // Host header to send
	b     *Backend
	body  *bodyReader
}

// bodyReader remembers why reading the client's body failed, so that a
// malformed body is the client's 400, not the backend's 502.
type bodyReader struct {
	io.ReadCloser
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

type targetKey struct{}

// NewProxy returns the data path of the listener called name (used in
// error messages).
func NewProxy(name string, logger *zap.SugaredLogger) *Proxy {
	p := &Proxy{name: name, logger: logger}
	p.init()
	return p
}

// sibling returns a proxy of another name for the same routes (the HTTPS
// side of the external listener), sharing p's transports.
func (p *Proxy) sibling(name string) *Proxy {
	q := &Proxy{name: name, logger: p.logger, h1: p.h1, h2: p.h2}
	q.table.Store(p.table.Load())
	return q
}

func (p *Proxy) init() {
	p.table.Store(newTable())
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		return dialTarget(ctx, dialer, network, addr)
	}
	h1 := &http.Transport{
		DialContext:           dial,
		MaxIdleConns:          1000,
		MaxIdleConnsPerHost:   100,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}
	h2 := &http.Transport{
		DialContext:        dial,
		IdleConnTimeout:    90 * time.Second,
		DisableCompression: true,
		Protocols:          new(http.Protocols),
	}
	h2.Protocols.SetUnencryptedHTTP2(true)
	p.h1 = p.reverseProxy(h1)
	p.h2 = p.reverseProxy(h2)
}

func (p *Proxy) reverseProxy(t http.RoundTripper) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Transport: t,
		Rewrite: func(pr *httputil.ProxyRequest) {
			tg := pr.In.Context().Value(targetKey{}).(*target)
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = tg.addrs[tg.first]
			pr.Out.Host = tg.host
			if xff := pr.In.Header["X-Forwarded-For"]; xff != nil {
				pr.Out.Header["X-Forwarded-For"] = xff
			}
			pr.SetXForwarded()
		},
		ErrorHandler: p.proxyError,
		BufferPool:   bufferPool{},
	}
}

// bufferPool recycles the 32 KiB buffers the reverse proxy copies bodies
// through, so a request costs no buffer allocation.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *buffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { buffers.Put(&b) }

// SetTable publishes a new routing snapshot.
func (p *Proxy) SetTable(t *Table) { p.table.Store(t) }

// ServeHTTP routes one request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rt, hostKnown := p.table.Load().lookup(r)
	if rt == nil {
		if !hostKnown {
			http.Error(w, fmt.Sprintf("no ingress on the %s listener serves host %q", p.name, normalizeHost(r.Host)), http.StatusNotFound)
		} else {
			http.Error(w, fmt.Sprintf("no ingress path of host %q matches %q", normalizeHost(r.Host), r.URL.Path), http.StatusNotFound)
		}
		return
	}
	// Knative's readiness probes are not redirected: they must reach the
	// backend to get the spec's hash echoed.
	if rt.redirectHTTP && p.redirects && r.Header.Get("K-Network-Probe") == "" {
		u := *r.URL
		u.Scheme, u.Host = "https", normalizeHost(r.Host)
		http.Redirect(w, r, u.String(), http.StatusMovedPermanently)
		return
	}
	s := rt.pick()
	ep := s.backend.current()
	if len(ep.addrs) == 0 {
		http.Error(w, ep.problem, http.StatusServiceUnavailable)
		return
	}
	for _, h := range s.appendHeaders {
		r.Header.Set(h.name, h.value)
	}
	for _, h := range rt.appendHeaders {
		r.Header.Set(h.name, h.value)
	}
	tg := &target{addrs: ep.addrs, first: int(s.backend.next.Add(1) % uint32(len(ep.addrs))), host: r.Host, b: s.backend}
	if rt.rewriteHost != "" {
		tg.host = rt.rewriteHost
	}
	if r.Body != nil && r.Body != http.NoBody {
		tg.body = &bodyReader{ReadCloser: r.Body}
		r.Body = tg.body
	}
	r = r.WithContext(context.WithValue(r.Context(), targetKey{}, tg))
	if ep.h2c {
		p.h2.ServeHTTP(w, r)
	} else {
		p.h1.ServeHTTP(w, r)
	}
}

// proxyError answers 502 when no endpoint could be reached, naming the
// Service, and stays quiet when the client went away.
func (p *Proxy) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(r.Context().Err(), context.Canceled) {
		w.WriteHeader(499)
		return
	}
	tg, _ := r.Context().Value(targetKey{}).(*target)
	if tg != nil && tg.body != nil && tg.body.err != nil {
		http.Error(w, "malformed request body: "+tg.body.err.Error(), http.StatusBadRequest)
		return
	}
	name := "backend"
	if tg != nil {
		name = "service " + tg.b.key.String()
	}
	p.logger.Debugw("proxy error", "backend", name, "error", err)
	http.Error(w, fmt.Sprintf("%s: %v", name, err), http.StatusBadGateway)
}

// dialTarget dials the endpoint the request was assigned and, when that
// connection is refused, the request's other endpoints in turn: nothing of
// the request has been sent yet, so this is safe for any method.
func dialTarget(ctx context.Context, d *net.Dialer, network, addr string) (net.Conn, error) {
	conn, err := d.DialContext(ctx, network, addr)
	tg, _ := ctx.Value(targetKey{}).(*target)
	if err == nil || tg == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		return conn, err
	}
	for i := 1; i < len(tg.addrs); i++ {
		alt := tg.addrs[(tg.first+i)%len(tg.addrs)]
		if alt == addr {
			continue
		}
		c, e := d.DialContext(ctx, network, alt)
		if e == nil {
			return c, nil
		}
		if !errors.Is(e, syscall.ECONNREFUSED) {
			return nil, e
		}
	}
	return nil, err
}
