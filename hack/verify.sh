#!/usr/bin/env bash
# Fails when anything generated or formatted is stale, without changing the
# work tree: generated files are regenerated, compared with what is there,
# and put back as they were.
#   hack/verify.sh            all checks
#   hack/verify.sh generated  only the generated-files check
set -euo pipefail
cd "$(dirname "$0")/.."

GENERATED=(config/crd/bases config/rbac/operator/role.yaml config/rbac/agent/role.yaml api/v1alpha1/zz_generated.deepcopy.go images/operator/Dockerfile images/agent/Dockerfile)
fail=0

verify_generated() {
  local saved
  saved="$(mktemp -d)"
  tar -cf "$saved/before.tar" "${GENERATED[@]}"
  make -s manifests generate >/dev/null
  tar -cf "$saved/after.tar" "${GENERATED[@]}"
  mkdir "$saved/before" "$saved/after"
  tar -xf "$saved/before.tar" -C "$saved/before"
  tar -xf "$saved/after.tar" -C "$saved/after"
  if ! diff -ru "$saved/before" "$saved/after" >"$saved/diff"; then
    echo "verify: generated files are stale; run 'make manifests generate' and commit the result:" >&2
    sed "s#$saved/before/##; s#$saved/after/##" "$saved/diff" | head -40 >&2
    # Put the work tree back as it was: verify reports, it never edits.
    rm -rf "${GENERATED[@]}"
    tar -xf "$saved/before.tar"
    fail=1
  fi
  rm -rf "$saved"
}

verify_format() {
  local bad
  bad="$(gofmt -l $(git ls-files '*.go') 2>/dev/null || true)"
  if [ -n "$bad" ]; then
    echo "verify: gofmt would change: $bad (run 'make fmt')" >&2
    fail=1
  fi
}

verify_gomod() {
  if ! go mod tidy -diff >/dev/null 2>&1; then
    echo "verify: go.mod/go.sum are not tidy (run 'go mod tidy'):" >&2
    go mod tidy -diff >&2 || true
    fail=1
  fi
}

verify_vet() {
  go vet ./... || fail=1
}

case "${1:-all}" in
  generated) verify_generated ;;
  all) verify_generated; verify_format; verify_gomod; verify_vet ;;
  *) echo "usage: $0 [generated|all]" >&2; exit 2 ;;
esac
[ "$fail" -eq 0 ] && echo "verify: ok" >&2
exit "$fail"
