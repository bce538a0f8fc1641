# shellcheck shell=bash
# Shared by the scripts that build Kubernetes binaries from the
# k8s.io/kubernetes Go module (hack/controlplane.sh, hack/kube-proxy.sh).
#
# k8s.io/kubernetes can only be built as a dependency when every staging
# module it lists ("k8s.io/x => ./staging/src/k8s.io/x") is replaced by its
# published v0.x version; k8s_module_dir writes such a go.mod.

# k8s_module_dir DIR VERSION CMD...: writes DIR/go.mod requiring
# k8s.io/kubernetes@VERSION with the staging replaces, plus a tools.go that
# imports k8s.io/kubernetes/cmd/CMD for each CMD, and runs go mod tidy.
k8s_module_dir() {
  local dir="$1" version="$2" gomod cmd
  shift 2
  mkdir -p "$dir"
  gomod="$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')"
  {
    echo "module proxyshift.local/k8sbuild"
    echo
    echo "go 1.26"
    echo
    echo "require k8s.io/kubernetes $version"
    echo
    sed -n 's#^\s*\(k8s\.io/[^ ]*\) => ./staging/.*#replace \1 => \1 v0.'"${version#v1.}"'#p' "$gomod"
  } > "$dir/go.mod"
  {
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for cmd in "$@"; do echo "	_ \"k8s.io/kubernetes/cmd/$cmd\""; done
    echo ")"
  } > "$dir/tools.go"
  (cd "$dir" && go mod tidy >&2)
}

# k8s_build DIR VERSION CMD OUT: builds k8s.io/kubernetes/cmd/CMD inside DIR
# (prepared by k8s_module_dir) into OUT, stamped with VERSION, atomically.
k8s_build() {
  local dir="$1" version="$2" cmd="$3" out="$4"
  (cd "$dir" && CGO_ENABLED=0 GOFLAGS=-mod=mod GOWORK=off go build -trimpath \
    -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/client-go/pkg/version.gitVersion=$version" \
    -o "$out.tmp" "k8s.io/kubernetes/cmd/$cmd") && mv "$out.tmp" "$out"
}
