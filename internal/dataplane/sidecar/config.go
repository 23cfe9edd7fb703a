package sidecar

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/controlclient"
	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/tier"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// Config of a sidecar; FromEnv reads it from the pod's environment.
type Config struct {
	Namespace, Workflow, Function, Pod string
	PodIP                              string
	DataplanePort                      int    // data-plane port: pulls and message streams (9192; Knative uses 9090/9091)
	ShmDir                             string // where resolved inputs are written for the function
	MemoryLimit                        int64  // store cap in bytes
	InlineThreshold                    int    // objects up to this size stay inline
	ObjectTTL                          time.Duration
	OperatorAddr                       string // control stream; empty: keys from KeyFile
	KeyFile                            string // JSON {"active": id, "keys": {id: base64}} for standalone use
	APISocket                          string // unix socket of the local API for the function; empty disables it
	MetricsPort                        int    // Prometheus /metrics of the data plane; 0 disables it
	// TokenFile holds the pod's projected service-account token for the
	// control stream (audience controlclient.Audience), re-read on every
	// (re)connect; default controlclient.DefaultTokenFile, where Knative
	// mounts it ($ZIPTRAIL_TOKEN_FILE overrides it).
	TokenFile string
	// Log receives control-stream errors (connection failures, refused
	// tokens, events the operator refused); nil discards them.
	Log func(error)
	// PutTimeout bounds how long a put waits for memory in a full pod
	// (no fast tier to spill to) before it fails with "store full".
	PutTimeout time.Duration
	// Tiers: Redis takes spilled objects, S3 the backup of unread objects
	// when the pod terminates. Nil tiers are disabled.
	Redis *tier.Redis
	S3    *tier.S3
	// BackupTimeout bounds the SIGTERM backup (inside Knative's drain).
	BackupTimeout time.Duration
	// GroupDrainTimeout bounds how long a terminating sidecar keeps
	// serving messaging-group members still running (default 10 m).
	GroupDrainTimeout time.Duration
	// SameNode: the same-node data plane (samenode.go); zero: TCP only.
	SameNode SameNodeConfig
	// NoDirectTCP keeps group members on different nodes on the
	// sidecars' message streams instead of direct TCP channels between
	// their functions ($ZIPTRAIL_DIRECT_TCP=off; docs/messaging.md,
	// "Direct channels across nodes").
	NoDirectTCP bool
	// MaxOutputsBytes caps one function response with outputs, which is
	// read whole to turn large objects into references; default
	// invocation.MaxEnvelopeBytes. All such responses being read share
	// the larger of MemoryLimit and MaxOutputsBytes.
	MaxOutputsBytes int64
	// RevisionTimeout bounds a delegated invocation, which does not end
	// when its caller (the producer's sidecar) goes away: Knative's
	// REVISION_TIMEOUT_SECONDS; default 300 s, Knative's default.
	RevisionTimeout time.Duration
	// PullTimeouts bound a pull from another pod: the connect, the wait
	// for the answer's header, the longest pause in the body
	// ($ZIPTRAIL_PULL_DIAL_TIMEOUT, $ZIPTRAIL_PULL_RESPONSE_TIMEOUT,
	// $ZIPTRAIL_PULL_STALL_TIMEOUT, Go durations); a producer that misses
	// one is taken for gone and the object read from the tiers. Zero
	// fields: pull's defaults (10 s, 30 s, 30 s).
	PullTimeouts pull.Timeouts
	// IdempotencyMaxKeys and IdempotencyMaxBytes cap the outcomes this
	// sidecar records by idempotency key (idempotency.go): past either,
	// the oldest are freed (ziptrail_idempotency_evictions_total).
	// Defaults 65536 keys and 64 MiB ($ZIPTRAIL_IDEMPOTENCY_MAX_KEYS,
	// $ZIPTRAIL_IDEMPOTENCY_MAX_BYTES).
	IdempotencyMaxKeys  int
	IdempotencyMaxBytes int64
	// KeepReportsFor is how long the report of an invocation the
	// operator's dispatcher sent is kept unsent, waiting for the operator
	// to release it once it saved the answer (controlclient/kept.go);
	// default controlclient.DefaultKeepFor.
	KeepReportsFor time.Duration
	// StartReportHold is how long the start of an invocation a producer's
	// sidecar sent (delegated firing) waits to be reported with its
	// outcome, in one control message; default 50 ms (startHold).
	StartReportHold time.Duration
	// FunctionCrashRetries is how many times an invocation is sent to
	// the function again when its process died before answering (the
	// connection to it failed, and no response header came: crash.go);
	// 0 (a Config's zero value) disables it, the call then answers 502
	// at the first death. FromEnv: $ZIPTRAIL_FUNCTION_CRASH_RETRIES,
	// default 2.
	FunctionCrashRetries int
	// FunctionRestartWait bounds the wait, before each of those retries,
	// for the function to accept connections again (its container being
	// restarted), within the invocation's own timeout; default 60 s.
	FunctionRestartWait time.Duration

	// envErrs are the variables FromEnv could not use: Start refuses
	// to run with them (Validate).
	envErrs []error
	// releaseTaken, when set (tests), is the local API's ReleaseTaken.
	releaseTaken func(tokens []string)
}

// Validate reports settings the sidecar must not start with.
func (c Config) Validate() error {
	return errors.Join(append(c.envErrs, c.PullTimeouts.Validate())...)
}

// pullTimeoutsFromEnv reads the pull timeouts; unset variables leave the
// defaults, malformed or out-of-range ones are errors naming them.
func pullTimeoutsFromEnv() (pull.Timeouts, []error) {
	var t pull.Timeouts
	var errs []error
	for _, v := range []struct {
		name string
		d    *time.Duration
	}{{"ZIPTRAIL_PULL_DIAL_TIMEOUT", &t.Dial}, {"ZIPTRAIL_PULL_RESPONSE_TIMEOUT", &t.Response}, {"ZIPTRAIL_PULL_STALL_TIMEOUT", &t.Stall}} {
		s := os.Getenv(v.name)
		if s == "" {
			continue
		}
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 || d > pull.MaxTimeout {
			errs = append(errs, fmt.Errorf("%s=%q: want a positive duration of at most %v, such as 10s", v.name, s, pull.MaxTimeout))
			continue
		}
		*v.d = d
	}
	return t, errs
}

// FromEnv builds a Config from Knative's and ziptrail's environment.
func FromEnv() Config {
	c := Config{
		Namespace: os.Getenv("SERVING_NAMESPACE"), Pod: os.Getenv("SERVING_POD"), PodIP: os.Getenv("SERVING_POD_IP"),
		Workflow: os.Getenv("ZIPTRAIL_WORKFLOW"), Function: os.Getenv("ZIPTRAIL_FUNCTION"),
		DataplanePort: envInt("ZIPTRAIL_DATAPLANE_PORT", 9192), ShmDir: envStr("ZIPTRAIL_SHM_DIR", "/dev/shm/ziptrail/objects"),
		MemoryLimit: int64(envInt("ZIPTRAIL_MEMORY_LIMIT", 256<<20)), InlineThreshold: envInt("ZIPTRAIL_INLINE_THRESHOLD", 64<<10),
		ObjectTTL:    time.Duration(envInt("ZIPTRAIL_OBJECT_TTL_SECONDS", 600)) * time.Second,
		OperatorAddr: os.Getenv("ZIPTRAIL_OPERATOR_ADDR"), KeyFile: os.Getenv("ZIPTRAIL_KEY_FILE"), TokenFile: controlclient.TokenFileFromEnv(),
		APISocket: os.Getenv("ZIPTRAIL_SOCKET"), MetricsPort: envInt("ZIPTRAIL_METRICS_PORT", 9193),
		SameNode:        sameNodeFromEnv(),
		NoDirectTCP:     os.Getenv("ZIPTRAIL_DIRECT_TCP") == "off",
		RevisionTimeout: time.Duration(envInt("REVISION_TIMEOUT_SECONDS", 300)) * time.Second,
	}
	if c.Function == "" {
		c.Function = os.Getenv("SERVING_SERVICE")
	}
	c.Log = func(err error) { fmt.Fprintf(os.Stderr, "queue-proxy-zl: control stream: %v\n", err) }
	if c.APISocket == "" {
		// Knative sets queue-proxy's environment, so in a cluster only the
		// user container gets ZIPTRAIL_SOCKET: both agree on the path next
		// to the shared-memory object directory (/dev/shm/ziptrail).
		c.APISocket = filepath.Join(filepath.Dir(c.ShmDir), "sidecar.sock")
	}
	c.BackupTimeout = time.Duration(envInt("ZIPTRAIL_BACKUP_TIMEOUT_SECONDS", 25)) * time.Second
	c.MaxOutputsBytes = int64(envInt("ZIPTRAIL_MAX_OUTPUTS_BYTES", invocation.MaxEnvelopeBytes))
	c.PullTimeouts, c.envErrs = pullTimeoutsFromEnv()
	c.IdempotencyMaxKeys = envInt("ZIPTRAIL_IDEMPOTENCY_MAX_KEYS", defaultRecordKeys)
	c.IdempotencyMaxBytes = int64(envInt("ZIPTRAIL_IDEMPOTENCY_MAX_BYTES", defaultRecordBytes))
	c.FunctionCrashRetries = max(0, envInt("ZIPTRAIL_FUNCTION_CRASH_RETRIES", defaultCrashRetries))
	c.PutTimeout = 30 * time.Second
	if d, err := time.ParseDuration(os.Getenv("ZIPTRAIL_PUT_TIMEOUT")); err == nil && d > 0 {
		c.PutTimeout = d
	}
	// Tiers normally come from the operator over the control stream; these
	// variables are overrides for tests and --standalone only.
	if os.Getenv("ZIPTRAIL_REDIS_ADDR") != "" || os.Getenv("ZIPTRAIL_S3_ENDPOINT") != "" {
		r, s3, err := TiersFrom(&controlv1.Tiers{RedisAddr: os.Getenv("ZIPTRAIL_REDIS_ADDR"), RedisPassword: os.Getenv("ZIPTRAIL_REDIS_PASSWORD"),
			S3Endpoint: os.Getenv("ZIPTRAIL_S3_ENDPOINT"), S3AccessKey: os.Getenv("ZIPTRAIL_S3_ACCESS_KEY"), S3SecretKey: os.Getenv("ZIPTRAIL_S3_SECRET_KEY"),
			S3Bucket: os.Getenv("ZIPTRAIL_S3_BUCKET"), S3Tls: os.Getenv("ZIPTRAIL_S3_TLS") == "true"}, c.Namespace)
		if err == nil {
			c.Redis, c.S3 = r, s3
		}
	}
	return c
}

func envStr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil {
		return v
	}
	return def
}
