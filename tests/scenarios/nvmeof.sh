# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# shellcheck disable=SC2034 # pid_a, pid_b: read through ${!pid_var}
# Scenario of tests/tests/nvmeof.rs (issue 14, item 1): NVMe over Fabrics from a guest on our
# PVRDMA device to a native Linux target, as a user would run it. This host runs the target:
# Soft-RoCE (rxe0) on bridge br0 (10.20.0.254), nvmet + nvmet-rdma configured through configfs,
# port 4420, one subsystem whose namespace is a brd RAM disk (real storage: what is written stays
# and reads back; null_blk would not). One guest (10.20.0.1, --pvrdma on tapa, one vCPU) runs
# tests/guest/nvmeof.sh: nvme-cli's discover and connect over RDMA, a known pattern written through
# the block device with O_DIRECT, read back and verified, nvme disconnect. Meanwhile this host
# checks, on its RAM disk, what arrived: the MD5 of every chunk and the headers of some blocks.
# With BASELINE_MIB > 0 (not by default: it adds minutes), a second guest B (10.20.0.2, a plain
# vmxnet3 NIC on tapb, its own kernel's Soft-RoCE under nvme-rdma) then does the same with the
# first BASELINE_MIB, over a RAM disk zeroed first: the Soft-RoCE baseline of the figures.
# With MIG_MIB > 0 (the default), guest A then runs its migration pass (issue 14 item 7): a bounded
# loop of verified write+read rounds over the namespace, during which this host live-migrates it
# (pvrdma-remote send-migration over a Unix socket, --downtime-ms 300) to a new VMM (A2, its own
# TAP tapa2 on br0); A finishes its rounds, disconnects and powers off on A2 (migrate_mid_io).
# The kernel's nvme-rdma is the device's first kernel RDMA user here: fast registration (REG_MR),
# SEND_WITH_INV, LOCAL_INV, kernel CQ polling.
# Then NFS over RDMA (issue 14, item 2), in the same test-host boot: this host's kernel NFS server
# (nfsd, NFSv4.x only, svcrdma listening on RDMA port 20049 over the same Soft-RoCE; rpc.mountd
# answers nfsd's export upcalls, no rpcbind) exports a tmpfs as NFSv4's root; a third guest
# (10.20.0.3, --pvrdma on tapn) runs tests/guest/nfsrdma.sh: mounts it with proto=rdma, writes a
# tree of files (SMALL_FILES of 1-64 KiB, LARGE_FILES of LARGE_MIB) and reads it back over a fresh
# mount, verified against its manifest of MD5s; this host checks the manifest on its side (md5sum
# -c of the guest's MANIFEST.md5, and its own manifest of what it holds).
# With BASELINE_MIB > 0, a guest NB (10.20.0.4, a plain vmxnet3 NIC on tapnb, its own kernel's
# Soft-RoCE under rpcrdma) then does the same over an emptied export: the NFS baseline.
# Results: $OUT/nvmeof.env (set-up, the target's MD5s and block headers, VMM exit and panics;
# B's prefixed "b."; the migration's "mig_"), $OUT/nvmeof-{a,a2,b}-{serial,vmm}.log (the guests'
# results: see tests/guest/nvmeof.sh; A's console continues in a2's after the migration),
# $OUT/nvmeof-a-to-nvmeof-a2-remote.log (send-migration's output: the blackout),
# $OUT/nvmeof-a2-counters.json (only if A2 stalled: its devices' counters before it was stopped),
# $OUT/nvmeof-l1-dmesg.txt (this host's kernel log: nvmet's and nfsd's side), $OUT/rxe-devinfo.txt;
# $OUT/nfsrdma.env (the NFS server's set-up and check, the NFS guest's VMM exit and panics),
# $OUT/nfsrdma{,-b}-{serial,vmm}.log (see tests/guest/nfsrdma.sh; NB's keys prefixed "b."),
# $OUT/nfsrdma{,-b}-host-manifest.txt and nfsrdma{,-b}-guest-manifest.txt (this host's MD5s of the
# export, the guest's MANIFEST.md5),
# $OUT/nfsrdma-mountd.log.

isolate_network

# The whole run, boot included: typically 6-12 min at nested speed (the NVMe-oF pass with its
# migration phase took 176 s on 2026-11-26, NFS adds ~2.5 min); a data path that hangs costs the
# guest's bounded waits (LIMIT per command, CTRL_LOSS_TMO per lost controller).
NVMEOF_LIMIT=${NVMEOF_LIMIT:-2700}
LIMIT=${LIMIT:-600}
READY_WAIT=${READY_WAIT:-600}
CHECK_WAIT=${CHECK_WAIT:-600}
CTRL_LOSS_TMO=${CTRL_LOSS_TMO:-60}
SIZE_MIB=${SIZE_MIB:-256}
CHUNK_MIB=${CHUNK_MIB:-32}
BASELINE_MIB=${BASELINE_MIB:-0}
BASELINE_CHUNK_MIB=${BASELINE_CHUNK_MIB:-8}
MIG_MIB=${MIG_MIB:-8}
MIG_AFTER=${MIG_AFTER:-4}
MIG_SECONDS=${MIG_SECONDS:-600}
MIG_STALL=${MIG_STALL:-240}
MIG_WATCH=${MIG_WATCH:-100}
# Guest to guest: the target guest's RAM disk, what each initiator writes, and per chunk.
G2G_MIB=${G2G_MIB:-32}
G2G_CHUNK_MIB=${G2G_CHUNK_MIB:-16}
G2G_NQN=nqn.2026-11.dev.pvrdma-vmm:guest-target
MAC_T=52:54:00:20:00:05
MAC_I1=52:54:00:20:00:06
MAC_I2=52:54:00:20:00:07
IP_T=10.20.0.5
IP_I1=10.20.0.6
IP_I2=10.20.0.7
MAC_A=52:54:00:20:00:01
MAC_B=52:54:00:20:00:02
IP_A=10.20.0.1
IP_B=10.20.0.2
HOST_IP=10.20.0.254
SIG_PORT=8000
PORT=4420
NQN=nqn.2026-11.dev.pvrdma-vmm:nvmeof-e2e
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:8d7c4f5e-2b1a-4c3d-9e8f-7a6b5c4d3e2f
HOSTID=8d7c4f5e-2b1a-4c3d-9e8f-7a6b5c4d3e2f
SIG=$WORK/sig
CFG=/sys/kernel/config/nvmet
# The NFS/RDMA phase: its guest, the server's RDMA port, the port the guest's mount asks for
# (another one shows the test failing) and the tree.
MAC_N=52:54:00:20:00:03
IP_N=10.20.0.3
MAC_NB=52:54:00:20:00:04
IP_NB=10.20.0.4
NFS_RDMA_PORT=20049
NFS_MOUNT_PORT=${NFS_MOUNT_PORT:-$NFS_RDMA_PORT}
NFS_DIR=/srv/pvrdma-nfs-e2e
SMALL_FILES=${SMALL_FILES:-200}
LARGE_FILES=${LARGE_FILES:-3}
LARGE_MIB=${LARGE_MIB:-32}

start_clock "$NVMEOF_LIMIT"

l1_bridge br0
ip addr add "$HOST_IP/24" dev br0
l1_tap tapa br0
l1_tap tapa2 br0

# This host's signal server (tests/guest/nvmeof.sh polls it): busybox from the guest userspace.
mkdir -p "$SIG"
"$PVRDMA_USERSPACE/bin/busybox" httpd -f -p "$HOST_IP:$SIG_PORT" -h "$SIG" &

# Soft-RoCE on the bridge; its port goes active once the bridge has carrier (a VMM on a TAP).
rxe_ok=0
if modprobe rdma_rxe && rdma link add rxe0 type rxe netdev br0; then
  rxe_ok=1
else
  record nvmeof "rxe_setup=fail"
fi

# The target, but for its port: a RAM disk of SIZE_MIB as namespace 1 of subsystem NQN, any host
# allowed. (The port needs an RDMA device on its address: it comes once Soft-RoCE is up.)
target_setup() {
  modprobe brd rd_nr=1 rd_size=$((SIZE_MIB * 1024)) max_part=0 || { echo "modprobe brd"; return 1; }
  [[ -b /dev/ram0 ]] || { echo "no /dev/ram0"; return 1; }
  [[ $(blockdev --getsize64 /dev/ram0) == $((SIZE_MIB * 1048576)) ]] || { echo "/dev/ram0 is $(blockdev --getsize64 /dev/ram0) bytes"; return 1; }
  modprobe -a nvmet nvmet-rdma || { echo "modprobe nvmet nvmet-rdma"; return 1; }
  mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config || { echo "mount configfs"; return 1; }
  local s=$CFG/subsystems/$NQN
  mkdir "$s" && echo 1 > "$s/attr_allow_any_host" &&
    mkdir "$s/namespaces/1" && echo -n /dev/ram0 > "$s/namespaces/1/device_path" &&
    echo 1 > "$s/namespaces/1/enable" || { echo "configfs subsystem"; return 1; }
}
# target_port: port 1, RDMA on HOST_IP:PORT, serving NQN (nvmet-rdma listens once the subsystem is
# linked to it; the link fails if it cannot).
target_port() {
  local p=$CFG/ports/1
  mkdir "$p" && echo rdma > "$p/addr_trtype" && echo ipv4 > "$p/addr_adrfam" &&
    echo "$HOST_IP" > "$p/addr_traddr" && echo "$PORT" > "$p/addr_trsvcid" &&
    ln -s "$CFG/subsystems/$NQN" "$p/subsystems/$NQN"
}
# target_teardown: everything target_setup and target_port made, in reverse (DIRECT mode runs on a
# real host).
target_teardown() {
  rm -f "$CFG/ports/1/subsystems/$NQN" 2> /dev/null || true
  rmdir "$CFG/ports/1" 2> /dev/null || true
  echo 0 2> /dev/null > "$CFG/subsystems/$NQN/namespaces/1/enable" || true
  rmdir "$CFG/subsystems/$NQN/namespaces/1" "$CFG/subsystems/$NQN" 2> /dev/null || true
  modprobe -r nvmet-rdma nvmet brd 2> /dev/null || true
  rdma link delete rxe0 2> /dev/null || true
}

if why=$(target_setup 2>&1); then
  record nvmeof "target_setup=ok"
else
  record nvmeof "target_setup=fail" "target_why=$(echo "$why" | tr '\n' ' ')"
fi
log "target: $(grep target_ "$OUT/nvmeof.env" | tr '\n' ' ')"

header="HOST_IP=$HOST_IP SIG_PORT=$SIG_PORT NQN=$NQN PORT=$PORT HOSTNQN=$HOSTNQN HOSTID=$HOSTID SIZE_MIB=$SIZE_MIB
LIMIT=$LIMIT READY_WAIT=$READY_WAIT CHECK_WAIT=$CHECK_WAIT CTRL_LOSS_TMO=$CTRL_LOSS_TMO"
guest_script_disk "$WORK/nvmeof-a-run.img" "$header
RDMA_DEV=vmw_pvrdma0 MY_IP=$IP_A WRITE_MIB=$SIZE_MIB CHUNK_MIB=$CHUNK_MIB CHECKED_SIGNAL=target-checked-a
MIG_MIB=$MIG_MIB MIG_AFTER=$MIG_AFTER MIG_SECONDS=$MIG_SECONDS MIG_WATCH=$MIG_WATCH" "$GUEST_SCRIPTS/nvmeof.sh"
run_guest nvmeof-a "$WORK/nvmeof-a-run.img" --pvrdma "tap=tapa,mac=$MAC_A" --api-socket "$WORK/a.api"
pid_a=$VMM_PID

RXE_GIDX=''
if ((rxe_ok)); then
  RXE_GIDX=$(wait_rxe_gid rxe0 "$HOST_IP" 120) || RXE_GIDX=''
  { rdma link show; ibv_devinfo -v -d rxe0; } > "$OUT/rxe-devinfo.txt" 2>&1 || true
  if [[ -n $RXE_GIDX ]]; then
    record nvmeof "rxe_setup=ok" "rxe_gid=$(cat "/sys/class/infiniband/rxe0/ports/1/gids/$RXE_GIDX")"
  else
    record nvmeof "rxe_setup=fail"
  fi
fi

ready=0
if [[ -n $RXE_GIDX ]] && grep -q '^target_setup=ok' "$OUT/nvmeof.env"; then
  if why=$(target_port 2>&1); then
    ready=1
  else
    record nvmeof "port_why=$(echo "$why" | tr '\n' ' ')"
  fi
fi
record nvmeof "port_ready=$ready"
if ((ready)); then : > "$SIG/target-ready"; else : > "$SIG/target-failed"; fi
log "port: ready=$ready"

# nfs_setup: the kernel NFS server, NFSv4.x only (v2/v3 would need lockd and rpcbind), exporting
# a tmpfs at NFS_DIR as NFSv4's root (fsid=0: a tmpfs has no UUID) to the bridge's /24, listening
# on RDMA only (port NFS_RDMA_PORT; no TCP/UDP listener). A grace period and lease of 10 s (the
# least nfsd takes) so that the guest's OPENs are not held back 90 s by a fresh server's grace.
# rpc.mountd (v4 only: no RPC listener, no rpcbind; started next, in this shell) answers nfsd's
# upcalls for the export.
nfs_setup() {
  local v n=/proc/fs/nfsd
  modprobe -a nfsd rpcrdma || { echo "modprobe nfsd rpcrdma"; return 1; }
  mountpoint -q $n || mount -t nfsd nfsd $n || { echo "mount nfsd"; return 1; }
  mkdir -p "$NFS_DIR" /var/lib/nfs/v4recovery && mount -t tmpfs -o size=512m,mode=1777 tmpfs "$NFS_DIR" || { echo "tmpfs $NFS_DIR"; return 1; }
  exportfs -o rw,sync,no_root_squash,insecure,no_subtree_check,fsid=0 "10.20.0.0/24:$NFS_DIR" || { echo "exportfs"; return 1; }
  for v in -2 -3 +4 +4.1 +4.2; do echo "$v" > $n/versions 2> /dev/null || true; done
  echo 10 > $n/nfsv4leasetime && echo 10 > $n/nfsv4gracetime || { echo "lease and grace time"; return 1; }
  echo "rdma $NFS_RDMA_PORT" > $n/portlist || { echo "portlist: rdma $NFS_RDMA_PORT"; return 1; }
  echo 4 > $n/threads || { echo "nfsd threads"; return 1; }
  grep -q '^rdma' $n/portlist || { echo "no rdma listener: $(tr '\n' ' ' < $n/portlist)"; return 1; }
  echo "versions=$(cat $n/versions) portlist=$(tr '\n' ' ' < $n/portlist) threads=$(cat $n/threads)"
}
# nfs_teardown: what nfs_setup made, in reverse (DIRECT mode runs on a real host).
nfs_teardown() {
  echo 0 > /proc/fs/nfsd/threads 2> /dev/null || true
  [[ -n ${MOUNTD_PID:-} ]] && kill "$MOUNTD_PID" 2> /dev/null || true
  exportfs -u "10.20.0.0/24:$NFS_DIR" 2> /dev/null || true
  umount "$NFS_DIR" 2> /dev/null || true
}
nfs_ready=0
if [[ -n $RXE_GIDX ]]; then
  if why=$(nfs_setup 2>&1); then
    nfs_ready=1
    rpc.mountd -F -N 2 -N 3 > "$OUT/nfsrdma-mountd.log" 2>&1 &
    MOUNTD_PID=$!
    record nfsrdma "nfs_setup=ok" "nfs_server=$(echo "$why" | tail -n 1)"
  else
    record nfsrdma "nfs_setup=fail" "nfs_why=$(echo "$why" | tr '\n' ' ')"
  fi
else
  record nfsrdma "nfs_setup=fail" "nfs_why=no Soft-RoCE"
fi
log "nfs: $(tr '\n' ' ' < "$OUT/nfsrdma.env")"

# check_target G PREFIX MIB CHUNK: what arrived on the RAM disk once guest G (VMM $pid_G) wrote
# its MIB: each CHUNK's MD5 and the header of the first, a middle and the last block of each
# chunk, as PREFIX-ed keys (the rest of the check is the guest's); then G's CHECKED_SIGNAL.
# Read with O_DIRECT: nvmet's block backend writes with bios, past this host's page cache of
# /dev/ram0, so a buffered read may be answered by what an earlier read or write left cached.
check_target() {
  local g=$1 prefix=$2 mib=$3 chunk=$4 pid_var=pid_$1 c b start
  local blocks=$((chunk * 256)) serial=$OUT/nvmeof-$1-serial.log
  if ((ready)) && wait_for_line "$serial" 'NVMEOF-(WRITTEN|FAIL)' "$(remaining)" "${!pid_var}" &&
    grep -q 'NVMEOF-WRITTEN' "$serial"; then
    start=$(now_us)
    for ((c = 0; c < mib / chunk; c++)); do
      record nvmeof "${prefix}target.chunk.$c.md5=$(dd if=/dev/ram0 bs=1M skip=$((c * chunk)) count="$chunk" iflag=direct 2> /dev/null | md5sum | cut -d' ' -f1)"
      for b in $((c * blocks)) $((c * blocks + blocks / 2 + 1)) $(((c + 1) * blocks - 1)); do
        record nvmeof "${prefix}target.block.$b=$(dd if=/dev/ram0 bs=4096 skip="$b" count=1 iflag=direct 2> /dev/null | head -c 28 | tr -c 'a-z0-9 -' '?')"
      done
    done
    record nvmeof "${prefix}target_check=done" "${prefix}target_check_secs=$(since "$start")"
  else
    record nvmeof "${prefix}target_check=skipped"
  fi
  : > "$SIG/target-checked-$g"
}

# end_guest G: G's VMM must end once its guest powered off: 60 s after the guest's last word it is
# killed.
end_guest() {
  end_guests nvmeof nvmeof "$1"
  record_panics nvmeof nvmeof "$1"
}

# migrate_mid_io: the migration phase (issue 14 item 7). Once guest A reports its verified
# write+read loop running (and a few seconds more, so that rounds are in flight), its VM moves
# from VMM A to a new VMM A2 (TAP tapa2) through pvrdma-remote on both API sockets, over a Unix
# socket (migrate_vm); then this host serves "migrated", upon which the guest finishes its
# rounds on A2.
# Records the remote exit statuses, send-migration's "migration completed" line (the blackout) and
# A's exit. Sets pid_a2.
migrate_mid_io() {
  if ! wait_for_line "$OUT/nvmeof-a-serial.log" 'NVMEOF-(MIGRATION-LOOP|FAIL|DONE)' "$(remaining)" "$pid_a" ||
    ! grep -q 'NVMEOF-MIGRATION-LOOP' "$OUT/nvmeof-a-serial.log"; then
    record nvmeof "mig_loop=never-started"
    : > "$SIG/migrated"
    pid_a2=$pid_a
    return 0
  fi
  record nvmeof "mig_loop=running"
  sleep 4
  migrate_vm nvmeof nvmeof-a nvmeof-a2 "$WORK/a.api" "$MAC_A=tapa2"
  pid_a2=$VMM_PID
  : > "$SIG/migrated"
  wait_for_exit "$pid_a" 30
  record nvmeof "a_exit=$EXIT_STATUS"
  # A data path the switch-over broke hangs the guest's I/O for good: without a round verified on
  # A2 within MIG_STALL seconds, A2 is stopped, so that the suite fails now instead of at its limit.
  if wait_for_line "$OUT/nvmeof-a2-serial.log" 'NVMEOF-(ROUND .*migrated=1|MIGRATION-PASS|FAIL)' "$MIG_STALL" "$pid_a2"; then
    record nvmeof "mig_stalled=0"
  else
    record nvmeof "mig_stalled=1"
    log "migration: no round on A2 within $MIG_STALL s; stopping it"
    # The device's counters and each QP's as the hang left them (its exit log adds the CQs').
    timeout 10 "$PVRDMA_REMOTE_BIN" --api-socket "$WORK/nvmeof-a2.api" counters > "$OUT/nvmeof-a2-counters.json" 2>&1 || true
    timeout 10 "$PVRDMA_REMOTE_BIN" --api-socket "$WORK/nvmeof-a2.api" shutdown > /dev/null 2>&1 || kill -KILL "$pid_a2" 2> /dev/null || true
  fi
  record_panics nvmeof nvmeof a
}

check_target a '' "$SIZE_MIB" "$CHUNK_MIB"
if ((MIG_MIB > 0)); then
  migrate_mid_io
  end_guest a2
else
  end_guest a
fi
# nvmet's side: the NVM controllers it created for the guest's host NQN.
record nvmeof "target_controllers=$(dmesg | grep -c "nvmet: creating nvm controller .* for NQN $HOSTNQN" || true)"

# Guest to guest: guest T is the target (nvmet-rdma on its own PVRDMA device, tests/guest/nvmet.sh);
# initiator I1 reaches it over the same-host channel (no RoCE frame on I1's TAP), T and I1 both
# with share_memory=on (the one-copy path: described records, settled at every fast registration
# and invalidation), then I2, whose VMM has local=off, over the bridge (RoCE v2 on both TAPs). Each writes G2G_MIB of the pattern,
# T reports what arrived (then zeroes it), and the initiator reads back and verifies.
g2g_initiator() { # NAME IP PVRDMA-OPTIONS
  local name=$1 pid_var=pid_$1
  guest_script_disk "$WORK/nvmeof-$name-run.img" "$header
TARGET_IP=$IP_T NQN=$G2G_NQN SIZE_MIB=$G2G_MIB READY_SIGNAL=g2g-ready FAILED_SIGNAL=g2g-failed
RDMA_DEV=vmw_pvrdma0 MY_IP=$2 WRITE_MIB=$G2G_MIB CHUNK_MIB=$G2G_CHUNK_MIB CHECKED_SIGNAL=g2g-checked-$name MIG_MIB=0" \
    "$GUEST_SCRIPTS/nvmeof.sh"
  run_guest "nvmeof-$name" "$WORK/nvmeof-$name-run.img" --pvrdma "$3"
  printf -v "$pid_var" '%s' "$VMM_PID"
  if wait_for_line "$OUT/nvmeof-$name-serial.log" 'NVMEOF-(WRITTEN|FAIL)' "$(remaining)" "${!pid_var}" &&
    grep -q 'NVMEOF-WRITTEN' "$OUT/nvmeof-$name-serial.log"; then
    : > "$SIG/check-$name"
    wait_for_line "$OUT/nvmeof-t-serial.log" "NVMET-(CHECKED initiator=$name|FAIL)" "$(remaining)" "$pid_t" || true
  fi
  : > "$SIG/g2g-checked-$name"
  end_guest "$name"
  record nvmeof "$name.roce_frames=$(frames_counted "tap$name")"
  # Read back and gone: T may zero its data for the next initiator.
  : > "$SIG/done-$name"
  wait_for_line "$OUT/nvmeof-t-serial.log" "NVMET-(ZEROED initiator=$name|FAIL)" "$(remaining)" "$pid_t" || true
}
if ((G2G_MIB > 0)); then
  modprobe -a sch_prio cls_u32 || true
  for t in tapt tapi1 tapi2; do l1_tap "$t" br0; done
  # RoCE v2 frames this host passes to each initiator's TAP: T's answers, when they take the wire.
  for t in tapi1 tapi2; do frame_counter "$t" || record nvmeof "counter_$t=fail"; done
  guest_script_disk "$WORK/nvmeof-t-run.img" "HOST_IP=$HOST_IP SIG_PORT=$SIG_PORT MY_IP=$IP_T NQN=$G2G_NQN PORT=$PORT
SIZE_MIB=$G2G_MIB WRITE_MIB=$G2G_MIB CHUNK_MIB=$G2G_CHUNK_MIB INITIATORS='i1 i2' LIMIT=$LIMIT CHECK_WAIT=$CHECK_WAIT" \
    "$GUEST_SCRIPTS/nvmet.sh"
  run_guest nvmeof-t "$WORK/nvmeof-t-run.img" --pvrdma "tap=tapt,mac=$MAC_T,share_memory=on"
  pid_t=$VMM_PID
  if wait_for_line "$OUT/nvmeof-t-serial.log" 'NVMET-(READY|FAIL)' "$(remaining)" "$pid_t" &&
    grep -q 'NVMET-READY' "$OUT/nvmeof-t-serial.log"; then
    : > "$SIG/g2g-ready"
  else
    : > "$SIG/g2g-failed"
  fi
  g2g_initiator i1 "$IP_I1" "tap=tapi1,mac=$MAC_I1,share_memory=on"
  g2g_initiator i2 "$IP_I2" "tap=tapi2,mac=$MAC_I2,local=off"
  : > "$SIG/g2g-done"
  end_guest t
  log "guest to guest: $(grep -E '^(t|i1|i2)[._]' "$OUT/nvmeof.env" | tr '\n' ' ')"
fi

# NFS over RDMA: guest N mounts the export, writes its tree and, once this host checked it, reads
# it back.
# nfs_guest NAME PREFIX DEV IP NIC...: guest NAME (console $OUT/NAME-serial.log) runs
# tests/guest/nfsrdma.sh with RDMA_DEV=DEV, MY_IP=IP and the VMM options NIC (its NIC on its own
# TAP); this host checks what it wrote and records it in nfsrdma.env, keys PREFIX-ed. The export
# and the "nfs-checked" signal are emptied first: what an earlier guest wrote, or was told, must
# not pass for this one's.
nfs_guest() {
  local name=$1 prefix=$2 dev=$3 ip=$4 start pid
  shift 4
  rm -rf "${NFS_DIR:?}/tree" "$NFS_DIR/MANIFEST.md5" "$SIG/nfs-checked"
  guest_script_disk "$WORK/$name-run.img" "HOST_IP=$HOST_IP SIG_PORT=$SIG_PORT RDMA_DEV=$dev MY_IP=$ip NFS_PORT=$NFS_MOUNT_PORT
SMALL_FILES=$SMALL_FILES LARGE_FILES=$LARGE_FILES LARGE_MIB=$LARGE_MIB LIMIT=$LIMIT READY_WAIT=$READY_WAIT CHECK_WAIT=$CHECK_WAIT" \
    "$GUEST_SCRIPTS/nfsrdma.sh"
  run_guest "$name" "$WORK/$name-run.img" "$@"
  pid=$VMM_PID
  # This host's side of what the guest wrote: md5sum -c of the guest's manifest over the export,
  # and this host's own manifest (the same form: `md5sum` of tree/..., sorted) of what it holds.
  if ((nfs_ready)) && wait_for_line "$OUT/$name-serial.log" 'NFSRDMA-(WRITTEN|FAIL)' "$(remaining)" "$pid" &&
    grep -q 'NFSRDMA-WRITTEN' "$OUT/$name-serial.log"; then
    start=$(now_us)
    (cd "$NFS_DIR" && find tree -type f | LC_ALL=C sort | xargs md5sum) > "$OUT/$name-host-manifest.txt" 2>&1 || true
    cp "$NFS_DIR/MANIFEST.md5" "$OUT/$name-guest-manifest.txt" 2> /dev/null || true
    (cd "$NFS_DIR" && md5sum -c MANIFEST.md5) > "$WORK/nfs-check.txt" 2>&1 || true
    record nfsrdma "${prefix}host_manifest_md5=$(md5sum < "$OUT/$name-host-manifest.txt" | cut -d' ' -f1)" \
      "${prefix}host_guest_manifest_md5=$( (md5sum < "$NFS_DIR/MANIFEST.md5" 2> /dev/null || echo none) | cut -d' ' -f1)" \
      "${prefix}host_files=$(find "$NFS_DIR/tree" -type f 2> /dev/null | wc -l)" \
      "${prefix}host_bytes=$(find "$NFS_DIR/tree" -type f -printf '%s\n' 2> /dev/null | awk '{ s += $1 } END { print s + 0 }')" \
      "${prefix}host_check_ok=$(grep -c ': OK$' "$WORK/nfs-check.txt")" \
      "${prefix}host_check_failed=$(grep -vc ': OK$' "$WORK/nfs-check.txt")" \
      "${prefix}host_check=done" "${prefix}host_check_secs=$(since "$start")"
  else
    record nfsrdma "${prefix}host_check=skipped"
  fi
  : > "$SIG/nfs-checked"
  wait_for_line "$OUT/$name-serial.log" 'GUEST-POWEROFF' "$(remaining)" "$pid" || true
  wait_for_exit "$pid" 60
  record nfsrdma "${prefix}n_exit=$EXIT_STATUS" "${prefix}n_panics=$(panics "$OUT/$name-vmm.log")"
}
if ((nfs_ready)); then : > "$SIG/nfs-ready"; else : > "$SIG/nfs-failed"; fi
l1_tap tapn br0
nfs_guest nfsrdma '' vmw_pvrdma0 "$IP_N" --pvrdma "tap=tapn,mac=$MAC_N"
# The NFS baseline (with BASELINE_MIB > 0, as NVMe-oF's): guest NB, Soft-RoCE in its own kernel
# on a plain vmxnet3 NIC, copies the same tree the same way.
if ((BASELINE_MIB > 0)); then
  l1_tap tapnb br0
  nfs_guest nfsrdma-b b. rxe0 "$IP_NB" --net "tap=tapnb,mac=$MAC_NB"
fi
# nfsd's side: its RDMA connections, and anything it complained about.
record nfsrdma "server_rdma_log_lines=$(dmesg | grep -ciE 'svcrdma|rpcrdma' || true)"
log "nfsrdma: $(tr '\n' ' ' < "$OUT/nfsrdma.env")"

# The baseline: guest B, Soft-RoCE in its own kernel, on a RAM disk zeroed first (what A wrote
# there must not pass for what B wrote; O_DIRECT, as check_target reads).
if ((BASELINE_MIB > 0)); then
  dd if=/dev/zero of=/dev/ram0 bs=1M count="$BASELINE_MIB" oflag=direct 2> /dev/null || record nvmeof "b.zero=fail"
  l1_tap tapb br0
  guest_script_disk "$WORK/nvmeof-b-run.img" "$header
RDMA_DEV=rxe0 MY_IP=$IP_B WRITE_MIB=$BASELINE_MIB CHUNK_MIB=$BASELINE_CHUNK_MIB CHECKED_SIGNAL=target-checked-b" "$GUEST_SCRIPTS/nvmeof.sh"
  run_guest nvmeof-b "$WORK/nvmeof-b-run.img" --net "tap=tapb,mac=$MAC_B"
  pid_b=$VMM_PID
  check_target b b. "$BASELINE_MIB" "$BASELINE_CHUNK_MIB"
  end_guest b
fi
record nvmeof "seconds=$(since "$t0")"
# nvmet's side of the whole run, and anything it complained about.
dmesg > "$OUT/nvmeof-l1-dmesg.txt" 2>&1 || true
nfs_teardown
target_teardown
log "nvmeof: $(grep -vE '^(b\.)?target\.' "$OUT/nvmeof.env" | tr '\n' ' ')"
