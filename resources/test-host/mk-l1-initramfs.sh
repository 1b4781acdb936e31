#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Stage "l1": the test host's (L1) initramfs: static busybox, the modules that mount the host root
# over 9p with an overlay on top (closure from modules.dep), and l1-init as /init.
# Called by build-assets.sh. Inputs (env): RES OUT KVER KERNEL_DIR USERSPACE_DIR. Output: OUT/initramfs.cpio.gz
set -euo pipefail
. "$RES/lib/common.sh"
LOG_TAG=l1

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
d=$work/initramfs
mkdir -p "$d"/{bin,proc,sys,dev,lower,rw,newroot}
cp "$USERSPACE_DIR/root/bin/busybox" "$d/bin/busybox"
copy_module_closure "$KERNEL_DIR" "$KVER" "$d" virtio_pci 9pnet_virtio 9p overlay
install -m 0755 "$RES/test-host/l1-init" "$d/init"
mk_cpio_gz "$d" "$OUT/initramfs.cpio.gz"
log "L1 initramfs: $(du -h "$OUT/initramfs.cpio.gz" | cut -f1)"
