#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Stage "guest": the L2 guest's initramfs (busybox /init + kernel modules + the userspace tree) and
# its raw ext4 root disk (the userspace's full tree, with UCX and Open MPI, + an id file the guest
# prints to prove it read the disk).
# Inputs (env): RES OUT KVER KERNEL_DIR USERSPACE_DIR GUEST_MODULES GUEST_EXTRA_MODULES ROOTDISK_ID.
# GUEST_MODULES are loaded at boot (guest/init loads everything in load-order); GUEST_EXTRA_MODULES
# are only in the module tree (modules.dep covers them), for tests to load with modprobe/insmod.
# Output: OUT/initramfs.cpio.gz, OUT/rootfs.ext4
set -euo pipefail
. "$RES/lib/common.sh"
LOG_TAG=guest

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

initrd=$work/initramfs
cp -a "$USERSPACE_DIR/root" "$initrd"
mkdir -p "$initrd"/{proc,sys,dev,tmp,run,mnt/root}
# shellcheck disable=SC2086 # GUEST_MODULES, GUEST_EXTRA_MODULES: lists of module names
# First every module the image carries, then the boot set alone: the second call rewrites
# load-order with the boot set's closure only, and its depmod indexes every .ko in the tree.
if [[ -n ${GUEST_EXTRA_MODULES:-} ]]; then
  copy_module_closure "$KERNEL_DIR" "$KVER" "$initrd" $GUEST_MODULES $GUEST_EXTRA_MODULES
fi
# shellcheck disable=SC2086
copy_module_closure "$KERNEL_DIR" "$KVER" "$initrd" $GUEST_MODULES
# shellcheck disable=SC2086
printf '%s\n' $GUEST_MODULES > "$initrd/lib/modules/$KVER/required"
install -m 0755 "$RES/guest/init" "$initrd/init"
mk_cpio_gz "$initrd" "$OUT/initramfs.cpio.gz"
log "initramfs: $(du -h "$OUT/initramfs.cpio.gz" | cut -f1)"

disk=$work/rootdisk
cp -a "$USERSPACE_DIR/full" "$disk"
mkdir -p "$disk"/{proc,sys,dev,tmp,run}
printf '%s\n' "$ROOTDISK_ID" > "$disk/etc/pvrdma-vmm-rootdisk"
# Size: the tree plus 25% and 16 MiB for ext4's metadata and journal; built from the directory with
# mkfs.ext4 -d (no loop mount, no root privileges needed for this step).
kib=$(du -sk "$disk" | cut -f1)
size_mib=$(( (kib * 5 / 4) / 1024 + 16 ))
mkfs.ext4 -q -F -L pvrdma-root -E root_owner=0:0 -d "$disk" "$OUT/rootfs.ext4" "${size_mib}M"
log "rootfs.ext4: ${size_mib} MiB"
