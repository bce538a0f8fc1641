#!/usr/bin/env bash
# Runs every Go fuzz target for a bounded number of inputs (about 5 s each
# on the 2-core test machine; FUZZTIME, if set, for every target: a count
# such as 20000x, or a duration): the Service/EndpointSlice -> model path,
# the choice of endpoints under topology hints, and the node policy, fed
# whatever the fuzzer makes of addresses, prefixes, ports and endpoint
# states. `go test` alone runs only their seeds; this makes `make test`
# (and CI) search a little beyond them on every run. A failing input is
# written under the package's testdata/fuzz/ and the script fails; commit
# the input with the fix so that it stays a seed.
#
# The defaults are counts, not durations: with a duration, Go 1.26's fuzz
# coordinator can report "context deadline exceeded" as a failure when
# the time runs out while a worker is busy (go.dev/issue/75804, fixed in
# Go 1.27), which made CI red without any failing input (FuzzNodePolicy,
# 2026-12-03). A count has no deadline to race.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(
  "./nodeagent/model FuzzTracker 5000x"
  "./nodeagent/model FuzzTopology 40000x"
  "./nodeagent/dataplane FuzzNodePolicy 60000x"
)
for t in "${targets[@]}"; do
  read -r pkg name count <<<"$t"
  budget="${FUZZTIME:-$count}"
  echo "fuzz: $name ($pkg) for $budget"
  go test -run '^$' -fuzz "^${name}\$" -fuzztime "$budget" "$pkg"
done
