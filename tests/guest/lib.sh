# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh
# Helpers for every guest script (busybox sh in a `pvtest=run` guest): the scenario's
# guest_script_disk, and scripts/demo.sh, put this file between the scenario's variables and the
# script. A script defines its own say/fail (its marker prefix) and DEV (the RDMA device).

now() { cut -d. -f1 /proc/uptime; }

# retry SECS CMD...: runs CMD, quietly, until it succeeds, for at most SECS seconds (a state the
# guest waits for: link up, a GID, a signal).
retry() {
  _end=$(($(now) + $1))
  shift
  until "$@" > /dev/null 2>&1; do
    [ "$(now)" -lt "$_end" ] || return 1
    sleep 0.2
  done
}

# again SECS CMD...: runs CMD until it succeeds, for at most SECS seconds, 2 s apart, with its
# output (a client whose server may not listen yet).
again() {
  _end=$(($(now) + $1))
  shift
  until "$@"; do
    [ "$(now)" -lt "$_end" ] || return 1
    sleep 2
  done
}

# driver_log: the kernel's last lines about the RDMA and NIC drivers, for a failure report.
driver_log() { dmesg | grep -E 'rxe|vmw_pvrdma|vmxnet3|infiniband|ib_core' | tail -n 20; }

carrier_up() { [ "$(cat /sys/class/net/eth0/carrier 2> /dev/null)" = 1 ]; }
port_active() { grep -q ACTIVE "/sys/class/infiniband/$DEV/ports/1/state" 2> /dev/null; }

# ipv4_mapped_gid IP: ::ffff:IP as sysfs prints GIDs.
ipv4_mapped_gid() {
  echo "$1" | awk -F. '{ printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x\n", $1, $2, $3, $4 }'
}

# find_gid: GIDX := the index of the RoCE v2 GID of MY_IP in DEV's port 1.
find_gid() {
  _want=$(ipv4_mapped_gid "$MY_IP")
  _port=/sys/class/infiniband/$DEV/ports/1
  for _f in "$_port"/gids/*; do
    _i=${_f##*/}
    [ "$(cat "$_f" 2> /dev/null)" = "$_want" ] || continue
    [ "$(cat "$_port/gid_attrs/types/$_i" 2> /dev/null)" = "RoCE v2" ] || continue
    GIDX=$_i
    return 0
  done
  return 1
}

# device_ready: DEV is there, its port 1 ACTIVE and GIDX := the RoCE v2 GID of MY_IP (up to 60 s
# each), said as "GID dev=D idx=N gid=G mtu=M"; fails with a message.
device_ready() {
  [ -d "/sys/class/infiniband/$DEV" ] || fail "no /sys/class/infiniband/$DEV"
  retry 60 port_active || fail "$DEV port 1 not ACTIVE after 60 s: $(cat "/sys/class/infiniband/$DEV/ports/1/state")"
  retry 60 find_gid || fail "no RoCE v2 GID of $MY_IP on $DEV after 60 s"
  find_gid
  say "GID dev=$DEV idx=$GIDX gid=$(cat "/sys/class/infiniband/$DEV/ports/1/gids/$GIDX") mtu=$(cat /sys/class/net/eth0/mtu)"
}

# eth0_up_with_gid: eth0 up with MY_IP/24, then GIDX := its RoCE v2 GID on DEV (ib_core adds it
# asynchronously: up to 120 s); fails with a message.
eth0_up_with_gid() {
  ip link set lo up
  { ip link set eth0 up && ip addr add "$MY_IP/24" dev eth0; } || fail "network set-up"
  retry 120 find_gid || fail "no RoCE v2 GID of $MY_IP on $DEV"
  find_gid
}
