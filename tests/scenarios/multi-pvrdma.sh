# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# shellcheck disable=SC2034 # pid_*: read through ${!pid_var}
# Scenario of tests/tests/multi_pvrdma.rs (issue 16 goal 4): two guests with two PVRDMA devices
# each (--pvrdma twice: slot of vmxnet3 + PVRDMA per device, each on its own TAP, MAC and
# bridge: br0 for the devices 0 at 10.17.0.0/24, br1 for the devices 1 at 10.17.1.0/24) run
# ibv_rc_pingpong -c on both devices at once (tests/guest/multi-pvrdma.sh), over the same-host
# channel; guest B is live-migrated mid-run (--tap MAC=TAP for both of its NICs). vm.counters of
# B before the migration and of B2 after the programs ended.
# Results: $OUT/multi-pvrdma.env, consoles $OUT/multi-{a,b,b2}-serial.log, VMM logs
# $OUT/multi-*-vmm.log, counters $OUT/multi-{b,b2}-counters.json, pvrdma-remote's output
# $OUT/multi-*-remote.log.

isolate_network

MULTI_LIMIT=${MULTI_LIMIT:-900}
PP_ITERS=${PP_ITERS:-3000}
HOLD=20
MAC_A0=52:54:00:17:00:01 MAC_A1=52:54:00:17:01:01
MAC_B0=52:54:00:17:00:02 MAC_B1=52:54:00:17:01:02

start_clock "$MULTI_LIMIT"

for i in 0 1; do
  l1_bridge "br$i"
  for g in a b b2; do l1_tap "tap$g$i" "br$i"; done
done

header="PP_ITERS=$PP_ITERS HOLD=$HOLD"
guest_script_disk "$WORK/multi-a-run.img" "$header ROLE=a IP0=10.17.0.1 IP1=10.17.1.1 PEER0=10.17.0.2 PEER1=10.17.1.2" "$GUEST_SCRIPTS/multi-pvrdma.sh"
guest_script_disk "$WORK/multi-b-run.img" "$header ROLE=b IP0=10.17.0.2 IP1=10.17.1.2 PEER0=10.17.0.1 PEER1=10.17.1.1" "$GUEST_SCRIPTS/multi-pvrdma.sh"

run_guest multi-a "$WORK/multi-a-run.img" --pvrdma "tap=tapa0,mac=$MAC_A0" --pvrdma "tap=tapa1,mac=$MAC_A1"
pid_a=$VMM_PID
run_guest multi-b "$WORK/multi-b-run.img" --pvrdma "tap=tapb0,mac=$MAC_B0" --pvrdma "tap=tapb1,mac=$MAC_B1" \
  --api-socket "$WORK/multi-b.api"
pid_b=$VMM_PID

# counters NAME: `pvrdma-remote counters` of $WORK/multi-NAME.api into
# $OUT/multi-NAME-counters.json; prints its exit status.
counters() {
  local rc=0
  timeout 10 "$PVRDMA_REMOTE_BIN" --api-socket "$WORK/multi-$1.api" counters > "$OUT/multi-$1-counters.json" || rc=$?
  echo "$rc"
}

# B's traffic flows on both devices: migrate it, both NICs mapped to B2's TAPs.
wait_for_line "$OUT/multi-b-serial.log" 'MULTI-TRAFFIC|MULTI-FAIL' "$(remaining)" "$pid_b" || record multi-pvrdma "traffic=never-started"
sleep 5
record multi-pvrdma "b_counters_rc=$(counters b)"
start_receiver multi-b2 "$WORK/multi-b2.api"
pid_b2=$VMM_PID
t=$(now_us)
record multi-pvrdma "receive_rc=$(remote_cmd multi-b2 --api-socket "$WORK/multi-b2.api" receive-migration "tcp:127.0.0.1:6710" \
  --tap "$MAC_B0=tapb20" --tap "$MAC_B1=tapb21" --disk-dir "$WORK" --no-wait)"
record multi-pvrdma "send_rc=$(remote_cmd multi-b-to-b2 --api-socket "$WORK/multi-b.api" send-migration "tcp:127.0.0.1:6710" --downtime-ms 300)"
record multi-pvrdma "migration_seconds=$(since "$t")"
wait_for_exit "$pid_b" 30
record multi-pvrdma "b_exit=$EXIT_STATUS"

# B2 holds HOLD seconds after its programs ended: its counters then have all the traffic since
# the migration.
wait_for_line "$OUT/multi-b2-serial.log" 'MULTI-DONE|MULTI-FAIL' "$(remaining)" "$pid_b2" || true
record multi-pvrdma "b2_counters_rc=$(counters b2)"

end_guests multi-pvrdma multi a b2
record multi-pvrdma "seconds=$(since "$t0")"
record_panics multi-pvrdma multi a b b2
log "multi-pvrdma: $(tr '\n' ' ' < "$OUT/multi-pvrdma.env")"
