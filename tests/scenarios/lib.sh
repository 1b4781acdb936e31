# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# shellcheck disable=SC2034 # GUEST_CMDLINE, GUEST_SCRIPTS, WORK, EXIT_STATUS, VMM_PID, t0: set here for the scenarios
# Helpers for scenario scripts, sourced by the wrapper e2e::testhost generates (set -euo pipefail,
# OUT and PVRDMA_ASSETS_ENV exported). Results go to $OUT/<name>.env as key=value lines that the
# Rust test reads; waits are polls with a deadline, never open-ended.

# shellcheck source=/dev/null
. "$PVRDMA_ASSETS_ENV"

# tests/guest/: the scripts scenarios ship to `pvtest=run` guests (guest_script_disk).
GUEST_SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")/../guest" && pwd)
E2E_RESOURCES=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../resources" && pwd)

# Kernel command line shared by every guest: serial console, and `quiet` because every console
# byte is a trapped I/O write, very slow in a nested guest; panic=-1 turns a panic into a reset
# (which ends the VMM) instead of a hang until the time limit.
GUEST_CMDLINE="console=ttyS0 quiet panic=-1"

# Scratch space (sockets, stamps); in DIRECT mode also the end of any VMM left running by a failed step.
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

now_us() { echo "${EPOCHREALTIME/./}"; }

# since T0_US: seconds elapsed, one decimal.
since() {
  local d=$(($(now_us) - $1))
  printf '%d.%d\n' $((d / 1000000)) $((d / 100000 % 10))
}

log() { echo "[scenario +$SECONDS s] $*"; }

# start_clock LIMIT: sets t0 (now, for `since`) and the scenario's deadline, LIMIT seconds on.
start_clock() {
  t0=$(now_us)
  SCENARIO_DEADLINE=$((t0 + $1 * 1000000))
}

# remaining: seconds left until start_clock's deadline (at least 1), for waits that share it.
remaining() {
  local r=$(((SCENARIO_DEADLINE - $(now_us)) / 1000000))
  echo $((r > 0 ? r : 1))
}

# record NAME key=value...: results for the Rust side, in $OUT/NAME.env.
record() {
  local file=$OUT/$1.env
  shift
  printf '%s\n' "$@" >> "$file"
}

# A guest console line saying its kernel died: what it waited for will never come. (A user
# program's "traps: ... general protection fault ip:..." is not one.)
KERNEL_CRASH_RE='Oops: |Kernel panic|PANIC: |BUG: unable to handle|general protection fault[,:]'

# wait_for_line FILE ERE SECONDS [PID]: until a line of FILE matches ERE. Fails after SECONDS, as
# soon as process PID (the VMM writing FILE) is gone without the line having appeared, or, for a
# guest console (*-serial.log), as soon as it shows the guest kernel crashed.
wait_for_line() {
  local file=$1 re=$2 deadline=$(($(now_us) + $3 * 1000000)) pid=${4:-} crash
  until grep -qE -- "$re" "$file" 2>/dev/null; do
    if [[ $file == *-serial.log ]] && crash=$(grep -m1 -E -- "$KERNEL_CRASH_RE" "$file" 2>/dev/null); then
      log "wait_for_line: no /$re/ in $file: its guest kernel crashed: $crash"
      return 1
    fi
    if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
      grep -qE -- "$re" "$file" 2>/dev/null && return 0
      log "wait_for_line: process $pid exited before /$re/ appeared in $file"
      return 1
    fi
    if (($(now_us) >= deadline)); then
      log "wait_for_line: no /$re/ in $file after $3 s"
      return 1
    fi
    sleep 0.2
  done
}

# wait_for_exit PID SECONDS: waits for background job PID and sets EXIT_STATUS to its exit
# status; after SECONDS it kills the job and sets EXIT_STATUS=timeout.
wait_for_exit() {
  local pid=$1 deadline=$(($(now_us) + $2 * 1000000))
  while kill -0 "$pid" 2>/dev/null; do
    if (($(now_us) >= deadline)); then
      log "process $pid still running after $2 s: killing it"
      kill -KILL "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      EXIT_STATUS=timeout
      return 0
    fi
    sleep 0.2
  done
  EXIT_STATUS=0
  wait "$pid" || EXIT_STATUS=$?
}

# end_guests ENV PREFIX G...: for each guest G in turn (console $OUT/PREFIX-G-serial.log, its VMM's
# PID in pid_G), the VMM must end once the guest powered off: 60 s after the guest's last word it
# is killed (exit=timeout), however much of the run's time is left. Records ENV's G_exit.
end_guests() {
  local env=$1 prefix=$2 g pid_var
  shift 2
  for g in "$@"; do
    pid_var=pid_$g
    wait_for_line "$OUT/$prefix-$g-serial.log" 'GUEST-POWEROFF' "$(remaining)" "${!pid_var}" || true
    wait_for_exit "${!pid_var}" 60
    record "$env" "${g}_exit=$EXIT_STATUS"
  done
}

# panics LOG...: the panics and forbidden system calls in the VMM logs LOG... together (nothing if
# one is missing: the tests then fail on the empty value).
panics() {
  local log
  for log in "$@"; do [[ -e $log ]] || return 0; done
  cat "$@" | grep -cE 'panicked at|forbidden syscall' || true
}

# record_panics ENV PREFIX G...: ENV's G_panics, from each VMM log $OUT/PREFIX-G-vmm.log.
record_panics() {
  local env=$1 prefix=$2 g
  shift 2
  for g in "$@"; do record "$env" "${g}_panics=$(panics "$OUT/$prefix-$g-vmm.log")"; done
}

# last_tick FILE: the highest counter the tick-mode guest printed so far (0 if none).
last_tick() {
  local n
  n=$(grep -oE 'PVRDMA-VMM-TICK n=[0-9]+' "$1" 2>/dev/null | tail -n1 | cut -d= -f2) || true
  echo "${n:-0}"
}

# start_vmm NAME ARGS...: our VMM in the background with the stock guest kernel and initramfs,
# VMM_CPUS vCPUs (default 2) and VMM_MEMORY (default 512M); its stdout/stderr in
# $OUT/NAME-vmm.log. Sets VMM_PID.
start_vmm() {
  local name=$1
  shift
  [[ -x ${PVRDMA_VMM_BIN:-} ]] || { log "PVRDMA_VMM_BIN is not set to an executable"; return 1; }
  "$PVRDMA_VMM_BIN" --kernel "${KERNEL:-$PVRDMA_KERNEL}" --initramfs "$PVRDMA_GUEST_INITRAMFS" --cpus "${VMM_CPUS:-2}" \
    --memory "${VMM_MEMORY:-512M}" "$@" > "$OUT/$name-vmm.log" 2>&1 &
  VMM_PID=$!
}

# run_guest NAME IMG ARGS...: start_vmm NAME for a `pvtest=run` guest that runs the script disk
# IMG (guest_script_disk), with VMM_CPUS vCPUs (default 1 here: most scenarios run several guests
# in a 1-vCPU test host) and its console in $OUT/NAME-serial.log; ARGS add its NICs and the rest.
run_guest() {
  local name=$1 img=$2
  shift 2
  VMM_CPUS=${VMM_CPUS:-1} start_vmm "$name" --cmdline "$GUEST_CMDLINE pvtest=run pvrun=/dev/vda" \
    --disk "path=$img,readonly=on" --serial "file=$OUT/$name-serial.log" "$@"
}

# start_receiver NAME SOCKET: a VMM with only an API socket (SOCKET), waiting for a migration; its
# console in $OUT/NAME-serial.log, its log in $OUT/NAME-vmm.log. Sets VMM_PID once the VMM says
# it listens on SOCKET: the socket's file exists between bind and listen, when a connection is
# refused (seen in a loaded test host: receive-migration failed, "Connection refused").
start_receiver() {
  "$PVRDMA_VMM_BIN" --api-socket "$2" --serial "file=$OUT/$1-serial.log" > "$OUT/$1-vmm.log" 2>&1 &
  VMM_PID=$!
  wait_for_line "$OUT/$1-vmm.log" "API listening on $2" 30 "$VMM_PID"
}

# isolate_network: first call of a scenario that makes bridges and TAPs (l1_bridge, l1_tap). In
# TEST-HOST mode there is nothing to do: L1 is a machine of its own. In DIRECT mode the scenario
# runs again (the wrapper, $0) inside a network namespace of its own (unshare --net; needs root),
# so that nothing it does touches this host's network, with resources/test-host/l1-common.sh's
# helpers loaded.
isolate_network() {
  [[ $PVRDMA_E2E_MODE == direct ]] || return 0
  if [[ ${PVRDMA_E2E_NETNS:-} != 1 ]]; then
    rm -rf "$WORK"
    trap - EXIT
    exec env PVRDMA_E2E_NETNS=1 unshare --net -- bash "$0"
  fi
  ip link set lo up
  # shellcheck source=/dev/null
  . "$E2E_RESOURCES/test-host/l1-common.sh"
}

# guest_script_disk IMG HEADER SCRIPT...: the raw disk a `pvtest=run pvrun=/dev/vdX` guest runs
# (guest/init): HEADER (variable assignments, one per line), the guest helpers (guest/lib.sh), then
# the SCRIPTs' text, NUL-padded to whole 512-byte sectors.
# A copy of the text goes to $OUT/<IMG's name>.sh for the logs.
guest_script_disk() {
  local img=$1 header=$2 script
  shift 2
  for script in "$@"; do
    [[ -r $script ]] || { log "guest_script_disk: cannot read $script"; return 1; }
  done
  { printf '%s\n' "$header"; cat "$GUEST_SCRIPTS/lib.sh" "$@"; } > "$img"
  cp "$img" "$OUT/$(basename "${img%.*}").sh"
  truncate -s %512 "$img"
}

# wait_for_path PATH SECONDS: until PATH exists (e.g. a TAP device the VMM creates).
wait_for_path() {
  local deadline=$(($(now_us) + $2 * 1000000))
  until [[ -e $1 ]]; do
    if (($(now_us) >= deadline)); then
      log "wait_for_path: no $1 after $2 s"
      return 1
    fi
    sleep 0.1
  done
}

# remote_cmd LOG ARGS...: pvrdma-remote ARGS, bounded (REMOTE_LIMIT s, default 600: a migration
# takes minutes at TCG speed), its output appended to $OUT/LOG-remote.log; prints its exit status.
remote_cmd() {
  local log=$1 rc=0
  shift
  echo "\$ pvrdma-remote $*" >> "$OUT/$log-remote.log"
  timeout "${REMOTE_LIMIT:-600}" "$PVRDMA_REMOTE_BIN" "$@" >> "$OUT/$log-remote.log" 2>&1 || rc=$?
  echo "$rc"
}

# ipv4_mapped_gid IP: ::ffff:IP as sysfs prints GIDs.
ipv4_mapped_gid() {
  local a b c d
  IFS=. read -r a b c d <<< "$1"
  printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x\n' "$a" "$b" "$c" "$d"
}

# rxe_gid_index DEV IP: the index of Soft-RoCE device DEV's RoCE v2 GID of IP, once its port is
# active; fails before.
rxe_gid_index() {
  local port=/sys/class/infiniband/$1/ports/1 want f i
  grep -q ACTIVE "$port/state" 2>/dev/null || return 1
  want=$(ipv4_mapped_gid "$2")
  for f in "$port"/gids/*; do
    i=${f##*/}
    [[ $(cat "$f" 2>/dev/null) == "$want" && $(cat "$port/gid_attrs/types/$i" 2>/dev/null) == "RoCE v2" ]] || continue
    echo "$i"
    return 0
  done
  return 1
}

# wait_rxe_gid DEV IP SECONDS: rxe_gid_index DEV IP once it succeeds (the port goes active once
# its netdev has carrier), for at most SECONDS; fails after.
wait_rxe_gid() {
  local end=$(($(now_us) + $3 * 1000000))
  until rxe_gid_index "$1" "$2"; do
    (($(now_us) < end)) || return 1
    sleep 0.5
  done
}

# frame_counter DEV [MATCH...]: the frames this host sends out of DEV that a tc u32 filter of
# MATCH selects (default: RoCE v2, UDP 4791) go through class 1:3 of a prio qdisc, everything else
# through 1:1; the class's counters then count them (frames_counted). Needs sch_prio and cls_u32.
frame_counter() {
  local dev=$1
  shift
  (($#)) || set -- protocol ip u32 match ip protocol 17 0xff match ip dport 4791 0xffff
  tc qdisc add dev "$dev" root handle 1: prio bands 3 priomap 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 &&
    tc filter add dev "$dev" parent 1: prio 1 "$@" flowid 1:3
}
# frames_counted DEV: how many frames frame_counter DEV counted so far.
frames_counted() {
  tc -s class show dev "$1" | awk '$1 == "class" { n = ($3 == "1:3") } n && $1 == "Sent" { print $4; exit }'
}

# migrate_vm ENV SRC DST API TAPMAP [ARGS...]: live-migrates the VM of VMM SRC (API socket API) to a new VMM
# DST started here (console $OUT/DST-serial.log), over a Unix socket, with pvrdma-remote on both
# sides (receive-migration --tap TAPMAP: "MAC=TAP", --disk-dir $WORK, where guest_script_disk puts
# the disks, and ARGS, e.g. more --disk-dir; send-migration --downtime-ms 300). Records in
# $OUT/ENV.env mig_receive_rc, mig_send_rc, mig_seconds and mig_completed (send-migration's
# "migration completed: ..." line: the blackout; the whole output in $OUT/SRC-to-DST-remote.log).
# Sets VMM_PID to DST's.
migrate_vm() {
  local env=$1 src=$2 dst=$3 api=$4 taps=$5 url=unix:$WORK/$3.sock t
  shift 5
  start_receiver "$dst" "$WORK/$dst.api"
  t=$(now_us)
  record "$env" "mig_receive_rc=$(remote_cmd "$dst" --api-socket "$WORK/$dst.api" receive-migration "$url" --tap "$taps" --disk-dir "$WORK" "$@" --no-wait)"
  record "$env" "mig_send_rc=$(remote_cmd "$src-to-$dst" --api-socket "$api" send-migration "$url" --downtime-ms 300)"
  record "$env" "mig_seconds=$(since "$t")"
  record "$env" "mig_completed=$(grep -m1 '^migration completed:' "$OUT/$src-to-$dst-remote.log" || true)"
  log "migration: $(grep '^mig_' "$OUT/$env.env" | tr '\n' ' ')"
}
