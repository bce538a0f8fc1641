#!/usr/bin/env bash
# Installs the Debian packages the tests and the demo need, when missing.
# Each line maps a command to the package that provides it.
set -euo pipefail

declare -A PACKAGES=(
  [ip]=iproute2
  # The iptables dataplane and its tests use both backends' restore/save.
  [iptables-legacy-restore]=iptables
  [iptables-nft-restore]=iptables
  # Tests, the demo and --cleanup read rulesets and ipsets with these.
  [nft]=nftables
  [ipset]=ipset
  [pgrep]=procps
  # Tests read the node's connection-tracking table back with it.
  [conntrack]=conntrack
  # The real-node cluster (test/realcluster): Debian's runc and CNI plugins
  # run under the containerd built by hack/realcluster.sh.
  [runc]=runc
  [/usr/lib/cni/bridge]=containernetworking-plugins
  # make test-vm (hack/vm): the VM, its initramfs and the modules tree.
  [qemu-system-x86_64]=qemu-system-x86
  [cpio]=cpio
  [depmod]=kmod
)

missing=()
for cmd in "${!PACKAGES[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${PACKAGES[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing ${missing[*]}; install them as root: apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
