# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Scenario of `cargo run -p e2e --bin bench-boot`: time from starting a VMM to the guest's first
# /init line (PVRDMA-VMM-GUEST-INIT), for each VMM in VMMS (qemu-microvm, pvrdma-vmm) booting the
# same kernel and initramfs with 2 vCPUs and 512 MiB, in the same L1. Runs 0..RUNS, the VMMs
# interleaved within each run so that drift in L1 hits both alike; run 0 is a warm-up (the first
# exec of a large binary over 9p costs seconds) that the report leaves out.
# Writes $OUT/bench.tsv: vmm, run, seconds to the marker (NA if none), seconds to exit, exit status.

BENCH_LIMIT=${BENCH_LIMIT:-300}
BENCH_CMDLINE="$GUEST_CMDLINE pvtest=bench"

# rtc=on: without a CMOS RTC, Linux's rtc_cmos probe spins on the missing chip for ~6 s of a
# nested guest's boot; the baseline should be QEMU at its best, not at its default.
launch_qemu_microvm() {
  qemu-system-x86_64 -M microvm,rtc=on -accel kvm -cpu host -smp 2 -m 512M \
    -display none -monitor none -nodefaults -no-reboot -serial "file:$1" \
    -kernel "$PVRDMA_KERNEL" -initrd "$PVRDMA_GUEST_INITRAMFS" -append "$BENCH_CMDLINE"
}

launch_pvrdma_vmm() {
  "$PVRDMA_VMM_BIN" --kernel "$PVRDMA_KERNEL" --initramfs "$PVRDMA_GUEST_INITRAMFS" --cmdline "$BENCH_CMDLINE" \
    --cpus 2 --memory 512M --serial "file=$1"
}

# secs FROM_US TO_US: seconds with three decimals.
secs() {
  local d=$(($2 - $1))
  printf '%d.%03d' $((d / 1000000)) $((d / 1000 % 1000))
}

one_run() {
  local vmm=$1 run=$2 serial=$WORK/$1-$2.serial stamp=$WORK/$1-$2.init t0 t_exit pid watcher init
  : > "$serial"
  t0=$(now_us)
  "launch_${vmm//-/_}" "$serial" > "$OUT/$vmm-$run-vmm.log" 2>&1 &
  pid=$!
  # tail follows the serial file through inotify rather than by polling (a poller would take L1's
  # one CPU away from the guest being timed) and stamps the marker line as soon as it lands.
  # --pid ends tail when the VMM is gone.
  tail -n +1 -F -s 0.1 --pid="$pid" "$serial" 2>/dev/null | while IFS= read -r line; do
    if [[ $line == *PVRDMA-VMM-GUEST-INIT* && ! -e $stamp ]]; then echo "${EPOCHREALTIME/./}" > "$stamp"; fi
  done &
  watcher=$!
  wait_for_exit "$pid" "$BENCH_LIMIT"
  t_exit=$(now_us)
  wait_for_exit "$watcher" 10
  init=NA
  if [[ -s $stamp ]]; then init=$(secs "$t0" "$(<"$stamp")"); fi
  if [[ $init == NA || $EXIT_STATUS != 0 ]]; then cp "$serial" "$OUT/$vmm-$run-serial.log"; fi
  printf '%s\t%s\t%s\t%s\t%s\n' "$vmm" "$run" "$init" "$(secs "$t0" "$t_exit")" "$EXIT_STATUS" >> "$OUT/bench.tsv"
  log "$vmm run $run: init marker after $init s, exit $EXIT_STATUS"
}

for run in $(seq 0 "${RUNS:?}"); do
  for vmm in ${VMMS:?}; do
    one_run "$vmm" "$run"
  done
done
