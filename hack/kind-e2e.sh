#!/usr/bin/env bash
# kind-e2e.sh runs the e2e suite against real Knative Serving on a kind
# cluster: create the cluster, install Knative Serving (the release matching
# knative.dev/serving in go.mod) with Kourier, build and `kind load` our
# images, `helm install` the chart, run `go test ./e2e/...` with
# E2E_TARGET=kind, and delete the cluster (KEEP_CLUSTER=1 keeps it).
#
# Needs docker (or podman via KIND_EXPERIMENTAL_PROVIDER), kind, kubectl,
# helm and Go. Our CI machines have no container runtime, so this is not
# part of `make test`; it is for a developer machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CLUSTER="${KIND_CLUSTER:-ziptrail-e2e}"
REGISTRY="${IMAGE_REGISTRY:-ghcr.io/ziptrail}"
TAG="${IMAGE_TAG:-e2e}"
DOCKER="${DOCKER:-docker}"
NAMESPACE=ziptrail-system

# knative.dev/serving v0.N.0 is released as knative-v1.(N-27).x
# (v0.37 = knative-v1.10, v0.47 = knative-v1.20, v0.50 = knative-v1.23).
if [[ -z "${KNATIVE_VERSION:-}" ]]; then
	mod="$(go list -m -f '{{.Version}}' knative.dev/serving)"
	minor="$(cut -d. -f2 <<<"$mod")"
	KNATIVE_VERSION="knative-v1.$((minor - 27)).0"
fi
SERVING="https://github.com/knative/serving/releases/download/${KNATIVE_VERSION}"
KOURIER="https://github.com/knative-extensions/net-kourier/releases/download/${KNATIVE_VERSION}"

for tool in kind kubectl helm go "$DOCKER"; do
	command -v "$tool" >/dev/null || { echo "kind-e2e: $tool not found (eval \"\$(hack/install-deps.sh --env)\" for helm/kubectl)" >&2; exit 1; }
done

cleanup() {
	if [[ "${KEEP_CLUSTER:-}" != 1 ]]; then kind delete cluster --name "$CLUSTER"; fi
}
if ! kind get clusters | grep -qx "$CLUSTER"; then
	kind create cluster --name "$CLUSTER" --wait 120s
fi
trap cleanup EXIT
kubectl config use-context "kind-$CLUSTER"

echo "== Knative Serving ${KNATIVE_VERSION} with Kourier"
kubectl apply -f "$SERVING/serving-crds.yaml"
kubectl wait --for=condition=Established --timeout=120s crd/services.serving.knative.dev
kubectl apply -f "$SERVING/serving-core.yaml"
kubectl apply -f "$KOURIER/kourier.yaml"
kubectl patch configmap/config-network -n knative-serving --type merge \
	-p '{"data":{"ingress-class":"kourier.ingress.networking.knative.dev"}}'
# As on the local target (e2e/suite_test.go): two pods per function by
# default (the fan-out and fault specs expect them); functions that set their
# own min-scale, and scale-to-zero, keep Knative's behaviour.
kubectl patch configmap/config-autoscaler -n knative-serving --type merge \
	-p '{"data":{"min-scale":"2"}}'
# Kourier's gateway is a LoadBalancer Service; on kind it is reached through
# its NodePort, and sslip.io gives the default domain.
kubectl apply -f "$SERVING/serving-default-domain.yaml"
kubectl wait --for=condition=Available --timeout=300s -n knative-serving deployment --all
kubectl wait --for=condition=Available --timeout=300s -n kourier-system deployment --all

echo "== images ${REGISTRY}/*:${TAG}"
for image in operator queue-proxy-zl activator-ext; do
	"$DOCKER" build -f "build/Dockerfile.$image" -t "$REGISTRY/$image:$TAG" .
	kind load docker-image --name "$CLUSTER" "$REGISTRY/$image:$TAG"
done

echo "== helm install"
helm upgrade --install ziptrail charts/ziptrail --namespace "$NAMESPACE" --create-namespace --wait --timeout 5m \
	--set image.registry="$REGISTRY" --set image.tag="$TAG" --set image.pullPolicy=Never \
	--set activatorExt.enabled=true --set sameNode.enabled=true
# The hook swapped the activator's image: wait for Knative's activator to roll out with it.
kubectl rollout status -n knative-serving deployment/activator --timeout=300s
kubectl get configmap/config-deployment -n knative-serving -o jsonpath='{.data.queue-sidecar-image}{"\n"}'

echo "== e2e (E2E_TARGET=kind)"
# The suite reaches Knative's ingress (Kourier) and the session gateway
# through port-forwards; the tests create their own namespaces.
kubectl port-forward -n kourier-system service/kourier 18080:80 >/dev/null &
pf_ingress=$!
kubectl port-forward -n "$NAMESPACE" service/ziptrail-gateway 18088:8088 >/dev/null &
pf_gateway=$!
trap 'kill "$pf_ingress" "$pf_gateway" 2>/dev/null || true; cleanup' EXIT
for port in 18080 18088; do
	for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.2; done
done
# Only ./e2e/: e2e/node, e2e/knative and e2e/helm start their own local
# cluster (root, this host) and do not run against kind.
E2E_TARGET=kind E2E_INGRESS=127.0.0.1:18080 E2E_GATEWAY=127.0.0.1:18088 \
	go test -count=1 -timeout 60m ./e2e/ "$@"
