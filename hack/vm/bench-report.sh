#!/usr/bin/env bash
# hack/vm/bench-report.sh DOC: puts the IPVS report that test/vmbench
# printed on the VM's console (between its PROXYSHIFT-BENCH-REPORT-BEGIN
# and -END lines, in the serial log of the last hack/vm/run.sh) into the
# Markdown file DOC, between the lines "<!-- make bench-vm: begin -->" and
# "<!-- make bench-vm: end -->" (appended when missing). make bench-vm
# runs it after the VM, also when a package failed: a run that stopped
# early says so in its report.
set -euo pipefail
doc="${1:?usage: hack/vm/bench-report.sh DOC}"
log="${PROXYSHIFT_VM_LOG:-${PROXYSHIFT_CACHE:-$HOME/.cache/proxyshift}/vm/serial.log}"
begin='<!-- make bench-vm: begin -->'
end='<!-- make bench-vm: end -->'

report="$(mktemp)"
trap 'rm -f "$report"' EXIT
awk '/^PROXYSHIFT-BENCH-REPORT-BEGIN$/ { on = 1; body = ""; next }
     /^PROXYSHIFT-BENCH-REPORT-END$/ { on = 0; last = body; next }
     on { body = body $0 "\n" }
     END { printf "%s", last }' "$log" > "$report"
if [ ! -s "$report" ]; then
  echo "bench-report: no IPVS report in $log (did test/vmbench run?)" >&2
  exit 1
fi
if ! grep -qxF "$begin" "$doc" || ! grep -qxF "$end" "$doc"; then
  printf '\n%s\n%s\n' "$begin" "$end" >> "$doc"
fi
awk -v begin="$begin" -v end="$end" -v file="$report" '
  $0 == begin { print; while ((getline line < file) > 0) print line; skip = 1; next }
  $0 == end { skip = 0 }
  !skip' "$doc" > "$doc.new"
mv "$doc.new" "$doc"
echo "bench-report: the IPVS report is in $doc" >&2
