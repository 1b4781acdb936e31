# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Scenario of `cargo run -p e2e --bin bench-rdma` (issue 5 benchmark): ibv_rc_pingpong and
# ib_write_bw between two guests A (10.13.0.1, servers) and B (10.13.0.2, clients) on one bridge
# br0 (10.13.0.254) of this host, each VMM's NIC on its own TAP (tapa, tapb), one pair after the
# other, for each configuration in CONFIGS:
#   pvrdma-local  --pvrdma tap=...,mac=... (vmxnet3 + PVRDMA), the VMMs' default same-host channel
#   pvrdma-wire   the same with local=off on both: the RoCE v2 frames cross the TAPs and the bridge
#   rxe           --net tap=...,mac=... (vmxnet3 only); the guests run Linux Soft-RoCE (rdma_rxe,
#                 rxe0 on eth0), so their RoCE v2 frames cross the same TAPs and bridge
# Same kernel, initramfs and guest script (tests/guest/bench-rdma.sh) for all, one vCPU each.
# Writes $OUT/bench.tsv: config, program (pp | bw), round, client rc, server rc, figure (pp:
# usec/iter; bw: BW average MB/sec; NA if the client printed none, NOCLOCK if perftest printed
# that its cycle-clock calibration failed, which makes its figures 0.00); and $OUT/bench.env: per
# config, the VMMs' exits, the RoCE v2 frames (UDP 4791) this host sent to each TAP meanwhile and
# the guests' set-up failures. Logs: bench-<config>-{a,b}-{serial,vmm}.log.

isolate_network

BENCH_LIMIT=${BENCH_LIMIT:-600}
PROG_LIMIT=${PROG_LIMIT:-120}
READY_WAIT=${READY_WAIT:-240}
IP_A=10.13.0.1
IP_B=10.13.0.2
HOST_IP=10.13.0.254

l1_bridge br0
ip addr add "$HOST_IP/24" dev br0
l1_tap tapa br0
l1_tap tapb br0

modprobe -a sch_prio cls_u32 || true
for dev in tapa tapb; do
  frame_counter "$dev" || record bench "counter_$dev=fail"
done

# launch CONFIG ROLE IP MAC: one guest of CONFIG in the background; its pid in GUEST_PID.
launch() {
  local config=$1 role=$2 ip=$3 mac=$4 peer=$IP_B kind=pvrdma nic
  [[ $role == b ]] && peer=$IP_A
  case $config in
    pvrdma-local) nic=(--pvrdma "tap=tap$role,mac=$mac") ;;
    pvrdma-wire) nic=(--pvrdma "tap=tap$role,mac=$mac,local=off") ;;
    rxe)
      nic=(--net "tap=tap$role,mac=$mac")
      kind=rxe
      ;;
    *)
      log "bench-rdma: unknown configuration $config"
      return 1
      ;;
  esac
  local name=bench-$config-$role
  guest_script_disk "$WORK/$name-run.img" "ROLE=$role KIND=$kind MY_IP=$ip PEER_IP=$peer HOST_IP=$HOST_IP ROUNDS=${ROUNDS:?}
PP_ITERS=${PP_ITERS:?} PP_SIZE=${PP_SIZE:?} BW_ITERS=${BW_ITERS:?} BW_SIZE=${BW_SIZE:?} PORT_BASE=18900
LIMIT=$PROG_LIMIT READY_WAIT=$READY_WAIT" "$GUEST_SCRIPTS/bench-rdma.sh"
  run_guest "$name" "$WORK/$name-run.img" "${nic[@]}"
  GUEST_PID=$VMM_PID
}

# figures CONFIG: bench.tsv lines of CONFIG from B's (client) and A's (server) consoles.
figures() {
  local config=$1
  tr -d '\r' < "$OUT/bench-$config-a-serial.log" > "$WORK/a.log"
  tr -d '\r' < "$OUT/bench-$config-b-serial.log" > "$WORK/b.log"
  awk -v config="$config" '
    FNR == 1 { file++ }
    # kv NAME: the value of NAME=... on this line.
    function kv(name,   i) { for (i = 1; i <= NF; i++) if (index($i, name "=") == 1) return substr($i, length(name) + 2); return "" }
    /^BENCH-RDMA-BEGIN / { prog = kv("prog"); round = kv("round"); inside = 1; header = 0; next }
    /^BENCH-RDMA-END / {
      key = kv("prog") SUBSEP kv("round")
      if (file == 1) srv[key] = kv("rc")
      else { cli[key] = kv("rc"); if (!(key in fig)) fig[key] = "NA"; order[++n] = key }
      inside = 0; next
    }
    !inside || file == 1 { next }
    prog == "pp" && / iters in .* usec\/iter/ { fig[prog SUBSEP round] = $(NF - 1) }
    prog == "bw" && header && NF >= 5 && $1 ~ /^[0-9]+$/ { fig[prog SUBSEP round] = $4; header = 0 }
    prog == "bw" && /#bytes/ { header = 1 }
    # perftest could not calibrate its cycle clock (noisy nested guest): its figures are 0.00.
    prog == "bw" && /Correlation coefficient/ { noclock[prog SUBSEP round] = 1 }
    END {
      for (i = 1; i <= n; i++) {
        split(order[i], k, SUBSEP)
        f = (order[i] in noclock) ? "NOCLOCK" : fig[order[i]]
        printf "%s\t%s\t%s\t%s\t%s\t%s\n", config, k[1], k[2], cli[order[i]], (order[i] in srv) ? srv[order[i]] : "none", f
      }
    }' "$WORK/a.log" "$WORK/b.log" >> "$OUT/bench.tsv"
}

pair=0
for config in ${CONFIGS:?}; do
  pair=$((pair + 1))
  log "bench-rdma: $config pair"
  t0=$(now_us)
  before_a=$(frames_counted tapa) before_b=$(frames_counted tapb)
  # MACs of their own per pair: no same-host channel socket of a previous pair is ever addressed.
  launch "$config" a "$IP_A" "52:54:00:13:0$pair:01"
  pid_a=$GUEST_PID
  launch "$config" b "$IP_B" "52:54:00:13:0$pair:02"
  pid_b=$GUEST_PID
  # Each VMM must end once its guest powered off (60 s grace, as in rdma.sh).
  wait_for_line "$OUT/bench-$config-b-serial.log" 'GUEST-POWEROFF' "$BENCH_LIMIT" "$pid_b" || true
  wait_for_exit "$pid_b" 60
  exit_b=$EXIT_STATUS
  wait_for_line "$OUT/bench-$config-a-serial.log" 'GUEST-POWEROFF' 60 "$pid_a" || true
  wait_for_exit "$pid_a" 60
  exit_a=$EXIT_STATUS
  after_a=$(frames_counted tapa) after_b=$(frames_counted tapb)
  figures "$config"
  fails=$(grep -h -o 'BENCH-RDMA-FAIL.*' "$OUT/bench-$config-a-serial.log" "$OUT/bench-$config-b-serial.log" | tr -d '\r' | tr ' ' '_' | paste -sd' ' -) || true
  record bench "$config.a_exit=$exit_a" "$config.b_exit=$exit_b" \
    "$config.tapa_roce_frames=$((${after_a:-0} - ${before_a:-0}))" "$config.tapb_roce_frames=$((${after_b:-0} - ${before_b:-0}))" \
    "$config.a_done=$(grep -c 'BENCH-RDMA-DONE' "$OUT/bench-$config-a-serial.log" || true)" \
    "$config.b_done=$(grep -c 'BENCH-RDMA-DONE' "$OUT/bench-$config-b-serial.log" || true)" \
    "$config.panics=$(panics "$OUT/bench-$config-a-vmm.log" "$OUT/bench-$config-b-vmm.log")" \
    "$config.fail=${fails:-}" "$config.seconds=$(since "$t0")"
  log "bench-rdma: $config: $(grep "^$config\." "$OUT/bench.env" | tr '\n' ' ')"
done
