# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Scenario of `cargo run -p e2e --bin bench-migration` (issue 6 benchmark): the blackout and total
# time of live-migrating guest B against its memory size and the number of QPs carrying traffic.
# For each memory size in MEMORY_SIZES (MiB, B's --memory), one pair: guests A (10.16.0.1, 512 MiB,
# ib_write_bw servers) and B (10.16.0.2, clients), each with a PVRDMA slot on bridge br0
# (10.16.0.254) of this host, one vCPU each, booted once. Then for each cell of CELLS (QP counts
# in order; 0 = B idle, N = `ib_write_bw -q N` from B to A over the VMMs' same-host channel):
# the cell's traffic starts, B is migrated over TCP (127.0.0.1) to a new VMM process of this
# host with the other of B's two TAPs (tapb0, tapb1), the traffic is stopped a few seconds after
# the switch-over, and the migrated VM is the next cell's source (b1 -> b2 -> b3 ...). The guests
# run tests/guest/bench-migration.sh; this host drives their cells with signals (files served by
# busybox httpd). Writes $OUT/bench.tsv, one line per cell: memory MiB, round, QPs, cell,
# send-migration's exit status, its "migration completed: ..." line (or NA), the bytes the
# destination's vm.info says it received (or NA), pre-copy passes, whether the traffic was still
# running at the switch-over (yes | no | idle | nostart), the client's and the server's exit
# status (- for an idle cell, none if it never ended), ib_write_bw's BW average (MB/s; NOCLOCK if
# perftest could not calibrate its clock; NA; -), and the source VMM's exit (or kept: the
# migration failed and B stays there); and $OUT/bench.env per memory size: the last VMMs' exits,
# panics in any VMM log of the pair, the guests' set-up failures, the pair's seconds. Logs:
# bench-mig-<MiB>-{a,b1,b2,...}-{serial,vmm}.log, bench-mig-<MiB>-cell<N>-{send,receive}-remote.log.

isolate_network
# Each VMM holds an eventfd per QP and more (issue 16's cells have 4096 QPs a guest).
ulimit -n 65536

MIGRATION_TIMEOUT=${MIGRATION_TIMEOUT:-400}
DOWNTIME_MS=${DOWNTIME_MS:-300}
TRAFFIC_WAIT=${TRAFFIC_WAIT:-240}
READY_WAIT=${READY_WAIT:-240}
# A side's program may take as long to end as to start (it destroys its QPs one by one).
STOP_WAIT=$((READY_WAIT > 120 ? READY_WAIT : 120))
BOOT_WAIT=${BOOT_WAIT:-360}
SETTLE=${SETTLE:-5}
POST_TRAFFIC=${POST_TRAFFIC:-5}
LIMIT=${LIMIT:-900}
SIGNAL_WAIT=$((MIGRATION_TIMEOUT + TRAFFIC_WAIT + 2 * STOP_WAIT + 600))
# lib.sh's remote_cmd: a migration's pvrdma-remote outlives its --timeout-s a little at most.
# shellcheck disable=SC2034 # read by remote_cmd
REMOTE_LIMIT=$((MIGRATION_TIMEOUT + 60))
IP_A=10.16.0.1
IP_B=10.16.0.2
HOST_IP=10.16.0.254
SIG_PORT=8000
SIG=$WORK/sig

l1_bridge br0
ip addr add "$HOST_IP/24" dev br0
for t in tapa tapb0 tapb1; do l1_tap "$t" br0; done

# This host's signal server (tests/guest/bench-migration.sh polls it): busybox from the guest
# userspace.
mkdir -p "$SIG"
"$PVRDMA_USERSPACE/bin/busybox" httpd -f -p "$HOST_IP:$SIG_PORT" -h "$SIG" &
signal() { : > "$SIG/$1"; }

# boot NAME MEMORY TAP MAC ARGS...: one guest with one vCPU and MEMORY in the background
# (run_guest of $WORK/NAME-run.img); its pid in VMM_PID.
boot() {
  local name=$1 memory=$2 tap=$3 mac=$4
  shift 4
  VMM_MEMORY=$memory run_guest "$name" "$WORK/$name-run.img" --pvrdma "tap=$tap,mac=$mac" "$@"
}

# receiver NAME: start_receiver with the API socket $WORK/NAME.api.
receiver() { start_receiver "$1" "$WORK/$1.api"; }

# marker PREFIX ERE: the first line of the pair's B consoles (whichever VMM ran B when it was
# printed) matching ERE, without the carriage return.
b_marker() {
  cat "$OUT/$1"-b*-serial.log 2> /dev/null | tr -d '\r' | grep -m1 -E -- "$2" || true
}

# kv LINE NAME: the value of NAME=... in LINE.
# b_frames PAIR SRC: RoCE frames B's PVRDMA has sent so far, on the wire and over the same-host
# channel (its vm.counters), or nothing if its API does not answer.
b_frames() {
  timeout 10 "$PVRDMA_REMOTE_BIN" --api-socket "$WORK/$1-$2.api" counters 2> /dev/null |
    grep -oE '"roce_(local_)?tx": *[0-9]+' | grep -oE '[0-9]+$' | awk '{ n += $1 } END { if (NR) print n }'
}

# frames_flow PAIR SRC QPS WAIT: whether B's PVRDMA sends at least QPS frames more within WAIT
# seconds. All QPs in RTS does not say that ib_write_bw posts: with thousands of QPs it is still
# setting up for a minute or more after that, and a migration then is not one under traffic.
frames_flow() {
  local first now end=$((SECONDS + $4))
  first=$(b_frames "$1" "$2")
  [[ -n $first ]] || return 1
  while ((SECONDS < end)); do
    now=$(b_frames "$1" "$2")
    [[ -n $now ]] && ((now - first >= $3)) && return 0
    sleep 1
  done
  return 1
}

kv() { sed -n "s/.*[[:space:]]$2=\([^[:space:]]*\).*/\1/p" <<< " $1"; }

# bw_figure NAME CELL: ib_write_bw's BW average in the client's output of CELL (its result line
# follows the "#bytes" header), NOCLOCK if perftest said it could not calibrate its cycle clock
# (its figures are 0.00 then), NA if there is none.
bw_figure() {
  cat "$OUT/$1"-b*-serial.log 2> /dev/null | tr -d '\r' | awk -v cell="$2" '
    $0 ~ "BENCH-MIG-BEGIN cell=" cell " side=client" { inside = 1; next }
    !inside { next }
    /BENCH-MIG-END / { exit }
    /Correlation coefficient/ { noclock = 1 }
    header && NF >= 5 && $1 ~ /^[0-9]+$/ { fig = $4; header = 0 }
    /#bytes/ { header = 1 }
    END { print noclock ? "NOCLOCK" : (fig == "" ? "NA" : fig) }'
}

modprobe -a tun bridge 2> /dev/null || true
mport=6700
pair=0
for mem in ${MEMORY_SIZES:?}; do
  pair=$((pair + 1))
  log "bench-migration: $mem MiB pair"
  t_pair=$(now_us)
  p=bench-mig-$mem
  # MACs of their own per pair: no same-host channel socket of a previous pair is ever addressed.
  mac_a=52:54:00:16:0$pair:01 mac_b=52:54:00:16:0$pair:02
  common="HOST_IP=$HOST_IP SIG_PORT=$SIG_PORT PAIR=$p CELLS='${CELLS:?}'
SIZE=${SIZE:?} TX_DEPTH=${TX_DEPTH:?} QP_TIMEOUT=${QP_TIMEOUT:?} PORT_BASE=$((18900 + 100 * pair)) LIMIT=$LIMIT READY_WAIT=$READY_WAIT STOP_WAIT=$STOP_WAIT SIGNAL_WAIT=$SIGNAL_WAIT"
  guest_script_disk "$WORK/$p-a-run.img" "ROLE=a MY_IP=$IP_A PEER_IP=$IP_B $common" "$GUEST_SCRIPTS/bench-migration.sh"
  guest_script_disk "$WORK/$p-b1-run.img" "ROLE=b MY_IP=$IP_B PEER_IP=$IP_A $common" "$GUEST_SCRIPTS/bench-migration.sh"
  boot "$p-a" 512M tapa "$mac_a"
  pid_a=$VMM_PID
  boot "$p-b1" "${mem}M" tapb1 "$mac_b" --api-socket "$WORK/$p-b1.api"
  pid_src=$VMM_PID src=b1 src_tap=tapb1 gen=1

  ready=1
  wait_for_line "$OUT/$p-b1-serial.log" 'BENCH-MIG-READY' "$BOOT_WAIT" "$pid_src" || ready=0
  wait_for_line "$OUT/$p-a-serial.log" 'BENCH-MIG-READY' 60 "$pid_a" || ready=0
  record bench "$mem.boot_seconds=$(since "$t_pair")"
  cell=0
  round=1
  per_round=$(wc -w <<< "${QPS:?}")
  for qps in $CELLS; do
    cell=$((cell + 1))
    round=$(((cell - 1) / per_round + 1))
    if [[ $ready != 1 ]] || ! kill -0 "$pid_src" 2> /dev/null || ! kill -0 "$pid_a" 2> /dev/null; then
      log "bench-migration: $mem MiB: a guest is not ready or its VMM is gone; no more cells"
      break
    fi
    serial=$OUT/$p-$src-serial.log
    signal "$p-start-$cell"
    covered=idle client_rc=- server_rc=- bw=-
    if ((qps > 0)); then
      wait_for_line "$serial" "BENCH-MIG-(TRAFFIC|END) cell=$cell " "$TRAFFIC_WAIT" "$pid_src" || true
      if ! grep -q "BENCH-MIG-TRAFFIC cell=$cell " "$serial" || ! frames_flow "$p" "$src" "$qps" "$TRAFFIC_WAIT"; then
        # No figure without the traffic: this cell is not migrated.
        log "bench-migration: $mem MiB, cell $cell: the traffic of $qps QPs never started"
        signal "$p-stop-$cell"
        wait_for_line "$serial" "BENCH-MIG-END cell=$cell " "$STOP_WAIT" "$pid_src" || true
        wait_for_line "$OUT/$p-a-serial.log" "BENCH-MIG-END cell=$cell " "$STOP_WAIT" "$pid_a" || true
        end_b=$(b_marker "$p" "BENCH-MIG-END cell=$cell ")
        end_a=$(tr -d '\r' < "$OUT/$p-a-serial.log" | grep -m1 -E "BENCH-MIG-END cell=$cell " || true)
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mem" "$round" "$qps" "$cell" none NA NA 0 nostart \
          "$(kv "$end_b" rc | grep . || echo none)" "$(kv "$end_a" rc | grep . || echo none)" NA kept >> "$OUT/bench.tsv"
        continue
      fi
      covered=yes
    else
      wait_for_line "$serial" "BENCH-MIG-IDLE cell=$cell " 60 "$pid_src" || true
    fi
    sleep "$SETTLE"

    # The migration, over TCP, to a new VMM with the TAP the source does not hold.
    gen=$((gen + 1))
    dst=b$gen dst_tap=tapb0
    [[ $src_tap == tapb0 ]] && dst_tap=tapb1
    mport=$((mport + 1))
    receiver "$p-$dst" || true
    pid_dst=$VMM_PID
    log "bench-migration: $mem MiB, cell $cell ($qps QPs): $src -> $dst"
    receive_rc=$(remote_cmd "$p-cell$cell-receive" --api-socket "$WORK/$p-$dst.api" receive-migration "tcp:127.0.0.1:$mport" --tap "$mac_b=$dst_tap" --disk-dir "$WORK" --no-wait)
    send_rc=$(remote_cmd "$p-cell$cell-send" --api-socket "$WORK/$p-$src.api" send-migration "tcp:127.0.0.1:$mport" \
      --downtime-ms "$DOWNTIME_MS" --timeout-s "$MIGRATION_TIMEOUT")
    # The traffic ended before the switch-over: the end of this migration was not under traffic.
    if ((qps > 0)) && grep -qE "BENCH-MIG-END cell=$cell .*side=client" "$serial"; then
      covered=no
    fi
    completed=$(grep -m1 -o 'migration completed: .*' "$OUT/$p-cell$cell-send-remote.log" || echo NA)
    passes=$(grep -c '^pass [0-9]*:' "$OUT/$p-cell$cell-send-remote.log" || true)
    received=NA
    if [[ $send_rc == 0 ]]; then
      received=$(timeout 10 "$PVRDMA_REMOTE_BIN" --api-socket "$WORK/$p-$dst.api" info 2> /dev/null |
        grep -m1 -o '"bytes_transferred": *[0-9]*' | grep -o '[0-9]*$' || echo NA)
      wait_for_exit "$pid_src" 30
      src_exit=$EXIT_STATUS
      pid_src=$pid_dst src=$dst src_tap=$dst_tap
    elif ! kill -0 "$pid_src" 2> /dev/null && kill -0 "$pid_dst" 2> /dev/null; then
      # pvrdma-remote could not tell the outcome, but the source is gone and the destination runs.
      log "bench-migration: $mem MiB, cell $cell: send-migration rc=$send_rc, yet B runs on $dst now"
      wait_for_exit "$pid_src" 1
      src_exit=$EXIT_STATUS
      pid_src=$pid_dst src=$dst src_tap=$dst_tap
    else
      log "bench-migration: $mem MiB, cell $cell: send-migration rc=$send_rc (receive rc=$receive_rc); B stays on $src"
      src_exit=kept
      timeout 10 "$PVRDMA_REMOTE_BIN" --api-socket "$WORK/$p-$dst.api" shutdown > /dev/null 2>&1 || true
      wait_for_exit "$pid_dst" 30
    fi

    if ((qps > 0)); then
      sleep "$POST_TRAFFIC"
      signal "$p-stop-$cell"
      if [[ -z $(b_marker "$p" "BENCH-MIG-END cell=$cell ") ]]; then
        wait_for_line "$OUT/$p-$src-serial.log" "BENCH-MIG-END cell=$cell " "$STOP_WAIT" "$pid_src" || true
      fi
      wait_for_line "$OUT/$p-a-serial.log" "BENCH-MIG-END cell=$cell " "$STOP_WAIT" "$pid_a" || true
      end_b=$(b_marker "$p" "BENCH-MIG-END cell=$cell ")
      end_a=$(tr -d '\r' < "$OUT/$p-a-serial.log" | grep -m1 -E "BENCH-MIG-END cell=$cell " || true)
      client_rc=$(kv "$end_b" rc | grep . || echo none)
      server_rc=$(kv "$end_a" rc | grep . || echo none)
      bw=$(bw_figure "$p" "$cell") || bw=NA
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mem" "$round" "$qps" "$cell" "$send_rc" "$completed" \
      "$received" "$passes" "$covered" "$client_rc" "$server_rc" "$bw" "$src_exit" >> "$OUT/bench.tsv"
    log "bench-migration: $mem MiB, cell $cell: $(tail -n 1 "$OUT/bench.tsv" | tr '\t' '|')"
  done

  # The guests end their scripts and power off, which ends their VMMs.
  signal "$p-end"
  wait_for_line "$OUT/$p-$src-serial.log" 'GUEST-POWEROFF' 120 "$pid_src" || true
  wait_for_exit "$pid_src" 60
  exit_b=$EXIT_STATUS
  wait_for_line "$OUT/$p-a-serial.log" 'GUEST-POWEROFF' 60 "$pid_a" || true
  wait_for_exit "$pid_a" 60
  exit_a=$EXIT_STATUS
  fails=$(cat "$OUT/$p"-*-serial.log | grep -o 'BENCH-MIG-FAIL.*' | tr -d '\r' | tr ' ' '_' | paste -sd' ' -) || true
  record bench "$mem.a_exit=$exit_a" "$mem.b_exit=$exit_b" "$mem.b_last=$src" \
    "$mem.panics=$(panics "$OUT/$p"-*-vmm.log)" \
    "$mem.fail=${fails:-}" "$mem.seconds=$(since "$t_pair")"
  log "bench-migration: $mem MiB: $(grep "^$mem\." "$OUT/bench.env" | tr '\n' ' ')"
done
