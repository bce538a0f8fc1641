#!/usr/bin/env bash
# debs.sh PACKAGES_FILE ROOTFS: unpacks the Debian packages listed in
# PACKAGES_FILE (one per line, # comments), with their dependency closure
# (Depends and Pre-Depends, no Recommends), into the directory ROOTFS, and
# drops documentation. It is the one recipe for an image's userland: `make
# images` (hack/images) and the generated Dockerfiles both run it, so the
# two ways of building an image cannot drift apart.
#
# .deb files are kept in $DEBS_CACHE (default ~/.cache/proxyshift/debs) and
# fetched with `apt-get download` only when the candidate version is not
# there yet. It prints "package=version" for each package it unpacked.
set -euo pipefail
list="$1" rootfs="$2"
cache="${DEBS_CACHE:-${HOME:-/root}/.cache/proxyshift/debs}"
mkdir -p "$cache" "$rootfs"

mapfile -t wanted < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$list" | grep -v '^$')
[ ${#wanted[@]} -gt 0 ] || { echo "debs: $list lists no package" >&2; exit 1; }

# A machine that never ran apt-get update has no package lists yet.
apt-cache show "${wanted[0]}" >/dev/null 2>&1 || apt-get update -qq >&2

# The closure: every real package reachable through Depends/Pre-Depends
# (virtual packages, printed as <name>, are provided by one of them).
mapfile -t closure < <(apt-cache depends --recurse --no-recommends --no-suggests \
  --no-conflicts --no-breaks --no-replaces --no-enhances "${wanted[@]}" |
  grep -v '^[[:space:]<]' | sed 's/:.*//' | sort -u)

# The candidate version's file name of each, in one apt-cache call.
mapfile -t files < <(apt-cache show --no-all-versions "${closure[@]}" | sed -n 's#^Filename: .*/##p')
[ ${#files[@]} -eq ${#closure[@]} ] || { echo "debs: no single candidate for each of ${closure[*]}" >&2; exit 1; }
for i in "${!closure[@]}"; do
  if [ ! -f "$cache/${files[$i]}" ]; then
    # apt-get download names the file after the version with its epoch
    # ("libgmp10_2%3a6.2.1..."), the archive's Filename leaves it out: fetch
    # into a directory of its own and store it under the archive's name.
    dl="$(mktemp -d "$cache/download.XXXXXX")"
    (cd "$dl" && apt-get download -qq -o APT::Sandbox::User=root "${closure[$i]}" >&2)
    mv "$dl"/*.deb "$cache/${files[$i]}"
    rmdir "$dl"
  fi
  dpkg-deb -x "$cache/${files[$i]}" "$rootfs"
  echo "${files[$i]%_*.deb}" | sed 's/_/=/'
done
rm -rf "$rootfs/usr/lib/x86_64-linux-gnu/gconv" "$rootfs/usr/share/doc" "$rootfs/usr/share/man" "$rootfs/usr/share/info" "$rootfs/usr/share/lintian"
