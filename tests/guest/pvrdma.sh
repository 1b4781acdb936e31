# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh
# shellcheck disable=SC2153 # MY_IP, HOST_IP...: prepended by the scenario
# Guest side of tests/scenarios/pvrdma.sh (issue 4): the PVRDMA control path as an unmodified guest
# sees it. Runs in a `pvtest=run` guest (busybox sh) whose --pvrdma slot gives it vmxnet3 (eth0)
# and vmw_pvrdma, both loaded by guest/init. The scenario prepends:
#   MY_IP MY_IP6   eth0's IPv4 (/24) and IPv6 (/64) addresses, whose RoCE v2 GIDs must appear
#   HOST_IP        the TAP's address on the host (a ping target: the NIC really works)
#
# Output: the output of each command between "SECTION-BEGIN <name>" and "SECTION-END <name> rc=N"
# lines, parsed by tests/tests/pvrdma.rs, and "RDMA-<WHAT> ..." markers; a step that cannot go on
# prints "RDMA-FAIL <why>" and the script exits 1. Every wait is a retry loop with a deadline.

DEV=vmw_pvrdma0
say() { echo "RDMA-$*"; }
fail() {
  say "FAIL $*"
  driver_log
  exit 1
}

port_state_is() { ibv_devinfo -d "$DEV" | grep -q "state:.*$1"; }
# Both RoCE v2 GIDs of eth0's addresses are in the table (ib_core adds them asynchronously).
gids_ready() {
  _info=$(ibv_devinfo -v -d "$DEV") || return 1
  echo "$_info" | grep -q "::ffff:$MY_IP, RoCE v2" && echo "$_info" | grep -q "$MY_IP6, RoCE v2"
}
pvrdma_dmesg() { dmesg | grep -E 'vmw_pvrdma|vmxnet3'; }
sysfs_gids() {
  for f in "/sys/class/infiniband/$DEV/ports/1/gids/"*; do
    _i=${f##*/}
    _g=$(cat "$f")
    [ "$_g" = 0000:0000:0000:0000:0000:0000:0000:0000 ] && continue
    echo "$_i $_g $(cat "/sys/class/infiniband/$DEV/ports/1/gid_attrs/types/$_i" 2> /dev/null)"
  done
}

ip link set lo up
ip link set eth0 up || fail "ip link set eth0 up"
ip addr add "$MY_IP/24" dev eth0 || fail "ip addr add $MY_IP"
ip -6 addr add "$MY_IP6/64" dev eth0 || fail "ip -6 addr add $MY_IP6"
retry 30 carrier_up || fail "eth0 has no carrier after 30 s"
retry 60 ping -c 1 -W 1 "$HOST_IP" || fail "no ping answer from the host $HOST_IP"
say "NET-OK ip=$MY_IP ip6=$MY_IP6 mac=$(cat /sys/class/net/eth0/address)"

section dmesg-probe pvrdma_dmesg
[ -d "/sys/class/infiniband/$DEV" ] || fail "no /sys/class/infiniband/$DEV: vmw_pvrdma did not register ($(ls /sys/class/infiniband 2>&1))"
retry 60 gids_ready || fail "the RoCE v2 GIDs of $MY_IP and $MY_IP6 did not appear in 60 s"
section devinfo-up ibv_devinfo -v -d "$DEV"
section sysfs-gids sysfs_gids
section rdma-link rdma link show
section rdma-dev rdma dev show
section rdma-res-before rdma resource show
section verbs pvrdma-verbs-check "$DEV" "$MY_IP"
section rdma-res rdma resource show
section access pvrdma-access-check "$DEV" "$MY_IP"

# Link down and up on the NIC the device is paired with.
ip link set eth0 down || fail "ip link set eth0 down"
retry 30 port_state_is PORT_DOWN || say "WARN port not down 30 s after eth0 went down"
section devinfo-down ibv_devinfo -d "$DEV"
section rdma-link-down rdma link show
ip link set eth0 up || fail "ip link set eth0 up"
retry 30 port_state_is PORT_ACTIVE || say "WARN port not active 30 s after eth0 came up"
# Linux flushes a static IPv6 address when its interface goes down (keep_addr_on_down=0): add it
# again, and both GIDs must come back.
ip -6 addr add "$MY_IP6/64" dev eth0 2> /dev/null
retry 60 gids_ready || say "WARN the GIDs did not come back within 60 s of eth0 coming up"
section devinfo-up-again ibv_devinfo -v -d "$DEV"

# Unload and load the driver again: the device must take a second probe.
section rmmod rmmod vmw_pvrdma
section after-rmmod ls /sys/class/infiniband
KO=/lib/modules/$(uname -r)/extra/vmw_pvrdma.ko
section insmod insmod "$KO"
retry 60 gids_ready || say "WARN the GIDs did not come back within 60 s of insmod"
section devinfo-reloaded ibv_devinfo -v -d "$DEV"
section verbs-reloaded pvrdma-verbs-check "$DEV" "$MY_IP"
section dmesg-end pvrdma_dmesg
say "DONE"
