// Command ziptrail-ingress is the local cluster's Knative networking layer
// (KIngress): one process that is both the controller for Ingresses of the
// class ziptrail.ingress.networking.knative.dev and the gateway that serves
// them (internal/localcluster/kingress). Knative Serving uses it when config-network has
// `ingress-class: ziptrail.ingress.networking.knative.dev`.
//
//	ziptrail-ingress --kubeconfig ~/.cache/ziptrail/local/kubeconfig \
//	    --http-address :8080 --cluster-local-address :8081 --admin-address :8090
//
// --public-service and --private-service name the Services in front of the
// two listeners; they are reported as the Ingresses' DomainInternal, which
// Knative Serving turns into each route's cluster-local ExternalName Service.
// On the local cluster the gateway runs on the host: --advertise-ip HostIP
// makes those Services point at its listeners.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ziptrail/ziptrail/internal/localcluster/kingress"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "ziptrail-ingress:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		kubeconfig = flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the cluster; in-cluster configuration when empty")
		httpAddr   = flag.String("http-address", ":8080", "listen address of the external gateway (ExternalIP rules)")
		localAddr  = flag.String("cluster-local-address", ":8081", "listen address of the cluster-local gateway (ClusterLocal and ExternalIP rules)")
		httpsAddr  = flag.String("https-address", "", "listen address of the external gateway over TLS (spec.tls certificates by SNI; enables httpOption Redirected); empty to disable")
		adminAddr  = flag.String("admin-address", ":8090", "listen address of /healthz and /readyz; empty to disable")
		class      = flag.String("ingress-class", kingress.ClassName, "ingress class served (annotation networking.knative.dev/ingress.class)")
		public     = flag.String("public-service", "ziptrail-ingress.knative-serving.svc.cluster.local", "DomainInternal reported for the public load balancer")
		private    = flag.String("private-service", "ziptrail-ingress-internal.knative-serving.svc.cluster.local", "DomainInternal reported for the private load balancer")
		advertise  = flag.String("advertise-ip", "", "when set, create/update the --public-service and --private-service Services with EndpointSlices pointing at this IP and the listeners' ports (a gateway on the host of the local cluster)")
		publicType = flag.String("public-service-type", "ClusterIP", "type of the advertised public Service: ClusterIP or NodePort")
		threads    = flag.Int("threads", 2, "reconciler workers")
		maxHeader  = flag.Int("max-header-bytes", kingress.DefaultMaxHeaderBytes, "largest request line + headers accepted (larger get 431)")
		verbose    = flag.Bool("v", false, "debug logging")
	)
	flag.Parse()

	cfg, err := restConfig(*kubeconfig)
	if err != nil {
		return err
	}
	level := zapcore.InfoLevel
	if *verbose {
		level = zapcore.DebugLevel
	}
	zc := zap.NewProductionConfig()
	zc.Level = zap.NewAtomicLevelAt(level)
	logger, err := zc.Build()
	if err != nil {
		return err
	}
	defer func() { _ = logger.Sync() }()

	ext, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		return fmt.Errorf("--http-address: %w", err)
	}
	loc, err := net.Listen("tcp", *localAddr)
	if err != nil {
		return fmt.Errorf("--cluster-local-address: %w", err)
	}
	var admin, secure net.Listener
	if *httpsAddr != "" {
		if secure, err = net.Listen("tcp", *httpsAddr); err != nil {
			return fmt.Errorf("--https-address: %w", err)
		}
	}
	if *adminAddr != "" {
		if admin, err = net.Listen("tcp", *adminAddr); err != nil {
			return fmt.Errorf("--admin-address: %w", err)
		}
	}
	var adv *kingress.Advertise
	if *advertise != "" {
		adv = &kingress.Advertise{IP: *advertise, PublicType: corev1.ServiceType(*publicType)}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return kingress.Run(ctx, kingress.Options{
		Config: cfg, External: ext, Local: loc, Admin: admin, HTTPS: secure,
		Class: *class, PublicService: *public, PrivateService: *private,
		Logger: logger.Sugar(), Threads: *threads, MaxHeaderBytes: *maxHeader, Advertise: adv,
	})
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig and not in a cluster: %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
	}
	return cfg, nil
}
