# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Sourced by run-l1.sh and run-l1-pair.sh (host side): the machine-wide L1 lock. An L1 takes most
# of a CPU per vCPU for its whole run, so a machine runs one L1, or one pair, at a time.

# l1_lock OUT: holds /tmp/pvrdma-vmm-l1.lock on fd 8 until the calling script exits; waits up to
# 1 h. Once it holds the lock it creates OUT/l1-locked: the e2e harness starts a scenario's time
# limit there, so that waiting for another suite's L1 does not count against it.
l1_lock() {
  exec 8>/tmp/pvrdma-vmm-l1.lock
  if ! flock -n 8; then
    log "another L1 is running (lock /tmp/pvrdma-vmm-l1.lock); waiting up to 1 h"
    flock -w 3600 8 || die "timed out waiting for the other L1"
  fi
  : > "$1/l1-locked"
}
