# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh
# shellcheck disable=SC2153 # ROLE, MY_IP, PEER_IP: prepended by scripts/demo.sh
# Guest side of scripts/demo.sh, run after tests/guest/lib.sh (eth0_up_with_gid, again): bring up
# eth0, find the RoCE v2 GID of its address on vmw_pvrdma0, then run ibv_rc_pingpong (data
# checked) and rping (rdma_cm, data verified) against the other guest, both at once: ROLE=server
# serves, ROLE=client connects (trying again while the server is not listening yet). Prints
# DEMO-OK or DEMO-FAIL at the end.
DEV=vmw_pvrdma0
fail() { echo "DEMO-FAIL $*"; exit 1; }
eth0_up_with_gid
echo "demo: $DEV port $(cat /sys/class/infiniband/$DEV/ports/1/state), GID[$GIDX] = ::ffff:$MY_IP"

# Both programs run at once, for PP_ITERS and RPING_COUNT rounds: long enough for the client's
# VM to be live-migrated while they run (scripts/demo.sh watches for DEMO-TRAFFIC). The client
# says DEMO-TRAFFIC only once traffic flows: its ibv_rc_pingpong's QP is in RTS and its rping
# (-v: a line per round) verified rounds; DEMO-FAIL at once if a program ends before or nothing
# flows within TRAFFIC_WAIT seconds (the connect retries included).
if [ "$ROLE" = server ]; then
  timeout 900 ibv_rc_pingpong -d $DEV -g "$GIDX" -c -n "$PP_ITERS" -s 4096 > /tmp/pp.log 2>&1 &
  pp=$!
  timeout 900 rping -s -a "$MY_IP" -V -C "$RPING_COUNT" > /tmp/rping.log 2>&1 &
  rp=$!
else
  sleep 3
  (again 120 timeout 900 ibv_rc_pingpong -d $DEV -g "$GIDX" -c -n "$PP_ITERS" -s 4096 "$PEER_IP") > /tmp/pp.log 2>&1 &
  pp=$!
  (again 120 timeout 900 rping -c -a "$PEER_IP" -v -V -C "$RPING_COUNT") > /tmp/rping.log 2>&1 &
  rp=$!
  if ! wait_traffic "${TRAFFIC_WAIT:-300}" /tmp/rping.log $pp $rp; then
    fail "$TRAFFIC_WHY; pingpong: $(tail -n 3 /tmp/pp.log | tr '\n' ' ') rping: $(tail -n 3 /tmp/rping.log | tr '\n' ' ')"
  fi
  echo "DEMO-TRAFFIC ibv_rc_pingpong in RTS, rping rounds verified: $(grep -c '^ping data: ' /tmp/rping.log)"
fi
wait $pp; pp_rc=$?
wait $rp; rp_rc=$?
grep -E 'local address|remote address|bytes in|iters in|Failed status|Completion with error' /tmp/pp.log
tail -n 2 /tmp/rping.log
[ $pp_rc = 0 ] || fail "ibv_rc_pingpong rc=$pp_rc: $(grep -E 'Failed status|failed' /tmp/pp.log | head -n 3)"
[ $rp_rc = 0 ] || fail "rping rc=$rp_rc: $(tail -n 3 /tmp/rping.log)"
echo "DEMO-OK $ROLE"
