#!/usr/bin/env bash
# Fetches, once, what the test VM boots: Debian's cloud kernel (the one the
# linux-image-cloud-amd64 package depends on, or PROXYSHIFT_VM_KVER) with
# its modules tree, depmod'ed since the package ships no modules.dep, and a
# static busybox. Both are cached under ~/.cache/proxyshift/vm keyed by
# version; a warm run reads apt's local lists only. Prints two lines: the
# kernel's directory (vmlinuz, config, lib/modules/<kver>) and the busybox
# binary.
#
# busybox-static is downloaded and unpacked rather than installed: it
# conflicts with Debian's dynamically linked busybox package, which a host
# may have, and only a static busybox can run in the VM.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

CACHE_ROOT="${PROXYSHIFT_CACHE:-$HOME/.cache/proxyshift}"
VM_CACHE="$CACHE_ROOT/vm"
KERNEL_META="${PROXYSHIFT_VM_KERNEL_PACKAGE:-linux-image-cloud-amd64}"

log() { echo "vm: $*" >&2; }

# apt_ready says whether apt's lists know the package; if not, it fetches
# them once (needs root).
apt_ready() {
  apt-cache show "$1" >/dev/null 2>&1 && return 0
  [ "$(id -u)" -eq 0 ] || return 1
  log "apt lists do not know $1: apt-get update"
  apt-get update -qq >&2 || return 1
  apt-cache show "$1" >/dev/null 2>&1
}

# newest_cached prints the newest cache entry matching a glob, if any.
newest_cached() {
  local d
  d="$(ls -1dt $1 2>/dev/null | head -1 || true)"
  [ -n "$d" ] && [ -e "$d/.complete" ] && echo "$d"
}

# download PACKAGE[=VERSION] DIR: the .deb, unpacked into DIR.
download() {
  local tmp
  tmp="$(mktemp -d "$VM_CACHE/.download.XXXXXX")"
  # The cache may sit where apt's unprivileged _apt user cannot write.
  (cd "$tmp" && apt-get -o APT::Sandbox::User="$(id -un)" download -qq "$1" >&2)
  dpkg -x "$tmp"/*.deb "$2"
  rm -rf "$tmp"
}

kernel() {
  local kver dir tmp mods
  kver="${PROXYSHIFT_VM_KVER:-}"
  if [ -z "$kver" ] && apt_ready "$KERNEL_META"; then
    kver="$(apt-cache depends "$KERNEL_META" | sed -n 's/^ *Depends: linux-image-//p' | head -1)"
  fi
  if [ -z "$kver" ]; then
    dir="$(newest_cached "$VM_CACHE/[0-9]*")" || { log "cannot tell which kernel $KERNEL_META is (no apt lists) and none is cached"; exit 1; }
    log "apt lists unavailable: using the cached kernel $(basename "$dir")"
    echo "$dir"
    return
  fi
  dir="$VM_CACHE/$kver"
  if [ -e "$dir/.complete" ]; then
    echo "$dir"
    return
  fi
  log "fetching linux-image-$kver"
  tmp="$(mktemp -d "$VM_CACHE/.kernel.XXXXXX")"
  download "linux-image-$kver" "$tmp/deb"
  mkdir -p "$tmp/out/lib/modules"
  mods="$tmp/deb/lib/modules/$kver"
  [ -d "$mods" ] || mods="$tmp/deb/usr/lib/modules/$kver"
  mv "$mods" "$tmp/out/lib/modules/$kver"
  mv "$tmp/deb/boot/vmlinuz-$kver" "$tmp/out/vmlinuz"
  mv "$tmp/deb/boot/config-$kver" "$tmp/out/config"
  depmod -b "$tmp/out" "$kver"
  touch "$tmp/out/.complete"
  rm -rf "$dir"
  mv "$tmp/out" "$dir"
  rm -rf "$tmp"
  echo "$dir"
}

busybox() {
  local ver dir
  if apt_ready busybox-static; then
    ver="$(apt-cache policy busybox-static | sed -n 's/^ *Candidate: //p')"
  fi
  if [ -z "${ver:-}" ] || [ "$ver" = "(none)" ]; then
    dir="$(newest_cached "$VM_CACHE/busybox-static-*")" || { log "busybox-static: not in apt's lists and not cached"; exit 1; }
    echo "$dir/bin/busybox"
    return
  fi
  dir="$VM_CACHE/busybox-static-${ver//:/_}"
  if [ ! -e "$dir/.complete" ]; then
    log "fetching busybox-static $ver"
    rm -rf "$dir"
    download "busybox-static=$ver" "$dir"
    touch "$dir/.complete"
  fi
  echo "$dir/bin/busybox"
}

mkdir -p "$VM_CACHE"
kernel
busybox
