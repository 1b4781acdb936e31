# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Helpers shared by the host-side asset recipes and test-host scripts (sourced, never run).
# Callers run under `set -euo pipefail`; every helper keeps that contract (no unchecked failures).

# Progress goes to stderr so that stdout stays machine-readable (build-assets.sh prints one path).
log() { printf '[%s] %s\n' "${LOG_TAG:-pvrdma-assets}" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "${LOG_TAG:-pvrdma-assets}" "$*" >&2; exit 1; }

# apt refuses to run concurrently; wait for another apt/dpkg run instead of failing at once.
APT_OPTS=(-o DPkg::Lock::Timeout=300 -o APT::Sandbox::User=root)

apt_updated=0
apt_update_once() {
  [[ $apt_updated == 1 ]] && return 0
  log "apt-get update"
  apt-get "${APT_OPTS[@]}" update -qq >&2 || die "apt-get update failed (are Debian's package mirrors reachable?)"
  apt_updated=1
}

# Candidate version of each package, from the local apt lists ("pkg version" lines, input order).
# Updates the lists once if a package is unknown (fresh machine, or lists older than the archive).
# A package the archive no longer has (Debian drops an old kernel ABI when a new one lands) is
# still usable from a .deb downloaded earlier into $DEBS.
candidate_versions() {
  local out pkg ver lines=''
  out=$(candidate_versions_from_lists "$@") && { printf '%s\n' "$out"; return 0; }
  apt_update_once
  out=$(candidate_versions_from_lists "$@") && { printf '%s\n' "$out"; return 0; }
  for pkg in "$@"; do
    ver=$(candidate_versions_from_lists "$pkg" | cut -d' ' -f2) || ver=$(cached_deb_version "$pkg") \
      || die "package '$pkg' is not in the apt archive nor in $DEBS (for the guest kernel, PVRDMA_GUEST_KVER selects another ABI: apt-cache search linux-image-6.1)"
    lines+="$pkg $ver"$'\n'
  done
  printf '%s' "$lines"
}

# Version of the newest .deb of a package in $DEBS (fails if there is none).
cached_deb_version() {
  local f ver
  f=$(compgen -G "$DEBS/${1}_*.deb" | sort -V | tail -n1) || true
  [[ -n $f ]] || return 1
  ver=$(dpkg-deb -f "$f" Version)
  log "$1 is no longer in the apt archive: using the downloaded $(basename "$f")"
  echo "$ver"
}

# Prints "pkg version" lines, or the unknown package names and fails.
candidate_versions_from_lists() {
  local stanzas
  stanzas=$(apt-cache show --no-all-versions "$@" 2>/dev/null) || true
  awk -v want="$*" '
    /^Package:/ {p = $2} /^Version:/ {v[p] = $2}
    END {
      n = split(want, w, " ")
      for (i = 1; i <= n; i++) if (!(w[i] in v)) miss = miss " " w[i]
      if (miss != "") {print substr(miss, 2); exit 1}
      for (i = 1; i <= n; i++) print w[i], v[w[i]]
    }' <<<"$stanzas"
}

installed_version() { dpkg-query -W -f '${Version}' "$1" 2>/dev/null || true; }

# Install the packages that are not installed yet (no apt call at all when everything is there).
ensure_installed() {
  local missing=() pkg
  for pkg in "$@"; do
    [[ $(dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null || true) == "install ok installed" ]] || missing+=("$pkg")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  [[ $(id -u) -eq 0 ]] || die "missing Debian packages: ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})"
  apt_update_once
  log "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get "${APT_OPTS[@]}" install -y -qq --no-install-recommends "${missing[@]}" >&2 \
    || die "apt-get install ${missing[*]} failed"
}

# Path of the downloaded .deb for pkg=version in DIR, downloading it if needed.
# apt names files pkg_version_arch.deb with ':' (epoch) escaped as %3a.
fetch_deb() {
  local dir=$1 pkg=$2 ver=$3 f
  f=$(compgen -G "$dir/${pkg}_${ver//:/%3a}_*.deb" | head -n1 || true)
  if [[ -z $f ]]; then
    (cd "$dir" && apt-get "${APT_OPTS[@]}" download -qq "$pkg=$ver" >&2) || die "apt-get download $pkg=$ver failed"
    f=$(compgen -G "$dir/${pkg}_${ver//:/%3a}_*.deb" | head -n1 || true)
    [[ -n $f ]] || die "apt-get download $pkg=$ver left no .deb in $dir"
  fi
  printf '%s\n' "$f"
}

# Copy the modules MODS (and everything modules.dep + softdeps say they need, in load order)
# from the module tree of KVER under KROOT into DEST, and write DEST/lib/modules/KVER/load-order:
# one path per line, relative to /lib/modules/KVER, in the order insmod must see them.
copy_module_closure() {
  local kroot=$1 kver=$2 dest=$3; shift 3
  local mdir="$kroot/lib/modules/$kver" ddir="$dest/lib/modules/$kver" m lines rel
  mkdir -p "$ddir"
  : > "$ddir/load-order.tmp"
  for m in "$@"; do
    lines=$(modprobe -d "$kroot" -S "$kver" --show-depends "$m") || die "module $m: not found in $mdir"
    # "builtin X" lines need nothing; "insmod /path/x.ko [params]" lines are the files to load.
    awk '$1 == "insmod" {print $2}' <<<"$lines" >> "$ddir/load-order.tmp"
  done
  awk '!seen[$0]++' "$ddir/load-order.tmp" | while read -r m; do
    rel=${m#"$mdir"/}
    mkdir -p "$ddir/$(dirname "$rel")"
    cp "$m" "$ddir/$rel"
    printf '%s\n' "$rel"
  done > "$ddir/load-order"
  rm "$ddir/load-order.tmp"
  # depmod needs these to index the subset; a tree with modules.dep lets busybox modprobe work too.
  cp "$mdir"/modules.order "$mdir"/modules.builtin "$mdir"/modules.builtin.modinfo "$ddir/"
  depmod -b "$dest" "$kver"
}

# Gzip'd newc cpio of DIR; entries owned by root (the build may run as anyone) and sorted.
mk_cpio_gz() {
  local dir=$1 out=$2
  (cd "$dir" && find . -print0 | LC_ALL=C sort -z | cpio --null --quiet -o -H newc -R 0:0 --reproducible | gzip -6 -n) > "$out"
}
