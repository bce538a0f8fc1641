#!/usr/bin/env bash
# Builds kube-proxy from the k8s.io/kubernetes Go module (its main,
# cmd/kube-proxy, runs app.NewProxyCommand through k8s.io/component-base/cli)
# and caches it under ~/.cache/proxyshift, keyed by version. Prints the
# binary's path. Used by `make bench` to measure proxyshift beside kube-proxy.
set -euo pipefail
# shellcheck source=lib/k8smodule.sh
. "$(dirname "$0")/lib/k8smodule.sh"

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
CACHE_ROOT="${PROXYSHIFT_CACHE:-$HOME/.cache/proxyshift}"
BIN="$CACHE_ROOT/kube-proxy/$K8S_VERSION/kube-proxy"

if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi
command -v go >/dev/null || { echo "kube-proxy: go is required" >&2; exit 1; }
mkdir -p "$(dirname "$BIN")"
work="$(mktemp -d "$CACHE_ROOT/build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export GOFLAGS=-mod=mod GOWORK=off
k8s_module_dir "$work/kubernetes" "$K8S_VERSION" kube-proxy
echo "kube-proxy: building $K8S_VERSION" >&2
k8s_build "$work/kubernetes" "$K8S_VERSION" kube-proxy "$BIN"
echo "$BIN"
