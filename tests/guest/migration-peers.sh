# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh
# shellcheck disable=SC2153 # ROLE, MY_IP...: prepended by the scenario
# Guest side of tests/scenarios/migration-peers.sh (issue 6): the peers of a guest B that is
# live-migrated twice while it carries RDMA traffic. The scenario prepends:
#   ROLE              a | b
#   MY_IP PEER_IP HOST_IP   eth0's address, the other guest's, and the test host's bridge
#                     (which runs Soft-RoCE, rxe0) (/24)
#   PP_ITERS RPING_COUNT    rounds of ibv_rc_pingpong -c and rping -V against rxe0 (B)
#   WRITE_MIB WRITE_SECONDS pvrdma-write-check's buffer size and duration
# B, phase 1: ibv_rc_pingpong (data checked) and rping (data verified) against Soft-RoCE on the
#   test host, both at once; the scenario migrates B meanwhile. Then
# B, phase 2: pvrdma-write-check server: A streams RDMA WRITEs into B's memory and B's CPU writes
#   memory of its own, every round verified by checksum and pattern; the scenario migrates B again.
# A: pvrdma-write-check client towards B, retried until B listens (B gets there after phase 1).
# Lines: MIGPEER-TRAFFIC (B's traffic flows: its pingpong's QP in RTS, rping rounds verified;
# MIGPEER-FAIL at once if not within 300 s), MIGPEER-RXE-DONE pp_rc=N rping_rc=N,
# the programs' own WRITE-CHECK-* lines, MIGPEER-WRITE-DONE rc=N, MIGPEER-OK or MIGPEER-FAIL why.
DEV=vmw_pvrdma0
fail() { echo "MIGPEER-FAIL $*"; exit 1; }

eth0_up_with_gid

if [ "$ROLE" = b ]; then
  (again 120 timeout 900 ibv_rc_pingpong -d $DEV -g "$GIDX" -c -n "$PP_ITERS" -s 4096 -p 18801 "$HOST_IP") \
    > /tmp/pp.log 2>&1 &
  pp=$!
  (again 120 timeout 900 rping -c -a "$HOST_IP" -p 18802 -v -V -C "$RPING_COUNT") > /tmp/rping.log 2>&1 &
  rp=$!
  # Traffic flows (the pingpong's QP in RTS, rping rounds verified) before the scenario may
  # migrate B: a marker after a mere sleep could not tell.
  if ! wait_traffic 300 /tmp/rping.log $pp $rp; then
    fail "$TRAFFIC_WHY; pingpong: $(tail -n 3 /tmp/pp.log | tr '\n' ' ') rping: $(tail -n 3 /tmp/rping.log | tr '\n' ' ')"
  fi
  echo "MIGPEER-TRAFFIC ibv_rc_pingpong in RTS, rping rounds verified: $(grep -c '^ping data: ' /tmp/rping.log)"
  wait $pp; pp_rc=$?
  wait $rp; rp_rc=$?
  grep -E 'local address|remote address|bytes in|iters in|Failed status|Completion with error' /tmp/pp.log
  tail -n 2 /tmp/rping.log
  echo "MIGPEER-RXE-DONE pp_rc=$pp_rc rping_rc=$rp_rc"
  timeout 900 pvrdma-write-check server 18803 "$WRITE_MIB" "$WRITE_SECONDS"
  wc_rc=$?
  echo "MIGPEER-WRITE-DONE rc=$wc_rc"
  [ $pp_rc = 0 ] || fail "ibv_rc_pingpong rc=$pp_rc: $(grep -E 'Failed status|failed' /tmp/pp.log | head -n 3)"
  [ $rp_rc = 0 ] || fail "rping rc=$rp_rc: $(tail -n 3 /tmp/rping.log)"
  [ $wc_rc = 0 ] || fail "pvrdma-write-check server rc=$wc_rc"
else
  # B listens only after its phase 1: try again while the client could not connect, but never
  # once it ran (a failure then is the result).
  end=$(($(now) + 600))
  while :; do
    timeout 900 pvrdma-write-check client "$PEER_IP" 18803 "$WRITE_MIB" "$WRITE_SECONDS" > /tmp/wc.log 2>&1
    wc_rc=$?
    cat /tmp/wc.log
    [ $wc_rc = 0 ] && break
    grep -q WRITE-CHECK-RUNNING /tmp/wc.log && break
    [ "$(now)" -lt $end ] || break
  done
  echo "MIGPEER-WRITE-DONE rc=$wc_rc"
  [ $wc_rc = 0 ] || fail "pvrdma-write-check client rc=$wc_rc"
fi
echo "MIGPEER-OK $ROLE"
