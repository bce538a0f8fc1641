#!/usr/bin/env bash
# Builds the test control plane (kube-apiserver, etcd, kubectl) from their Go
# modules and caches the binaries under ~/.cache/proxyshift, keyed by version.
# Prints the directory holding them: use it as KUBEBUILDER_ASSETS.
#
# Why from modules: the machines that run our tests reach only the Go module
# proxy, so no release tarball can be downloaded. k8s.io/kubernetes can only be
# built as a dependency when every staging module it lists is replaced by its
# published v0.x version; etcd's server module has replace lines of its own,
# so it is built through a tiny main that calls etcdmain.Main.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
CACHE_ROOT="${PROXYSHIFT_CACHE:-$HOME/.cache/proxyshift}"
BIN_DIR="$CACHE_ROOT/controlplane/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
STAGING_VERSION="v0.${K8S_VERSION#v1.}"

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
  local dir="$work/kubernetes" gomod
  mkdir -p "$dir"
  gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')"
  {
    echo "module proxyshift.local/controlplane"
    echo
    echo "go 1.26"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    # Every "k8s.io/x => ./staging/src/k8s.io/x" line becomes "k8s.io/x => k8s.io/x v0.N.M".
    sed -n 's#^\s*\(k8s\.io/[^ ]*\) => ./staging/.*#replace \1 => \1 '"$STAGING_VERSION"'#p' "$gomod"
  } > "$dir/go.mod"
  cat > "$dir/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  (cd "$dir" && go mod tidy >&2 &&
    for cmd in kube-apiserver kubectl; do
      log "building $cmd $K8S_VERSION"
      go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION" \
        -o "$BIN_DIR/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd" && mv "$BIN_DIR/$cmd.tmp" "$BIN_DIR/$cmd"
    done)
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
