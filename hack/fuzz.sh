#!/usr/bin/env bash
# Runs every Go fuzz target for a bounded time (FUZZTIME each, default 5s):
# the Service/EndpointSlice -> model path, the choice of endpoints under
# topology hints, and the node policy, fed whatever the fuzzer makes of
# addresses, prefixes, ports and endpoint states. `go test` alone runs
# only their seeds; this makes `make test` (and CI) search a little beyond
# them on every run. A failing input is written under the package's
# testdata/fuzz/ and the script fails; commit the input with the fix so
# that it stays a seed.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME="${FUZZTIME:-5s}"
targets=(
  "./nodeagent/model FuzzTracker"
  "./nodeagent/model FuzzTopology"
  "./nodeagent/dataplane FuzzNodePolicy"
)
for t in "${targets[@]}"; do
  read -r pkg name <<<"$t"
  echo "fuzz: $name ($pkg) for $FUZZTIME"
  go test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "$pkg"
done
