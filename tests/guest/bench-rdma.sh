# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh
# shellcheck disable=SC2153 # ROLE, MY_IP...: prepended by the scenario
# Guest side of tests/scenarios/bench-rdma.sh (issue 5 benchmark): timed RDMA programs between two
# L2 guests A and B (busybox sh, `pvtest=run`) on one bridge of the test host, through either our
# PVRDMA device (vmw_pvrdma0), QEMU's (vmw_pvrdma0 too) or Linux Soft-RoCE over the guest's own
# vmxnet3 (rxe0, which this script creates). The scenario prepends:
#   ROLE            a (runs the servers) | b (runs the clients, whose figures are reported)
#   KIND            pvrdma | qemu-pvrdma | rxe
#   MY_IP PEER_IP HOST_IP   eth0's address, the other guest's and the bridge's (/24)
#   SHARED_IP       qemu-pvrdma: both guests' RoCE address (see below)
#   ROUNDS          rounds; each runs ibv_rc_pingpong (polling), ibv_rc_pingpong -e (completion
#                   events), ib_write_bw, ib_read_bw and ib_send_bw once
#                   (qemu-pvrdma: ibv_rc_pingpong -e, ib_write_bw and ib_read_bw in the first round
#                   only, see below)
#   PP_ITERS PP_SIZE  ibv_rc_pingpong -n and -s (both kinds)
#   BW_ITERS BW_SIZE  ib_{write,read,send}_bw -n and -s
#   PORT_BASE       TCP ports PORT_BASE+1.. (one per program run, so that a late client never
#                   meets the previous run's server)
#   LIMIT           seconds any one program may run (killed then: `timeout`)
#   ONCE_LIMIT      the same for the programs of RDMA_ONCE (see below), which hang on QEMU's device
#   READY_WAIT      seconds the first server waits for B (B may boot later) and a client tries
#                   again while it cannot connect (its server is not listening yet)
#
# Programs write straight to the console (a tty: line-buffered, so nothing is lost if `timeout`
# kills one); the scenario reads the figures out of the sections:
#   BENCH-RDMA-GID dev=D idx=N gid=G
#   BENCH-RDMA-RXE ok modules=... | BENCH-RDMA-FAIL why   (rxe: rdma_rxe loaded, rxe0 on eth0)
#   BENCH-RDMA-BEGIN prog=P round=R side=S ... BENCH-RDMA-END prog=P round=R side=S rc=N attempts=K
#     P: pp, ppe (ibv_rc_pingpong, ibv_rc_pingpong -e: "N iters in T seconds = U usec/iter") |
#        write, read, send
#        (ib_write_bw, ib_read_bw, ib_send_bw: BW average)
#   BENCH-RDMA-DONE role=R
# A failed program is a result (its rc), not the end of the script; a set-up failure prints
# BENCH-RDMA-FAIL and ends the script with status 1.

say() { echo "BENCH-RDMA-$*"; }
fail() {
  say "FAIL role=$ROLE kind=$KIND $*"
  driver_log
  exit 1
}

# setup_rxe: Soft-RoCE on eth0 (lib.sh's rxe_up), said with the modules it loaded.
setup_rxe() {
  rxe_up
  say "RXE ok modules=$(for _m in crc32_generic udp_tunnel ip6_udp_tunnel rdma_rxe; do [ -d "/sys/module/$_m" ] && printf '%s,' "$_m"; done) link=$(rdma link show rxe0/1 2> /dev/null | tr -s ' ' | cut -c1-80)"
}

# run PROG ROUND PORT FIRST LIMIT CMD...: one program run. A serves (bounded by LIMIT seconds, plus
# READY_WAIT for the FIRST, whose client may still be booting); B connects (bounded by LIMIT), again
# while its server is not listening yet (for READY_WAIT at most).
run() {
  _prog=$1 _round=$2 _port=$3 _first=$4 _limit=$5
  shift 5
  set -- "$@" -p "$_port"
  _attempts=1
  if [ "$ROLE" = a ]; then
    [ "$_first" = 1 ] && _limit=$((_limit + READY_WAIT))
    say "BEGIN prog=$_prog round=$_round side=server"
    timeout "$_limit" "$@"
    _rc=$?
    say "END prog=$_prog round=$_round side=server rc=$_rc attempts=1"
    return 0
  fi
  _err=/tmp/client.err
  _end=$(($(now) + READY_WAIT))
  say "BEGIN prog=$_prog round=$_round side=client"
  while :; do
    timeout "$_limit" "$@" "$PEER_IP" 2> "$_err"
    _rc=$?
    cat "$_err"
    if [ $_rc -eq 0 ] || ! grep -q "Couldn't connect to" "$_err" || [ "$(now)" -ge "$_end" ]; then
      break
    fi
    _attempts=$((_attempts + 1))
    sleep 1
  done
  say "END prog=$_prog round=$_round side=client rc=$_rc attempts=$_attempts"
}

ip link set lo up
ip link set eth0 up || fail "ip link set eth0 up"
ip addr add "$MY_IP/24" dev eth0 || fail "ip addr add $MY_IP"
retry 30 carrier_up || fail "eth0 has no carrier after 30 s"
retry 120 ping -c 1 -W 1 "$HOST_IP" || fail "no ping answer from the test host $HOST_IP"

# RDMA_ONCE: the programs run in the first round only, bounded by ONCE_LIMIT (QEMU's model posts
# every work request as a SEND and gives every MR the rkey 0xffffffff: ib_write_bw and ib_read_bw
# hang there until killed; so does ibv_rc_pingpong -e, whose first completion event never comes;
# once shows that they still do).
RDMA_ONCE=
case $KIND in
  pvrdma)
    DEV=vmw_pvrdma0
    device_ready
    ;;
  qemu-pvrdma)
    # QEMU's device posts the guest's verbs on Soft-RoCE rxe0 in the test host, which delivers
    # locally only between equal GIDs: both guests' RoCE address is SHARED_IP (also on rxe0's
    # netdev), a /32 beside eth0's own, which perftest's TCP exchange keeps using.
    DEV=vmw_pvrdma0
    RDMA_ONCE="ppe write read"
    ip addr add "$SHARED_IP/32" dev eth0 || fail "ip addr add $SHARED_IP/32"
    device_ready "$SHARED_IP" "RoCE v2" "IB/RoCE v1"
    say "GIDS $(cd /sys/class/infiniband/$DEV/ports/1 && for f in gids/*; do g=$(cat "$f"); [ "$g" = 0000:0000:0000:0000:0000:0000:0000:0000 ] || printf '%s=%s/%s ' "${f#gids/}" "$g" "$(tr ' ' _ < "gid_attrs/types/${f#gids/}")"; done)"
    ;;
  rxe)
    DEV=rxe0
    setup_rxe
    device_ready
    ;;
  *) fail "unknown KIND $KIND" ;;
esac
# Both guests up before the first round (B's client tries again anyway; this keeps the first
# server's wait short when B is the one that booted first).
retry "$READY_WAIT" ping -c 1 -W 1 "$PEER_IP" || fail "no ping answer from the peer $PEER_IP"

r=1
while [ "$r" -le "$ROUNDS" ]; do
  first=0
  [ "$r" = 1 ] && first=1
  port=$((PORT_BASE + 5 * (r - 1)))
  for prog in pp ppe write read send; do
    port=$((port + 1))
    limit=$LIMIT
    case " $RDMA_ONCE " in *" $prog "*)
      [ "$r" = 1 ] || continue
      limit=$ONCE_LIMIT
      ;;
    esac
    case $prog in
      pp) run pp "$r" "$port" "$first" "$limit" ibv_rc_pingpong -d "$DEV" -g "$GIDX" -n "$PP_ITERS" -s "$PP_SIZE" ;;
      # The same with completion events: each side sleeps on its CQ's channel (the device's
      # interrupt wakes it) instead of spinning on the CQ, so that the one-vCPU test host's time
      # slices matter less.
      ppe) run ppe "$r" "$port" 0 "$limit" ibv_rc_pingpong -e -d "$DEV" -g "$GIDX" -n "$PP_ITERS" -s "$PP_SIZE" ;;
      *) run "$prog" "$r" "$port" 0 "$limit" "ib_${prog}_bw" -d "$DEV" -x "$GIDX" -F -n "$BW_ITERS" -s "$BW_SIZE" ;;
    esac
  done
  r=$((r + 1))
done
say "DONE role=$ROLE"
