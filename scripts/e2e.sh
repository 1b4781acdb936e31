#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the end-to-end suites (tests/tests/*.rs, one test binary and one test-host run each) side by
# side, in as many lanes as the test host can have CPUs: E2E_LANES, by default one per CPU of this
# machine, at most 2. A test host has one vCPU (docs: more stall under TCG) and keeps one CPU busy
# for its whole run, so on CI's two cores two suites at a time take half the time of one after the
# other. The lanes share the L1 slots (resources/test-host/l1-lock.sh, PVRDMA_L1_SLOTS = lanes); the
# two-host suite, which needs two CPUs, runs first and alone.
# Each suite's whole output is printed when it ends; then a summary. Exit status 1 if any failed.
#
# Usage: scripts/e2e.sh [SUITE...]   (default: every suite; names as in tests/tests/, e.g. rdma)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Longest first (idle minutes on a 2-core machine), so that the lanes end close together; a suite
# not listed here starts before these.
ORDER=(ucx nvmeof migration roce rdma migration_peers snapshot boot net pvrdma)
# Suites that run their own pair of test hosts: alone, before the lanes.
PAIRS=(migration_hosts)

lanes=${E2E_LANES:-$(($(nproc) < 2 ? 1 : 2))}
[[ $lanes =~ ^[1-9]$ ]] || { echo "e2e.sh: E2E_LANES must be 1-9, got '$lanes'" >&2; exit 2; }
export PVRDMA_L1_SLOTS=$lanes

# The test binaries, by suite name (cargo builds them if needed).
declare -A bin
while IFS=' ' read -r name path; do bin[$name]=$path; done < <(
  cargo test --release -p e2e --locked --no-run --message-format=json |
    sed -n 's/.*"target":{[^}]*"kind":\["test"\][^}]*"name":"\([^"]*\)".*"executable":"\([^"]*\)".*/\1 \2/p'
)
((${#bin[@]} > 0)) || { echo "e2e.sh: cargo listed no e2e test binary" >&2; exit 2; }

if (($# > 0)); then
  wanted=("$@")
else
  wanted=()
  for name in "${!bin[@]}"; do [[ " ${ORDER[*]} ${PAIRS[*]} " == *" $name "* ]] || wanted+=("$name"); done
  wanted+=("${PAIRS[@]}" "${ORDER[@]}")
fi
for name in "${wanted[@]}"; do
  [[ -n ${bin[$name]:-} ]] || { echo "e2e.sh: no e2e suite '$name' (have: ${!bin[*]})" >&2; exit 2; }
done

logs=$(mktemp -d /tmp/pvrdma-e2e.XXXXXX)
trap 'rm -rf "$logs"' EXIT

# run_suite NAME: its test binary from the package directory, as cargo test runs it; output to
# $logs/NAME.log, then printed whole; "NAME SECONDS rc" in $logs/results.
run_suite() {
  local name=$1 t0=$SECONDS rc=0
  echo "e2e.sh: $name started ($(date +%T))"
  (cd tests && "${bin[$name]}") > "$logs/$name.log" 2>&1 || rc=$?
  {
    flock 9
    printf '\n======== %s: %s in %d s ========\n' "$name" "$( ((rc == 0)) && echo passed || echo "FAILED (rc=$rc)")" $((SECONDS - t0))
    cat "$logs/$name.log"
    echo "$name $((SECONDS - t0)) $rc" >> "$logs/results"
  } 9> "$logs/print.lock"
}

# lane: takes the next suite from the queue until it is empty.
lane() {
  local name
  # (sed -i replaces the queue's file: the lock is on a file of its own.)
  # shellcheck disable=SC2016 # the inner shell expands $1
  while name=$(flock "$logs/queue.lock" sh -c 'head -n 1 "$1" && sed -i 1d "$1"' _ "$logs/queue") && [[ -n $name ]]; do
    run_suite "$name"
  done
}

t0=$SECONDS
: > "$logs/queue"
for name in "${wanted[@]}"; do
  if [[ " ${PAIRS[*]} " == *" $name "* ]]; then run_suite "$name"; else echo "$name" >> "$logs/queue"; fi
done
for ((i = 0; i < lanes; i++)); do lane & done
wait

echo
echo "======== e2e summary: $lanes lane(s), $((SECONDS - t0)) s ========"
failed=0
while read -r name secs rc; do
  printf '%-16s %5d s  %s\n' "$name" "$secs" "$( ((rc == 0)) && echo ok || echo "FAILED (rc=$rc)")"
  ((rc == 0)) || failed=1
done < "$logs/results"
exit $failed
