#!/usr/bin/env bash
# install-deps.sh installs everything ziptrail's tests and demo need, pinned,
# into a cache outside the repository ($ZIPTRAIL_CACHE, default
# $HOME/.cache/ziptrail). It is idempotent: a second run only checks what is
# already there. Binaries are cached by version, so bumping a pin rebuilds only
# that tool.
#
#   hack/install-deps.sh            install everything
#   hack/install-deps.sh --env      print the environment (eval-able) and exit
#
# No binary download sites are reachable from our CI, so the Kubernetes control
# plane (kube-apiserver, etcd, kubectl), MinIO and helm are built from Go
# modules through the module proxy; redis-server comes from Debian.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${ZIPTRAIL_CACHE:-$HOME/.cache/ziptrail}"

# Pins. Keep these in one place; docs/dependencies.md explains each.
K8S_VERSION=v1.36.3        # kube-apiserver, kubectl (envtest assets), kube-controller-manager, kube-scheduler, kube-proxy
COREDNS_VERSION=v1.14.7    # cluster DNS of the local cluster (see hack/tools/coredns/go.mod)
ETCD_VERSION=v3.6.16       # etcd server (see hack/tools/etcd/go.mod)
CONTROLLER_TOOLS_VERSION=v0.20.1
HELM_VERSION=v3.22.0
PROTOC_GEN_GO_VERSION=v1.36.12     # matches google.golang.org/protobuf in go.mod
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
PY_PACKAGES=(pytest==9.2.0 grpcio==1.85.1 grpcio-tools==1.85.1 grpcio-status==1.85.1 protobuf==7.36.2 googleapis-common-protos==1.76.0 kubernetes==37.0.2 hypothesis==6.170.15)

ENVTEST_DIR="$CACHE/k8s/$K8S_VERSION-etcd-$ETCD_VERSION"
BIN="$CACHE/bin"
VENV="$CACHE/venv"

print_env() {
	echo "export ZIPTRAIL_CACHE=\"$CACHE\""
	echo "export KUBEBUILDER_ASSETS=\"$ENVTEST_DIR\""
	echo "export PATH=\"$BIN:$ENVTEST_DIR:$VENV/bin:\$PATH\""
}
if [[ "${1:-}" == "--env" ]]; then
	print_env
	exit 0
fi

log() { printf '[install-deps] %s\n' "$*"; }
have() { [[ -x "$1" ]]; }
start=$(date +%s)
mkdir -p "$BIN" "$ENVTEST_DIR"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

# --- Debian packages --------------------------------------------------------
apt_pkgs=()
command -v redis-server >/dev/null || apt_pkgs+=(redis-server)
command -v ip >/dev/null || apt_pkgs+=(iproute2)
command -v protoc >/dev/null || apt_pkgs+=(protobuf-compiler)
command -v iptables >/dev/null || apt_pkgs+=(iptables)   # kube-proxy (iptables mode)
command -v conntrack >/dev/null || apt_pkgs+=(conntrack) # kube-proxy clears stale UDP (DNS) entries
if ((${#apt_pkgs[@]})); then
	log "apt-get install ${apt_pkgs[*]}"
	SUDO=""
	[[ $(id -u) -ne 0 ]] && SUDO=sudo
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${apt_pkgs[@]}" >/dev/null
else
	log "debian: redis-server, ip, protoc, iptables, conntrack present"
fi

# --- Go tools built from modules ------------------------------------------
go_install() { # name version pkg@version
	local name=$1 version=$2 pkg=$3
	local dst="$BIN/$name-$version"
	if have "$dst"; then
		log "$name $version cached"
	else
		log "building $name $version (go install $pkg)"
		local t=$(date +%s)
		GOBIN="$CACHE/gobin-tmp" CGO_ENABLED=0 go install -trimpath "$pkg"
		mv "$CACHE/gobin-tmp/$name" "$dst"
		log "built $name in $(($(date +%s) - t))s"
	fi
	ln -sf "$dst" "$BIN/$name"
}

# kube-apiserver, kubectl and the other components of the local cluster
# (kube-controller-manager, kube-scheduler, kube-proxy) from k8s.io/kubernetes
# with its staging modules replaced by their published versions
# (hack/tools/k8s/go.mod). They share most packages: after kube-apiserver,
# each builds largely from the Go build cache.
build_k8s() {
	local ver=$K8S_VERSION
	local ldflags
	ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$ver -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$ver" | cut -d. -f2) -X k8s.io/component-base/version.gitTreeState=clean"
	for cmd in kube-apiserver kubectl kube-controller-manager kube-scheduler kube-proxy; do
		if have "$ENVTEST_DIR/$cmd"; then
			log "$cmd $ver cached"
			continue
		fi
		log "building $cmd $ver from k8s.io/kubernetes (cold on 2 cores: kube-apiserver ~9 min, the others 1-5 min each)"
		local t=$(date +%s)
		(cd "$ROOT/hack/tools/k8s" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$ENVTEST_DIR/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
		mv "$ENVTEST_DIR/$cmd.tmp" "$ENVTEST_DIR/$cmd"
		log "built $cmd in $(($(date +%s) - t))s"
	done
	if have "$ENVTEST_DIR/etcd"; then
		log "etcd $ETCD_VERSION cached"
	else
		log "building etcd $ETCD_VERSION (cold: ~1.5 min)"
		local t=$(date +%s)
		(cd "$ROOT/hack/tools/etcd" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$ENVTEST_DIR/etcd.tmp" .)
		mv "$ENVTEST_DIR/etcd.tmp" "$ENVTEST_DIR/etcd"
		log "built etcd in $(($(date +%s) - t))s"
	fi
	ln -sf "$ENVTEST_DIR/kubectl" "$BIN/kubectl"
}

build_k8s
go_install controller-gen "$CONTROLLER_TOOLS_VERSION" "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_TOOLS_VERSION"
go_install protoc-gen-go "$PROTOC_GEN_GO_VERSION" "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION"
go_install protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION" "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC_VERSION"
go_install helm "$HELM_VERSION" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
go_install minio "$MINIO_VERSION" "github.com/minio/minio@$MINIO_VERSION"

# CoreDNS with only the plugins the local cluster's DNS uses
# (hack/tools/coredns/main.go).
if have "$BIN/coredns-$COREDNS_VERSION"; then
	log "coredns $COREDNS_VERSION cached"
else
	log "building coredns $COREDNS_VERSION (cold: ~2-4 min)"
	t=$(date +%s)
	(cd "$ROOT/hack/tools/coredns" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN/coredns-$COREDNS_VERSION.tmp" .)
	mv "$BIN/coredns-$COREDNS_VERSION.tmp" "$BIN/coredns-$COREDNS_VERSION"
	log "built coredns in $(($(date +%s) - t))s"
fi
ln -sf "$BIN/coredns-$COREDNS_VERSION" "$BIN/coredns"

# Knative Serving's controller, webhook, autoscaler and activator: tools of
# the main module (go.mod's `tool` block pins knative.dev/serving). The local
# cluster's node agent builds them into each cluster's image cache when their
# pods start (config/local/images.yaml); compiling them here once fills the
# Go build cache, so that a pod start only links.
knative_stamp="$CACHE/knative-build-$(grep -E '^\s+knative.dev/serving ' "$ROOT/go.mod" | awk '{print $2}')-$(go env GOVERSION)"
if [[ -f "$knative_stamp" ]]; then
	log "knative serving commands compiled (build cache)"
else
	log "compiling Knative Serving's controller, webhook, autoscaler, activator (cold on 2 cores: ~4-6 min)"
	t=$(date +%s)
	(cd "$ROOT" && go build knative.dev/serving/cmd/controller knative.dev/serving/cmd/webhook knative.dev/serving/cmd/autoscaler knative.dev/serving/cmd/activator)
	rm -f "$CACHE"/knative-build-*
	touch "$knative_stamp"
	log "compiled them in $(($(date +%s) - t))s"
fi

# --- Python ----------------------------------------------------------------
stamp="$VENV/.ziptrail-$(echo "${PY_PACKAGES[*]}" | sha256sum | cut -c1-12)"
if [[ -f "$stamp" ]]; then
	log "python venv cached ($VENV)"
else
	log "creating python venv $VENV: ${PY_PACKAGES[*]}"
	python3 -m venv "$VENV"
	"$VENV/bin/pip" install -q --upgrade pip
	"$VENV/bin/pip" install -q "${PY_PACKAGES[@]}"
	rm -f "$VENV"/.ziptrail-*
	touch "$stamp"
fi

log "versions:"
log "  kube-apiserver $("$ENVTEST_DIR/kube-apiserver" --version 2>&1 | head -1)"
log "  etcd           $("$ENVTEST_DIR/etcd" --version 2>&1 | head -1)"
log "  kubectl        $("$ENVTEST_DIR/kubectl" version --client 2>&1 | head -1)"
log "  kube-controller-manager, kube-scheduler, kube-proxy $("$ENVTEST_DIR/kube-proxy" --version 2>&1 | head -1)"
log "  coredns        $("$BIN/coredns" -version 2>&1 | head -1)"
log "  iptables       $(iptables --version 2>&1)"
log "  controller-gen $("$BIN/controller-gen" --version 2>&1)"
log "  protoc         $(protoc --version 2>&1) protoc-gen-go $PROTOC_GEN_GO_VERSION protoc-gen-go-grpc $PROTOC_GEN_GO_GRPC_VERSION"
log "  helm           $("$BIN/helm" version --short 2>&1)"
log "  minio          $MINIO_VERSION"
log "  redis-server   $(redis-server --version | awk '{print $3}')"
log "  python         $("$VENV/bin/python" --version) pytest $("$VENV/bin/pytest" --version 2>&1 | awk '{print $2}')"
log "done in $(($(date +%s) - start))s; environment: eval \"\$(hack/install-deps.sh --env)\""
