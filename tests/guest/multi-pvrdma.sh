# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh
# shellcheck disable=SC2153 # ROLE, IP0...: prepended by the scenario
# shellcheck disable=SC2034 # DEV, MY_IP: read by lib.sh's find_gid and port_active
# Guest side of tests/scenarios/multi-pvrdma.sh (issue 16 goal 4): a guest with two PVRDMA
# devices, each paired with its own vmxnet3 (eth0 with vmw_pvrdma0, eth1 with vmw_pvrdma1), runs
# ibv_rc_pingpong -c on both devices at once. The scenario prepends:
#   ROLE              a (the servers) | b (the clients, live-migrated mid-run)
#   IP0 IP1           this guest's addresses on eth0 and eth1 (/24, one subnet per device)
#   PEER0 PEER1       the other guest's
#   PP_ITERS          rounds of each ibv_rc_pingpong (4 KiB, data checked: -c)
#   HOLD              seconds B waits after its programs ended, for the scenario's vm.counters
# Lines: MULTI-GID dev=D idx=N gid=G netdev=E (each device ACTIVE with its own address's GID and
# not the other's), MULTI-TRAFFIC (B: both pingpongs' QPs in RTS), MULTI-DONE pp0_rc=N pp1_rc=N,
# MULTI-OK ROLE or MULTI-FAIL why.
say() { echo "MULTI-$*"; }
fail() { say "FAIL $*"; exit 1; }
# var NAME I: the value of variable NAME followed by I (IP0, PEER1, GIDX0...).
var() { eval "echo \"\$$1$2\""; }

ip link set lo up
for i in 0 1; do
  { ip link set "eth$i" up && ip addr add "$(var IP $i)/24" dev "eth$i"; } || fail "eth$i set-up"
done

# gid_of I IP: GIDX := the index of the RoCE v2 GID of IP on vmw_pvrdmaI.
gid_of() {
  DEV=vmw_pvrdma$1 MY_IP=$2
  find_gid
}
for i in 0 1; do
  DEV=vmw_pvrdma$i
  addr=$(var IP $i)
  retry 60 test -d "/sys/class/infiniband/$DEV" || fail "no $DEV: $(ls /sys/class/infiniband)"
  retry 60 port_active || fail "$DEV port 1 not ACTIVE: $(cat "/sys/class/infiniband/$DEV/ports/1/state")"
  retry 120 gid_of "$i" "$addr" || fail "no RoCE v2 GID of $addr on $DEV"
  gid_of "$i" "$addr"
  eval "GIDX$i=$GIDX"
  say "GID dev=$DEV idx=$GIDX gid=$(cat "/sys/class/infiniband/$DEV/ports/1/gids/$GIDX") $(rdma link show "$DEV/1" | grep -o 'netdev [a-z0-9]*')"
  # Each device is its own HCA: the other device's address is not one of its GIDs.
  other=$(var IP $((1 - i)))
  if gid_of "$i" "$other"; then fail "$DEV has the GID of $other (the other device's address)"; fi
done

# pingpong I [PEER]: ibv_rc_pingpong -c on vmw_pvrdmaI (server without PEER), port 1882I, its
# output in /tmp/ppI.log.
pingpong() {
  gidx=$(var GIDX "$1")
  if [ -n "${2:-}" ]; then
    again 120 timeout 900 ibv_rc_pingpong -d "vmw_pvrdma$1" -g "$gidx" -c -n "$PP_ITERS" -s 4096 -p "1882$1" "$2"
  else
    timeout 900 ibv_rc_pingpong -d "vmw_pvrdma$1" -g "$gidx" -c -n "$PP_ITERS" -s 4096 -p "1882$1"
  fi > "/tmp/pp$1.log" 2>&1
}

if [ "$ROLE" = b ]; then
  pingpong 0 "$PEER0" &
  p0=$!
  pingpong 1 "$PEER1" &
  p1=$!
  # Both QPs in RTS before the scenario may migrate B.
  end=$(($(now) + 300))
  until DEV=vmw_pvrdma0 pingpong_rts && DEV=vmw_pvrdma1 pingpong_rts; do
    if ! running $p0 || ! running $p1; then
      fail "a pingpong ended before traffic flowed: $(cat /tmp/pp0.log /tmp/pp1.log | tail -n 6 | tr '\n' ' ')"
    fi
    [ "$(now)" -lt $end ] || fail "no pingpong QP in RTS on both devices after 300 s"
    sleep 0.5
  done
  say "TRAFFIC both devices' QPs in RTS: $(rdma res show qp | grep -c 'comm ibv_rc_pingpong')"
else
  pingpong 0 &
  p0=$!
  pingpong 1 &
  p1=$!
fi
wait $p0; rc0=$?
wait $p1; rc1=$?
for i in 0 1; do
  grep -E 'local address|remote address|bytes in|iters in|Failed status|Completion with error|mismatch' "/tmp/pp$i.log" | sed "s/^/pp$i: /"
done
say "DONE pp0_rc=$rc0 pp1_rc=$rc1"
[ "$ROLE" = b ] && sleep "$HOLD"
[ $rc0 = 0 ] || fail "ibv_rc_pingpong on vmw_pvrdma0 rc=$rc0"
[ $rc1 = 0 ] || fail "ibv_rc_pingpong on vmw_pvrdma1 rc=$rc1"
say "OK $ROLE"
