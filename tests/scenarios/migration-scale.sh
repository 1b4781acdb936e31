# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Scenario of tests/tests/migration_scale.rs (issue 16 goal 3): a live migration of a guest whose
# PVRDMA device carries QPS busy RC QPs (4096 by default). Guests A (10.17.0.1, server) and B
# (10.17.0.2, client), each with a PVRDMA slot on bridge br0 of this host, run pvrdma-qps-check
# (tests/guest/migration-scale.sh): QPS RC QPs a side, every QP writing rounds of checked data
# into its peer. Once every QP of B has finished a round (QPS-CHECK-RUNNING), B is migrated over
# TCP to a new VMM process with a TAP of its own (tapb2); the programs run RUN_SECONDS from
# then, so the migration falls inside their run, and must finish with every round verified.
# Each VMM may open 4 files per QP and more: the scenario raises its open-file limit first.
# Results: $OUT/migration-scale.env (exit statuses, remote exit codes, timings), the consoles
# $OUT/migration-scale-{a,b,b2}-serial.log, the VMM logs (the device logs the QPNs and keys it
# saved and restored), pvrdma-remote's output $OUT/migration-scale-{send,b2}-remote.log.

isolate_network

QPS=${QPS:-4096}
RUN_SECONDS=${RUN_SECONDS:-240}
SCALE_LIMIT=${SCALE_LIMIT:-2200}
MAC_A=52:54:00:17:00:01
MAC_B=52:54:00:17:00:02

start_clock "$SCALE_LIMIT"
ulimit -n 65536 || record migration-scale "ulimit=failed"
record migration-scale "qps=$QPS" "nofile=$(ulimit -n)"

l1_bridge br0
ip addr add 10.17.0.254/24 dev br0
for t in tapa tapb tapb2; do l1_tap "$t" br0; done

common="QPS=$QPS RUN_SECONDS=$RUN_SECONDS"
guest_script_disk "$WORK/scale-a-run.img" "ROLE=a MY_IP=10.17.0.1 PEER_IP=10.17.0.2 $common" "$GUEST_SCRIPTS/migration-scale.sh"
guest_script_disk "$WORK/scale-b-run.img" "ROLE=b MY_IP=10.17.0.2 PEER_IP=10.17.0.1 $common" "$GUEST_SCRIPTS/migration-scale.sh"

run_guest migration-scale-a "$WORK/scale-a-run.img" --pvrdma "tap=tapa,mac=$MAC_A"
pid_a=$VMM_PID
run_guest migration-scale-b "$WORK/scale-b-run.img" --pvrdma "tap=tapb,mac=$MAC_B" --api-socket "$WORK/b.api"
pid_b=$VMM_PID

t_setup=$(now_us)
if wait_for_line "$OUT/migration-scale-b-serial.log" 'QPS-CHECK-RUNNING' "$(remaining)" "$pid_b"; then
  record migration-scale "running=yes" "setup_seconds=$(since "$t_setup")"
  t_running=$(now_us)
  sleep 5
  start_receiver migration-scale-b2 "$WORK/b2.api"
  pid_b2=$VMM_PID
  t_mig=$(now_us)
  record migration-scale "receive_rc=$(remote_cmd migration-scale-b2 --api-socket "$WORK/b2.api" receive-migration "tcp:127.0.0.1:6710" --tap "$MAC_B=tapb2" --disk-dir "$WORK" --no-wait)"
  send_rc=$(remote_cmd migration-scale-send --api-socket "$WORK/b.api" send-migration "tcp:127.0.0.1:6710" --downtime-ms 300 --timeout-s 900)
  record migration-scale "send_rc=$send_rc" "migration_seconds=$(since "$t_mig")" "migrated_after=$(since "$t_running")"
  if [[ $send_rc == 0 ]]; then
    wait_for_exit "$pid_b" 30
    record migration-scale "source_exit=$EXIT_STATUS"
  else
    # B stays on its source: the programs finish there, without a migration to prove anything.
    timeout 10 "$PVRDMA_REMOTE_BIN" --api-socket "$WORK/b2.api" shutdown > /dev/null 2>&1 || true
    pid_b2=$pid_b
  fi
else
  record migration-scale "running=no" "setup_seconds=$(since "$t_setup")"
  pid_b2=$pid_b
fi

# Both programs finish (their guests then power off, which ends the VMMs).
end_guests migration-scale migration-scale a b2
# A guest still running at the deadline: stop its VMM (its log then has its counters).
for pid in $pid_a $pid_b $pid_b2; do kill "$pid" 2> /dev/null || true; done
record migration-scale "seconds=$(since "$t0")"
record_panics migration-scale migration-scale a b b2
log "migration-scale: $(tr '\n' ' ' < "$OUT/migration-scale.env")"
