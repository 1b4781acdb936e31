#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job (README): two Debian guests under pvrdma-vmm, each with the PVRDMA slot (vmxnet3 +
# PVRDMA sharing a TAP) on one bridge, run RDMA traffic with the unmodified tools against each
# other: ibv_rc_pingpong (data checked) and rping (rdma_cm, data verified), both at once. While
# they run, guest B is live-migrated to a new VMM process (its own TAP on the bridge) through the
# HTTP API with pvrdma-remote. Consoles are shown with a prefix; the exit status is 0 when both
# guests report success and the migration completed. Runs the VMMs
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
remote=$PWD/target/release/pvrdma-remote

# One script disk per guest: the role's variables, the guest helpers, then the guest script,
# NUL-padded to sectors.
iters="PP_ITERS=${PP_ITERS:-20000} RPING_COUNT=${RPING_COUNT:-3000}"
for g in a b; do
  if [[ $g == a ]]; then vars="ROLE=server MY_IP=10.77.0.1 PEER_IP=10.77.0.2 $iters"; else vars="ROLE=client MY_IP=10.77.0.2 PEER_IP=10.77.0.1 $iters"; fi
  { printf '%s\n' $vars; cat tests/guest/lib.sh scripts/demo-guest.sh; } > "$work/guest-$g.img"
  truncate -s %512 "$work/guest-$g.img"
done

# What runs on the host of the two guests (this one, or the test host).
cat > "$work/host.sh" <<HOST
set -u
. $PWD/resources/test-host/l1-common.sh || exit 1
[[ \${PVRDMA_L1:-} == 1 ]] && { l1_setup_kvm || exit 1; }
# Logs, consoles and sockets: the test host's shared /out (the source tree is read-only there).
L=\${PVRDMA_L1:+/out}; L=\${L:-$work}
# API and migration sockets: a local directory (9p cannot hold sockets).
S=\$(mktemp -d)
ip link set lo up
l1_bridge br0 || exit 1
for t in a b b2; do l1_tap tap\$t br0 || exit 1; done
pids=()
for g in a b; do
  mac=52:54:00:77:00:0\$([[ \$g == a ]] && echo 1 || echo 2)
  $vmm --kernel $PVRDMA_KERNEL --initramfs $PVRDMA_GUEST_INITRAMFS --cpus 1 --memory 512M \\
    --cmdline "console=ttyS0 panic=-1 quiet pvtest=run pvrun=/dev/vda" \\
    --disk path=$work/guest-\$g.img,readonly=on --pvrdma tap=tap\$g,mac=\$mac \\
    --serial file=\$L/\$g.console --api-socket \$S/\$g.api > \$L/\$g.vmm.log 2>&1 &
  pids+=(\$!)
done
# B's destination: a VMM with only an API socket, waiting for the migration.
$vmm --api-socket \$S/b2.api --serial file=\$L/b2.console > \$L/b2.vmm.log 2>&1 &
pids+=(\$!)
touch \$L/a.console \$L/b.console \$L/b2.console
tail -n +1 -f \$L/a.console | sed -u 's/^/[guest A] /' &
tail -n +1 -f \$L/b.console | sed -u 's/^/[guest B] /' &
tail -n +1 -f \$L/b2.console | sed -u "s/^/[guest B, migrated] /" &
rc=0
# Once B's traffic runs: move B to the new VMM (its NIC on tapb2), with progress shown.
for i in \$(seq 600); do grep -q DEMO-TRAFFIC \$L/b.console && break; sleep 0.5; done
sleep 5
echo "demo: migrating guest B while ibv_rc_pingpong and rping run"
$remote --api-socket \$S/b2.api receive-migration unix:\$S/migrate.sock --tap 52:54:00:77:00:02=tapb2 --disk-dir $work --no-wait || rc=1
$remote --api-socket \$S/b.api send-migration unix:\$S/migrate.sock --downtime-ms 300 || rc=1
for p in "\${pids[@]}"; do wait \$p || rc=1; done
sleep 1
kill %4 %5 %6 2>/dev/null
grep -q "DEMO-OK" \$L/a.console || rc=1
cat \$L/b.console \$L/b2.console | grep -q "DEMO-OK" || rc=1
echo "demo: \$( ((rc == 0)) && echo 'both guests ran ibv_rc_pingpong and rping to completion, B live-migrated mid-run' || echo FAILED; ) (logs in $work/out)"
exit \$rc
HOST

if [[ -e /sys/module/kvm_pvm ]] || ! grep -qwE 'vmx|svm' /proc/cpuinfo; then
  echo "demo: this host's KVM cannot boot a stock Linux kernel; running inside the test host (QEMU TCG, a few minutes)"
  exec resources/test-host/run-l1.sh --script "$work/host.sh" --out "$work/out" --timeout 1200 --smp 1
fi
exec env PVRDMA_E2E_NETNS=1 unshare --net -- bash "$work/host.sh"
