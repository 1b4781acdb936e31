# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Scenario of `cargo run -p e2e --bin bench-net` (issue 3 benchmark): TCP throughput between two
# guests on one bridge of this host, for each VMM in VMMS (pvrdma-vmm: --net; qemu: q35 with
# QEMU's own `-device vmxnet3` on a TAP), one pair after the other, same kernel, initramfs and
# guest script (tests/guest/net.sh in bench mode: B sends DATA_MB MiB to A BENCH_ROUNDS times,
# timed by B's clock; A checks every transfer's md5), at MTU MTU.
# Writes $OUT/bench.tsv: vmm, round, bytes, seconds, md5 match (1/0), TCP segments A received with a
# bad checksum so far (InCsumErrors); logs as bench-<vmm>-{a,b}-*.
# And $OUT/bench-trace.tsv, a sample about every second while a pair runs (issue 15 goal 5: what
# a slow round looked like): vmm, microseconds since the pair started, rounds B has sent and A has
# received so far (from their consoles), the TAPs' packet counters as this host sees them (tapa
# rx, tapa tx, tapb rx, tapb tx: a TAP's tx is what its guest's NIC receives), this host's CPU
# ticks so far (busy, idle), then A's and B's `pvrdma-remote counters` on one line each
# (pvrdma-vmm; "-" for QEMU, which has no such API).

isolate_network

BENCH_LIMIT=${BENCH_LIMIT:-900}
MTU=${MTU:-1500}
cmdline="$GUEST_CMDLINE pvtest=run pvrun=/dev/vda pvmods=vmxnet3"

l1_bridge br0
for tap in tapa tapb; do
  l1_tap "$tap" br0
  ip link set "$tap" mtu 9000
done

header="MODE=bench PORT=5001 DATA_MB=${DATA_MB:?} BENCH_ROUNDS=${BENCH_ROUNDS:?} BENCH_MTU=$MTU HOST_SIG=3"
guest_script_disk "$WORK/bench-a-run.img" "$header ROLE=a MY_IP=10.10.0.1 PEER_IP=10.10.0.2 MY_SIG=1 PEER_SIG=2" "$GUEST_SCRIPTS/net.sh"
guest_script_disk "$WORK/bench-b-run.img" "$header ROLE=b MY_IP=10.10.0.2 PEER_IP=10.10.0.1 MY_SIG=2 PEER_SIG=1" "$GUEST_SCRIPTS/net.sh"

# launch_<vmm> NAME ROLE MAC: one guest in the background, its pid in GUEST_PID.
launch_pvrdma_vmm() {
  VMM_CPUS=1 start_vmm "$1" --cmdline "$cmdline" --disk "path=$WORK/bench-$2-run.img,readonly=on" \
    --serial "file=$OUT/$1-serial.log" --net "tap=tap$2,mac=$3" --api-socket "$WORK/$1.api"
  GUEST_PID=$VMM_PID
}

launch_qemu() {
  qemu-system-x86_64 -M q35 -accel kvm -cpu host -smp 1 -m 512M -bios /usr/share/qemu/qboot.rom \
    -display none -monitor none -nodefaults -no-reboot -serial "file:$OUT/$1-serial.log" \
    -kernel "$PVRDMA_KERNEL" -initrd "$PVRDMA_GUEST_INITRAMFS" -append "$cmdline" \
    -drive "file=$WORK/bench-$2-run.img,format=raw,if=none,id=disk0,readonly=on" -device virtio-blk-pci,drive=disk0 \
    -netdev "tap,id=net0,ifname=tap$2,script=no,downscript=no" -device "vmxnet3,netdev=net0,mac=$3" \
    > "$OUT/$1-vmm.log" 2>&1 &
  GUEST_PID=$!
}

# vmm_counters NAME: NAME's `pvrdma-remote counters` on one line ("-" without its API socket or
# an answer).
vmm_counters() {
  local api=$WORK/$1.api json
  [[ -S $api && -x ${PVRDMA_REMOTE_BIN:-} ]] && json=$(timeout 5 "$PVRDMA_REMOTE_BIN" --api-socket "$api" counters 2>/dev/null) &&
    tr -d ' \n' <<<"$json" && return 0
  echo -
}

# line_count FILE PATTERN: how many lines of FILE match PATTERN (0 if none or no file).
line_count() {
  local n
  n=$(grep -c "$2" "$1" 2>/dev/null) || true
  echo "${n:-0}"
}

# trace VMM: a line of bench-trace.tsv about every second until killed (see the header).
trace() {
  local vmm=$1 t0 tap stats rx tx user nice system idle iowait irq softirq steal
  t0=$(now_us)
  while :; do
    stats=()
    for tap in tapa tapb; do
      read -r rx < "/sys/class/net/$tap/statistics/rx_packets"
      read -r tx < "/sys/class/net/$tap/statistics/tx_packets"
      stats+=("$rx" "$tx")
    done
    read -r _ user nice system idle iowait irq softirq steal _ < /proc/stat
    stats+=($((user + nice + system + irq + softirq + steal)) $((idle + iowait)))
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$vmm" $(($(now_us) - t0)) \
      "$(line_count "$OUT/bench-$vmm-b-serial.log" 'NET-TCP-SENT round=')" \
      "$(line_count "$OUT/bench-$vmm-a-serial.log" 'NET-TCP-RECV round=')" "${stats[@]}" \
      "$(vmm_counters "bench-$vmm-a")" "$(vmm_counters "bench-$vmm-b")" >> "$OUT/bench-trace.tsv"
    sleep 1
  done
}

for vmm in ${VMMS:?}; do
  log "bench-net: $vmm pair"
  "launch_${vmm//-/_}" "bench-$vmm-a" a 52:54:00:0a:00:01
  pid_a=$GUEST_PID
  "launch_${vmm//-/_}" "bench-$vmm-b" b 52:54:00:0b:00:02
  pid_b=$GUEST_PID
  trace "$vmm" &
  trace_pid=$!
  wait_for_exit "$pid_b" "$BENCH_LIMIT"
  kill "$trace_pid" 2>/dev/null || true
  wait "$trace_pid" 2>/dev/null || true
  exit_b=$EXIT_STATUS
  wait_for_exit "$pid_a" 60
  log "bench-net: $vmm exits: a=$EXIT_STATUS b=$exit_b"
  # One line per round: B's timing, A's checksum and its count of TCP segments received with a
  # bad checksum so far.
  grep -o 'NET-TCP-SENT round=.*' "$OUT/bench-$vmm-b-serial.log" | tr -d '\r' | while read -r _ round bytes md5 secs _; do
    round=${round#round=}
    recv=$(grep -o "NET-TCP-RECV round=$round .*" "$OUT/bench-$vmm-a-serial.log" | tr -d '\r' | head -n1) || true
    match=0
    [[ $recv == *"bytes=${bytes#bytes=} md5=${md5#md5=} "* ]] && match=1
    csum_errors=$(grep -o 'csum_errors=[0-9]*' <<<"$recv" | cut -d= -f2) || true
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$vmm" "$round" "${bytes#bytes=}" "${secs#secs=}" "$match" "${csum_errors:-NA}" >> "$OUT/bench.tsv"
  done
done
