# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Sourced by run-l1.sh and run-l1-pair.sh (host side): the machine-wide L1 slots. An L1 takes most
# of a CPU per vCPU for its whole run, so a machine runs at most PVRDMA_L1_SLOTS single-vCPU L1s at
# once (default 1: a shared development machine; scripts/e2e.sh sets one per CPU it gives the
# suites). Slot 0 is /tmp/pvrdma-vmm-l1.lock, slot N /tmp/pvrdma-vmm-l1.lock.N.

# l1_lock OUT [CPUS]: holds CPUS slots (default 1; an L1 asks for one per vCPU, a pair of L1s for
# 2; asking for more than there are takes them all) until the calling script exits; waits up to
# 1 h. Once it holds them it creates OUT/l1-locked: the e2e harness starts a scenario's time limit
# there, so that waiting for another suite's L1 does not count against it.
l1_lock() {
  local out=$1 want=${2:-1} slots=${PVRDMA_L1_SLOTS:-1} deadline fd i
  [[ $slots =~ ^[1-9][0-9]?$ ]] || die "PVRDMA_L1_SLOTS must be a whole number from 1 to 99, got '$slots'"
  ((want <= slots)) || want=$slots
  deadline=$((SECONDS + 3600))
  if ((want > 1)); then
    # Several slots: always the first WANT, in order, so that two such callers never deadlock.
    for ((i = 0; i < want; i++)); do
      exec {fd}> "$(l1_slot_path "$i")"
      flock -n "$fd" || {
        log "L1 slot $i is taken (another suite's L1); waiting up to 1 h"
        flock -w $((deadline - SECONDS)) "$fd" || die "timed out waiting for the other L1s"
      }
    done
  else
    # One slot: whichever is free first.
    local said=0
    while :; do
      for ((i = 0; i < slots; i++)); do
        exec {fd}> "$(l1_slot_path "$i")"
        flock -n "$fd" && break 2
        exec {fd}>&-
      done
      ((said)) || log "all $slots L1 slot(s) are taken (lock /tmp/pvrdma-vmm-l1.lock*); waiting up to 1 h"
      said=1
      ((SECONDS < deadline)) || die "timed out waiting for a free L1 slot"
      sleep 2
    done
  fi
  : > "$out/l1-locked"
}

l1_slot_path() {
  if (($1 == 0)); then echo /tmp/pvrdma-vmm-l1.lock; else echo "/tmp/pvrdma-vmm-l1.lock.$1"; fi
}
