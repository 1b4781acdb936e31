# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Scenario of tests/tests/migration.rs (issue 6): live migration with queue pairs carrying traffic.
# Guests A (10.14.0.1) and B (10.14.0.2), each with a PVRDMA slot on bridge br0 of this host, run
# ibv_rc_pingpong -c (data checked) and rping -V (data verified) against each other, both at once
# and for many rounds (scripts/demo-guest.sh, the README demo's guest program). While they run:
#   1. a migration of B to a VMM that refuses it (its TAP override names a MAC B does not have):
#      send-migration must fail and leave B running on its source;
#   2. three migrations that fail before the switch-over, each of which must leave B running:
#      the destination VMM killed mid-transfer (once it received a memory batch, not all), a 3 s timeout, and vm.cancel-migration; the last
#      two to one receiver, which must survive an abandoned migration and take the next;
#   3. the migration of B to a new VMM process with its own TAP (tapb2), over TCP, through the
#      HTTP API with pvrdma-remote, which prints the progress and the blackout.
# Results: $OUT/migration.env (exit statuses, remote exit codes, timings), $OUT/migration-*-vmm.log
# (the device logs the QPNs and keys it saved and restored), the consoles
# $OUT/migration-{a,b,b2}-serial.log, pvrdma-remote's output $OUT/migration-*-remote.log and
# `pvrdma-remote counters` of B before its migration and of B2 after it,
# $OUT/migration-{b,b2}-counters.json.

isolate_network

MIGRATION_LIMIT=${MIGRATION_LIMIT:-900}
PP_ITERS=${PP_ITERS:-12000}
RPING_COUNT=${RPING_COUNT:-2000}
MAC_A=52:54:00:14:00:01
MAC_B=52:54:00:14:00:02

start_clock "$MIGRATION_LIMIT"

l1_bridge br0
ip addr add 10.14.0.254/24 dev br0
for t in tapa tapb tapb2 tapbx; do l1_tap "$t" br0; done
# The RARP frames the bridge floods to A's TAP: only a migrated vmxnet3 announcing its MAC on
# resume sends them (no guest does).
modprobe -a sch_prio cls_u32 || true
frame_counter tapa protocol 0x8035 u32 match u32 0 0 || record migration "rarp_counter=fail"

iters="PP_ITERS=$PP_ITERS RPING_COUNT=$RPING_COUNT"
guest=$E2E_RESOURCES/../scripts/demo-guest.sh
guest_script_disk "$WORK/migration-a-run.img" "ROLE=server MY_IP=10.14.0.1 PEER_IP=10.14.0.2 $iters" "$guest"
guest_script_disk "$WORK/migration-b-run.img" "ROLE=client MY_IP=10.14.0.2 PEER_IP=10.14.0.1 $iters" "$guest"

run_guest migration-a "$WORK/migration-a-run.img" --pvrdma "tap=tapa,mac=$MAC_A"
pid_a=$VMM_PID
run_guest migration-b "$WORK/migration-b-run.img" --pvrdma "tap=tapb,mac=$MAC_B" --api-socket "$WORK/b.api"
pid_b=$VMM_PID

# receiver NAME: start_receiver with the API socket $WORK/NAME.api.
receiver() { start_receiver "migration-$1" "$WORK/$1.api"; }

if ! wait_for_line "$OUT/migration-b-serial.log" 'DEMO-TRAFFIC' "$(remaining)" "$pid_b"; then
  record migration "traffic=never-started"
fi
sleep 5

# 1. A destination that refuses: the source must report the failure and keep the VM.
receiver bx
pid_bx=$VMM_PID
record migration "refused_receive_rc=$(remote_cmd migration-bx --api-socket "$WORK/bx.api" receive-migration "unix:$WORK/bx.sock" --tap 52:54:00:99:99:99=tapbx --no-wait)"
record migration "refused_send_rc=$(remote_cmd migration-refused --api-socket "$WORK/b.api" send-migration "unix:$WORK/bx.sock")"
record migration "refused_source_alive=$(kill -0 "$pid_b" 2>/dev/null && echo yes || echo no)"
record migration "refused_source_state=$(timeout 10 "$PVRDMA_REMOTE_BIN" --api-socket "$WORK/b.api" info | grep -o '"state": "[A-Za-z]*"' | head -n1 | cut -d'"' -f4)"
timeout 10 "$PVRDMA_REMOTE_BIN" --api-socket "$WORK/bx.api" shutdown > /dev/null 2>&1 || true
wait_for_exit "$pid_bx" 30
record migration "refused_receiver_exit=$EXIT_STATUS"

# source_state: B's state as its source VMM reports it.
source_state() {
  timeout 10 "$PVRDMA_REMOTE_BIN" --api-socket "$WORK/b.api" info | grep -o '"state": "[A-Za-z]*"' |
    head -n1 | cut -d'"' -f4
}

# send_in_background NAME ARGS...: remote_cmd migration-NAME send-migration ARGS... in the background; its
# exit status lands in $WORK/NAME.rc. Sets SEND_PID.
send_in_background() {
  local name=$1
  shift
  (remote_cmd "migration-$name" --api-socket "$WORK/b.api" send-migration "$@" > "$WORK/$name.rc") &
  SEND_PID=$!
}

# migration_field API KEY: the number KEY of the last migration of the VMM at API (vm.info), empty
# if it has none (yet).
migration_field() {
  timeout 10 "$PVRDMA_REMOTE_BIN" --api-socket "$1" info 2>/dev/null | grep -o "\"$2\": [0-9]*" |
    head -n1 | grep -o '[0-9]*$'
}

# 2a. The destination dies mid-transfer: killed once it received memory (bytes_transferred of its
# vm.info, counted per 64 MiB batch) and before it has all of it; what it had received then is
# recorded (died_received_bytes, of died_memory_bytes), and the suite fails unless that is
# between 0 and all: a kill before any byte, or after the whole transfer, tests something else.
receiver by
pid_by=$VMM_PID
remote_cmd migration-by --api-socket "$WORK/by.api" receive-migration "unix:$WORK/by.sock" --tap "$MAC_B=tapbx" --disk-dir "$WORK" --no-wait > /dev/null
send_in_background died "unix:$WORK/by.sock"
died_bytes=0
died_deadline=$(($(now_us) + 120 * 1000000))
while (($(now_us) < died_deadline)) && kill -0 "$pid_by" 2>/dev/null; do
  died_bytes=$(migration_field "$WORK/by.api" bytes_transferred)
  ((${died_bytes:-0} > 0)) && break
  sleep 0.1
done
record migration "died_memory_bytes=$(migration_field "$WORK/by.api" memory_bytes)"
kill -KILL "$pid_by" 2>/dev/null || true
record migration "died_received_bytes=${died_bytes:-0}"
wait "$SEND_PID" || true
record migration "died_send_rc=$(cat "$WORK/died.rc")" "died_source_state=$(source_state)"

# 2b. A timeout, then 2c. a cancel, both to one receiver.
receiver bz
pid_bz=$VMM_PID
remote_cmd migration-bz --api-socket "$WORK/bz.api" receive-migration "unix:$WORK/bz.sock" --tap "$MAC_B=tapbx" --disk-dir "$WORK" --no-wait > /dev/null
record migration "timeout_send_rc=$(remote_cmd migration-timeout --api-socket "$WORK/b.api" send-migration "unix:$WORK/bz.sock" --timeout-s 3)"
record migration "timeout_source_state=$(source_state)"
record migration "rereceive_rc=$(remote_cmd migration-bz --api-socket "$WORK/bz.api" receive-migration "unix:$WORK/bz.sock" --tap "$MAC_B=tapbx" --disk-dir "$WORK" --no-wait)"
send_in_background cancelled "unix:$WORK/bz.sock"
sleep 4
record migration "cancel_rc=$(remote_cmd migration-cancel --api-socket "$WORK/b.api" cancel-migration)"
wait "$SEND_PID" || true
record migration "cancelled_send_rc=$(cat "$WORK/cancelled.rc")" "cancelled_source_state=$(source_state)"
timeout 10 "$PVRDMA_REMOTE_BIN" --api-socket "$WORK/bz.api" shutdown > /dev/null 2>&1 || true
wait_for_exit "$pid_bz" 30
record migration "failures_receiver_exit=$EXIT_STATUS"

# counters NAME: `pvrdma-remote counters` of $WORK/NAME.api into $OUT/migration-NAME-counters.json;
# prints its exit status.
counters() {
  local rc=0
  timeout 10 "$PVRDMA_REMOTE_BIN" --api-socket "$WORK/$1.api" counters > "$OUT/migration-$1-counters.json" || rc=$?
  echo "$rc"
}

# B's counters after its traffic ran a while and the four failed migrations (the last one cancelled).
record migration "b_counters_rc=$(counters b)"

# 3. The migration, over TCP, while both programs run.
record migration "rarp_before=$(frames_counted tapa)"
receiver b2
pid_b2=$VMM_PID
t_mig=$(now_us)
record migration "receive_rc=$(remote_cmd migration-b2 --api-socket "$WORK/b2.api" receive-migration "tcp:127.0.0.1:6700" --tap "$MAC_B=tapb2" --disk-dir "$WORK" --no-wait)"
record migration "send_rc=$(remote_cmd migration-send --api-socket "$WORK/b.api" send-migration "tcp:127.0.0.1:6700" --downtime-ms 300)"
record migration "migration_seconds=$(since "$t_mig")"
# The announcements are spaced over 450 ms from the resume; then the bridge must have learnt that
# B's MAC is behind B2's TAP (its guest's RDMA traffic goes over the same-host channel, not the
# bridge).
sleep 1
record migration "rarp_after=$(frames_counted tapa)" \
  "fdb_b=$(bridge fdb show br br0 | awk -v mac="$MAC_B" '$1 == mac { for (i = 2; i < NF; i++) if ($i == "dev") { print $(i + 1); exit } }')"
record migration "b2_counters_rc=$(counters b2)"
wait_for_exit "$pid_b" 30
record migration "source_exit=$EXIT_STATUS"

# Both programs finish (their guests then power off, which ends the VMMs). If A's failed, B2's
# cannot finish: it is shut down over the API at once, so that its VMM logs its counters.
for g in a b2; do
  if [[ $g == b2 ]] && grep -q 'DEMO-FAIL' "$OUT/migration-a-serial.log"; then
    timeout 10 "$PVRDMA_REMOTE_BIN" --api-socket "$WORK/b2.api" shutdown > /dev/null 2>&1 || true
  fi
  end_guests migration migration "$g"
done
record migration "seconds=$(since "$t0")"
record_panics migration migration a b b2 bx by bz
log "migration: $(tr '\n' ' ' < "$OUT/migration.env")"
