# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Scenario of tests/tests/ucx.rs (issue 14 item 3, and the UCX/MPI part of item 7): UCX and Open
# MPI between two guests on the PVRDMA device. Guests A (10.22.0.1) and B (10.22.0.2), each with a
# PVRDMA slot (one vCPU, the VMM's default same-host channel) on bridge br0 (10.22.0.254) of this
# host, run tests/guest/ucx.sh: ucx_perftest over rc_verbs and over ud_verbs, then Open MPI jobs
# over UCX spanning both (pvrdma-mpi-check), then a job that runs while this host live-migrates B
# (pvrdma-remote send-migration over a Unix socket) to a new VMM B2 (its own TAP tapb2).
# With BASELINE=1 (not by default: it adds minutes), once A and B are gone, the Soft-RoCE baseline:
# guests RXE-A (10.22.0.3) and RXE-B (10.22.0.4), each with a plain vmxnet3 NIC (--net, TAPs
# taprxa and taprxb) and Soft-RoCE (rxe0) in its own kernel, run the same ucx_perftest steps.
# Results: $OUT/ucx.env (VMM exits and panics, the migration's remote exit codes and blackout),
# $OUT/ucx-{a,b,b2}-{serial,vmm}.log (B's console continues in b2's), $OUT/ucx-b-to-ucx-b2-remote.log,
# $OUT/ucx-{a,b}-counters.json (`pvrdma-remote counters` after the ucx_perftest steps),
# $OUT/ucx-rxe-{a,b}-{serial,vmm}.log (the baseline's guests).

isolate_network

# The whole run, boots included: a data path that hangs costs LIMIT per program.
UCX_LIMIT=${UCX_LIMIT:-1800}
LIMIT=${LIMIT:-300}
READY_WAIT=${READY_WAIT:-240}
RETRY_WAIT=${RETRY_WAIT:-60}
GATE_WAIT=${GATE_WAIT:-900}
RC_TLS=${RC_TLS:-rc_v}
UD_TLS=${UD_TLS:-ud_v}
LAT_SIZE=${LAT_SIZE:-64}
LAT_ITERS=${LAT_ITERS:-200}
BW_SIZE=${BW_SIZE:-65536}
BW_ITERS=${BW_ITERS:-100}
WARMUP=${WARMUP:-50}
MPI_BYTES=${MPI_BYTES:-131072}
MPI_ROUNDS=${MPI_ROUNDS:-4}
MPI_SKEW=${MPI_SKEW:-0}
MIG_AFTER=${MIG_AFTER:-3}
MIG_SECONDS=${MIG_SECONDS:-900}
BASELINE=${BASELINE:-0}
MAC_A=52:54:00:22:00:01
MAC_B=52:54:00:22:00:02
IP_A=10.22.0.1
IP_B=10.22.0.2
MAC_RXA=52:54:00:22:00:03
MAC_RXB=52:54:00:22:00:04
IP_RXA=10.22.0.3
IP_RXB=10.22.0.4
HOST_IP=10.22.0.254
SIG_PORT=8000
RSH_PORT=2222
SIG=$WORK/sig

start_clock "$UCX_LIMIT"

l1_bridge br0
ip addr add "$HOST_IP/24" dev br0
for t in tapa tapb tapb2; do l1_tap "$t" br0; done
mkdir -p "$SIG"
"$PVRDMA_USERSPACE/bin/busybox" httpd -f -p "$HOST_IP:$SIG_PORT" -h "$SIG" &

# header IP_A IP_B: what tests/guest/ucx.sh is told in both guests of a pair.
header() {
  echo "IP_A=$1 IP_B=$2 HOST_IP=$HOST_IP SIG_PORT=$SIG_PORT RSH_PORT=$RSH_PORT
LIMIT=$LIMIT READY_WAIT=$READY_WAIT RETRY_WAIT=$RETRY_WAIT GATE_WAIT=$GATE_WAIT RC_TLS=$RC_TLS UD_TLS=$UD_TLS
LAT_SIZE=$LAT_SIZE LAT_ITERS=$LAT_ITERS BW_SIZE=$BW_SIZE BW_ITERS=$BW_ITERS WARMUP=$WARMUP
MPI_BYTES=$MPI_BYTES MPI_ROUNDS=$MPI_ROUNDS MPI_SKEW=$MPI_SKEW MIG_AFTER=$MIG_AFTER MIG_SECONDS=$MIG_SECONDS"
}
guest_script_disk "$WORK/ucx-a-run.img" "$(header "$IP_A" "$IP_B") ROLE=a MY_IP=$IP_A" "$GUEST_SCRIPTS/ucx.sh"
guest_script_disk "$WORK/ucx-b-run.img" "$(header "$IP_A" "$IP_B") ROLE=b MY_IP=$IP_B" "$GUEST_SCRIPTS/ucx.sh"

# The root disk (UCX and Open MPI) is each guest's /dev/vdb, read-only.
rootfs=(--disk "path=$PVRDMA_ROOTFS,readonly=on")
run_guest ucx-a "$WORK/ucx-a-run.img" "${rootfs[@]}" --pvrdma "tap=tapa,mac=$MAC_A" --api-socket "$WORK/a.api"
pid_a=$VMM_PID
run_guest ucx-b "$WORK/ucx-b-run.img" "${rootfs[@]}" --pvrdma "tap=tapb,mac=$MAC_B" --api-socket "$WORK/b.api"
pid_b=$VMM_PID

# Both devices' counters once the ucx_perftest steps are over (per-QP transport counters: frames
# received, dropped and why).
if wait_for_line "$OUT/ucx-a-serial.log" 'UCX-(PERF-DONE|FAIL)' "$(remaining)" "$pid_a"; then
  for g in a b; do
    timeout 10 "$PVRDMA_REMOTE_BIN" --api-socket "$WORK/$g.api" counters > "$OUT/ucx-$g-counters.json" 2>&1 || true
  done
fi

# The migration: once A's job runs verified rounds (and a few seconds more), B moves to B2.
pid_b_last=$pid_b
if wait_for_line "$OUT/ucx-a-serial.log" 'UCX-(MIGRATION-LOOP|FAIL|DONE)' "$(remaining)" "$pid_a" &&
  grep -q 'UCX-MIGRATION-LOOP running' "$OUT/ucx-a-serial.log"; then
  sleep 4
  migrate_vm ucx ucx-b ucx-b2 "$WORK/b.api" "$MAC_B=tapb2" --disk-dir "$(dirname "$PVRDMA_ROOTFS")"
  if grep -q '^mig_send_rc=0$' "$OUT/ucx.env"; then
    pid_b_last=$VMM_PID
    wait_for_exit "$pid_b" 30
    record ucx "b_exit=$EXIT_STATUS"
    record_panics ucx ucx b
  else
    # A failed migration leaves B running on its VMM (the tests fail on the return codes): the
    # receiver goes, B finishes where it is, and the run goes on without waiting for B2.
    kill "$VMM_PID" 2> /dev/null || true
    wait_for_exit "$VMM_PID" 10
  fi
else
  record ucx "mig_loop=never-started"
fi
: > "$SIG/migrated"
# B (whichever VMM runs it) ends once A is done: served here, where B finds it however late it
# polls, as A's own signal server would not be (A powers off at once).
wait_for_line "$OUT/ucx-a-serial.log" 'UCX-(DONE|FAIL)' "$(remaining)" "$pid_a" || true
: > "$SIG/mpi-done"

# end_guest NAME PID: the VMM must end once its guest powered off: 60 s after the guest's last
# word it is killed.
end_guest() {
  wait_for_line "$OUT/$1-serial.log" 'GUEST-POWEROFF' "$(remaining)" "$2" || true
  wait_for_exit "$2" 60
  record ucx "${1#ucx-}_exit=$EXIT_STATUS"
  record ucx "${1#ucx-}_panics=$(panics "$OUT/$1-vmm.log")"
}
end_guest ucx-a "$pid_a"
if [[ $pid_b_last != "$pid_b" ]]; then end_guest ucx-b2 "$pid_b_last"; else end_guest ucx-b "$pid_b"; fi

# The Soft-RoCE baseline: both guests at once, as A and B ran, with this host to themselves.
if ((BASELINE)); then
  for t in taprxa taprxb; do l1_tap "$t" br0; done
  for g in a b; do
    ip_var=IP_RX${g^^}
    guest_script_disk "$WORK/ucx-rxe-$g-run.img" "$(header "$IP_RXA" "$IP_RXB") ROLE=$g MY_IP=${!ip_var} RDMA_DEV=rxe0" "$GUEST_SCRIPTS/ucx.sh"
  done
  run_guest ucx-rxe-a "$WORK/ucx-rxe-a-run.img" "${rootfs[@]}" --net "tap=taprxa,mac=$MAC_RXA"
  pid_rxa=$VMM_PID
  run_guest ucx-rxe-b "$WORK/ucx-rxe-b-run.img" "${rootfs[@]}" --net "tap=taprxb,mac=$MAC_RXB"
  pid_rxb=$VMM_PID
  end_guest ucx-rxe-a "$pid_rxa"
  end_guest ucx-rxe-b "$pid_rxb"
fi
record ucx "seconds=$(since "$t0")"
log "ucx: $(tr '\n' ' ' < "$OUT/ucx.env")"
