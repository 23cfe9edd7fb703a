package app

import (
	"flag"
	"os"
	"strings"
	"time"

	"github.com/ziptrail/ziptrail/internal/operator/orchestrator"
	"github.com/ziptrail/ziptrail/internal/operator/podwebhook"
)

// Config is the operator's configuration: cmd/operator's flags. Every
// process that runs an operator (the operator's pod, the local cluster,
// the Python SDK's test environment) starts from DefaultConfig and sets
// what differs.
type Config struct {
	MetricsAddr, ProbeAddr, ControlAddr, GatewayAddr string
	// PprofAddr serves Go's /debug/pprof profiles (empty or 0: off).
	PprofAddr                                      string
	GatewayGRPCAddr                                string
	LeaderElect                                    bool
	LeaderNamespace                                string
	RedisAddr, RedisPassword, CheckpointKey        string
	S3Endpoint, S3AccessKey, S3SecretKey, S3Bucket string
	S3TLS                                          bool
	// ControlService is the host:port sidecars reach the control stream
	// at, written on every function's revision template.
	ControlService string
	// Ingress is the host:port every invocation is sent to, routed by
	// Host; empty: the Services' cluster-local addresses.
	Ingress     string
	Concurrency int
	// InputsAddr is where large session inputs are served to the
	// sidecars; InputsAdvertise where pods reach it.
	InputsAddr, InputsAdvertise    string
	InputStoreBytes, MaxInputBytes int64
	ResultGrace                    time.Duration
	// KeyReaders may read every namespace's reference keys from the
	// control service (activator-ext's ServiceAccount).
	KeyReaders []string
	PodWebhook PodWebhookConfig
	Shard      ShardConfig
	// Delegate lets producers' sidecars fire Immediate and ByName
	// triggers; Direct sends invocations straight to ready pods.
	Delegate, Direct                           bool
	Limits                                     orchestrator.Limits
	DrainTimeout, RedispatchAfter, SaveTimeout time.Duration
}

// PodWebhookConfig is the pod webhook's (podwebhook.go).
type PodWebhookConfig struct {
	Port    int
	CertDir string
	HostDir string
}

// ShardConfig is the sharded engine's (docs/sharding.md).
type ShardConfig struct {
	Buckets  int
	Identity string
	Lease    time.Duration
	Renew    time.Duration
	Retry    time.Duration
}

// DefaultConfig is the configuration of the flags' defaults.
func DefaultConfig() Config {
	var c Config
	c.Flags(flag.NewFlagSet("defaults", flag.ContinueOnError))
	return c
}

// Flags registers the operator's flags on fs, with c's fields as their
// destinations, and sets those fields to the defaults.
func (c *Config) Flags(fs *flag.FlagSet) {
	fs.StringVar(&c.MetricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint (0 disables it)")
	fs.StringVar(&c.PprofAddr, "pprof-bind-address", "", "address of Go's /debug/pprof profiles, to find where the operator's time goes (empty or 0: off; it shows the process's state to whoever reaches it)")
	fs.StringVar(&c.ProbeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz (every replica; the leader is the pod labelled ziptrail.dev/leader=true)")
	fs.StringVar(&c.ControlAddr, "control-bind-address", ":9443", "address of the sidecars' gRPC control stream")
	fs.Func("control-key-readers", "comma-separated users (system:serviceaccount:<ns>:<sa>) that may read every namespace's reference keys "+
		"from the control service: activator-ext's ServiceAccount, e.g. system:serviceaccount:knative-serving:activator (the chart sets it when activatorExt is enabled)",
		func(v string) error {
			c.KeyReaders = nil
			for _, u := range strings.Split(v, ",") {
				if u = strings.TrimSpace(u); u != "" {
					c.KeyReaders = append(c.KeyReaders, u)
				}
			}
			return nil
		})
	fs.StringVar(&c.GatewayAddr, "gateway-bind-address", ":8088", "address of the session gateway (HTTP)")
	fs.StringVar(&c.GatewayGRPCAddr, "gateway-grpc-bind-address", ":8089", "address of the session gateway (gRPC)")
	fs.BoolVar(&c.LeaderElect, "leader-elect", false, "elect a leader so only one replica drives the trigger engine")
	fs.StringVar(&c.LeaderNamespace, "leader-election-namespace", "", "namespace of the leader-election lease (default: the pod's namespace)")
	fs.StringVar(&c.RedisAddr, "redis-addr", os.Getenv("ZIPTRAIL_REDIS_ADDR"), "host:port of Redis: fast tier and engine checkpoints (empty: both disabled)")
	fs.StringVar(&c.RedisPassword, "redis-password", os.Getenv("ZIPTRAIL_REDIS_PASSWORD"), "Redis password")
	fs.StringVar(&c.CheckpointKey, "checkpoint-key", "ziptrail:engine", "Redis key of the engine checkpoint")
	fs.StringVar(&c.S3Endpoint, "s3-endpoint", os.Getenv("ZIPTRAIL_S3_ENDPOINT"), "host:port of the S3-compatible slow tier (empty: tier disabled)")
	fs.StringVar(&c.S3AccessKey, "s3-access-key", os.Getenv("ZIPTRAIL_S3_ACCESS_KEY"), "S3 access key (default $ZIPTRAIL_S3_ACCESS_KEY, which the chart sets from its Secret); sent to sidecars over the authenticated control stream only")
	fs.StringVar(&c.S3SecretKey, "s3-secret-key", os.Getenv("ZIPTRAIL_S3_SECRET_KEY"), "S3 secret key (default $ZIPTRAIL_S3_SECRET_KEY); sent to sidecars over the authenticated control stream only")
	fs.StringVar(&c.S3Bucket, "s3-bucket", envOr("ZIPTRAIL_S3_BUCKET", "ziptrail"), "S3 bucket of the slow tier")
	fs.BoolVar(&c.S3TLS, "s3-tls", os.Getenv("ZIPTRAIL_S3_TLS") == "true", "reach the S3 endpoint over TLS")
	fs.StringVar(&c.ControlService, "control-service-address", "", "host:port sidecars reach the control stream at (the control Service, e.g. ziptrail-control.ziptrail-system.svc:9443; the chart sets it); "+
		"written on every function's revision template as the annotation ziptrail.dev/control-addr (empty: sidecars run without an operator)")
	fs.StringVar(&c.Ingress, "ingress", "", "host:port to send every invocation to, routed by Host (default: the Services' cluster-local addresses)")
	fs.IntVar(&c.Concurrency, "dispatch-concurrency", 256, "invocations in flight at most")
	fs.StringVar(&c.InputsAddr, "inputs-bind-address", ":9194", "data-plane address serving large session inputs to the workflows' sidecars")
	fs.StringVar(&c.InputsAdvertise, "inputs-advertise-address", "", "host:port pods reach the inputs address at (default: $POD_IP and the port of --inputs-bind-address)")
	fs.Int64Var(&c.InputStoreBytes, "input-store-bytes", 256<<20, "memory held at most for the inputs of running sessions (inputs over 64 KiB); starts beyond it are refused with 503")
	fs.Int64Var(&c.MaxInputBytes, "max-input-bytes", 64<<20, "largest session input the gateway accepts (413 beyond)")
	fs.DurationVar(&c.ResultGrace, "result-grace", orchestrator.DefaultResultGrace, "how long a session's result stays readable after its first full read when its client does not acknowledge it (docs/gateway.md)")
	fs.BoolVar(&c.Delegate, "delegate-triggers", true, "let producers' sidecars fire their workflow's Immediate and ByName triggers themselves, "+
		"reporting to the engine, which stays the authority (docs/design.md, 'Delegated firing')")
	fs.BoolVar(&c.Direct, "direct-dispatch", true, "send each invocation straight to a ready pod of its function's revision (its queue-proxy), as Knative's activator does, "+
		"instead of through the ingress and the activator; a revision without a ready pod, with a containerConcurrency limit or split traffic, and a pod's overload, go by the route (docs/dispatch.md)")
	fs.DurationVar(&c.DrainTimeout, "engine-drain-timeout", 10*time.Second, "on a graceful stop (rollout, upgrade, a demoted bucket), how long calls in flight may take before the last save "+
		"(keep it under the pod's terminationGracePeriodSeconds)")
	fs.DurationVar(&c.RedispatchAfter, "engine-redispatch-after", orchestrator.DefaultRedispatchAfter, "after a restore, how long to wait for news of an invocation in flight "+
		"before sending it again with the same idempotency key")
	fs.DurationVar(&c.SaveTimeout, "checkpoint-save-timeout", 5*time.Second, "bound of one checkpoint save; while saves fail, starts are answered 503")

	fs.IntVar(&c.PodWebhook.Port, "pod-webhook-port", 0, "port of the mutating webhook that gives function pods their objects volume and queue-proxy-zl the same-node directory (docs/samenode.md); 0 disables it")
	fs.StringVar(&c.PodWebhook.CertDir, "pod-webhook-cert-dir", "/etc/ziptrail/webhook-tls", "directory holding the webhook's tls.crt and tls.key")
	fs.StringVar(&c.PodWebhook.HostDir, "pod-webhook-host-dir", podwebhook.DefaultHostDir, "the node directory (hostPath) mounted into queue-proxy")

	fs.IntVar(&c.Shard.Buckets, "engine-buckets", 0, "shard the trigger engine into this many buckets owned by the operator's replicas "+
		"(Knative bucket leader election, one Lease each; every replica serves the control stream and the gateway for its buckets "+
		"and redirects or proxies the rest); 0 runs one engine on the elected leader")
	fs.StringVar(&c.Shard.Identity, "engine-identity", os.Getenv("POD_IP"), "this replica's address (host) as the other replicas and the sidecars reach it (default $POD_IP)")
	// One setting for both forms: the unsharded leader's Lease and the
	// sharded engine's bucket Leases.
	fs.DurationVar(&c.Shard.Lease, "engine-lease-duration", 15*time.Second, "engine Leases (the leader's, or each bucket's): how long a dead replica keeps the engine")
	fs.DurationVar(&c.Shard.Renew, "engine-renew-deadline", 10*time.Second, "engine Leases: how long a replica tries to renew before it gives the engine up")
	fs.DurationVar(&c.Shard.Retry, "engine-retry-period", 2*time.Second, "engine Leases: how often they are renewed and free ones tried")

	c.Limits = orchestrator.DefaultLimits() // docs/limits.md
	c.Limits.Flags(fs)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
