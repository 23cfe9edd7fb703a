// Package app assembles activator-ext (cmd/activator-ext): Knative
// Serving's activator with ziptrail's layer, as described there.
package app

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/kelseyhightower/envconfig"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	netcfg "knative.dev/networking/pkg/config"
	netprobe "knative.dev/networking/pkg/http/probe"
	kubeclient "knative.dev/pkg/client/injection/kube/client"
	endpointsinformer "knative.dev/pkg/client/injection/kube/informers/core/v1/endpoints"
	configmapinformer "knative.dev/pkg/configmap/informer"
	"knative.dev/pkg/controller"
	"knative.dev/pkg/injection"
	"knative.dev/pkg/injection/sharedmain"
	pkglogging "knative.dev/pkg/logging"
	"knative.dev/pkg/logging/logkey"
	pkgnet "knative.dev/pkg/network"
	knativetls "knative.dev/pkg/network/tls"
	k8sruntime "knative.dev/pkg/observability/runtime/k8s"
	"knative.dev/pkg/signals"
	"knative.dev/pkg/system"
	"knative.dev/pkg/version"
	"knative.dev/pkg/websocket"
	"knative.dev/serving/pkg/activator"
	"knative.dev/serving/pkg/activator/certificate"
	activatorconfig "knative.dev/serving/pkg/activator/config"
	activatorhandler "knative.dev/serving/pkg/activator/handler"
	activatornet "knative.dev/serving/pkg/activator/net"
	apiconfig "knative.dev/serving/pkg/apis/config"
	"knative.dev/serving/pkg/apis/serving"
	asmetrics "knative.dev/serving/pkg/autoscaler/metrics"
	pkghttp "knative.dev/serving/pkg/http"
	"knative.dev/serving/pkg/http/handler"
	"knative.dev/serving/pkg/logging"
	"knative.dev/serving/pkg/networking"
	o11yconfigmap "knative.dev/serving/pkg/observability/configmap"
	"knative.dev/serving/pkg/observability/otel"

	"github.com/ziptrail/ziptrail/internal/dataplane/activatorext"
	"github.com/ziptrail/ziptrail/internal/dataplane/controlclient"
	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
)

const component = "activator" // keeps Knative's logging/observability config keys

// env is Knative's activator environment (the Deployment in serving-core
// sets it) plus ziptrail's keep-alive settings.
type env struct {
	PodName                  string        `split_words:"true" required:"true"`
	PodIP                    string        `split_words:"true" required:"true"`
	MaxIdleProxyConns        int           `split_words:"true" default:"1000"`
	MaxIdleProxyConnsPerHost int           `split_words:"true" default:"100"`
	ProbeTimeout             time.Duration `split_words:"true" default:"300ms"`
	ProbeFrequency           time.Duration `split_words:"true" default:"200ms"`

	// ZIPTRAIL_KEEPALIVE_INTERVAL: how often a waiting request's objects
	// are extended; ZIPTRAIL_KEEPALIVE_EXTENSION: by how much (from now).
	ZiptrailKeepaliveInterval  time.Duration `envconfig:"ZIPTRAIL_KEEPALIVE_INTERVAL" default:"5s"`
	ZiptrailKeepaliveExtension time.Duration `envconfig:"ZIPTRAIL_KEEPALIVE_EXTENSION" default:"30s"`
	// ZIPTRAIL_OPERATOR_ADDR: host:port of the operator's control service,
	// which hands out namespaces' reference keys (GetKeys) to the
	// activator's ServiceAccount, allow-listed there; ZIPTRAIL_TOKEN_FILE:
	// the activator's projected service-account token for audience
	// control.ziptrail.dev (the chart mounts it at the default path).
	// Without an operator address the keep-alive is off (a warning says
	// so) and the activator still serves: it is on every cold start's path.
	ZiptrailOperatorAddr string `envconfig:"ZIPTRAIL_OPERATOR_ADDR"`
	ZiptrailTokenFile    string `envconfig:"ZIPTRAIL_TOKEN_FILE" default:"/var/run/secrets/tokens/control.ziptrail.dev"`
}

// Main runs the activator until SIGTERM (cmd/activator-ext's main).
func Main() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	cfg := injection.ParseAndGetRESTConfigOrDie()
	ctx, informers := injection.Default.SetupInformers(ctx, cfg)

	var e env
	if err := envconfig.Process("", &e); err != nil {
		log.Fatal("environment: ", err)
	}
	if e.ZiptrailKeepaliveExtension > pull.DefaultMaxExtend {
		// Producers refuse such extends: every keep-alive would fail.
		log.Fatalf("environment: ZIPTRAIL_KEEPALIVE_EXTENSION=%v exceeds the producers' extend limit %v: lower it", e.ZiptrailKeepaliveExtension, pull.DefaultMaxExtend)
	}
	kube := kubeclient.Get(ctx)
	var verr error
	if err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(context.Context) (bool, error) {
		verr = version.CheckMinimumVersion(kube.Discovery())
		return verr == nil, nil
	}); err != nil {
		log.Fatal("Kubernetes API not reachable or too old: ", verr)
	}

	loggingConfig, err := sharedmain.GetLoggingConfig(ctx)
	if err != nil {
		log.Fatal("logging configuration: ", err)
	}
	logger, atomicLevel := pkglogging.NewLoggerFromConfig(loggingConfig, component)
	logger = logger.With(zap.String(logkey.ControllerType, component), zap.String(logkey.Pod, e.PodName))
	ctx = pkglogging.WithLogger(ctx, logger)
	defer func() { _ = logger.Sync() }()

	pprof := k8sruntime.NewProfilingServer(logger.Named("pprof"))
	mp, tp := otel.SetupObservabilityOrDie(ctx, component, logger, pprof)
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		_ = mp.Shutdown(sctx)
		_ = tp.Shutdown(sctx)
	}()

	if err := controller.StartInformers(ctx.Done(), informers...); err != nil {
		logger.Fatalw("Failed to start informers", zap.Error(err))
	}
	logger.Info("Starting activator-ext (Knative activator + ziptrail)")

	// One transport for the throttler's probes and the proxy (Knative shares
	// it so probed connections are reused).
	transport := pkgnet.NewProxyAutoTransport(e.MaxIdleProxyConns, e.MaxIdleProxyConnsPerHost)
	networkCM, err := kube.CoreV1().ConfigMaps(system.Namespace()).Get(ctx, netcfg.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		logger.Fatalw("Failed to fetch network config", zap.Error(err))
	}
	networkConfig, err := netcfg.NewConfigFromConfigMap(networkCM)
	if err != nil {
		logger.Fatalw("Failed to parse network config", zap.Error(err))
	}
	tlsEnabled := networkConfig.SystemInternalTLSEnabled()
	var certCache *certificate.CertCache
	if tlsEnabled {
		if certCache, err = certificate.NewCertCache(ctx); err != nil {
			logger.Fatalw("Failed to create certificate cache", zap.Error(err))
		}
		transport = pkgnet.NewProxyAutoTLSTransport(e.MaxIdleProxyConns, e.MaxIdleProxyConnsPerHost, certCache.TLSContext())
	}
	activatornet.SetProbeSettings(e.ProbeTimeout, e.ProbeFrequency)

	throttler := activatornet.NewThrottler(ctx, e.PodIP)
	go throttler.Run(ctx, transport, networkConfig.EnableMeshPodAddressability, networkConfig.MeshCompatibilityMode)

	// ziptrail: keep-alive over the data plane, locality over the revisions'
	// private Endpoints (the informer Knative's throttler already runs).
	zmetrics, err := activatorext.NewMetrics(mp)
	if err != nil {
		logger.Fatalw("Failed to create ziptrail metrics", zap.Error(err))
	}
	// Namespaces' reference keys come from the operator, which checks the
	// activator's token and allow-lists its ServiceAccount; they are read
	// again at most once a keep-alive round (references name key ids, and
	// anyone can forge those).
	var keepAlive activatorext.KeepAliver
	if e.ZiptrailOperatorAddr == "" {
		logger.Warn("ZIPTRAIL_OPERATOR_ADDR is not set: referenced objects are not kept alive during cold starts")
	} else {
		keysClient, err := controlclient.NewKeysClient(e.ZiptrailOperatorAddr, controlclient.FileToken(e.ZiptrailTokenFile))
		if err != nil {
			logger.Fatalw("Failed to create the operator's keys client", zap.Error(err))
		}
		defer func() { _ = keysClient.Close() }()
		extender := &activatorext.DataPlaneExtender{Keys: activatorext.OperatorKeys(keysClient), MinReread: e.ZiptrailKeepaliveInterval}
		defer extender.Close()
		keepAlive = &activatorext.Periodic{Extend: extender.Extend, Interval: e.ZiptrailKeepaliveInterval,
			Extension: e.ZiptrailKeepaliveExtension, Metrics: zmetrics}
	}
	endpoints := endpointsinformer.Get(ctx).Lister()
	locality := &activatorext.LocalityThrottler{
		Next:    throttler,
		Metrics: zmetrics,
		Pods: activatorext.EndpointsIndex{List: func(rev types.NamespacedName) ([]*corev1.Endpoints, error) {
			return endpoints.Endpoints(rev.Namespace).List(labels.SelectorFromSet(labels.Set{
				serving.RevisionLabelKey:  rev.Name,
				networking.ServiceTypeKey: string(networking.ServiceTypePrivate),
			}))
		}},
		Concurrency: func(ctx context.Context) int {
			if r := activatorhandler.RevisionFrom(ctx); r != nil && r.Spec.ContainerConcurrency != nil {
				return int(*r.Spec.ContainerConcurrency)
			}
			return 0
		},
	}

	configMapWatcher := configmapinformer.NewInformedWatcher(kube, system.Namespace())
	configStore := activatorconfig.NewStore(logger)
	configStore.WatchConfigs(configMapWatcher)

	statCh := make(chan []asmetrics.StatMessage)
	defer close(statCh)
	autoscalerEndpoint := "ws://" + pkgnet.GetServiceHostname("autoscaler", system.Namespace()) + ":8080"
	statSink := websocket.NewDurableSendingConnection(autoscalerEndpoint, logger, activator.AutoscalerConnectionOptions(logger, mp)...)
	defer statSink.Shutdown()
	go activator.ReportStats(logger, statSink, statCh)
	concurrencyReporter := activatorhandler.NewConcurrencyReporter(ctx, e.PodName, statCh, mp)
	go concurrencyReporter.Run(ctx.Done())

	// The handler chain, innermost first: Knative's, with ziptrail's handler
	// right around the activation handler (it needs the revision the
	// context handler resolved, and must see the request before the
	// throttler makes it wait).
	var ah http.Handler = activatorhandler.New(ctx, locality, transport, networkConfig.EnableMeshPodAddressability, logger, tlsEnabled, tp, mp)
	ah = &activatorext.Handler{Next: ah, KeepAlive: keepAlive, Metrics: zmetrics,
		Namespace: func(r *http.Request) string { return activatorhandler.RevIDFrom(r.Context()).Namespace }}
	ah = handler.NewTimeoutHandler(ah, "activator request timeout", revisionTimeouts, logger)
	ah = concurrencyReporter.Handler(ah)
	ah = activatorhandler.NewTracingAttributeHandler(tp, ah)
	reqLog, err := pkghttp.NewRequestLogHandler(ah, logging.NewSyncFileWriter(os.Stdout), "", requestLogInput, false)
	if err != nil {
		logger.Fatalw("Unable to create request log handler", zap.Error(err))
	}
	ah = activatorhandler.NewMetricAttributeHandler(e.PodName, reqLog)
	ah = activatorhandler.WrapActivatorHandlerWithFullDuplex(ah, logger)
	ah = activatorhandler.NewContextHandler(ctx, ah, configStore)
	ah = otelhttp.NewHandler(ah, "handle", otelhttp.WithTracerProvider(tp), otelhttp.WithMeterProvider(mp))
	ah = &activatorhandler.ProbeHandler{NextHandler: ah}
	ah = netprobe.NewHandler(ah)
	sigCtx := signals.NewContext()
	ah = &activatorhandler.HealthHandler{HealthCheck: healthCheck(sigCtx, logger, statSink), NextHandler: ah, Logger: logger}

	configMapWatcher.Watch(pkglogging.ConfigMapName(), pkglogging.UpdateLevelFromConfigMap(logger, atomicLevel, component))
	configMapWatcher.Watch(o11yconfigmap.Name(), requestLogFromConfigMap(logger, reqLog), pprof.UpdateFromConfigMap)
	if err := configMapWatcher.Start(ctx.Done()); err != nil {
		logger.Fatalw("Failed to start configuration manager", zap.Error(err))
	}

	servers := map[string]*http.Server{
		"http1":   pkgnet.NewServer(":"+strconv.Itoa(networking.BackendHTTPPort), ah),
		"h2c":     pkgnet.NewServer(":"+strconv.Itoa(networking.BackendHTTP2Port), ah),
		"profile": pprof.Server,
	}
	errCh := make(chan error, len(servers)+1)
	var mu sync.Mutex
	serve := func(name string, s *http.Server, run func() error) {
		mu.Lock()
		servers[name] = s
		mu.Unlock()
		go func() {
			if err := run(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errCh <- fmt.Errorf("%s server: %w", name, err)
			}
		}()
	}
	for name, s := range servers {
		serve(name, s, s.ListenAndServe)
	}
	if tlsEnabled {
		tlsCfg, err := knativetls.DefaultConfigFromEnv("ACTIVATOR_")
		if err != nil {
			logger.Fatalw("Failed to read TLS configuration from environment", zap.Error(err))
		}
		s := pkgnet.NewServer(":"+strconv.Itoa(networking.BackendHTTPSPort), ah)
		s.TLSConfig = tlsCfg
		s.TLSConfig.GetCertificate = certCache.GetCertificate
		serve("https", s, func() error { return s.ListenAndServeTLS("", "") })
	}

	select {
	case <-sigCtx.Done():
		logger.Info("Received SIGTERM")
	case err := <-errCh:
		logger.Errorw("HTTP server failed", zap.Error(err))
	}
	// Readiness now fails; give Kubernetes time to stop routing to us, then drain.
	time.Sleep(pkgnet.DefaultDrainTimeout)
	mu.Lock()
	defer mu.Unlock()
	for _, s := range servers {
		_ = s.Shutdown(context.Background())
	}
}

// revisionTimeouts are the revision's request, response-start and idle
// timeouts (Knative's defaults when the revision is unknown).
func revisionTimeouts(r *http.Request) (time.Duration, time.Duration, time.Duration) {
	rev := activatorhandler.RevisionFrom(r.Context())
	if rev == nil {
		return apiconfig.DefaultRevisionTimeoutSeconds * time.Second,
			apiconfig.DefaultRevisionResponseStartTimeoutSeconds * time.Second,
			apiconfig.DefaultRevisionIdleTimeoutSeconds * time.Second
	}
	seconds := func(p *int64) time.Duration {
		if p == nil {
			return 0
		}
		return time.Duration(*p) * time.Second
	}
	return seconds(rev.Spec.TimeoutSeconds), seconds(rev.Spec.ResponseStartTimeoutSeconds), seconds(rev.Spec.IdleTimeoutSeconds)
}

// healthCheck fails once SIGTERM arrived (drain) or while the autoscaler
// connection is down.
func healthCheck(sigCtx context.Context, logger *zap.SugaredLogger, statSink *websocket.ManagedConnection) func() error {
	var once sync.Once
	return func() error {
		select {
		case <-sigCtx.Done():
			once.Do(func() { logger.Info("Draining: readiness fails from now on") })
			return errors.New("received SIGTERM from kubelet")
		default:
			return statSink.Status()
		}
	}
}

// requestLogInput describes a request for Knative's request-log template.
func requestLogInput(req *http.Request, resp *pkghttp.RequestLogResponse) *pkghttp.RequestLogTemplateInput {
	in := &pkghttp.RequestLogTemplateInput{Request: req, Response: resp, Revision: &pkghttp.RequestLogRevision{}}
	if rev := activatorhandler.RevisionFrom(req.Context()); rev != nil {
		in.Revision.Namespace, in.Revision.Name = rev.Namespace, rev.Name
		in.Revision.Configuration = rev.Labels[serving.ConfigurationLabelKey]
		in.Revision.Service = rev.Labels[serving.ServiceLabelKey]
	}
	return in
}

// requestLogFromConfigMap applies config-observability's request-log
// settings to the request log handler.
func requestLogFromConfigMap(logger *zap.SugaredLogger, h *pkghttp.RequestLogHandler) func(*corev1.ConfigMap) {
	return func(cm *corev1.ConfigMap) {
		cfg, err := o11yconfigmap.Parse(cm)
		if err != nil {
			logger.Errorw("Failed to parse the observability config map", zap.Error(err))
			return
		}
		tmpl := ""
		if cfg.EnableRequestLog {
			tmpl = cfg.RequestLogTemplate
		}
		if err := h.SetTemplate(tmpl); err != nil {
			logger.Errorw("Failed to set the request log template", zap.Error(err), "template", tmpl)
		}
	}
}
