# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh
# shellcheck disable=SC2153 # ROLE, MY_IP...: prepended by the scenario
# Guest side of tests/scenarios/migration-scale.sh (issue 16): QPS RC QPs between guests A and B,
# every one carrying checked data (pvrdma-qps-check, resources/guest/qps-check.c) while the
# scenario live-migrates B. The scenario prepends:
#   ROLE            a (server) | b (client; the guest being migrated)
#   MY_IP PEER_IP   eth0's address and the other guest's (/24)
#   QPS RUN_SECONDS pvrdma-qps-check's QP count, and how long B's client runs once every QP has
#                   finished a round
# Lines: the program's own QPS-CHECK-* lines, then SCALE-DONE role=R rc=N.
DEV=vmw_pvrdma0
fail() { echo "SCALE-FAIL $*"; exit 1; }

eth0_up_with_gid
echo "SCALE-GID dev=$DEV idx=$GIDX"
if [ "$ROLE" = a ]; then
  timeout 3000 pvrdma-qps-check server 18950 "$QPS" "$GIDX" "$RUN_SECONDS"
else
  retry 120 ping -c 1 -W 1 "$PEER_IP" || fail "no ping answer from $PEER_IP"
  timeout 3000 pvrdma-qps-check client "$PEER_IP" 18950 "$QPS" "$GIDX" "$RUN_SECONDS"
fi
rc=$?
echo "SCALE-DONE role=$ROLE rc=$rc"
[ $rc = 0 ] || fail "pvrdma-qps-check rc=$rc"
