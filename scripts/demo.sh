#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job (README): boot the stock Debian guest under pvrdma-vmm with 2 vCPUs and its root
# disk, and show its console until it powers off. Runs the VMM directly where this host's KVM can
# boot Linux; otherwise (kvm-pvm, or no vmx/svm) inside the nested test host, the same way the
# end-to-end tests do. Guest assets are built on first use (see resources/build-assets.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
assets=$(resources/build-assets.sh)
cargo build --release --bins
# shellcheck source=/dev/null
. "$assets/assets.env"
vmm=$PWD/target/release/pvrdma-vmm
guest=(--kernel "$PVRDMA_KERNEL" --initramfs "$PVRDMA_GUEST_INITRAMFS" --cpus 2 --memory 512M
  --disk "path=$PVRDMA_ROOTFS,readonly=on" --serial tty
  --cmdline "console=ttyS0 panic=-1 pvtest=boot pvdisk=/dev/vda pvdiskro=1")

if [[ -e /sys/module/kvm_pvm ]] || ! grep -qwE 'vmx|svm' /proc/cpuinfo; then
  echo "demo: this host's KVM cannot boot a stock Linux kernel; running inside the test host (QEMU TCG, ~1 min)"
  work=$(mktemp -d "$PWD/target/demo.XXXXXX")
  # L1 mounts its own /tmp, so the script it runs lives in the work tree.
  {
    echo 'modprobe kvm_amd'
    printf '%q ' "$vmm" "${guest[@]}"
    echo
    echo 'rc=$?; echo "demo: pvrdma-vmm exited with status $rc"; exit $rc'
  } > "$work/l1.sh"
  exec resources/test-host/run-l1.sh --script "$work/l1.sh" --out "$work/out" --timeout 600
fi
exec "$vmm" "${guest[@]}"
