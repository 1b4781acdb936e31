#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Stage "kernel": Debian's stock kernel (vmlinuz + full module tree) plus vmw_pvrdma.ko, which Debian
# does not build, compiled out of tree from linux-source-6.1 against the matching linux-headers.
# Inputs (env, from build-assets.sh): RES OUT KVER DEBS IMAGE_VERSION. Output layout in OUT:
#   boot/vmlinuz-$KVER, boot/config-$KVER, lib/modules/$KVER/ (depmod'd, vmw_pvrdma in extra/),
#   boot/vmlinux-$KVER: the same kernel as an ELF vmlinux (for the VMM's ELF boot path)
set -euo pipefail
. "$RES/lib/common.sh"
LOG_TAG=kernel

deb=$(fetch_deb "$DEBS" "linux-image-$KVER" "$IMAGE_VERSION")
dpkg-deb -x "$deb" "$OUT"
rm -rf "${OUT:?}/usr" "${OUT:?}/etc"   # docs and the bug-report hook: nothing the guests use
[[ -f $OUT/boot/vmlinuz-$KVER ]] || die "$deb has no boot/vmlinuz-$KVER"

headers=/usr/src/linux-headers-$KVER
src_tar=/usr/src/linux-source-6.1.tar.xz
[[ -f $headers/Makefile ]] || die "$headers missing (package linux-headers-$KVER)"
[[ -f $src_tar ]] || die "$src_tar missing (package linux-source-6.1)"

build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
sub=linux-source-6.1/drivers/infiniband/hw/vmw_pvrdma
extract=linux-source-6.1/scripts/extract-vmlinux
log "extracting $sub and $extract from $src_tar"
tar -xJf "$src_tar" -C "$build" "$sub" "$extract"
# Debian ships no uncompressed vmlinux outside the huge -dbg package; the kernel's own script
# unpacks the one inside the bzImage.
sh "$build/$extract" "$OUT/boot/vmlinuz-$KVER" > "$OUT/boot/vmlinux-$KVER"
[[ $(head -c 4 "$OUT/boot/vmlinux-$KVER" | od -An -tx1 | tr -d ' ') == 7f454c46 ]] ||
  die "extract-vmlinux did not produce an ELF image from vmlinuz-$KVER"
log "building vmw_pvrdma.ko against $headers"
# The headers' config has CONFIG_INFINIBAND_VMWARE_PVRDMA unset (that is why Debian ships no module);
# setting it on the make command line is what makes kbuild compile the directory as a module.
make -s -C "$headers" M="$build/$sub" CONFIG_INFINIBAND_VMWARE_PVRDMA=m -j"$(nproc)" modules >&2
mkdir -p "$OUT/lib/modules/$KVER/extra"
# Debian's own modules carry no debug info; ours would be ~10x larger with it (slower initramfs).
strip --strip-debug -o "$OUT/lib/modules/$KVER/extra/vmw_pvrdma.ko" "$build/$sub/vmw_pvrdma.ko"
depmod -b "$OUT" "$KVER"
deps=$(modprobe -d "$OUT" -S "$KVER" --show-depends vmw_pvrdma) || die "vmw_pvrdma not indexed by depmod"
grep -q ib_core <<<"$deps" || die "vmw_pvrdma.ko does not depend on ib_core: wrong build? ($deps)"
