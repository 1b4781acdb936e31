# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Sourced by scripts that run inside the test host (L1, see l1-init): KVM and network set-up.
# Every helper fails (non-zero) with a message on stderr, for callers under `set -euo pipefail`.

# Also loaded by DIRECT-mode e2e scenarios inside a network namespace of their own
# (tests/scenarios/lib.sh: isolate_network), where bridges and TAPs stay out of the host's network.
if [[ ${PVRDMA_L1:-} != 1 && ${PVRDMA_E2E_NETNS:-} != 1 ]]; then
  echo "l1-common.sh: not inside the test host (PVRDMA_L1 is not 1) nor an e2e network namespace; refusing to load kernel modules here" >&2
  return 1
fi

l1_log() { echo "[L1 $(cut -d' ' -f1 /proc/uptime)] $*"; }

# kvm_amd on L1's emulated EPYC (SVM + NPT) gives L1 a real /dev/kvm for the L2 guests.
l1_setup_kvm() {
  modprobe kvm_amd || { echo "l1_setup_kvm: modprobe kvm_amd failed" >&2; return 1; }
  [[ -c /dev/kvm ]] || { echo "l1_setup_kvm: no /dev/kvm after loading kvm_amd" >&2; return 1; }
  l1_log "kvm_amd loaded: /dev/kvm ready (nested=$(cat /sys/module/kvm_amd/parameters/nested))"
}

# l1_bridge NAME: an L1 bridge to join guests' TAP devices (a switch between L2 guests).
l1_bridge() {
  # A kernel with the bridge built in has no module to load.
  [[ -d /sys/module/bridge ]] || modprobe bridge || { echo "l1_bridge: modprobe bridge failed" >&2; return 1; }
  ip link add "$1" type bridge && ip link set "$1" up
}

# l1_tap NAME [BRIDGE]: a TAP device for a VMM's NIC backend, up, optionally on BRIDGE.
l1_tap() {
  [[ -c /dev/net/tun ]] || modprobe tun || { echo "l1_tap: modprobe tun failed" >&2; return 1; }
  ip tuntap add dev "$1" mode tap && ip link set "$1" up
  if [[ -n ${2:-} ]]; then ip link set "$1" master "$2"; fi
}

# l1_link BRIDGE: the cable to the other test host of a pair (run-l1.sh --link: eth0, virtio-net)
# up on BRIDGE, which then spans both hosts.
l1_link() {
  modprobe virtio_net || { echo "l1_link: modprobe virtio_net failed" >&2; return 1; }
  local i
  for ((i = 0; i < 50; i++)); do
    [[ -e /sys/class/net/eth0 ]] && break
    sleep 0.1
  done
  [[ -e /sys/class/net/eth0 ]] || { echo "l1_link: no eth0 (was L1 started with run-l1.sh --link?)" >&2; return 1; }
  ip link set eth0 master "$1" && ip link set eth0 up
}
