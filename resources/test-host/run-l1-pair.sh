#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Boots two test hosts (L1s, see run-l1.sh) side by side, as two machines on one cable: each has a
# NIC (eth0) joined to the other's through UDP datagrams on this machine's loopback, and both see
# OUT/share as /share, where their scripts meet (markers, results, logs). Each L1 has one vCPU: the
# pair takes this machine's two CPUs, and holds the L1 lock for both.
#
# Usage: run-l1-pair.sh --script-a PATH --script-b PATH --out DIR [--timeout SECS] [--mem MIB] [--assets DIR]
# Output: DIR/l1-a and DIR/l1-b (each L1's console.log, l1-rc, ...), DIR/share (the scripts').
# Exit status: 126 if either L1 stalled (run-l1.sh), else the first non-zero of A's and B's, else 0.
# When one L1 fails, the other gets OTHER_GRACE seconds (default 60) to finish its logs, then is
# stopped: its script would otherwise wait for its partner until its own limits.
set -euo pipefail
RES=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=../lib/common.sh
. "$RES/lib/common.sh"
# shellcheck source=l1-lock.sh
. "$RES/test-host/l1-lock.sh"
LOG_TAG=run-l1-pair

script_a='' script_b='' out='' assets='' common=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --script-a) script_a=$2; shift 2 ;;
    --script-b) script_b=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --timeout | --mem) common+=("$1" "$2"); shift 2 ;;
    --assets) assets=$2; shift 2 ;;
    *) die "unknown argument '$1' (usage: run-l1-pair.sh --script-a PATH --script-b PATH --out DIR [--timeout SECS] [--mem MIB] [--assets DIR])" ;;
  esac
done
[[ -n $script_a && -n $script_b && -n $out ]] || die "--script-a, --script-b and --out are required"
OTHER_GRACE=${OTHER_GRACE:-60}
# Once for both: two run-l1.sh building a missing asset at once would race.
[[ -n $assets ]] || assets=$("$RES/build-assets.sh")
mkdir -p "$out/l1-a" "$out/l1-b" "$out/share"
rm -f "$out/l1-a/l1-stalled" "$out/l1-b/l1-stalled"

l1_lock "$out" 2
# free_udp_port: a UDP port of loopback nobody listens on (the L1s bind theirs a moment later).
free_udp_port() {
  local p i
  for ((i = 0; i < 100; i++)); do
    p=$((20000 + RANDOM % 40000))
    [[ -n $(ss -Hlun "sport = :$p") ]] || { echo "$p"; return 0; }
  done
  die "no free UDP port found for the cable"
}
port_a=$(free_udp_port)
port_b=$(free_udp_port)
while ((port_b == port_a)); do port_b=$(free_udp_port); done
log "pair: A on udp $port_a, B on udp $port_b, out=$out"

run_l1() { # NAME SCRIPT LOCAL REMOTE: one L1 of the pair, in the background; its console in l1-NAME/.
  bash "$RES/test-host/run-l1.sh" --no-lock --smp 1 --script "$2" --out "$out/l1-$1" --share "$out/share" \
    --link "$3:$4" --assets "$assets" "${common[@]}" > "$out/l1-$1/run.log" 2>&1 &
}
run_l1 a "$script_a" "$port_a" "$port_b"
pid_a=$!
run_l1 b "$script_b" "$port_b" "$port_a"
pid_b=$!
# stop NAME: powers L1 NAME off (kills its QEMU; its run-l1.sh then reports and exits).
stop() {
  local pid
  if pid=$(cat "$out/l1-$1/qemu-l1.pid" 2>/dev/null); then kill -KILL "$pid" 2>/dev/null || true; fi
}
trap 'stop a; stop b' EXIT

rc_a='' rc_b=''
for _ in a b; do
  rc=0 running=()
  [[ -n $rc_a ]] || running+=("$pid_a")
  [[ -n $rc_b ]] || running+=("$pid_b")
  wait -n -p done_pid "${running[@]}" || rc=$?
  if [[ $done_pid == "$pid_a" ]]; then rc_a=$rc other=$pid_b name=a peer=b; else rc_b=$rc other=$pid_a name=b peer=a; fi
  log "L1 $name ended: rc=$rc"
  if ((rc != 0)) && ((${#running[@]} > 1)); then
    log "giving the other L1 ${OTHER_GRACE}s before stopping it"
    for ((i = 0; i < OTHER_GRACE * 5; i++)); do kill -0 "$other" 2>/dev/null || break; sleep 0.2; done
    stop "$peer"
  fi
done
trap - EXIT
if [[ -e $out/l1-a/l1-stalled || -e $out/l1-b/l1-stalled ]]; then
  exit 126
fi
((rc_a != 0)) && exit "$rc_a"
exit "$rc_b"
