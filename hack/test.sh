#!/usr/bin/env bash
# make test's runner (and so CI's): the host suite and the VM's suite side
# by side, then the fuzz targets.
#
# Why side by side: the VM (hack/vm/run.sh) is one emulated CPU under
# qemu's TCG, and the host suite spends much of its time waiting on API
# servers, kubelets and traffic. One after the other they took about 33
# minutes warm on 2 cores, most of the 60-minute budget once the cold
# builds come first; side by side the run takes about as long as the
# longer of the two.
#
# The VM's output goes to a file while the host suite runs, and is printed
# whole after it, so the two never interleave: the host suite's summary
# line comes first, the VM's closes the output. It exits non-zero when any
# of the three failed. An interrupted run stops the VM (its process group;
# run.sh's host-side API server stops when run.sh's end closes its stdin).
set -euo pipefail
cd "$(dirname "$0")/.."

# The control plane first (a cold run builds it): both suites use it
# (the VM's cluster test reaches an API server on the host). Then
# kube-proxy, which the VM's benchmark test runs and the real-node
# cluster too: built once here, not by both at the same time.
assets="$(hack/controlplane.sh)"
hack/kube-proxy.sh > /dev/null
vm_out="$(mktemp "${TMPDIR:-/tmp}/proxyshift-vm.XXXXXX")"
setsid hack/vm/run.sh > "$vm_out" 2>&1 &
vm_pid=$!
stop_vm() {
  if kill -0 "$vm_pid" 2>/dev/null; then
    kill -TERM -- "-$vm_pid" 2>/dev/null || true
    wait "$vm_pid" 2>/dev/null || true
  fi
  rm -f "$vm_out"
}
trap stop_vm EXIT
echo "test: the VM's suite runs beside the host suite (pid $vm_pid); its output follows the host suite's"

# The real-node cluster's binaries (a cold run builds them) while the VM
# runs: only the host suite needs them.
host=0
hack/realcluster.sh > /dev/null || host=$?
[ "$host" -ne 0 ] || KUBEBUILDER_ASSETS="$assets" hack/gotest.sh ./... || host=$?
fuzz=0
hack/fuzz.sh || fuzz=$?

echo "test: waiting for the VM's suite"
vm=0
wait "$vm_pid" || vm=$?
cat "$vm_out"

[ "$host" -eq 0 ] || echo "test: the host suite failed" >&2
[ "$fuzz" -eq 0 ] || echo "test: a fuzz target failed" >&2
[ "$vm" -eq 0 ] || echo "test: the VM's suite failed" >&2
[ "$host" -eq 0 ] && [ "$fuzz" -eq 0 ] && [ "$vm" -eq 0 ]
