# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh
# shellcheck disable=SC2153 # ROLE, MY_IP...: prepended by the scenario
# Guest side of tests/scenarios/roce.sh (issue 14, items 5 and 6): RoCE v1, and RoCE v2 on a guest
# VLAN interface, through the PVRDMA device with the unmodified tools. Runs in each of five guests
# (busybox sh, `pvtest=run`) whose --pvrdma slots sit on one bridge of the test host (L1):
#   a, b   `gid=roce-v1,local=off`: their GIDs are RoCE v1 and their traffic crosses the bridge
#   c      `local=off`, with eth0.100 (VLAN 100) on top of eth0
#   d, e   the same-host channel (the default), with eth0.100
# The scenario prepends:
#   ROLE            a | b | c | d | e
#   MY_IP           eth0's address (/24); IP_A .. IP_E, HOST_IP: the guests' and the bridge's
#   VLAN            the VLAN id of eth0.VLAN (c, d, e); VIP_C VIP_D VIP_E: their addresses there
#   GID_TYPE        the sysfs type of the GIDs the programs use ("IB/RoCE v1" or "RoCE v2")
#   SIG_PORT LIMIT READY_WAIT RETRY_WAIT GATE_WAIT: as the step protocol of tests/guest/lib.sh
#                   (which the scenario puts in front of this script) uses them
#   PP_ITERS PING_COUNT  iterations of the pingpongs and of rping
#   CM_LIMIT        LIMIT of the rpings over the VLAN, which cannot connect (tests/tests/roce.rs):
#                   their clients' (their servers get 15 s more, so that the REJ a killed client's
#                   kernel sends finds the server's VMM still there)
#
# Steps (the step protocol of tests/guest/lib.sh; the server party first):
#   a <- b   over eth0, RoCE v1: ibv_rc_pingpong -c, rping -v -V
#   c <- d   over eth0.VLAN (c's side on the wire): ibv_rc_pingpong -c, ibv_ud_pingpong -c, rping
#   d <- e   over eth0.VLAN, on the same-host channel: the same
# The VLAN steps use the RoCE v2 GID of the eth0.VLAN address and connect to the server's address
# there, so that the guest's IP stack (ARP, the programs' TCP) speaks on the VLAN first.
#
# Output, parsed by tests/tests/roce.rs (and that of the step protocol of tests/guest/lib.sh):
#   RDMA-NET-OK role=R ip=IP mac=MAC [vlan_ip=VIP]
#   RDMA-GID idx=N gid=G type=T ndev=D   the GID the programs use: of MY_IP (a, b) or of the
#                                        eth0.VLAN address (c, d, e), of type GID_TYPE
#   RDMA-CM step=S tx_req=N rx_req=N tx_rep=N rx_rep=N tx_rej=N rx_rej=N   after each rping step
#                                    (its parties): the IB CM's message counters of DEV so far
#   RDMA-DONE role=R                 every step was gone through
#   RDMA-ALIVE role=R uptime=S       every 30 s (also inside sections)
# A set-up failure (no network, no VLAN, no device, no GID) prints "RDMA-FAIL <why>" and ends the
# script with status 1.

DEV=vmw_pvrdma0
SIG_DIR=/tmp/sig
# Which addresses ip_of gives: eth0's, or those on the VLAN (set before each group of steps).
NET=eth0

say() { echo "RDMA-$*"; }
fail() {
  say "FAIL role=$ROLE $*"
  driver_log
  exit 1
}

ip_of() {
  case $NET:$1 in
    eth0:a) echo "$IP_A" ;;
    eth0:b) echo "$IP_B" ;;
    eth0:c) echo "$IP_C" ;;
    eth0:d) echo "$IP_D" ;;
    eth0:e) echo "$IP_E" ;;
    vlan:c) echo "$VIP_C" ;;
    vlan:d) echo "$VIP_D" ;;
    vlan:e) echo "$VIP_E" ;;
  esac
}

# cm_limit SERVER: LIMIT for an rping over the VLAN of which SERVER is the server.
cm_limit() {
  LIMIT=$CM_LIMIT
  [ "$ROLE" = "$1" ] && LIMIT=$((CM_LIMIT + 15))
}

# cm_counters STEP SERVER CLIENT: the CM line of this guest after STEP, if it was one of its
# parties (the kernel's IB CM counts the messages it sent and received in sysfs: under the port
# since Linux 5.14, under /sys/class/infiniband_cm before).
cm_counters() {
  [ "$ROLE" = "$2" ] || [ "$ROLE" = "$3" ] || return 0
  _cm=/sys/class/infiniband/$DEV/ports/1
  [ -d "$_cm/cm_rx_msgs" ] || _cm=/sys/class/infiniband_cm/$DEV/1
  _line="CM step=$1"
  for _d in tx rx; do
    for _m in req rep rej; do
      _line="$_line ${_d}_$_m=$(cat "$_cm/cm_${_d}_msgs/$_m" 2> /dev/null || echo none)"
    done
  done
  say "$_line"
}

ip link set lo up
ip link set eth0 up || fail "ip link set eth0 up"
ip addr add "$MY_IP/24" dev eth0 || fail "ip addr add $MY_IP"
retry 30 carrier_up || fail "eth0 has no carrier after 30 s"
retry 120 ping -c 1 -W 1 "$HOST_IP" || fail "no ping answer from the test host $HOST_IP"
MY_VIP=
case $ROLE in
  c) MY_VIP=$VIP_C ;;
  d) MY_VIP=$VIP_D ;;
  e) MY_VIP=$VIP_E ;;
esac
if [ -n "$MY_VIP" ]; then
  # The guest image carries 8021q but nothing would load it for `ip link add ... type vlan`.
  modprobe 8021q || fail "modprobe 8021q"
  VDEV=eth0.$VLAN
  ip link add link eth0 name "$VDEV" type vlan id "$VLAN" || fail "ip link add $VDEV"
  ip link set "$VDEV" up || fail "ip link set $VDEV up"
  ip addr add "$MY_VIP/24" dev "$VDEV" || fail "ip addr add $MY_VIP dev $VDEV"
fi
say "NET-OK role=$ROLE ip=$MY_IP mac=$(cat /sys/class/net/eth0/address)${MY_VIP:+ vlan_ip=$MY_VIP}"

# A guest that goes silent is told apart from one whose program is still running.
(while sleep 30; do echo "RDMA-ALIVE role=$ROLE uptime=$(now)"; done) &

mkdir -p "$SIG_DIR"
httpd -f -p "$SIG_PORT" -h "$SIG_DIR" &

[ -d "/sys/class/infiniband/$DEV" ] || fail "no /sys/class/infiniband/$DEV: vmw_pvrdma did not register"
GID_IP=${MY_VIP:-$MY_IP}
retry 120 find_gid "$GID_IP" "$GID_TYPE" || fail "no $GID_TYPE GID of $GID_IP in the GID table after 120 s"
find_gid "$GID_IP" "$GID_TYPE"
_gids=/sys/class/infiniband/$DEV/ports/1
say "GID idx=$GIDX gid=$(cat "$_gids/gids/$GIDX") type=$(tr ' ' _ < "$_gids/gid_attrs/types/$GIDX") ndev=$(cat "$_gids/gid_attrs/ndevs/$GIDX" 2> /dev/null)"
echo "SECTION-BEGIN gids"
for _f in "$_gids"/gids/*; do
  _i=${_f##*/}
  _g=$(cat "$_f" 2> /dev/null) || continue
  [ "$_g" = 0000:0000:0000:0000:0000:0000:0000:0000 ] && continue
  echo "$_i $_g $(cat "$_gids/gid_attrs/types/$_i" 2> /dev/null) $(cat "$_gids/gid_attrs/ndevs/$_i" 2> /dev/null)"
done
echo "SECTION-END gids rc=0"

PP="-d $DEV -g $GIDX"
# shellcheck disable=SC2086 # PP: a word list
{
  NET=eth0
  step v1-rc a b - tcp 18901 ibv_rc_pingpong $PP -c -n "$PP_ITERS" -s 4096 -p 18901
  step v1-rping a b - cm 18902 rping -v -C "$PING_COUNT" -p 18902
  cm_counters v1-rping a b
  NET=vlan
  PROG_LIMIT=$LIMIT
  step vlan-wire-rc c d - tcp 18911 ibv_rc_pingpong $PP -c -n "$PP_ITERS" -s 4096 -p 18911
  step vlan-wire-ud c d - tcp 18912 ibv_ud_pingpong $PP -c -n "$PP_ITERS" -s 512 -p 18912
  cm_limit c
  step vlan-wire-rping c d - cm 18913 rping -v -C "$PING_COUNT" -p 18913
  LIMIT=$PROG_LIMIT
  cm_counters vlan-wire-rping c d
  step vlan-local-rc d e - tcp 18921 ibv_rc_pingpong $PP -c -n "$PP_ITERS" -s 4096 -p 18921
  step vlan-local-ud d e - tcp 18922 ibv_ud_pingpong $PP -c -n "$PP_ITERS" -s 512 -p 18922
  cm_limit d
  step vlan-local-rping d e - cm 18923 rping -v -C "$PING_COUNT" -p 18923
  LIMIT=$PROG_LIMIT
  cm_counters vlan-local-rping d e
}

echo "SECTION-BEGIN dmesg-end"
dmesg | grep -E 'vmw_pvrdma|infiniband|ib_core|rdma|8021q|eth0' | tail -n 30
echo "SECTION-END dmesg-end rc=0"
say "DONE role=$ROLE"
