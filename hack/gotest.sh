#!/usr/bin/env bash
# Runs go test with the given arguments and prints a readable summary
# (hack/testsummary): package results, failed tests' output, every skip with
# its reason, and "N passed, N failed, N skipped".
set -euo pipefail
cd "$(dirname "$0")/.."
go build -o bin/testsummary ./hack/testsummary
go test -json -count=1 -timeout 20m "$@" 2>&1 | bin/testsummary
