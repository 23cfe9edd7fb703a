# ziptrail Makefile. Tools and binaries live in $(ZIPTRAIL_CACHE) (outside the
# repo); hack/install-deps.sh installs them and prints the environment.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

ZIPTRAIL_CACHE ?= $(HOME)/.cache/ziptrail
export ZIPTRAIL_CACHE
DEPS_ENV = eval "$$(hack/install-deps.sh --env)"
GO_TEST_FLAGS ?= -race -count=1 -timeout 60m

.PHONY: deps
deps: ## Install pinned tools and servers into $(ZIPTRAIL_CACHE).
	hack/install-deps.sh

.PHONY: generate
generate: ## Generate deepcopy, CRDs, RBAC and protocol code.
	$(DEPS_ENV); hack/generate.sh

.PHONY: verify-generate
verify-generate: generate ## Fail if generated files are out of date.
	@git diff --exit-code -- api config internal proto charts sdk || { echo "generated files are stale: run 'make generate' and commit"; exit 1; }

.PHONY: build
build: ## Build all binaries into ./bin.
	go build -o bin/ ./cmd/...

.PHONY: lint
lint: ## gofmt and go vet.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [[ -n "$$out" ]]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	go vet ./...

.PHONY: test
test: deps lint test-go test-python fuzz-short chaos-short ## Install deps, then run every test suite against real servers, and the short chaos checker.

# The packages that run the local cluster (one per host at a time: each
# waits for the host, internal/localcluster/k8s claimHost) run one after another,
# alongside the others, one at a time too: in one `go test -p 2` a package
# waiting for the host held one of the two slots, and the others queued
# behind it. The race detector writes its reports to files (GORACE
# log_path), printed again after the run: a long run's log is often read
# from its end; the cluster packages' output is printed when they end.
CLUSTER_PKGS = /e2e($$|/)|/internal/localcluster/k8s$$
.PHONY: test-go
test-go:
	$(DEPS_ENV); races=$$(mktemp -d); out=$$(mktemp); rc=0; \
	pkgs=$$(go list ./...); cluster=$$(grep -E '$(CLUSTER_PKGS)' <<<"$$pkgs"); rest=$$(grep -vE '$(CLUSTER_PKGS)' <<<"$$pkgs"); \
	echo "--- go test: $$(wc -l <<<"$$cluster") packages on the local cluster, one at a time (output at their end), alongside the other $$(wc -l <<<"$$rest")"; \
	GORACE="log_path=$$races/report $${GORACE:-}" go test $(GO_TEST_FLAGS) -p 1 $$cluster >"$$out" 2>&1 & cpid=$$!; \
	GORACE="log_path=$$races/report $${GORACE:-}" go test $(GO_TEST_FLAGS) -p 1 $$rest || rc=$$?; \
	wait $$cpid || rc=$$?; \
	echo "--- go test: the packages on the local cluster"; cat "$$out"; \
	for f in "$$races"/report.*; do [[ -f $$f ]] || continue; echo "--- data race report $${f##*/} (pid):"; cat "$$f"; done; \
	rm -rf "$$races" "$$out"; exit $$rc

.PHONY: fuzz fuzz-short
fuzz: ## Every fuzz target for FUZZTIME each (default 10m): decoders of outside input (hack/fuzz.sh).
	$(DEPS_ENV); FUZZTIME=$${FUZZTIME:-10m} hack/fuzz.sh
fuzz-short: ## Every fuzz target for 5 s (part of make test).
	$(DEPS_ENV); FUZZTIME=5s FUZZMINIMIZETIME=1s hack/fuzz.sh

.PHONY: test-python
test-python: ## Python SDK and examples tests (pytest) in the cached venv.
	$(DEPS_ENV); pip install -q ./sdk/python && python -m pytest -q sdk/python examples

.PHONY: demo
demo: deps ## The local cluster (Kubernetes, real Knative Serving, ziptrail) runs the word count sample; checks it; tears down.
	$(DEPS_ENV); go run ./cmd/ziptrail demo

.PHONY: bench
bench: ## Trigger engine benchmarks (single core).
	go test -run XXX -bench . -cpu 1 -benchtime 2s ./internal/engine

.PHONY: bench-dataplane
bench-dataplane: deps ## ziptrail vs raw TCP vs Redis vs S3 (and the SDK path, its floor, redis-benchmark), one run, the systems in turns; writes docs/bench/.
	$(DEPS_ENV); go run ./bench/dataplane -reps 51

.PHONY: bench-messaging
bench-messaging: deps ## Direct messages between pods vs Redis LPUSH/BRPOP (Pikachu Fig. 7/8, allreduce, membership, death detection), one run; writes docs/bench/.
	$(DEPS_ENV); go run ./bench/messaging

.PHONY: bench-sessions
bench-sessions: deps ## Sessions/s through the whole path with a sharded engine: 1 and 2 operator replicas (each pinned to its core) alternately, projection to more; writes docs/bench/.
	$(DEPS_ENV); go run ./bench/sessions

.PHONY: bench-chain
bench-chain: deps ## Workflow latency on the local cluster: 2/4/100-function chains and a 1,000-step ring (root).
	$(DEPS_ENV); go run ./bench/chain -ring 1000

.PHONY: bench-coldstart
bench-coldstart: deps ## Cold starts on the local cluster: reader invoked with a reference from zero, warm baseline, autoscaler under load (root).
	$(DEPS_ENV); go run ./bench/coldstart

.PHONY: bench-sort
bench-sort: deps ## Sort of 1/2/4 GiB on the local cluster through each shuffle method, model vs measured, and Ray as a peer (root; docs/benchmarks.md "Sort").
	$(DEPS_ENV); test -f docs/bench/sort-calibration.json || go run ./cmd/ziptrail calibrate --local --worker-startup 585ms -o docs/bench/sort-calibration.json
	$(DEPS_ENV); go run ./bench/sort

.PHONY: bench-sidecarmem
bench-sidecarmem: deps ## Resident memory and invocation latency of queue-proxy-zl vs stock queue-proxy (root).
	$(DEPS_ENV); go run ./bench/sidecarmem -latency 2000

# The chaos checker (bench/chaos, docs/guarantees.md "How we test it"):
# sessions of four shapes under nemeses (operator SIGKILL/SIGSTOP, rollout
# restart, helm upgrade, function and queue-proxy-zl SIGKILL, Redis restart
# and SIGSTOP) on the local cluster with the chart-installed operator,
# unsharded then sharded; exits non-zero on any violation (root).
.PHONY: chaos chaos-short
chaos: deps ## Chaos checker: 10 minutes unsharded, then 10 sharded (3 replicas); a table per nemesis (root).
	$(DEPS_ENV); go run ./bench/chaos -duration $${CHAOS_DURATION:-10m} -sharded=both
# chaos-short packs every nemesis into 75 s (8 s a phase, against 67 s in
# make chaos): four operator disruptions (SIGKILL, SIGSTOP, two rollouts)
# follow each other within 40 s, so a session started before them waits for
# the engine through all of them (unsharded p99 72 s in a clean run); its
# deadline is 3 minutes (1 in make chaos): a gate with room, for sessions
# that never end.
# Part of make test.
chaos-short: deps ## Chaos checker, short: 75 s unsharded, then 75 s sharded, every nemesis, ≈ 5 minutes with setup (root).
	$(DEPS_ENV); go run ./bench/chaos -duration 75s -sharded=both -session-deadline 3m

.PHONY: e2e
e2e: deps ## The local e2e suite alone (part of make test).
	$(DEPS_ENV); go test -count=1 -timeout 20m ./e2e/...

.PHONY: help
help:
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk -F':.*?## ' '{printf "  %-16s %s\n", $$1, $$2}'
