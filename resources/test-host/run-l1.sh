#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Boots the test host (L1): Debian's stock 6.1 kernel under QEMU TCG with an emulated AMD CPU (SVM +
# nested paging, so kvm_amd gives L1 a real /dev/kvm), the host's root shared read-only over 9p and
# OUT shared read-write as /out. L1 runs SCRIPT (a host path) with bash and powers off.
#
# Usage: run-l1.sh --script PATH --out DIR [--timeout SECS] [--smp N] [--mem MIB] [--assets DIR]
#                  [--link LOCAL:REMOTE --share DIR --no-lock]
#   --smp: use 1 when the script runs more than one L2 guest (several nested guests under
#          multi-threaded TCG hung or reset in 3 of 5 runs; single-threaded was 4 of 4 fine).
#   --link: a second machine's cable: a virtio-net NIC (eth0 in L1, MAC 52:54:00:1f + LOCAL) whose
#          frames travel as UDP datagrams from 127.0.0.1:LOCAL to 127.0.0.1:REMOTE, where the other
#          test host's --link listens (QEMU's dgram netdev).
#   --share: DIR shared read-write as /share too (both hosts of a pair see the same directory).
#   --no-lock: the caller holds the L1 lock for this run (run-l1-pair.sh runs two L1s under it).
# Output: the L1 console on stdout and in OUT/console.log (lines prefixed with host seconds since
# start), QEMU's own messages in OUT/qemu-l1.stderr, the script's exit status in OUT/l1-rc, and
# while QEMU runs its PID in OUT/qemu-l1.pid.
# Exit status: the script's; 124 if L1 hit the timeout; 125 if L1 ended without reporting one;
# 126 if L1 stalled: no console line (l1-init prints a heartbeat every 30 s) for STALL_LIMIT s, or
# L1's kernel reports a CPU stuck for SOFTLOCKUP_LIMIT s or more (a soft lockup: seen with a nested
# guest's vCPU threads spinning on both CPUs of an -smp 2 L1 while the guest printed nothing; the
# heartbeat and the lockup reports themselves keep the console going, so silence never comes).
# Nested guests under TCG have been seen to wedge L1 itself (its timers stop, so its own timeouts
# never fire); the stall check ends such a run in minutes instead of at --timeout.
set -euo pipefail
RES=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=../lib/common.sh
. "$RES/lib/common.sh"
# shellcheck source=l1-lock.sh
. "$RES/test-host/l1-lock.sh"
LOG_TAG=run-l1

script='' out='' timeout=900 smp=2 mem=4096 assets='' link='' share='' lock=1
usage='usage: run-l1.sh --script PATH --out DIR [--timeout SECS] [--smp N] [--mem MIB] [--assets DIR] [--link LOCAL:REMOTE] [--share DIR] [--no-lock]'
while [[ $# -gt 0 ]]; do
  case $1 in
    --script) script=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --smp) smp=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --assets) assets=$2; shift 2 ;;
    --link) link=$2; shift 2 ;;
    --share) share=$2; shift 2 ;;
    --no-lock) lock=0; shift ;;
    *) die "unknown argument '$1' ($usage)" ;;
  esac
done
[[ $script == /* && -r $script ]] || die "--script must be an absolute path to a readable file (L1 sees the host root at /): '$script'"
[[ -n $out ]] || die "--out DIR is required"
[[ $timeout =~ ^[0-9]+$ && $smp =~ ^[0-9]+$ && $mem =~ ^[0-9]+$ ]] || die "--timeout, --smp and --mem take whole numbers"
extra=() append=''
if [[ -n $link ]]; then
  if ! [[ $link =~ ^([1-9][0-9]{0,4}):([1-9][0-9]{0,4})$ ]] || ((BASH_REMATCH[1] > 65535 || BASH_REMATCH[2] > 65535)); then
    die "--link takes LOCAL:REMOTE UDP ports, got '$link'"
  fi
  extra+=(-netdev "dgram,id=link,local.type=inet,local.host=127.0.0.1,local.port=${BASH_REMATCH[1]},remote.type=inet,remote.host=127.0.0.1,remote.port=${BASH_REMATCH[2]}"
    -device "virtio-net-pci,netdev=link,mac=$(printf '52:54:00:1f:%02x:%02x' $((BASH_REMATCH[1] >> 8)) $((BASH_REMATCH[1] & 255)))")
fi
if [[ -n $share ]]; then
  [[ -d $share ]] || die "--share: no directory '$share'"
  extra+=(-virtfs "local,path=$(cd "$share" && pwd),mount_tag=share,security_model=none")
  append=' l1share=1'
fi
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 not found (resources/build-assets.sh installs qemu-system-x86)"
[[ -n $assets ]] || assets=$("$RES/build-assets.sh")
[[ -f $assets/assets.env ]] || die "$assets/assets.env not found (run resources/build-assets.sh)"
# shellcheck source=/dev/null
. "$assets/assets.env"
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out/l1-rc" "$out/l1-stalled" "$out/qemu-l1.stderr"
STALL_LIMIT=${STALL_LIMIT:-180}
SOFTLOCKUP_LIMIT=${SOFTLOCKUP_LIMIT:-120}

# L1 takes most of a CPU per vCPU for its whole run: it waits for a free L1 slot per vCPU (l1-lock.sh).
((lock == 0)) || l1_lock "$out" "$smp"

log "L1: smp=$smp mem=${mem}M timeout=${timeout}s script=$script out=$out${link:+ link=$link}${share:+ share=$share}"
t0=${EPOCHREALTIME/./}
# QEMU's PID while it runs (run-l1-pair.sh stops one L1 of a pair with it).
pidfile=$out/qemu-l1.pid
trap 'rm -f "$pidfile"' EXIT
set +e
# This shell's own stderr goes to the QEMU log while the pipeline runs: bash reports a pipeline
# member killed by a signal (the stall check below kills QEMU) with a dump of the whole pipeline.
exec 3>&2 2>>"$out/qemu-l1.stderr"
# --foreground keeps QEMU in this script's process group, so that whoever runs this script can stop
# all of it by killing that group (plain timeout would move QEMU into a group of its own).
timeout --foreground -k 15 "$timeout" qemu-system-x86_64 -name pvrdma-l1,debug-threads=on -pidfile "$pidfile" \
  -accel tcg,thread=multi,tb-size=1024 -cpu EPYC -smp "$smp" -m "$mem" \
  -display none -monitor none -no-reboot -nodefaults \
  -chardev stdio,id=con,signal=off -serial chardev:con \
  -kernel "$PVRDMA_KERNEL" -initrd "$PVRDMA_L1_INITRAMFS" \
  -append "console=ttyS0 panic=-1 quiet l1script=$script l1modules=$PVRDMA_MODULES$append" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs "local,path=$out,mount_tag=out,security_model=none" "${extra[@]}" \
  < /dev/null \
  | while :; do
      if IFS= read -r -t "$STALL_LIMIT" line; then
        now=${EPOCHREALTIME/./}
        printf '[%4d.%02d] %s\n' $(((now - t0) / 1000000)) $(((now - t0) / 10000 % 100)) "${line%$'\r'}"
        if [[ $line =~ soft\ lockup\ -\ CPU#[0-9]+\ stuck\ for\ ([0-9]+)s ]] && ((BASH_REMATCH[1] >= SOFTLOCKUP_LIMIT)); then
          echo "a CPU of L1 stuck for ${BASH_REMATCH[1]}s (soft lockup)" > "$out/l1-stalled"
          kill -KILL "$(<"$pidfile")"
          break
        fi
      elif (($? > 128)); then
        echo "no console output for ${STALL_LIMIT}s" > "$out/l1-stalled"
        kill -KILL "$(<"$pidfile")"
        break
      else
        break # end of the console: QEMU exited
      fi
    done | tee "$out/console.log"
status=("${PIPESTATUS[@]}")
exec 2>&3 3>&-
set -e
qemu_rc=${status[0]}
if [[ -e $out/l1-stalled ]]; then
  log "L1 STALLED: $(<"$out/l1-stalled"), killed it (console: $out/console.log)"
  exit 126
fi
if [[ $qemu_rc == 124 || $qemu_rc == 137 ]]; then
  log "L1 TIMED OUT after ${timeout}s (console: $out/console.log)"
  exit 124
fi
if [[ ! -s $out/l1-rc ]]; then
  log "L1 ended (qemu rc=$qemu_rc) without reporting the script's exit status; see $out/console.log and $out/qemu-l1.stderr"
  grep -m1 -h 'L1-ERROR' "$out/console.log" >&2 || true
  exit 125
fi
rc=$(<"$out/l1-rc")
log "L1 done in $(((${EPOCHREALTIME/./} - t0) / 1000000)) s, script rc=$rc"
exit "$rc"
