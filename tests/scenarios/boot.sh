# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Scenario of tests/tests/boot.rs: one test-host boot, several L2 guests one after the other.
# PHASES (space-separated) selects, in order:
#   reference      QEMU (q35, qboot) boots the same kernel, initramfs and disk: proves the images
#                  and markers without our VMM, so a failure of the next phases is the VMM's
#   vmm-boot       pvrdma-vmm boots the stock kernel, 2 vCPUs, read-only root disk; the guest
#                  prints its markers and powers off
#   vmm-boot-elf   the same with the kernel as an ELF vmlinux instead of the bzImage
#   vmm-lifecycle  tick-mode guest with a disk, a vmxnet3 NIC and a PVRDMA device: every thread's
#                  seccomp mode (/proc/PID/task/*/status); pause over the API (counter stops),
#                  resume (it goes on), shutdown (the VMM exits)
# Each phase writes $OUT/<phase>.env and $OUT/<phase>-serial.log.

# The lifecycle phase makes TAPs (l1_tap).
isolate_network

# A stock kernel reaches /init in 24-35 s of L1 time; with margin for a loaded CI machine.
BOOT_LIMIT=${BOOT_LIMIT:-240}

phase_reference() {
  local t0 rc=0
  t0=$(now_us)
  timeout -k 5 "$BOOT_LIMIT" qemu-system-x86_64 -M q35 -accel kvm -cpu host -smp 2 -m 512M \
    -bios /usr/share/qemu/qboot.rom -display none -monitor none -nodefaults -no-reboot \
    -serial "file:$OUT/reference-serial.log" \
    -kernel "$PVRDMA_KERNEL" -initrd "$PVRDMA_GUEST_INITRAMFS" \
    -append "$GUEST_CMDLINE pvtest=boot pvdisk=/dev/vda pvdiskro=1" \
    -drive "file=$PVRDMA_ROOTFS,format=raw,if=none,id=disk0,readonly=on" -device virtio-blk-pci,drive=disk0 \
    > "$OUT/reference-qemu.log" 2>&1 || rc=$?
  record reference "exit=$rc" "seconds=$(since "$t0")"
}

phase_vmm_boot() {
  local t0
  t0=$(now_us)
  start_vmm vmm-boot --cmdline "$GUEST_CMDLINE pvtest=boot pvdisk=/dev/vda pvdiskro=1" \
    --disk "path=$PVRDMA_ROOTFS,readonly=on" --serial "file=$OUT/vmm-boot-serial.log" \
    --api-socket "$WORK/vmm-boot.sock"
  wait_for_exit "$VMM_PID" "$BOOT_LIMIT"
  record vmm-boot "exit=$EXIT_STATUS" "seconds=$(since "$t0")"
}

phase_vmm_boot_elf() {
  local t0
  t0=$(now_us)
  KERNEL=$PVRDMA_VMLINUX start_vmm vmm-boot-elf --cmdline "$GUEST_CMDLINE pvtest=boot pvdisk=/dev/vda pvdiskro=1" \
    --disk "path=$PVRDMA_ROOTFS,readonly=on" --serial "file=$OUT/vmm-boot-elf-serial.log"
  wait_for_exit "$VMM_PID" "$BOOT_LIMIT"
  record vmm-boot-elf "exit=$EXIT_STATUS" "seconds=$(since "$t0")"
}

phase_vmm_lifecycle() {
  local t0 serial=$OUT/vmm-lifecycle-serial.log sock=$WORK/vmm-lifecycle.sock
  t0=$(now_us)
  # With every device (disk, vmxnet3 NIC, PVRDMA), so that the sandbox check of lifecycle_steps
  # finds each device's worker thread among those it reads. The TAPs need no bridge: nothing is
  # sent over them.
  l1_tap tapn && l1_tap tapr || record vmm-lifecycle "taps=failed"
  start_vmm vmm-lifecycle --cmdline "$GUEST_CMDLINE pvtest=tick" --serial "file=$serial" --api-socket "$sock" \
    --disk "path=$PVRDMA_ROOTFS,readonly=on" --net "tap=tapn,mac=52:54:00:16:00:01" \
    --pvrdma "tap=tapr,mac=52:54:00:16:00:02"
  if lifecycle_steps "$VMM_PID" "$serial" "$sock"; then
    wait_for_exit "$VMM_PID" 60
  else
    kill -KILL "$VMM_PID" 2>/dev/null || true
    wait "$VMM_PID" 2>/dev/null || true
    EXIT_STATUS=killed
  fi
  record vmm-lifecycle "vmm_exit=$EXIT_STATUS" "seconds=$(since "$t0")"
}

# http_status SOCKET METHOD PATH [BODY]: the HTTP status the VMM's API answers (000: no answer).
http_status() {
  local body=()
  [[ $# -ge 4 ]] && body=(-H 'Content-Type: application/json' --data-binary "$4")
  curl -s -o /dev/null -w '%{http_code}' --max-time 30 --unix-socket "$1" -X "$2" "${body[@]}" \
    "http://localhost$3" || true
}

# Returns 0 once shutdown was requested (whatever came before), 1 if the VMM is beyond use.
lifecycle_steps() {
  local pid=$1 serial=$2 sock=$3 r=vmm-lifecycle t_a period_ms window n_paused n_after rc
  if ! wait_for_line "$serial" 'PVRDMA-VMM-TICK n=3 ' "$BOOT_LIMIT" "$pid"; then
    record $r "failed=no tick n=3 within ${BOOT_LIMIT}s"
    return 1
  fi
  # The guest ticks once per (guest) second, but a nested guest may run slower than that: watch
  # the pause for several real tick periods so that a missed stop cannot hide in the window.
  t_a=$(now_us)
  if ! wait_for_line "$serial" 'PVRDMA-VMM-TICK n=5 ' 60 "$pid"; then
    record $r "failed=no tick n=5 within 60 s of n=3"
    return 1
  fi
  period_ms=$((($(now_us) - t_a) / 2000))
  # The running VMM's sandbox: each thread's name, seccomp mode (2: filtered) and effective
  # capabilities, and what is left of the process's.
  local t threads=
  for t in /proc/"$pid"/task/*; do
    threads+="$(cat "$t/comm"):$(awk '/^Seccomp:/ {m = $2} /^CapEff:/ {c = $2} END {print m ":" c}' "$t/status"),"
  done
  record $r "thread_seccomp=${threads%,}" "cap_eff=$(awk '/^CapEff:/ {print $2}' /proc/"$pid"/status)" \
    "cap_bnd=$(awk '/^CapBnd:/ {print $2}' /proc/"$pid"/status)"
  window=$((3 * period_ms / 1000 + 1))
  ((window >= 5)) || window=5
  record $r "tick_period_ms=$period_ms" "pause_window_s=$window"

  rc=$(remote_cmd $r --api-socket "$sock" pause)
  record $r "pause_exit=$rc"
  if [[ $rc == 0 ]]; then
    n_paused=$(last_tick "$serial")
    # Deliberate observation window, not a wait for an event: nothing may happen during it.
    sleep "$window"
    n_after=$(last_tick "$serial")
    record $r "tick_at_pause=$n_paused" "tick_after_window=$n_after"
    rc=$(remote_cmd $r --api-socket "$sock" resume)
    record $r "resume_exit=$rc"
    if [[ $rc == 0 ]] && wait_for_line "$serial" "PVRDMA-VMM-TICK n=$((n_after + 2)) " 60 "$pid"; then
      record $r "tick_after_resume=$(last_tick "$serial")"
    else
      record $r "tick_after_resume=$(last_tick "$serial")" "failed=ticks did not go on after resume"
    fi
  fi
  # Malformed requests to the real VMM: each gets its 4xx, and the VMM keeps serving.
  record $r "http_unknown_path=$(http_status "$sock" GET /api/v1/vm.frobnicate)" \
    "http_wrong_method=$(http_status "$sock" GET /api/v1/vm.pause)" \
    "http_bad_json=$(http_status "$sock" PUT /api/v1/vm.pause '{"oops":')" \
    "http_unknown_field=$(http_status "$sock" PUT /api/v1/vm.pause '{"force":true}')" \
    "ping_after_bad_requests=$(remote_cmd $r --api-socket "$sock" ping)"
  kill -0 "$pid" 2>/dev/null || { record $r "failed=VMM exited before shutdown"; return 1; }
  rc=$(remote_cmd $r --api-socket "$sock" shutdown)
  record $r "shutdown_exit=$rc"
  return 0
}

for phase in ${PHASES:?}; do
  log "phase $phase"
  "phase_${phase//-/_}"
  log "phase $phase done: $(tr '\n' ' ' < "$OUT/$phase.env")"
done
