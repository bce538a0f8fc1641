#!/usr/bin/env bash
# Builds the test control plane (kube-apiserver, etcd, kubectl) from their Go
# modules and caches the binaries under ~/.cache/proxyshift, keyed by version.
# Prints the directory holding them: use it as KUBEBUILDER_ASSETS.
#
# Why from modules: the machines that run our tests reach only the Go module
# proxy, so no release tarball can be downloaded (hack/lib/k8smodule.sh holds
# the recipe for k8s.io/kubernetes). etcd's server module has replace lines of
# its own, so it is built through a tiny main that calls etcdmain.Main.
set -euo pipefail
# shellcheck source=lib/k8smodule.sh
. "$(dirname "$0")/lib/k8smodule.sh"

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
CACHE_ROOT="${PROXYSHIFT_CACHE:-$HOME/.cache/proxyshift}"
BIN_DIR="$CACHE_ROOT/controlplane/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"

log() { echo "controlplane: $*" >&2; }

have_all() {
  [ -x "$BIN_DIR/kube-apiserver" ] && [ -x "$BIN_DIR/etcd" ] && [ -x "$BIN_DIR/kubectl" ]
}

if have_all; then
  echo "$BIN_DIR"
  exit 0
fi

command -v go >/dev/null || { log "go is required"; exit 1; }
mkdir -p "$BIN_DIR"
work="$(mktemp -d "$CACHE_ROOT/build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOWORK=off

build_kubernetes() {
  local dir="$work/kubernetes" cmd
  k8s_module_dir "$dir" "$K8S_VERSION" kube-apiserver kubectl
  for cmd in kube-apiserver kubectl; do
    log "building $cmd $K8S_VERSION"
    k8s_build "$dir" "$K8S_VERSION" "$cmd" "$BIN_DIR/$cmd"
  done
}

build_etcd() {
  local dir="$work/etcd"
  mkdir -p "$dir"
  cat > "$dir/go.mod" <<GOMOD
module proxyshift.local/etcd

go 1.26

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
  cat > "$dir/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  log "building etcd $ETCD_VERSION"
  (cd "$dir" && go mod tidy >&2 && go build -trimpath -ldflags "-s -w" -o "$BIN_DIR/etcd.tmp" . && mv "$BIN_DIR/etcd.tmp" "$BIN_DIR/etcd")
}

[ -x "$BIN_DIR/etcd" ] || build_etcd
{ [ -x "$BIN_DIR/kube-apiserver" ] && [ -x "$BIN_DIR/kubectl" ]; } || build_kubernetes
have_all || { log "build incomplete in $BIN_DIR"; exit 1; }
echo "$BIN_DIR"
