package kingress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"go.uber.org/zap"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"knative.dev/networking/pkg/apis/networking/v1alpha1"
	ingressinformer "knative.dev/networking/pkg/client/injection/informers/networking/v1alpha1/ingress"
	ingressreconciler "knative.dev/networking/pkg/client/injection/reconciler/networking/v1alpha1/ingress"
	"knative.dev/networking/pkg/status"
	kubeclient "knative.dev/pkg/client/injection/kube/client"
	secretinformer "knative.dev/pkg/client/injection/kube/informers/core/v1/secret"
	serviceinformer "knative.dev/pkg/client/injection/kube/informers/core/v1/service"
	endpointsliceinformer "knative.dev/pkg/client/injection/kube/informers/discovery/v1/endpointslice"
	"knative.dev/pkg/controller"
	"knative.dev/pkg/injection"
	"knative.dev/pkg/kmeta"
	"knative.dev/pkg/logging"
	pkgreconciler "knative.dev/pkg/reconciler"
)

// Options configure Run.
type Options struct {
	// Config reaches the API server.
	Config *rest.Config
	// External and Local are the listeners of the external and the
	// cluster-local gateway. Admin (optional) serves /healthz and /readyz.
	External, Local, Admin net.Listener
	// HTTPS (optional) serves the external routes over TLS, with the
	// certificates of the Ingresses' spec.tls Secrets chosen by SNI. With
	// it, spec.httpOption Redirected makes External answer 301 to https.
	HTTPS net.Listener
	// Class is the ingress class served; ClassName when empty.
	Class string
	// PublicService and PrivateService are the DomainInternal host names
	// reported in the Ingress status (Knative Serving points the route's
	// placeholder Service at the private one), normally the Services in
	// front of External and Local.
	PublicService, PrivateService string
	// Logger logs; a no-op logger when nil.
	Logger *zap.SugaredLogger
	// Threads is the number of reconciler workers (2 when 0).
	Threads int
	// Advertise (optional) points the PublicService and PrivateService
	// Services at the listeners, for a gateway outside the cluster's pods.
	Advertise *Advertise
	// MaxHeaderBytes bounds a request's line and headers
	// (DefaultMaxHeaderBytes when 0); larger ones get 431.
	MaxHeaderBytes int
}

// DefaultMaxHeaderBytes is 64 KiB, about Envoy's default limit (60 KiB),
// so requests that pass here also pass a Kourier gateway.
const DefaultMaxHeaderBytes = 64 << 10

// Run serves KIngresses until ctx ends: it syncs the informers, programs the
// proxies with every Ingress of the class that exists already (so a restart
// never serves an empty table), starts the listeners, then reconciles.
func Run(ctx context.Context, o Options) error {
	if o.Config == nil || o.External == nil || o.Local == nil {
		return errors.New("kingress: Config, External and Local are required")
	}
	if o.Class == "" {
		o.Class = ClassName
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop().Sugar()
	}
	if o.MaxHeaderBytes <= 0 {
		o.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if o.Threads <= 0 {
		o.Threads = 2
	}
	extAddr, err := probeAddr(o.External.Addr())
	if err != nil {
		return err
	}
	locAddr, err := probeAddr(o.Local.Addr())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ctx = logging.WithLogger(ctx, o.Logger)
	ctx, informers := injection.Default.SetupInformers(ctx, o.Config)

	backends := NewBackends(serviceinformer.Get(ctx).Lister(), endpointsliceinformer.Get(ctx).Lister())
	r := &Reconciler{
		backends:   backends,
		external:   NewProxy("external", o.Logger),
		local:      NewProxy("cluster-local", o.Logger),
		programmed: map[types.NamespacedName]*ingressRoutes{},
		conflicted: map[types.NamespacedName]bool{},
	}
	if o.HTTPS != nil {
		r.external.redirects = true
		r.secure = r.external.sibling("external HTTPS")
		r.certs = newCertStore(secretinformer.Get(ctx).Lister())
	}
	if o.PublicService != "" {
		r.publicLB = []v1alpha1.LoadBalancerIngressStatus{{DomainInternal: o.PublicService}}
	}
	if o.PrivateService != "" {
		r.privateLB = []v1alpha1.LoadBalancerIngressStatus{{DomainInternal: o.PrivateService}}
	}

	var impl *controller.Impl
	prober := status.NewProber(o.Logger.Named("prober"), &selfTargetLister{external: extAddr, local: locAddr},
		func(ing *v1alpha1.Ingress) {
			impl.EnqueueKey(types.NamespacedName{Namespace: ing.Namespace, Name: ing.Name})
		})
	r.prober = prober
	impl = ingressreconciler.NewImpl(ctx, r, o.Class)
	r.enqueue = impl.EnqueueKey

	ingInformer := ingressinformer.Get(ctx)
	classFilter := pkgreconciler.AnnotationFilterFunc(ingressreconciler.ClassAnnotationKey, o.Class, false)
	if _, err := ingInformer.Informer().AddEventHandler(cache.FilteringResourceEventHandler{
		FilterFunc: classFilter,
		Handler:    controller.HandleAll(impl.Enqueue),
	}); err != nil {
		return err
	}
	refresh := func(obj any, name func(kmeta.Accessor) string) {
		acc, err := kmeta.DeletionHandlingAccessor(obj)
		if err != nil {
			return
		}
		if n := name(acc); n != "" {
			backends.Refresh(acc.GetNamespace(), n)
		}
	}
	if _, err := serviceinformer.Get(ctx).Informer().AddEventHandler(controller.HandleAll(func(obj any) {
		refresh(obj, func(a kmeta.Accessor) string { return a.GetName() })
	})); err != nil {
		return err
	}
	if _, err := endpointsliceinformer.Get(ctx).Informer().AddEventHandler(controller.HandleAll(func(obj any) {
		refresh(obj, func(a kmeta.Accessor) string { return a.GetLabels()[discoveryv1.LabelServiceName] })
	})); err != nil {
		return err
	}

	if err := controller.StartInformers(ctx.Done(), informers...); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("starting informers: %w", err)
	}
	if err := r.prime(ctx, ingInformer.Lister().List, classFilter); err != nil {
		return err
	}
	if o.Advertise != nil {
		if err := advertise(ctx, kubeclient.Get(ctx), o.Advertise, &o); err != nil {
			return err
		}
	}

	readyCh := make(chan struct{})
	servers := []*http.Server{newServer(r.external, o.MaxHeaderBytes), newServer(r.local, o.MaxHeaderBytes)}
	listeners := []net.Listener{o.External, o.Local}
	if o.HTTPS != nil {
		s := newServer(r.secure, o.MaxHeaderBytes)
		s.TLSConfig = &tls.Config{GetCertificate: r.certs.GetCertificate, MinVersion: tls.VersionTLS12,
			NextProtos: []string{"h2", "http/1.1"}}
		servers = append(servers, s)
		listeners = append(listeners, tls.NewListener(o.HTTPS, s.TLSConfig))
	}
	if o.Admin != nil {
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			select {
			case <-readyCh:
				_, _ = w.Write([]byte("ok\n"))
			default:
				http.Error(w, "not ready: informers are syncing", http.StatusServiceUnavailable)
			}
		})
		servers = append(servers, &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second})
		listeners = append(listeners, o.Admin)
	}
	errCh := make(chan error, len(servers)+1)
	for i, s := range servers {
		go func() {
			if err := s.Serve(listeners[i]); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errCh <- fmt.Errorf("serving on %s: %w", listeners[i].Addr(), err)
			}
		}()
	}
	close(readyCh)
	prober.Start(ctx.Done())
	go func() { errCh <- impl.RunContext(ctx, o.Threads) }()
	o.Logger.Infow("kingress serving", "class", o.Class, "external", o.External.Addr().String(), "local", o.Local.Addr().String())

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errCh:
	}
	cancel()
	shutdownCtx, done := context.WithTimeout(context.Background(), 5*time.Second)
	defer done()
	for _, s := range servers {
		_ = s.Shutdown(shutdownCtx)
	}
	return runErr
}

// newServer serves a proxy with HTTP/1.1 and cleartext HTTP/2 (prior
// knowledge), bounded headers and a header read timeout; bodies are not
// timed, as Knative enforces request timeouts in the activator and the
// queue-proxy.
func newServer(h http.Handler, maxHeaderBytes int) *http.Server {
	s := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       5 * time.Minute,
		MaxHeaderBytes:    maxHeaderBytes,
		Protocols:         new(http.Protocols),
	}
	s.Protocols.SetHTTP1(true)
	s.Protocols.SetUnencryptedHTTP2(true)
	s.Protocols.SetHTTP2(true) // on the HTTPS listener
	return s
}

// prime programs every existing Ingress of the class before the listeners
// open. An Ingress that does not translate is left to its reconcile.
func (r *Reconciler) prime(ctx context.Context, list func(labels.Selector) ([]*v1alpha1.Ingress, error), filter func(any) bool) error {
	all, err := list(labels.Everything())
	if err != nil {
		return fmt.Errorf("listing ingresses: %w", err)
	}
	for _, ing := range all {
		if !filter(ing) || ing.DeletionTimestamp != nil {
			continue
		}
		ing = ing.DeepCopy()
		ing.SetDefaults(ctx)
		if err := r.program(ing); err != nil {
			logging.FromContext(ctx).Warnw("ingress not primed", "ingress", ing.Namespace+"/"+ing.Name, "error", err)
		}
	}
	return nil
}
