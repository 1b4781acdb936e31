# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Scenario of tests/tests/snapshot.rs (issue 6): snapshot and restore of two RDMA peers with live
# queue pairs. Guests A (10.15.0.1) and B (10.15.0.2) run ibv_rc_pingpong -c and rping -V against
# each other (scripts/demo-guest.sh). Mid-run both are paused and snapshotted through the HTTP API
# (vm.snapshot), their VMMs shut down, and two new VMMs restore them with --restore (paused), then
# both are resumed: the programs must finish with their data checked, and the devices must
# restore the QPNs and keys they saved.
# Results: $OUT/snapshot.env, $OUT/snapshot-{a,b,a2,b2}-vmm.log, the consoles
# $OUT/snapshot-{a,b,a2,b2}-serial.log and pvrdma-remote's output $OUT/snapshot-remote.log.

isolate_network

SNAPSHOT_LIMIT=${SNAPSHOT_LIMIT:-900}
PP_ITERS=${PP_ITERS:-6000}
RPING_COUNT=${RPING_COUNT:-1500}

start_clock "$SNAPSHOT_LIMIT"

l1_bridge br0
ip addr add 10.15.0.254/24 dev br0
for t in tapa tapb; do l1_tap "$t" br0; done

iters="PP_ITERS=$PP_ITERS RPING_COUNT=$RPING_COUNT"
guest=$E2E_RESOURCES/../scripts/demo-guest.sh
guest_script_disk "$WORK/snapshot-a-run.img" "ROLE=server MY_IP=10.15.0.1 PEER_IP=10.15.0.2 $iters" "$guest"
guest_script_disk "$WORK/snapshot-b-run.img" "ROLE=client MY_IP=10.15.0.2 PEER_IP=10.15.0.1 $iters" "$guest"

run_guest snapshot-a "$WORK/snapshot-a-run.img" --pvrdma "tap=tapa,mac=52:54:00:15:00:01" --api-socket "$WORK/a.api"
pid_a=$VMM_PID
run_guest snapshot-b "$WORK/snapshot-b-run.img" --pvrdma "tap=tapb,mac=52:54:00:15:00:02" --api-socket "$WORK/b.api"
pid_b=$VMM_PID

if ! wait_for_line "$OUT/snapshot-b-serial.log" 'DEMO-TRAFFIC' "$(remaining)" "$pid_b"; then
  record snapshot "traffic=never-started"
fi
sleep 5

# Pause both (their QPs' timers stop), then snapshot each.
record snapshot "pause_a_rc=$(remote_cmd snapshot --api-socket "$WORK/a.api" pause)" "pause_b_rc=$(remote_cmd snapshot --api-socket "$WORK/b.api" pause)"
t_snap=$(now_us)
for g in a b; do
  record snapshot "snapshot_${g}_rc=$(remote_cmd snapshot --api-socket "$WORK/$g.api" snapshot "file://$WORK/snap-$g")"
done
record snapshot "snapshot_seconds=$(since "$t_snap")"
for g in a b; do
  pid_var=pid_$g
  record snapshot "shutdown_${g}_rc=$(remote_cmd snapshot --api-socket "$WORK/$g.api" shutdown)"
  wait_for_exit "${!pid_var}" 60
  record snapshot "${g}_exit=$EXIT_STATUS"
done

# Restore both (paused), then resume both.
t_restore=$(now_us)
for g in a b; do
  "$PVRDMA_VMM_BIN" --restore "source_url=file://$WORK/snap-$g" --api-socket "$WORK/${g}2.api" \
    --serial "file=$OUT/snapshot-${g}2-serial.log" > "$OUT/snapshot-${g}2-vmm.log" 2>&1 &
  declare "pid_${g}2=$!"
  wait_for_path "$WORK/${g}2.api" 120
done
for g in a b; do
  wait_for_line "$OUT/snapshot-${g}2-vmm.log" 'Restored the VM' 120 || record snapshot "${g}2_restore=missing"
done
record snapshot "restore_seconds=$(since "$t_restore")"
record snapshot "restored_state_a=$(timeout 10 "$PVRDMA_REMOTE_BIN" --api-socket "$WORK/a2.api" info | grep -o '"state": "[A-Za-z]*"' | head -n1 | cut -d'"' -f4)"
record snapshot "resume_a_rc=$(remote_cmd snapshot --api-socket "$WORK/a2.api" resume)" "resume_b_rc=$(remote_cmd snapshot --api-socket "$WORK/b2.api" resume)"

# Both programs finish (their guests then power off, which ends the VMMs).
end_guests snapshot snapshot a2 b2
record snapshot "seconds=$(since "$t0")"
record_panics snapshot snapshot a b a2 b2
log "snapshot: $(tr '\n' ' ' < "$OUT/snapshot.env")"
