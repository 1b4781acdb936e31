# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Scenario of `cargo run -p e2e --bin bench-rdma` (issues 5 and 15): ibv_rc_pingpong and
# ib_{write,read,send}_bw between two guests A (10.13.0.1, servers) and B (10.13.0.2, clients) on one bridge
# br0 (10.13.0.254) of this host, each VMM's NIC on its own TAP (tapa, tapb), one pair after the
# other, for each configuration in CONFIGS:
#   pvrdma-local  --pvrdma tap=...,mac=... (vmxnet3 + PVRDMA), the VMMs' default same-host channel
#   pvrdma-wire   the same with local=off on both: the RoCE v2 frames cross the TAPs and the bridge
#                 (both with PVRDMA_OPTS appended to --pvrdma, if set: e.g. poll=0)
#   rxe           --net tap=...,mac=... (vmxnet3 only); the guests run Linux Soft-RoCE (rdma_rxe,
#                 rxe0 on eth0), so their RoCE v2 frames cross the same TAPs and bridge
#   qemu-pvrdma   QEMU 7.2's own `-device pvrdma` instead of our VMM (see launch_qemu_pvrdma): its
#                 verbs run on Soft-RoCE rxe0 of this host, no RoCE frame touches the TAPs
# Same kernel, initramfs and guest script (tests/guest/bench-rdma.sh) for all, one vCPU each.
# Writes $OUT/bench.tsv: config, program (pp | ppe | write | read | send), round, client rc, server rc,
# figure (pp, ppe: usec/iter; the others: BW average MB/sec; NA if the client printed none, NOCLOCK if perftest printed
# that its cycle-clock calibration failed, which makes its figures 0.00); and $OUT/bench.env: per
# config, the VMMs' exits, the RoCE v2 frames (UDP 4791) this host sent to each TAP meanwhile and
# the guests' set-up failures. Logs: bench-<config>-{a,b}-{serial,vmm}.log (QEMU's output in the
# -vmm.log), qemu-pvrdma-mux.log (PVRDMA_MUX_BIN's). And $OUT/cpu.tsv, where this host's one CPU
# went, sampled about every half second while a pair runs: config, microseconds (this host's
# clock), the program B runs (its key, "-" between programs), CPU ticks so far of this host (busy,
# idle) and of each VMM (A's vCPU threads, A's other threads, B's, B's).

isolate_network

BENCH_LIMIT=${BENCH_LIMIT:-600}
PROG_LIMIT=${PROG_LIMIT:-120}
# qemu-pvrdma's ib_write_bw and ib_read_bw, which hang there (tests/guest/bench-rdma.sh).
ONCE_LIMIT=${ONCE_LIMIT:-30}
READY_WAIT=${READY_WAIT:-240}
IP_A=10.13.0.1
IP_B=10.13.0.2
HOST_IP=10.13.0.254
# qemu-pvrdma: both guests' RoCE address (see tests/guest/bench-rdma.sh), also on QEMU's backend.
SHARED_IP=10.13.9.11
MUX_SOCK=$WORK/rdmacm-mux.sock

l1_bridge br0
ip addr add "$HOST_IP/24" dev br0
l1_tap tapa br0
l1_tap tapb br0

modprobe -a sch_prio cls_u32 || true
for dev in tapa tapb; do
  frame_counter "$dev" || record bench "counter_$dev=fail"
done

# eui64_link_local MAC: the fe80:: address (and GID) a NIC with MAC derives.
eui64_link_local() {
  local a b c d e f
  IFS=: read -r a b c d e f <<<"$1"
  printf 'fe80::%x:%x:%x:%x\n' $(((0x$a ^ 2) << 8 | 0x$b)) $((0x$c << 8 | 0xff)) $((0xfe << 8 | 0x$d)) $((0x$e << 8 | 0x$f))
}

# qemu_pvrdma_backend MAC...: what QEMU's pvrdma needs in this host, once per run: Soft-RoCE rxe0
# on a dummy netdev d0 and the rdmacm-mux stand-in (PVRDMA_MUX_BIN) on MUX_SOCK; then the guest
# GIDs of the NICs with the MACs on d0. QEMU 7.2 maps each guest GID to rxe0's GID of the same
# value and refuses one that rxe0 lacks; for RC it uses the guest's GID 0 (fe80:: of its MAC) as
# well as the one the QP names (SHARED_IP's). Both guests share SHARED_IP: rxe delivers locally
# only when source and destination GIDs are equal. Fails with a log line.
qemu_pvrdma_backend() {
  local mac
  if [[ ! -e /sys/class/net/d0 ]]; then
    [[ -x ${PVRDMA_MUX_BIN:-} ]] || { log "PVRDMA_MUX_BIN is not set to an executable"; return 1; }
    modprobe -a dummy rdma_rxe || { log "modprobe dummy rdma_rxe failed"; return 1; }
    if ! { ip link add d0 type dummy && ip link set d0 up && ip addr add "$SHARED_IP/32" dev d0 &&
      rdma link add rxe0 type rxe netdev d0; }; then
      log "rxe0 on a dummy d0 failed"
      return 1
    fi
    "$PVRDMA_MUX_BIN" "$MUX_SOCK" > "$OUT/qemu-pvrdma-mux.log" 2>&1 &
    wait_for_line "$OUT/qemu-pvrdma-mux.log" 'listening' 30 $! || return 1
  fi
  for mac in "$@"; do
    ip -6 addr add "$(eui64_link_local "$mac")/64" dev d0 nodad || { log "d0: fe80:: of $mac failed"; return 1; }
  done
  wait_rxe_gid rxe0 "$SHARED_IP" 60 > /dev/null || { log "rxe0 has no GID of $SHARED_IP"; return 1; }
  { rdma link show; grep -H . /sys/class/infiniband/rxe0/ports/1/gids/* | grep -v ':0000:0000:0000:0000:0000:0000:0000:0000$'; } > "$OUT/qemu-pvrdma-rxe0.txt" 2>&1 || true
}

# launch_qemu_pvrdma NAME IMG ROLE MAC: a guest of QEMU's own pvrdma in the background (bench-net's
# launch_qemu plus what the device needs: guest RAM shared, vmxnet3 at function 0 and pvrdma at
# function 1 of one slot, which vmw_pvrdma pairs, and the mux chardev); its pid in GUEST_PID.
launch_qemu_pvrdma() {
  qemu-system-x86_64 -M q35 -accel kvm -cpu host -smp 1 -m 512M -bios /usr/share/qemu/qboot.rom \
    -object memory-backend-ram,id=mb,size=512M,share=on -numa node,memdev=mb \
    -display none -monitor none -nodefaults -no-reboot -serial "file:$OUT/$1-serial.log" \
    -kernel "$PVRDMA_KERNEL" -initrd "$PVRDMA_GUEST_INITRAMFS" -append "$GUEST_CMDLINE pvtest=run pvrun=/dev/vda" \
    -drive "file=$2,format=raw,if=none,id=disk0,readonly=on" -device virtio-blk-pci,drive=disk0 \
    -netdev "tap,id=net0,ifname=tap$3,script=no,downscript=no" -device "vmxnet3,netdev=net0,mac=$4,addr=10.0,multifunction=on" \
    -chardev "socket,id=mads,path=$MUX_SOCK" -device pvrdma,addr=10.1,ibdev=rxe0,netdev=d0,mad-chardev=mads \
    > "$OUT/$1-vmm.log" 2>&1 &
  GUEST_PID=$!
}

# task_ticks PID: the CPU ticks (user + system) of PID's threads, tab-separated: of its vCPU
# threads (ours: vcpuN; QEMU: "CPU N/KVM") and of all others (device workers, the main loop, QEMU's
# iothreads). Read with builtins: the sampler runs beside what it measures, on one CPU.
task_ticks() {
  local vcpu=0 other=0 stat comm file fields
  for file in /proc/"$1"/task/*/stat; do
    read -r stat < "$file" 2>/dev/null || continue
    comm=${stat#*(}
    comm=${comm%)*}
    # The fields after the comm, from state (field 3 of proc_pid_stat(5)): utime (14) and stime
    # (15) are the 12th and 13th.
    read -r -a fields <<<"${stat##*) }"
    if [[ $comm == vcpu* || $comm == CPU\ * ]]; then
      vcpu=$((vcpu + fields[11] + fields[12]))
    else
      other=$((other + fields[11] + fields[12]))
    fi
  done
  printf '%s\t%s\n' "$vcpu" "$other"
}

# cpu_sampler CONFIG PID_A PID_B: about every half second until killed, a line of cpu.tsv (see
# the header): which program B runs, this host's CPU ticks, and both VMMs' by thread kind.
cpu_sampler() {
  local config=$1 pid_a=$2 pid_b=$3 prog user nice system idle iowait irq softirq steal
  while :; do
    prog=$(grep -a -o 'BENCH-RDMA-\(BEGIN\|END\) prog=[a-z]* round=[0-9]*' "$OUT/bench-$config-b-serial.log" 2>/dev/null | tail -n1) || true
    case $prog in
      BENCH-RDMA-BEGIN*) prog=${prog#*prog=} prog=${prog%% *} ;;
      *) prog=- ;;
    esac
    read -r _ user nice system idle iowait irq softirq steal _ < /proc/stat
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$config" "$(now_us)" "$prog" \
      $((user + nice + system + irq + softirq + steal)) $((idle + iowait)) \
      "$(task_ticks "$pid_a")" "$(task_ticks "$pid_b")" >> "$OUT/cpu.tsv"
    sleep 0.5
  done
}

# launch CONFIG ROLE IP MAC: one guest of CONFIG in the background; its pid in GUEST_PID.
launch() {
  local config=$1 role=$2 ip=$3 mac=$4 peer=$IP_B kind=pvrdma nic=()
  [[ $role == b ]] && peer=$IP_A
  case $config in
    pvrdma-local) nic=(--pvrdma "tap=tap$role,mac=$mac${PVRDMA_OPTS:+,$PVRDMA_OPTS}") ;;
    pvrdma-wire) nic=(--pvrdma "tap=tap$role,mac=$mac,local=off${PVRDMA_OPTS:+,$PVRDMA_OPTS}") ;;
    rxe)
      nic=(--net "tap=tap$role,mac=$mac")
      kind=rxe
      ;;
    qemu-pvrdma) kind=qemu-pvrdma ;;
    *)
      log "bench-rdma: unknown configuration $config"
      return 1
      ;;
  esac
  local name=bench-$config-$role
  guest_script_disk "$WORK/$name-run.img" "ROLE=$role KIND=$kind MY_IP=$ip PEER_IP=$peer HOST_IP=$HOST_IP SHARED_IP=$SHARED_IP ROUNDS=${ROUNDS:?}
PP_ITERS=${PP_ITERS:?} PP_SIZE=${PP_SIZE:?} BW_ITERS=${BW_ITERS:?} BW_SIZE=${BW_SIZE:?} PORT_BASE=18900
LIMIT=$PROG_LIMIT ONCE_LIMIT=$ONCE_LIMIT READY_WAIT=$READY_WAIT" "$GUEST_SCRIPTS/bench-rdma.sh"
  if [[ $kind == qemu-pvrdma ]]; then
    launch_qemu_pvrdma "$name" "$WORK/$name-run.img" "$role" "$mac"
    return 0
  fi
  run_guest "$name" "$WORK/$name-run.img" "${nic[@]}"
  GUEST_PID=$VMM_PID
}

# figures CONFIG: bench.tsv lines of CONFIG from B's (client) and A's (server) consoles.
figures() {
  local config=$1
  tr -d '\r' < "$OUT/bench-$config-a-serial.log" > "$WORK/a.log"
  tr -d '\r' < "$OUT/bench-$config-b-serial.log" > "$WORK/b.log"
  awk -v config="$config" '
    FNR == 1 { file++ }
    # kv NAME: the value of NAME=... on this line.
    function kv(name,   i) { for (i = 1; i <= NF; i++) if (index($i, name "=") == 1) return substr($i, length(name) + 2); return "" }
    /^BENCH-RDMA-BEGIN / { prog = kv("prog"); round = kv("round"); inside = 1; header = 0; next }
    /^BENCH-RDMA-END / {
      key = kv("prog") SUBSEP kv("round")
      if (file == 1) srv[key] = kv("rc")
      else { cli[key] = kv("rc"); if (!(key in fig)) fig[key] = "NA"; order[++n] = key }
      inside = 0; next
    }
    !inside || file == 1 { next }
    prog ~ /^pp/ && / iters in .* usec\/iter/ { fig[prog SUBSEP round] = $(NF - 1) }
    prog !~ /^pp/ && header && NF >= 5 && $1 ~ /^[0-9]+$/ { fig[prog SUBSEP round] = $4; header = 0 }
    prog !~ /^pp/ && /#bytes/ { header = 1 }
    # perftest could not calibrate its cycle clock (noisy nested guest): its figures are 0.00.
    prog !~ /^pp/ && /Correlation coefficient/ { noclock[prog SUBSEP round] = 1 }
    END {
      for (i = 1; i <= n; i++) {
        split(order[i], k, SUBSEP)
        f = (order[i] in noclock) ? "NOCLOCK" : fig[order[i]]
        printf "%s\t%s\t%s\t%s\t%s\t%s\n", config, k[1], k[2], cli[order[i]], (order[i] in srv) ? srv[order[i]] : "none", f
      }
    }' "$WORK/a.log" "$WORK/b.log" >> "$OUT/bench.tsv"
}

pair=0
for config in ${CONFIGS:?}; do
  pair=$((pair + 1))
  log "bench-rdma: $config pair"
  t0=$(now_us)
  before_a=$(frames_counted tapa) before_b=$(frames_counted tapb)
  # MACs of their own per pair: no same-host channel socket of a previous pair is ever addressed.
  mac_a=52:54:00:13:0$pair:01 mac_b=52:54:00:13:0$pair:02
  if [[ $config == qemu-pvrdma ]] && ! qemu_pvrdma_backend "$mac_a" "$mac_b"; then
    record bench "$config.a_exit=not-started" "$config.b_exit=not-started" "$config.fail=backend-set-up"
    continue
  fi
  launch "$config" a "$IP_A" "$mac_a"
  pid_a=$GUEST_PID
  launch "$config" b "$IP_B" "$mac_b"
  pid_b=$GUEST_PID
  cpu_sampler "$config" "$pid_a" "$pid_b" &
  sampler_pid=$!
  # Each VMM must end once its guest powered off (60 s grace, as in rdma.sh).
  wait_for_line "$OUT/bench-$config-b-serial.log" 'GUEST-POWEROFF' "$BENCH_LIMIT" "$pid_b" || true
  kill "$sampler_pid" 2>/dev/null || true
  wait "$sampler_pid" 2>/dev/null || true
  wait_for_exit "$pid_b" 60
  exit_b=$EXIT_STATUS
  wait_for_line "$OUT/bench-$config-a-serial.log" 'GUEST-POWEROFF' 60 "$pid_a" || true
  wait_for_exit "$pid_a" 60
  exit_a=$EXIT_STATUS
  after_a=$(frames_counted tapa) after_b=$(frames_counted tapb)
  figures "$config"
  fails=$(grep -h -o 'BENCH-RDMA-FAIL.*' "$OUT/bench-$config-a-serial.log" "$OUT/bench-$config-b-serial.log" | tr -d '\r' | tr ' ' '_' | paste -sd' ' -) || true
  record bench "$config.a_exit=$exit_a" "$config.b_exit=$exit_b" \
    "$config.tapa_roce_frames=$((${after_a:-0} - ${before_a:-0}))" "$config.tapb_roce_frames=$((${after_b:-0} - ${before_b:-0}))" \
    "$config.a_done=$(grep -c 'BENCH-RDMA-DONE' "$OUT/bench-$config-a-serial.log" || true)" \
    "$config.b_done=$(grep -c 'BENCH-RDMA-DONE' "$OUT/bench-$config-b-serial.log" || true)" \
    "$config.panics=$(panics "$OUT/bench-$config-a-vmm.log" "$OUT/bench-$config-b-vmm.log")" \
    "$config.fail=${fails:-}" "$config.seconds=$(since "$t0")"
  log "bench-rdma: $config: $(grep "^$config\." "$OUT/bench.env" | tr '\n' ' ')"
done
