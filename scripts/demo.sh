#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job (README): two Debian guests under pvrdma-vmm, each with the PVRDMA slot (vmxnet3 +
# PVRDMA sharing a TAP) on one bridge, run RDMA traffic with the unmodified tools against each
# other: ibv_rc_pingpong (data checked) and rping (rdma_cm, data verified). Their consoles are
# shown with a prefix; the exit status is 0 when both guests report success. Runs the VMMs
# directly where this host's KVM can boot Linux (as root, in a network namespace of its own);
# otherwise (kvm-pvm, or no vmx/svm) inside the nested test host, as the end-to-end tests do.
# Guest assets are built on first use (see resources/build-assets.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
assets=$(resources/build-assets.sh)
cargo build --release --bins
# shellcheck source=/dev/null
. "$assets/assets.env"
work=$(mktemp -d "$PWD/target/demo.XXXXXX")
vmm=$PWD/target/release/pvrdma-vmm

# One script disk per guest: the role's variables, then the guest script, NUL-padded to sectors.
for g in a b; do
  if [[ $g == a ]]; then vars="ROLE=server MY_IP=10.77.0.1 PEER_IP=10.77.0.2"; else vars="ROLE=client MY_IP=10.77.0.2 PEER_IP=10.77.0.1"; fi
  { printf '%s\n' $vars; cat scripts/demo-guest.sh; } > "$work/guest-$g.img"
  truncate -s %512 "$work/guest-$g.img"
done

# What runs on the host of the two guests (this one, or the test host).
cat > "$work/host.sh" <<HOST
set -u
. $PWD/resources/test-host/l1-common.sh || exit 1
[[ \${PVRDMA_L1:-} == 1 ]] && { l1_setup_kvm || exit 1; }
ip link set lo up
l1_bridge br0 || exit 1
for g in a b; do l1_tap tap\$g br0 || exit 1; done
pids=()
for g in a b; do
  mac=52:54:00:77:00:0\$([[ \$g == a ]] && echo 1 || echo 2)
  $vmm --kernel $PVRDMA_KERNEL --initramfs $PVRDMA_GUEST_INITRAMFS --cpus 1 --memory 512M \\
    --cmdline "console=ttyS0 panic=-1 quiet pvtest=run pvrun=/dev/vda" \\
    --disk path=$work/guest-\$g.img,readonly=on --pvrdma tap=tap\$g,mac=\$mac \\
    --serial file=$work/\$g.console > $work/\$g.vmm.log 2>&1 &
  pids+=(\$!)
done
touch $work/a.console $work/b.console
tail -n +1 -f $work/a.console | sed -u 's/^/[guest A] /' &
tail -n +1 -f $work/b.console | sed -u 's/^/[guest B] /' &
rc=0
for p in "\${pids[@]}"; do wait \$p || rc=1; done
sleep 1
kill %3 %4 2>/dev/null
for g in a b; do grep -q "DEMO-OK" $work/\$g.console || rc=1; done
echo "demo: \$( ((rc == 0)) && echo 'both guests ran ibv_rc_pingpong and rping to completion' || echo FAILED; ) (logs in $work)"
exit \$rc
HOST

if [[ -e /sys/module/kvm_pvm ]] || ! grep -qwE 'vmx|svm' /proc/cpuinfo; then
  echo "demo: this host's KVM cannot boot a stock Linux kernel; running inside the test host (QEMU TCG, a few minutes)"
  exec resources/test-host/run-l1.sh --script "$work/host.sh" --out "$work/out" --timeout 1200 --smp 1
fi
exec env PVRDMA_E2E_NETNS=1 unshare --net -- bash "$work/host.sh"
