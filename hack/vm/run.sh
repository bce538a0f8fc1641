#!/usr/bin/env bash
# make test-vm: runs the tests that need a real kernel's modules (IPVS,
# module loading) inside a small VM booting Debian's stock cloud kernel,
# where ip_vs, nf_tables and iptables are loadable modules.
#
# It fetches the kernel and a static busybox once (hack/vm/fetch.sh, cached
# under ~/.cache/proxyshift/vm), builds a static test binary for every
# package in hack/vm/packages.txt, packs them with busybox, the modules of
# hack/vm/modules.txt (with their dependencies) and hack/vm/init into an
# initramfs, and boots it with qemu under timeout. The serial console is
# streamed here and kept in a log. It exits non-zero unless every package's
# result line says PASS: a missing line (kernel panic, timeout, crash) is a
# failure. A summary in `go test -json` terms closes the output.
#
# Environment:
#   PROXYSHIFT_VM_KVM=1        use KVM instead of TCG emulation (opt-in)
#   PROXYSHIFT_VM_TIMEOUT=3300 seconds before the VM is killed
#   PROXYSHIFT_VM_MEMORY=512   MiB of guest memory (default 1024 when a
#                              package needs the API server)
#   PROXYSHIFT_VM_TEST_TIMEOUT=DURATION  each package's -test.timeout
#                              (default 25m, 60m with benchmarks)
#   PROXYSHIFT_VM_RUN=REGEXP   only the tests matching REGEXP (-test.run)
#   PROXYSHIFT_VM_PACKAGES=RE  only the packages of packages.txt matching RE
#                              (grep -E)
#   PROXYSHIFT_VM_BENCH=REGEXP also the benchmarks matching REGEXP
#                              (-test.bench; make bench-vm sets it)
#   PROXYSHIFT_VM_BENCHTIME=N  their -test.benchtime (default 1x)
#   PROXYSHIFT_VM_ENV="K=V ..." environment variables for the tests in the
#                              VM (make bench-vm sets test/vmbench's sizes)
#   PROXYSHIFT_VM_LOG=FILE     where to keep the serial log
#                              (default ~/.cache/proxyshift/vm/serial.log)
#   PROXYSHIFT_VM_KVER=...     another kernel of Debian's archive
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/usr/sbin:/sbin"

CACHE_ROOT="${PROXYSHIFT_CACHE:-$HOME/.cache/proxyshift}"
VM_CACHE="$CACHE_ROOT/vm"
TIMEOUT="${PROXYSHIFT_VM_TIMEOUT:-3300}"
MEMORY="${PROXYSHIFT_VM_MEMORY:-}" # default: 512, 1024 with the API server
LOG="${PROXYSHIFT_VM_LOG:-$VM_CACHE/serial.log}"
# The guest's user-mode network and the API server's address on it
# (hack/vm/init and test/vm know them too).
VM_NET=198.18.254.0/24
VM_APISERVER=198.18.254.100:6443

log() { echo "test-vm: $*" >&2; }
start=$SECONDS

hack/install-deps.sh
{ read -r kernel_dir; read -r busybox; } < <(hack/vm/fetch.sh)
[ -n "${busybox:-}" ] || { log "hack/vm/fetch.sh failed"; exit 1; }
kver="$(basename "$kernel_dir")"
module_path="$(go list -m)"
repo="$PWD"

work="$(mktemp -d "$VM_CACHE/run.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# A TERM (hack/test.sh stopping an interrupted run) runs the EXIT trap.
trap 'exit 143' TERM INT
root="$work/root"
mkdir -p "$root"/{bin,dev,proc,sys,tmp,run,var,tests,src,lib/modules}
ln -s /run "$root/var/run"

# Test binaries, one per package, in the order the VM runs them; each
# package's testdata comes along, and the binary runs in its directory.
# A "bench <pkg>" line is there for its benchmarks only: it is left out
# unless PROXYSHIFT_VM_BENCH asks for benchmarks.
# An "apiserver <pkg>" line is a package whose tests need the API server:
# see "The API server" below.
mapfile -t packages < <(sed 's/#.*//' hack/vm/packages.txt |
  awk -v bench="${PROXYSHIFT_VM_BENCH:-}" '$1 == "bench" { if (bench != "") print $2; next } $1 == "apiserver" { print $2; next } NF { print $1 }' |
  grep -E -- "${PROXYSHIFT_VM_PACKAGES:-.}")
mapfile -t apiserver_packages < <(sed 's/#.*//' hack/vm/packages.txt | awk '$1 == "apiserver" { print $2 }')
needs_apiserver() {
  local p
  for p in "${apiserver_packages[@]}"; do [ "$p" = "$1" ] && return 0; done
  return 1
}
[ "${#packages[@]}" -gt 0 ] || { log "no package of hack/vm/packages.txt matches PROXYSHIFT_VM_PACKAGES=$PROXYSHIFT_VM_PACKAGES"; exit 1; }
for pkg in "${packages[@]}"; do
  bin="$root/tests/${pkg//\//_}.test"
  log "building $pkg"
  CGO_ENABLED=0 go test -c -o "$bin" "./$pkg"
  [ -x "$bin" ] || { log "$pkg has no tests to run"; exit 1; }
  mkdir -p "$root/src/$pkg"
  if [ -d "$pkg/testdata" ]; then cp -a "$pkg/testdata" "$root/src/$pkg/"; fi
  if needs_apiserver "$pkg"; then
    echo "$pkg apiserver" >> "$root/tests/list"
    apiserver=1
  else
    echo "$pkg" >> "$root/tests/list"
  fi
done

# The agent binary, static, for packages that run it as a process
# (test/vmcluster, test/vmbench): /usr/sbin/proxyshift-agent; and
# kube-proxy (hack/kube-proxy.sh, static), which test/vmbench measures
# beside it: /usr/sbin/kube-proxy. They and their test binaries need more
# memory than the others (the initramfs is held twice while it is
# unpacked).
if [ -z "$MEMORY" ]; then
  MEMORY=512
  [ -z "${apiserver:-}" ] || MEMORY=1024
fi
if [ -n "${apiserver:-}" ]; then
  mkdir -p "$root/usr/sbin"
  log "building cmd/agent"
  CGO_ENABLED=0 go build -o "$root/usr/sbin/proxyshift-agent" ./cmd/agent
  cp "$(hack/kube-proxy.sh)" "$root/usr/sbin/kube-proxy"
fi

# busybox, with a link per applet (not to itself).
cp "$busybox" "$root/bin/busybox"
for applet in $("$busybox" --list); do
  [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
done

# The host programs of hack/vm/programs.txt (Debian's, installed by
# hack/install-deps.sh), each as /usr/sbin/<name> linking to its binary,
# and the listed directories, with every shared library they need (ldd)
# at its host path.
copy_elf_deps() {
  ldd "$1" 2>/dev/null | grep -o '/[^ ]*' | while read -r lib; do
    [ -e "$root$lib" ] || cp -L --parents "$lib" "$root"
  done
}
mkdir -p "$root/usr/sbin"
sed 's/#.*//' hack/vm/programs.txt | awk NF | while read -r entry; do
  case "$entry" in
    /*)
      mkdir -p "$root$(dirname "$entry")"
      cp -a "$entry" "$root$(dirname "$entry")/"
      find "$entry" -name '*.so*' -type f | while read -r f; do copy_elf_deps "$f"; done
      ;;
    *)
      path="$(command -v "$entry")" || { log "$entry (hack/vm/programs.txt) is not installed"; exit 1; }
      real="$(readlink -f "$path")"
      [ -e "$root$real" ] || cp --parents "$real" "$root"
      [ "$real" = "/usr/sbin/$entry" ] || ln -sf "$real" "$root/usr/sbin/$entry"
      copy_elf_deps "$real"
      ;;
  esac
done

# The modules tree: the kernel's metadata whole, and the listed module
# files with everything modules.dep says they depend on.
src="$kernel_dir/lib/modules/$kver"
dst="$root/lib/modules/$kver"
mkdir -p "$dst"
cp "$src"/modules.* "$dst/"
(
  cd "$src"
  sed 's/#.*//' "$repo/hack/vm/modules.txt" | awk NF | while read -r entry; do
    find "$entry" -name '*.ko*'
  done | sort -u > "$work/wanted"
  awk -F'[: ]+' 'NR == FNR { want[$1] = 1; next } ($1 in want) { for (i = 1; i <= NF; i++) if ($i != "") print $i }' \
    "$work/wanted" modules.dep | sort -u > "$work/modules"
  cpio -pdm --quiet "$dst" < "$work/modules"
)
log "initramfs: ${#packages[@]} test binaries, $(wc -l < "$work/modules") modules of $kver"

# The API server, for the packages that need it: the test control plane
# (kube-apiserver and etcd of hack/controlplane.sh, proxyshift's CRDs)
# runs on the host, listening on 127.0.0.1 only (hack/vm/apiserver). The
# guest gets a user-mode NIC with no route out (restrict=on) on
# 198.18.254.0/24, whose only way out is a guestfwd of 198.18.254.100:6443
# to that port, and the administrator's kubeconfig naming that address at
# /etc/proxyshift/kubeconfig. /init brings the NIC up only for those
# packages. The trap stops the control plane, also after a failure.
netdev=(-net none)
if [ -n "${apiserver:-}" ]; then
  assets="$(hack/controlplane.sh)"
  go build -o "$work/apiserver" ./hack/vm/apiserver
  mkdir -p "$root/etc/proxyshift"
  mkfifo "$work/apiserver.stdin"
  # envtest's 20 s to start kube-apiserver is too short on a busy host.
  KUBEBUILDER_CONTROLPLANE_START_TIMEOUT="${KUBEBUILDER_CONTROLPLANE_START_TIMEOUT:-120s}" \
  "$work/apiserver" -assets "$assets" -guest-kubeconfig "$root/etc/proxyshift/kubeconfig" \
    -server "https://$VM_APISERVER" < "$work/apiserver.stdin" > "$work/apiserver.out" 2> "$work/apiserver.log" &
  apiserver_pid=$!
  exec {apiserver_stdin}> "$work/apiserver.stdin"
  trap 'exec {apiserver_stdin}>&-; kill "$apiserver_pid" 2>/dev/null || true; wait "$apiserver_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
  apiserver_start=$SECONDS
  until grep -q '^apiserver ready ' "$work/apiserver.out"; do
    if ! kill -0 "$apiserver_pid" 2>/dev/null || [ $((SECONDS - apiserver_start)) -gt 180 ]; then
      log "the host's API server did not start:"; cat "$work/apiserver.log" >&2; exit 1
    fi
    sleep 0.5
  done
  host_addr="$(sed -n 's/^apiserver ready //p' "$work/apiserver.out")"
  log "API server on the host at $host_addr (up in $((SECONDS - apiserver_start))s), the guest's at $VM_APISERVER"
  netdev=(-netdev "user,id=net0,net=$VM_NET,host=${VM_NET%.*/*}.2,restrict=on,guestfwd=tcp:$VM_APISERVER-cmd:$work/apiserver relay $host_addr"
    -device virtio-net-pci,netdev=net0,romfile=)
fi

cp hack/vm/init "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet) > "$work/initramfs"

accel=(-accel tcg -cpu max)
if [ "${PROXYSHIFT_VM_KVM:-}" = 1 ]; then
  accel=(-accel kvm -cpu host)
fi
append="console=ttyS0 panic=-1 quiet proxyshift.vm=1"
if [ -n "${PROXYSHIFT_VM_RUN:-}" ]; then
  append+=" proxyshift.run=$PROXYSHIFT_VM_RUN"
fi
if [ -n "${PROXYSHIFT_VM_TEST_TIMEOUT:-}" ]; then
  append+=" proxyshift.timeout=$PROXYSHIFT_VM_TEST_TIMEOUT"
fi
for kv in ${PROXYSHIFT_VM_ENV:-}; do
  case "$kv" in
    [A-Z_]*=*) append+=" proxyshift.env=$kv" ;;
    *) log "PROXYSHIFT_VM_ENV: want NAME=VALUE words, got $kv"; exit 1 ;;
  esac
done
if [ -n "${PROXYSHIFT_VM_BENCH:-}" ]; then
  append+=" proxyshift.bench=$PROXYSHIFT_VM_BENCH proxyshift.benchtime=${PROXYSHIFT_VM_BENCHTIME:-1x}"
fi

mkdir -p "$(dirname "$LOG")"
log "booting $kver (${accel[1]}, timeout ${TIMEOUT}s); serial log: $LOG"
boot=$SECONDS
status=0
timeout -k 5 "$TIMEOUT" qemu-system-x86_64 "${accel[@]}" -m "$MEMORY" \
  -nographic -no-reboot "${netdev[@]}" \
  -kernel "$kernel_dir/vmlinuz" -initrd "$work/initramfs" -append "$append" \
  < /dev/null 2>&1 | sed -u -e 's/\r$//' -e 's/\x1b\[[0-9;?]*[a-zA-Z]//g; s/\x1bc//g' | tee "$LOG" || status=$?
if [ "$status" -eq 124 ]; then
  log "the VM did not finish within ${TIMEOUT}s"
fi
log "VM ran $((SECONDS - boot))s"

# One result line per package, or it failed. The -test.v output between
# each package's BEGIN and RESULT lines becomes `go test -json` for the
# project's summary.
failed=0
summary_input="$work/summary.json"
: > "$summary_input"
for pkg in "${packages[@]}"; do
  result="$(sed -n "s#^PROXYSHIFT-VM-RESULT $pkg \(PASS\|FAIL\)\$#\1#p" "$LOG" | tail -1)"
  case "$result" in
    PASS) ;;
    FAIL) failed=1 ;;
    *) log "$pkg: no result line (the VM crashed, hung or was killed)"; result=MISSING; failed=1 ;;
  esac
  log "$pkg: $result"
  awk -v begin="PROXYSHIFT-VM-BEGIN $pkg" -v end="PROXYSHIFT-VM-RESULT $pkg " \
    '$0 == begin { on = 1; next } index($0, end) == 1 { on = 0 } on' "$LOG" |
    go tool test2json -p "$module_path/$pkg" >> "$summary_input" || true
  if [ "$result" = MISSING ]; then
    # Count the lost run as a failed test, so that the summary says so.
    printf '{"Action":"output","Package":"%s","Test":"(test VM)","Output":"no result line: the VM crashed, hung or was killed; see %s\\n"}\n{"Action":"fail","Package":"%s","Test":"(test VM)"}\n' \
      "$module_path/$pkg" "$LOG" "$module_path/$pkg" >> "$summary_input"
  fi
done
if [ -n "${PROXYSHIFT_VM_BENCH:-}" ]; then
  log "benchmarks (TCG emulation: compare them with each other, not with the host):"
  grep -E '^(Benchmark|    [a-z_]*bench_test.go)' "$LOG" >&2 || log "no benchmark ran"
fi
go build -o bin/testsummary ./hack/testsummary
bin/testsummary < "$summary_input" || failed=1
log "done in $((SECONDS - start))s"
exit "$failed"
