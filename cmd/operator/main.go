// Command operator runs ziptrail's controllers: it reconciles Workflows,
// Buckets and Triggers onto Knative Services and reports their status.
package main

import (
	"flag"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ziptrail/ziptrail/api/v1alpha1"
	"github.com/ziptrail/ziptrail/controllers"
)

func main() {
	var (
		metricsAddr = flag.String("metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint (0 disables it)")
		probeAddr   = flag.String("health-probe-bind-address", ":8081", "address of the /healthz and /readyz endpoints")
		leaderElect = flag.Bool("leader-elect", false, "elect a leader so only one replica drives reconciles and the trigger engine")
		leaderNS    = flag.String("leader-election-namespace", "", "namespace of the leader-election lease (default: the pod's namespace)")
		redisAddr   = flag.String("redis-addr", os.Getenv("ZIPTRAIL_REDIS_ADDR"), "host:port of the Redis fast tier (empty: tier disabled)")
		s3Endpoint  = flag.String("s3-endpoint", os.Getenv("ZIPTRAIL_S3_ENDPOINT"), "host:port of the S3-compatible slow tier (empty: tier disabled)")
		zapOpts     = zap.Options{Development: false}
	)
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	if err := run(*metricsAddr, *probeAddr, *leaderElect, *leaderNS, controllers.Tiers{Redis: *redisAddr != "", S3: *s3Endpoint != ""}); err != nil {
		fmt.Fprintf(os.Stderr, "operator: %v\n", err)
		os.Exit(1)
	}
}

func run(metricsAddr, probeAddr string, leaderElect bool, leaderNS string, tiers controllers.Tiers) error {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	utilruntime.Must(servingv1.AddToScheme(scheme))

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:  probeAddr,
		LeaderElection:          leaderElect,
		LeaderElectionID:        "operator.ziptrail.dev",
		LeaderElectionNamespace: leaderNS,
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	if err := controllers.Setup(mgr, tiers, nil); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}
