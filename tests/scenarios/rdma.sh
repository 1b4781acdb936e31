# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Scenario of tests/tests/rdma.rs (issue 5): the RDMA data path. Four guests, A (10.12.0.1), B
# (10.12.0.2), C (10.12.0.3) and D (10.12.0.4), each with a PVRDMA slot (--pvrdma: vmxnet3 + PVRDMA sharing a
# TAP), on one bridge br0 (10.12.0.254) of this host, which also runs Linux Soft-RoCE (rxe0 on br0)
# as the native endpoint. A and B have the VMM's default same-host channel (local=on: their RDMA
# traffic is a memory copy between the two VMMs); C has local=off, so that its traffic crosses its
# TAP, where netem can drop it. A and D have share_memory=on (B has not, so A and B keep the
# two-copy path): between A and D the one-copy path (described records, issue 15). All run tests/guest/rdma.sh, whose step table says who serves and
# who connects:
#   A <-> B    ibv_rc_pingpong -c and -e, ibv_ud_pingpong, ibv_srq_pingpong, ib_{write,read,send,
#              atomic}_bw, ib_{write,read,send}_lat, rping (rdma_cm); the RoCE v2 frames (UDP
#              4791) sent to A's and B's TAPs meanwhile are counted (the same-host channel
#              should leave none)
#   A <-> D    ibv_rc_pingpong -c, ib_{write,read,send}_bw: share_memory=on on both ends
#   A <-> rxe0 ibv_rc_pingpong -c and ib_write_bw, each side once as server and once as client
#              (this script runs rxe0's side)
#   A <-> C    ibv_rc_pingpong -c and ib_write_bw with netem dropping LOSS of the RoCE v2 frames
#              sent towards C on its TAP (requests: its ACKs pass, see netem_on)
# Every program is bounded by `timeout`; a failed one is a result, not the end of the run.
# Results: $OUT/rdma.env (set-up, this host's own runs as STEP.SIDE.KEY=..., netem and TAP
# counters, VMM exits and panics), $OUT/rdma-{a,b,c,d}-{serial,vmm}.log (the guests' results: see
# tests/guest/rdma.sh), $OUT/rdma-host-STEP-SIDE.log (output of this host's programs),
# $OUT/rxe-devinfo.txt, $OUT/netem-*.txt, $OUT/l1-ps.log (the busiest threads of this host every 30 s).

isolate_network

# The whole run of both guests, boot included: typically ~6 min; every program that hangs costs
# PROG_LIMIT (a data path that is not there costs ~20 min).
RDMA_LIMIT=${RDMA_LIMIT:-1500}
PROG_LIMIT=${PROG_LIMIT:-60}
READY_WAIT=${READY_WAIT:-240}
RETRY_WAIT=${RETRY_WAIT:-60}
GATE_WAIT=${GATE_WAIT:-900}
PP_ITERS=${PP_ITERS:-50}
LOSS_PP_ITERS=${LOSS_PP_ITERS:-200}
PERF_ITERS=${PERF_ITERS:-100}
PING_COUNT=${PING_COUNT:-10}
LOSS=${LOSS:-3%}
MAC_A=52:54:00:12:00:01
MAC_B=52:54:00:12:00:02
MAC_C=52:54:00:12:00:03
MAC_D=52:54:00:12:00:04
IP_A=10.12.0.1
IP_B=10.12.0.2
IP_C=10.12.0.3
IP_D=10.12.0.4
HOST_IP=10.12.0.254
SIG_PORT=8000
SIG=$WORK/sig
RETRY_RE="Couldn't connect to|RDMA_CM_EVENT_REJECTED"

start_clock "$RDMA_LIMIT"

l1_bridge br0
ip addr add "$HOST_IP/24" dev br0
l1_tap tapa br0
l1_tap tapb br0
l1_tap tapc br0
l1_tap tapd br0

modprobe -a sch_prio sch_netem cls_u32 || true
for dev in tapa tapb tapc tapd; do
  frame_counter "$dev" || record rdma "counter_$dev=fail"
done

# What runs in this host every 30 s (which VMM thread spins when a guest goes silent).
(while sleep 30; do
  echo "==== +$SECONDS s"
  ps -eLo pid,tid,stat,pcpu,time,comm --sort=-pcpu | head -n 12
done) > "$OUT/l1-ps.log" 2>&1 &

# This host's signal server (tests/guest/rdma.sh polls it): busybox from the guest userspace.
mkdir -p "$SIG"
"$PVRDMA_USERSPACE/bin/busybox" httpd -f -p "$HOST_IP:$SIG_PORT" -h "$SIG" &

# Soft-RoCE on the bridge. The port goes active once the bridge has carrier (a VMM on a TAP).
rxe_ok=0
if modprobe rdma_rxe && rdma link add rxe0 type rxe netdev br0; then
  rxe_ok=1
else
  record rdma "rxe_setup=fail" "rxe_why=modprobe-or-link-add"
fi

header="IP_A=$IP_A IP_B=$IP_B IP_C=$IP_C IP_D=$IP_D HOST_IP=$HOST_IP SIG_PORT=$SIG_PORT LIMIT=$PROG_LIMIT READY_WAIT=$READY_WAIT RETRY_WAIT=$RETRY_WAIT
GATE_WAIT=$GATE_WAIT PP_ITERS=$PP_ITERS LOSS_PP_ITERS=$LOSS_PP_ITERS PERF_ITERS=$PERF_ITERS PING_COUNT=$PING_COUNT"
guest_script_disk "$WORK/rdma-a-run.img" "$header ROLE=a MY_IP=$IP_A" "$GUEST_SCRIPTS/rdma.sh"
guest_script_disk "$WORK/rdma-b-run.img" "$header ROLE=b MY_IP=$IP_B" "$GUEST_SCRIPTS/rdma.sh"
guest_script_disk "$WORK/rdma-c-run.img" "$header ROLE=c MY_IP=$IP_C" "$GUEST_SCRIPTS/rdma.sh"
guest_script_disk "$WORK/rdma-d-run.img" "$header ROLE=d MY_IP=$IP_D" "$GUEST_SCRIPTS/rdma.sh"

# One vCPU each: the guests share L1's single vCPU.
run_guest rdma-a "$WORK/rdma-a-run.img" --pvrdma "tap=tapa,mac=$MAC_A,share_memory=on"
pid_a=$VMM_PID
run_guest rdma-b "$WORK/rdma-b-run.img" --pvrdma "tap=tapb,mac=$MAC_B"
pid_b=$VMM_PID
run_guest rdma-c "$WORK/rdma-c-run.img" --pvrdma "tap=tapc,mac=$MAC_C,local=off"
pid_c=$VMM_PID
# D only runs its steps with A (256M: four guests in this host's memory).
VMM_MEMORY=256M run_guest rdma-d "$WORK/rdma-d-run.img" --pvrdma "tap=tapd,mac=$MAC_D,share_memory=on"
pid_d=$VMM_PID

RXE_GIDX=''
if ((rxe_ok)); then
  RXE_GIDX=$(wait_rxe_gid rxe0 "$HOST_IP" 120) || RXE_GIDX=''
  { rdma link show; ibv_devinfo -v -d rxe0; } > "$OUT/rxe-devinfo.txt" 2>&1 || true
  if [[ -n $RXE_GIDX ]]; then
    record rdma "rxe_setup=ok" "rxe_gid_index=$RXE_GIDX" "rxe_gid=$(cat "/sys/class/infiniband/rxe0/ports/1/gids/$RXE_GIDX")"
  else
    record rdma "rxe_setup=fail" "rxe_why=no-active-port-with-the-roce-v2-gid-of-$HOST_IP-in-120-s"
  fi
fi
log "soft-roce: $(grep rxe_ "$OUT/rdma.env" | tr '\n' ' ')"

# host_result STEP SIDE RC SECS ATTEMPTS [WHY]
host_result() {
  record rdma "$1.$2.rc=$3" "$1.$2.secs=$4" "$1.$2.attempts=$5" "$1.$2.why=${6:-}"
  log "$1 $2: rc=$3 secs=$4 attempts=$5 ${6:-}"
}

# guest_line GUEST ERE: until a line of GUEST's serial log matches (bounded by the run's limit and
# by that guest's VMM).
guest_line() {
  local pid=$pid_a
  [[ $1 == b ]] && pid=$pid_b
  [[ $1 == c ]] && pid=$pid_c
  [[ $1 == d ]] && pid=$pid_d
  wait_for_line "$OUT/rdma-$1-serial.log" "$2" "$(remaining)" "$pid"
}

# host_step NAME SERVER CLIENT PORT CMD...: this host's side of a step with guest A (the same
# protocol as tests/guest/rdma.sh's `step`; A learns of this host's server through $SIG, this host
# of A's through A's console; "skip-STEP" from this host: its side will not run). stdbuf: line-buffered output, kept even if `timeout` kills it.
host_step() {
  local name=$1 srv=$2 port=$4 side=client pid rc=0 attempts=0 ready=0 start end
  shift 4
  [[ $srv == l ]] && side=server
  local out=$OUT/rdma-host-$name-$side.log
  if [[ -z $RXE_GIDX ]]; then
    : > "$SIG/skip-$name"
    host_result "$name" "$side" none 0 0 "no-soft-roce"
    return 0
  fi
  # A reached the step: A's previous step is over.
  if ! guest_line a "RDMA-AT step=$name([^a-z0-9-]|\$)"; then
    : > "$SIG/skip-$name"
    host_result "$name" "$side" none 0 0 "guest-a-never-reached-the-step"
    return 0
  fi
  start=$(now_us)
  if [[ $side == server ]]; then
    timeout "$PROG_LIMIT" stdbuf -oL -eL "$@" > "$out" 2>&1 &
    pid=$!
    end=$(($(now_us) + READY_WAIT * 1000000))
    while kill -0 "$pid" 2>/dev/null && (($(now_us) < end)); do
      if [[ -n $(ss -Hltn "sport = :$port") ]]; then
        ready=1
        break
      fi
      sleep 0.2
    done
    if ((ready)); then
      : > "$SIG/ready-$name"
    else
      : > "$SIG/skip-$name"
      kill "$pid" 2>/dev/null || true
    fi
    wait "$pid" || rc=$?
    host_result "$name" server "$rc" "$(since "$start")" 1 "$( ((ready)) || echo never-listened)"
    return 0
  fi
  : > "$SIG/at-$name"
  if ! guest_line a "RDMA-(NOT)?READY step=$name([^a-z0-9-]|\$)" ||
    grep -qE "RDMA-NOTREADY step=$name([^a-z0-9-]|\$)" "$OUT/rdma-a-serial.log"; then
    host_result "$name" client none 0 0 "server-not-ready"
    return 0
  fi
  : > "$out"
  end=$(($(now_us) + RETRY_WAIT * 1000000))
  while :; do
    attempts=$((attempts + 1))
    start=$(now_us)
    rc=0
    timeout "$PROG_LIMIT" stdbuf -oL -eL "$@" "$IP_A" >> "$out" 2>&1 || rc=$?
    if ((rc != 0)) && grep -qE "$RETRY_RE" "$out" && (($(now_us) < end)); then
      echo "RDMA-RETRY step=$name attempt=$attempts" >> "$out"
      sleep 1
      continue
    fi
    break
  done
  host_result "$name" client "$rc" "$(since "$start")" "$attempts"
}

# A is done with B and D once it reaches the first Soft-RoCE step: the RoCE frames that crossed
# A's, B's and D's TAPs until then (B and D have no other peer).
if guest_line a "RDMA-AT step=rxe-rc-host-server([^a-z0-9-]|\$)"; then
  record rdma "samehost.tapa.frames=$(frames_counted tapa)" "samehost.tapb.frames=$(frames_counted tapb)" \
    "samehost.tapd.frames=$(frames_counted tapd)"
fi
tc -s class show dev tapa > "$OUT/tapa-classes.txt" 2>&1 || true

PP=(-d rxe0 -g "$RXE_GIDX" -c -n "$PP_ITERS" -s 4096)
PERF=(-d rxe0 -x "$RXE_GIDX" -F -n "$PERF_ITERS" -s 16384)
host_step rxe-rc-host-server l a 18701 ibv_rc_pingpong "${PP[@]}" -p 18701
host_step rxe-rc-guest-server a l 18702 ibv_rc_pingpong "${PP[@]}" -p 18702
host_step rxe-write-bw-host-server l a 18703 ib_write_bw "${PERF[@]}" -p 18703
host_step rxe-write-bw-guest-server a l 18704 ib_write_bw "${PERF[@]}" -p 18704

# Loss: netem drops LOSS of the RoCE v2 frames (UDP 4791) this host sends to C through tapc (class
# 1:3 of its frame_counter); everything else (the programs' TCP exchange, the signals) passes
# untouched, so that the netem counters count RoCE frames only. RC ACKs (BTH opcode 0x11, 28 bytes
# into the IPv4 header) pass too, in class 1:2: ibv_rc_pingpong's server exits, destroying its QP,
# as soon as its last pong is acknowledged, and an ACK of the client's last ping lost then left the
# client retrying a QP that was gone ("transport retry counter exceeded"), whatever the devices do.
# Requests are still dropped, and retransmitted.
netem_on() {
  local roce=(protocol ip u32 match ip protocol 17 0xff match ip dport 4791 0xffff)
  tc filter del dev tapc parent 1: prio 1 &&
    tc filter add dev tapc parent 1: prio 1 "${roce[@]}" match u8 0x11 0xff at 28 flowid 1:2 &&
    tc filter add dev tapc parent 1: prio 2 "${roce[@]}" flowid 1:3 &&
    tc qdisc add dev tapc parent 1:3 handle 30: netem loss "$LOSS"
}
# netem_counters NAME: the netem qdisc's counters to $OUT/netem-NAME.txt and as rdma.env keys
# netem.NAME.sent / .dropped (cumulative since netem went on).
netem_counters() {
  local stats sent dropped
  stats=$(tc -s qdisc show dev tapc 2>&1) || true
  printf '%s\n' "$stats" > "$OUT/netem-$1.txt"
  # (No process substitution: L1's /dev has no /dev/fd.)
  read -r sent dropped <<< "$(awk '$1 == "qdisc" { n = ($2 == "netem") } n && $1 == "Sent" { gsub(",", "", $7); print $4, $7; exit }' <<< "$stats")" || true
  record rdma "netem.$1.sent=${sent:-none}" "netem.$1.dropped=${dropped:-none}"
  log "netem after $1: sent ${sent:-none} dropped ${dropped:-none} (RoCE v2 frames towards C)"
}
# loss_step_done STEP: both guests recorded their side of STEP.
loss_step_done() {
  guest_line a "RDMA-RESULT step=$1 " && guest_line c "RDMA-RESULT step=$1 "
}

if netem_on; then
  record rdma "netem=on" "netem_loss=$LOSS"
else
  record rdma "netem=fail"
fi
# Without netem the loss steps still run (the test then fails on the missing counters).
: > "$SIG/netem-on"
loss_step_done loss-rc || true
netem_counters loss-rc
: > "$SIG/loss-rc-counted"
loss_step_done loss-write-bw || true
netem_counters loss-write-bw
tc qdisc del dev tapc parent 1:3 handle 30: 2>/dev/null || true

end_guests rdma rdma a b c d
record rdma "seconds=$(since "$t0")"
record_panics rdma rdma a b c d
log "rdma: $(grep -vE '^rxe-|\.(secs|attempts|why)=' "$OUT/rdma.env" | tr '\n' ' ')"
