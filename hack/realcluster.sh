#!/usr/bin/env bash
# Builds the node and control-plane binaries of the real-node cluster
# (test/realcluster, `make cluster-real`) from their Go modules and caches them
# under ~/.cache/proxyshift, keyed by version. Prints the directory holding
# them:
#   kubelet, kube-controller-manager, kube-scheduler  k8s.io/kubernetes (hack/lib/k8smodule.sh)
#   kube-proxy                                        hack/kube-proxy.sh's cache (linked)
#   kube-apiserver, etcd, kubectl                     hack/controlplane.sh's cache (linked)
#   containerd, containerd-shim-runc-v2, ctr          github.com/containerd/containerd/v2
#
# containerd is built through a small wrapper module, static and without the
# storage drivers that need cgo (btrfs, devmapper, zfs); the shim also leaves
# out gRPC, as containerd's own release build does. runc and the CNI plugins
# come from Debian (hack/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/k8smodule.sh
. hack/lib/k8smodule.sh

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.4.2}"
CACHE_ROOT="${PROXYSHIFT_CACHE:-$HOME/.cache/proxyshift}"
BIN_DIR="$CACHE_ROOT/realcluster/k8s-$K8S_VERSION-containerd-$CONTAINERD_VERSION"
K8S_CMDS=(kubelet kube-controller-manager kube-scheduler)
CONTAINERD_CMDS=(containerd containerd-shim-runc-v2 ctr)
CONTAINERD_TAGS="urfave_cli_no_docs no_btrfs no_devmapper no_zfs osusergo netgo static_build"

log() { echo "realcluster: $*" >&2; }

have() {
  local f
  for f in "$@"; do [ -x "$BIN_DIR/$f" ] || return 1; done
}

ALL=("${K8S_CMDS[@]}" "${CONTAINERD_CMDS[@]}" kube-proxy kube-apiserver etcd kubectl)
if have "${ALL[@]}"; then
  echo "$BIN_DIR"
  exit 0
fi

command -v go >/dev/null || { log "go is required"; exit 1; }
mkdir -p "$BIN_DIR"
work="$(mktemp -d "$CACHE_ROOT/build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOWORK=off

build_containerd() {
  local dir="$work/containerd" cmd tags
  mkdir -p "$dir"
  cat > "$dir/go.mod" <<GOMOD
module proxyshift.local/containerdbuild

go 1.26

require github.com/containerd/containerd/v2 $CONTAINERD_VERSION
GOMOD
  {
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for cmd in "${CONTAINERD_CMDS[@]}"; do echo "	_ \"github.com/containerd/containerd/v2/cmd/$cmd\""; done
    echo ")"
  } > "$dir/tools.go"
  (cd "$dir" && go mod tidy >&2)
  for cmd in "${CONTAINERD_CMDS[@]}"; do
    tags="$CONTAINERD_TAGS"
    [ "$cmd" = containerd-shim-runc-v2 ] && tags="$tags no_grpc"
    log "building $cmd $CONTAINERD_VERSION"
    (cd "$dir" && go build -trimpath -tags "$tags" \
      -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
      -o "$BIN_DIR/$cmd.tmp" "github.com/containerd/containerd/v2/cmd/$cmd") && mv "$BIN_DIR/$cmd.tmp" "$BIN_DIR/$cmd"
  done
}

build_kubernetes() {
  local dir="$work/kubernetes" cmd
  k8s_module_dir "$dir" "$K8S_VERSION" "${K8S_CMDS[@]}"
  for cmd in "${K8S_CMDS[@]}"; do
    have "$cmd" && continue
    log "building $cmd $K8S_VERSION"
    k8s_build "$dir" "$K8S_VERSION" "$cmd" "$BIN_DIR/$cmd"
  done
}

# link NAME TARGET: BIN_DIR/NAME points at another script's cached binary.
link() { ln -sfn "$2" "$BIN_DIR/$1"; }

have "${CONTAINERD_CMDS[@]}" || build_containerd
have "${K8S_CMDS[@]}" || build_kubernetes
have kube-proxy || link kube-proxy "$(K8S_VERSION="$K8S_VERSION" hack/kube-proxy.sh)"
if ! have kube-apiserver etcd kubectl; then
  assets="$(K8S_VERSION="$K8S_VERSION" hack/controlplane.sh)"
  for cmd in kube-apiserver etcd kubectl; do link "$cmd" "$assets/$cmd"; done
fi
have "${ALL[@]}" || { log "build incomplete in $BIN_DIR"; exit 1; }
echo "$BIN_DIR"
