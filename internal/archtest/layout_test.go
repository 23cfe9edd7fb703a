package archtest

// This file is the layout: the wings, which package belongs to which, the
// rules between them and the imports that break a rule today. Edit it when
// a package moves (issue 34 moves them by `git mv`) or a new one is added;
// the machinery is in graph_test.go.

// A wing is a part of the house: where a package runs and who depends on it.
type wing string

const (
	operator     wing = "operator"      // the control plane, in the operator's pod
	dataPlane    wing = "data plane"    // queue-proxy-zl and activator-ext
	localCluster wing = "local cluster" // Kubernetes and Knative on a developer's machine and in CI
	tooling      wing = "tooling"       // test servers, envtest, calibration, the developer CLI
	sharedLeaf   wing = "shared leaf"   // used by several wings, imports none of them
	goSDK        wing = "Go SDK"        // linked into users' programs
	examples     wing = "examples"      // sample functions, built on the Go SDK
	benchmarks   wing = "benchmarks"
	testSuites   wing = "test suites" // e2e, the chart's tests, the Python SDK's test programs
)

// production reports whether code of the wing ships: runs in a user's
// cluster or is linked into a user's program.
func (w wing) production() bool {
	switch w {
	case operator, dataPlane, sharedLeaf, goSDK, examples:
		return true
	}
	return false
}

// A placement puts the packages matching pattern in a wing. pattern is a
// package path relative to the module: "a/b" is that package, "a/b/..." is
// a/b and every package under it. The longest matching pattern wins.
type placement struct {
	pattern string
	wing    wing
	// moveTo is where a package not yet at its home goes (issue 34); empty
	// for a home. A row with moveTo must place a package: once the package
	// has moved, the home's row places it and this row is to be deleted.
	moveTo string
}

// placements is the house. Every package of the module must be placed.
var placements = []placement{
	// The homes of the target layout. A package moved under one needs no
	// row of its own.
	{"internal/operator/...", operator, ""},
	{"internal/dataplane/...", dataPlane, ""},
	{"internal/localcluster/...", localCluster, ""},
	{"internal/tools/...", tooling, ""},
	{"internal/engine/...", sharedLeaf, ""},     // the trigger engine
	{"internal/invocation/...", sharedLeaf, ""}, // the invocation wire format (+ call/, rerun)
	{"internal/shuffle/...", sharedLeaf, ""},    // the Locus model and planner
	{"internal/recovery", sharedLeaf, ""},       // ends panics in shared processes: operator and data plane
	{"internal/retry", sharedLeaf, ""},          // paces the gateway clients' retries: CLI, Go admin client, controlclient
	{"internal/nodedir", sharedLeaf, ""},        // the same-node directory's mode and making: node-dir DaemonSet, node agent, data plane
	{"internal/archtest", tooling, ""},          // this package
	{"api/...", sharedLeaf, ""},                 // the CRDs: the user's API
	{"controllers/...", operator, ""},
	{"sdk/go/...", goSDK, ""},
	{"examples/...", examples, ""},
	{"bench/...", benchmarks, ""},
	{"e2e/...", testSuites, ""},
	{"charts", testSuites, ""},               // chart_test.go only
	{"sdk/python/tests/...", testSuites, ""}, // Go programs the Python SDK's tests run
	{"cmd/operator", operator, ""},
	{"cmd/queue-proxy-zl", dataPlane, ""},
	{"cmd/activator-ext", dataPlane, ""},
	{"cmd/ziptrail-node", localCluster, ""},
	{"cmd/ziptrail-ingress", localCluster, ""},
	// The ziptrail CLI is tooling, not production: its local up, demo and
	// calibrate link the local cluster, envtest and the test servers, and
	// the layout puts calibrate under internal/tools.
	{"cmd/ziptrail", tooling, ""},

	// The generated gRPC APIs are the contracts between the wings, spoken
	// by both sides: shared leaves, wherever their service lives.
	{"internal/operator/control/controlv1", sharedLeaf, ""},   // operator ↔ every sidecar
	{"internal/operator/gateway/gatewayv1", sharedLeaf, ""},   // session gateway ↔ CLI, Go admin client
	{"internal/dataplane/localapi/sidecarv1", sharedLeaf, ""}, // sidecar ↔ the SDKs
	// Test helpers that live beside the code they test.
	{"internal/operator/control/guard/guardtest", tooling, ""}, // hostile gRPC clients for the servers' tests
}

// dataPlaneClientAPI are the data-plane packages the operator may use, as
// a client.
var dataPlaneClientAPI = map[string]bool{
	"internal/dataplane/pull":  true,
	"internal/dataplane/ref":   true,
	"internal/dataplane/store": true,
}

// enginePath is the trigger engine's package.
const enginePath = "internal/engine"

// engineForbidden are the packages (with all under them) the engine must
// not reach, with what they are.
var engineForbidden = []struct{ root, what string }{
	{"k8s.io", "Kubernetes"},
	{"sigs.k8s.io", "Kubernetes"},
	{"knative.dev", "Knative"},
	{"net/http", "HTTP"},
	{"google.golang.org/grpc", "gRPC"},
}

// The rules' ids, as exceptions name them.
const (
	ruleDataPlane    = "data-plane-imports-no-operator"
	ruleOperatorUse  = "operator-uses-only-pull-ref-store"
	ruleEngine       = "engine-imports-no-kubernetes-http-grpc"
	ruleSDK          = "sdk-imports-no-operator-or-local-cluster"
	ruleProduction   = "production-imports-no-tooling"
	ruleSharedLeaves = "shared-leaves-import-no-wing"
)

// rules are the layout's rules. Each binds some packages and forbids them
// to reach others, directly or through any chain of imports.
var rules = []rule{
	{
		id:      ruleDataPlane,
		summary: "the data plane never imports the operator",
		binds:   inWing(dataPlane),
		forbids: wingIn(operator),
	},
	{
		id:      ruleOperatorUse,
		summary: "the operator uses the data plane only as a client of pull, ref and store",
		binds:   inWing(operator),
		forbids: func(p pkg) (string, bool) {
			return string(dataPlane), p.wing == dataPlane && !dataPlaneClientAPI[p.path]
		},
		passes: func(p pkg) bool { return dataPlaneClientAPI[p.path] },
	},
	{
		id:      ruleEngine,
		summary: "the trigger engine imports no Kubernetes, HTTP or gRPC package, directly or transitively",
		binds:   func(p pkg) bool { return p.local && under(p.path, enginePath) },
		forbids: func(p pkg) (string, bool) {
			if p.local {
				return "", false
			}
			for _, f := range engineForbidden {
				if under(p.path, f.root) {
					return f.what, true
				}
			}
			return "", false
		},
	},
	{
		id:      ruleSDK,
		summary: "sdk/go imports nothing from the operator or the local cluster",
		binds:   inWing(goSDK),
		forbids: wingIn(operator, localCluster),
	},
	{
		id:      ruleProduction,
		summary: "production code imports no tooling, local cluster, benchmark or test code",
		binds:   func(p pkg) bool { return p.wing.production() },
		forbids: func(p pkg) (string, bool) { return string(p.wing), p.local && !p.wing.production() },
	},
	{
		id:      ruleSharedLeaves,
		summary: "a shared leaf imports only other shared leaves (and outside packages)",
		binds:   inWing(sharedLeaf),
		forbids: func(p pkg) (string, bool) { return string(p.wing), p.local && p.wing != sharedLeaf },
	},
}

// exceptions are the imports that break a rule today, each to be fixed
// under the issue it names. Each is one direct import (from → to, paths
// relative to the module) that crosses the rule's boundary; what lies
// behind it is excused with it, any other way across is not. An exception
// no longer needed fails the test: delete it.
var exceptions = []exception{}
