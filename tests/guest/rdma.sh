# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh
# shellcheck disable=SC2153 # ROLE, MY_IP...: prepended by the scenario
# Guest side of tests/scenarios/rdma.sh (issue 5): RDMA traffic through the PVRDMA device with
# the unmodified tools (rdma-core's pingpongs, perftest, rping). Runs in each of four guests A, B,
# C and D (busybox sh, `pvtest=run`) whose --pvrdma slots sit on one bridge of the test host (L1),
# which also runs Linux Soft-RoCE (rxe0 on the bridge). The scenario prepends:
#   ROLE            a | b | c | d
#   MY_IP           eth0's address (/24); IP_A IP_B IP_C IP_D HOST_IP: the guests' and the bridge's
#   SIG_PORT        TCP port of each party's signal server (below)
#   LIMIT           seconds any one RDMA program may run (it is killed then: `timeout`)
#   READY_WAIT      seconds a client waits for its server to listen
#   RETRY_WAIT      seconds a client tries again while it cannot connect
#   GATE_WAIT       seconds a server waits for its client to reach the step, and a step for the
#                   test host's go-ahead (loss steps: netem is on)
#   PP_ITERS PERF_ITERS PING_COUNT  iteration counts (pingpongs, perftest, rping)
#   LOSS_PP_ITERS   iterations of the pingpong under loss (enough frames for netem to hit)
#
# The steps run in the order of the table at the end, by the protocol of the step protocol of tests/guest/lib.sh
# (which the scenario puts in front of this script); each has a server party, a client party (a, b,
# c, or l for L1) and a TCP port (or rdma_cm port) of its own. The test host serves its own signals
# (gates, and its rxe servers); it reads the guests' serial consoles for theirs.
#
# Output, parsed by tests/tests/rdma.rs (and that of the step protocol of tests/guest/lib.sh):
#   RDMA-GID idx=N gid=G type=T      the GID index used: the RoCE v2 GID of MY_IP
#   RDMA-DONE role=R                 every step was gone through
#   RDMA-ALIVE role=R uptime=S       every 30 s (also inside sections)
# A failed RDMA program is a result, not the end of the script; a set-up failure (no network, no
# device, no GID) prints "RDMA-FAIL <why>" and ends the script with status 1.

DEV=vmw_pvrdma0
SIG_DIR=/tmp/sig

say() { echo "RDMA-$*"; }
fail() {
  say "FAIL role=$ROLE $*"
  driver_log
  exit 1
}

ip_of() {
  case $1 in
    a) echo "$IP_A" ;;
    b) echo "$IP_B" ;;
    c) echo "$IP_C" ;;
    d) echo "$IP_D" ;;
    l) echo "$HOST_IP" ;;
  esac
}

ip link set lo up
ip link set eth0 up || fail "ip link set eth0 up"
ip addr add "$MY_IP/24" dev eth0 || fail "ip addr add $MY_IP"
retry 30 carrier_up || fail "eth0 has no carrier after 30 s"
retry 120 ping -c 1 -W 1 "$HOST_IP" || fail "no ping answer from the test host $HOST_IP"
say "NET-OK role=$ROLE ip=$MY_IP mac=$(cat /sys/class/net/eth0/address)"

# A guest that goes silent is told apart from one whose program is still running.
(while sleep 30; do echo "RDMA-ALIVE role=$ROLE uptime=$(now)"; done) &

mkdir -p "$SIG_DIR"
httpd -f -p "$SIG_PORT" -h "$SIG_DIR" &

[ -d "/sys/class/infiniband/$DEV" ] || fail "no /sys/class/infiniband/$DEV: vmw_pvrdma did not register"
retry 60 find_gid || fail "no RoCE v2 GID of $MY_IP in the GID table after 60 s"
find_gid
say "GID idx=$GIDX gid=$(cat "/sys/class/infiniband/$DEV/ports/1/gids/$GIDX") type=RoCE_v2"
echo "SECTION-BEGIN devinfo"
ibv_devinfo -v -d "$DEV" 2>&1
echo "SECTION-END devinfo rc=$?"

# librdmacm's rdma_server and rdma_client (rdma_create_ep) as one program for the step table:
# -b ADDR serves there, -s ADDR connects to it.
cat > /tmp/rdma-ep << 'EOS'
#!/bin/sh
# rdma-ep -p PORT -b|-s ADDR
case $3 in
  -b) exec rdma_server -s "$4" -p "$2" ;;
  *) exec rdma_client -s "$4" -p "$2" ;;
esac
EOS
chmod +x /tmp/rdma-ep

PP="-d $DEV -g $GIDX"
PERF="-d $DEV -x $GIDX -F"
# shellcheck disable=SC2086 # PP and PERF: word lists
{
  # Between the guests: A serves, B connects.
  step rc-data a b - tcp 18601 ibv_rc_pingpong $PP -c -n "$PP_ITERS" -s 4096 -p 18601
  step rc-events a b - tcp 18602 ibv_rc_pingpong $PP -e -n "$PP_ITERS" -s 4096 -p 18602
  step ud a b - tcp 18603 ibv_ud_pingpong $PP -c -n "$PP_ITERS" -s 512 -p 18603
  step srq a b - tcp 18604 ibv_srq_pingpong $PP -q 4 -n "$PP_ITERS" -s 4096 -p 18604
  step write-bw a b - tcp 18611 ib_write_bw $PERF -n "$PERF_ITERS" -s 16384 -p 18611
  step read-bw a b - tcp 18612 ib_read_bw $PERF -n "$PERF_ITERS" -s 16384 -p 18612
  step send-bw a b - tcp 18613 ib_send_bw $PERF -n "$PERF_ITERS" -s 16384 -p 18613
  step atomic-bw a b - tcp 18614 ib_atomic_bw $PERF -n "$PERF_ITERS" -p 18614
  step write-lat a b - tcp 18621 ib_write_lat $PERF -n "$PERF_ITERS" -s 64 -p 18621
  step read-lat a b - tcp 18622 ib_read_lat $PERF -n "$PERF_ITERS" -s 64 -p 18622
  step send-lat a b - tcp 18623 ib_send_lat $PERF -n "$PERF_ITERS" -s 64 -p 18623
  step rping a b - cm 18631 rping -v -C "$PING_COUNT" -p 18631
  # rdma_cm's endpoint API and its connection tests, each way: rdma_server/rdma_client
  # (rdma_create_ep), ucmatose (RC, two connections) and udaddy (UD; its port is fixed: 7174).
  step ep-ab a b - cmep 18641 /tmp/rdma-ep -p 18641
  step ep-ba b a - cmep 18642 /tmp/rdma-ep -p 18642
  step ucmatose-ab a b - cmep 18643 ucmatose -p 18643 -c 2 -C 10 -S 1024
  step ucmatose-ba b a - cmep 18644 ucmatose -p 18644 -c 2 -C 10 -S 1024
  step udaddy-ab a b - cmep 7174 udaddy -c 2 -C 10 -S 512
  step udaddy-ba b a - cmep 7174 udaddy -c 2 -C 10 -S 512
  # A and D, both share_memory=on: the one-copy path, payloads each way (WRITE and SEND from D,
  # READ responses from A, the pingpong's both ways with its data checked).
  step share-rc a d - tcp 18651 ibv_rc_pingpong $PP -c -n "$PP_ITERS" -s 16384 -p 18651
  step share-write-bw a d - tcp 18652 ib_write_bw $PERF -n "$PERF_ITERS" -s 65536 -p 18652
  step share-read-bw a d - tcp 18653 ib_read_bw $PERF -n "$PERF_ITERS" -s 65536 -p 18653
  step share-send-bw a d - tcp 18654 ib_send_bw $PERF -n "$PERF_ITERS" -s 65536 -p 18654
  # Against Linux Soft-RoCE (rxe0 in the test host): each side once as server, once as client.
  step rxe-rc-host-server l a - tcp 18701 ibv_rc_pingpong $PP -c -n "$PP_ITERS" -s 4096 -p 18701
  step rxe-rc-guest-server a l - tcp 18702 ibv_rc_pingpong $PP -c -n "$PP_ITERS" -s 4096 -p 18702
  step rxe-write-bw-host-server l a - tcp 18703 ib_write_bw $PERF -n "$PERF_ITERS" -s 16384 -p 18703
  step rxe-write-bw-guest-server a l - tcp 18704 ib_write_bw $PERF -n "$PERF_ITERS" -s 16384 -p 18704
  # Loss: the test host drops RoCE frames towards C (netem on C's TAP; C's VMM has no same-host
  # channel) while these run; C receives the data of the second one.
  step loss-rc a c netem-on tcp 18801 ibv_rc_pingpong $PP -c -n "$LOSS_PP_ITERS" -s 4096 -p 18801
  step loss-write-bw c a loss-rc-counted tcp 18802 ib_write_bw $PERF -n "$PERF_ITERS" -s 16384 -p 18802
}

echo "SECTION-BEGIN dmesg-end"
dmesg | grep -E 'vmw_pvrdma|infiniband|ib_core|rdma' | tail -n 30
echo "SECTION-END dmesg-end rc=0"
say "DONE role=$ROLE"
