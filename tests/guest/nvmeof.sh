# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh
# shellcheck disable=SC2153 # MY_IP, HOST_IP...: prepended by the scenario
# Guest side of tests/scenarios/nvmeof.sh (issue 14): the NVMe over Fabrics initiator. The kernel's
# nvme-rdma driver, on the PVRDMA device, connects with nvme-cli to the test host's Linux target
# (nvmet-rdma on Soft-RoCE, a brd RAM disk as its namespace), writes a known pattern through the
# block device, reads it back with O_DIRECT and verifies it, then disconnects. nvme-rdma is what
# posts fast-registration (REG_MR), SEND_WITH_INV and LOCAL_INV work requests and polls its CQs
# from the kernel: the device's kernel-QP path, which no rdma-core program exercises.
# The same script measures the Soft-RoCE baseline: in a guest with a plain vmxnet3 NIC, whose own
# kernel runs Soft-RoCE (rxe0 on eth0) under nvme-rdma.
# The scenario prepends:
#   RDMA_DEV        vmw_pvrdma0 (the device under test), or rxe0 (the baseline: this script
#                   loads rdma_rxe and adds rxe0 on eth0)
#   MY_IP HOST_IP   eth0's address and the test host's bridge (/24)
#   TARGET_IP       the target's address (default HOST_IP; another guest's for guest to guest)
#   SIG_PORT        TCP port of the test host's signal server: READY_SIGNAL/FAILED_SIGNAL
#                   (default "target-ready"/"target-failed": nvmet's port listens, or will not),
#                   CHECKED_SIGNAL (the target's side read back what this guest wrote)
#   NQN PORT        the subsystem's NQN and the target's port (4420)
#   HOSTNQN HOSTID  this host's NQN and ID, given to nvme-cli (no /etc/nvme, no DMI UUID here)
#   SIZE_MIB        the namespace's size
#   WRITE_MIB CHUNK_MIB  how much to write from its start, and per dd (CHUNK_MIB divides WRITE_MIB)
#   LIMIT           seconds any one command may run (`timeout`)
#   READY_WAIT CHECK_WAIT  seconds to wait for "target-ready" and for "target-checked"
#   MIG_MIB MIG_AFTER MIG_SECONDS  the migration pass (issue 14 item 7; MIG_MIB=0: none): rounds
#                   of MIG_MIB written and read back verified until the test host signals
#                   "migrated", then MIG_AFTER rounds more, all within MIG_SECONDS (see
#                   migration_pass)
#   MIG_WATCH       seconds without a finished round of the migration pass after which the
#                   guest's kernel state is dumped once (see mig_watch; default 100)
#   CTRL_LOSS_TMO   nvme connect's --ctrl-loss-tmo: a lost controller fails I/O after that many
#                   seconds instead of the default 600 of reconnects, so that a broken data path
#                   ends the test instead of hanging it
#
# The pattern, written over the first WRITE_MIB of the namespace: blocks of 4 KiB; block B is the text
# "pvrdma-nvmeof block %08d " (B), then printable ASCII starting at character 32 + B % 95, then a
# newline: every block (and every 512-byte sector in it) differs from its neighbours, so a block
# written to or read from the wrong place, or a page of a fast-registered MR mapped out of order,
# shows. The test host checks the headers of some blocks on its RAM disk, and the MD5 of every
# chunk against the MD5 this guest computed of the pattern.
#
# Output, parsed by tests/tests/nvmeof.rs:
#   NVMEOF-GID dev=D idx=N gid=G mtu=M     the RoCE v2 GID of MY_IP on the PVRDMA device
#   NVMEOF-MODULES nvme_rdma=1 ...         the initiator's modules, loaded with modprobe
#   SECTION-BEGIN discover|connect|list|disconnect ... SECTION-END NAME rc=N   nvme-cli's output
#   NVMEOF-CONNECTED ctrl=C transport=T address=A subsysnqn=Q state=S queues=N blk=B bytes=N
#   NVMEOF-CHUNK phase=write|read chunk=N md5=M secs=T [ok=0|1 first_bad_block=B got=TEXT]
#   NVMEOF-WRITTEN bytes=N centis=T        all chunks written (O_DIRECT, dd bs=1M)
#   NVMEOF-SIGNAL name=CHECKED_SIGNAL got=1|0
#   NVMEOF-READ bytes=N centis=T bad_chunks=N
#   NVMEOF-MIGRATION-LOOP running mib=N    (MIG_MIB > 0) the migration pass's first round verified
#   NVMEOF-ROUND r=N slot=S md5=M ok=1|0 migrated=0|1 wcentis=T rcentis=T   one round of it
#   NVMEOF-MIGRATION-PASS rounds=N after=N bad=N errors=N max_wcentis=T max_rcentis=T centis=T ok=1|0
#   SECTION-BEGIN mig-stall ... SECTION-END mig-stall rc=0   only when a round of the migration
#                                          pass hangs: see mig_watch
#   NVMEOF-DISCONNECTED gone=1|0           no NVMe controller or block device left afterwards
#   SECTION-BEGIN kernel-log ... SECTION-END kernel-log rc=0   the guest's dmesg lines about
#                                          nvme, RDMA and kernel warnings or bugs
#   NVMEOF-DONE ok=1|0, or NVMEOF-FAIL <why> (set-up failure; the script then ends with status 1)

DEV=$RDMA_DEV
TARGET_IP=${TARGET_IP:-$HOST_IP}
READY_SIGNAL=${READY_SIGNAL:-target-ready}
FAILED_SIGNAL=${FAILED_SIGNAL:-target-failed}
say() { echo "NVMEOF-$*"; }
# kernel_log: the framed part of the kernel's log a test reads (the console shows only errors:
# `quiet`).
kernel_log() { kernel_log_section 'nvme|rdma|pvrdma|WARNING|BUG|Call Trace|RIP:|timeout|I/O error|blk_update_request'; }
fail() {
  say "FAIL $*"
  driver_log
  kernel_log
  exit 1
}

# pattern FIRST COUNT: blocks FIRST .. FIRST+COUNT-1 of the pattern (see the header).
pattern() {
  awk -v first="$1" -v count="$2" 'BEGIN {
    a = ""
    for (i = 0; i < 95; i++) a = a sprintf("%c", 32 + i)
    while (length(a) < 8192) a = a a
    for (b = first; b < first + count; b++) {
      h = sprintf("pvrdma-nvmeof block %08d ", b)
      printf "%s%s\n", h, substr(a, 1 + b % 95, 4095 - length(h))
    }
  }'
}

# The baseline: Soft-RoCE in this guest.
[ "$DEV" = rxe0 ] && rxe_up
eth0_up_with_gid
say "GID dev=$DEV idx=$GIDX gid=$(cat "/sys/class/infiniband/$DEV/ports/1/gids/$GIDX") mtu=$(cat /sys/class/net/eth0/mtu)"

# The image carries nvme_rdma and its dependencies without loading them (GUEST_EXTRA_MODULES).
modprobe nvme-rdma || fail "modprobe nvme-rdma"
say "MODULES$(for m in nvme_core nvme_fabrics nvme_rdma rdma_cm; do printf ' %s=%s' "$m" "$([ -d "/sys/module/$m" ] && echo 1 || echo 0)"; done)"
[ -c /dev/nvme-fabrics ] || fail "no /dev/nvme-fabrics after loading nvme-rdma"

got=$(wait_host_signal "$READY_WAIT" "$READY_SIGNAL" "$FAILED_SIGNAL") || got=nothing
[ "$got" = "$READY_SIGNAL" ] || fail "the target is not ready: $got"

NVME_ID="--hostnqn=$HOSTNQN --hostid=$HOSTID"
# shellcheck disable=SC2086 # NVME_ID: two options
section discover nvme discover -t rdma -a "$TARGET_IP" -s "$PORT" $NVME_ID || fail "nvme discover failed"
# shellcheck disable=SC2086
section connect nvme connect -t rdma -a "$TARGET_IP" -s "$PORT" -n "$NQN" $NVME_ID --ctrl-loss-tmo="$CTRL_LOSS_TMO" ||
  fail "nvme connect failed"

# The controller of NQN and its namespace's block device (with native multipath, the subsystem's
# nvmeXnY; nothing else here is NVMe).
ctrl=''
for c in /sys/class/nvme/nvme*; do
  [ "$(cat "$c/subsysnqn" 2> /dev/null)" = "$NQN" ] && ctrl=${c##*/}
done
[ -n "$ctrl" ] || fail "no NVMe controller of $NQN after nvme connect: $(ls /sys/class/nvme 2>&1)"
nvme_block() { ls /sys/block | grep -E '^nvme[0-9]+n[0-9]+$' | head -n 1; }
has_nvme_block() { [ -n "$(nvme_block)" ]; }
retry 60 has_nvme_block || fail "no NVMe block device 60 s after nvme connect"
blk=$(nvme_block)
BLK=/dev/$blk
retry 30 test -b "$BLK" || fail "no $BLK"
bytes=$(($(cat "/sys/block/$blk/size") * 512))
say "CONNECTED ctrl=$ctrl transport=$(cat "/sys/class/nvme/$ctrl/transport") address=$(tr -d ' ' < "/sys/class/nvme/$ctrl/address") subsysnqn=$(cat "/sys/class/nvme/$ctrl/subsysnqn") state=$(cat "/sys/class/nvme/$ctrl/state") queues=$(cat "/sys/class/nvme/$ctrl/queue_count") blk=$blk bytes=$bytes"
section list nvme list
[ "$bytes" -ge $((SIZE_MIB * 1048576)) ] || fail "$BLK holds $bytes bytes, fewer than $SIZE_MIB MiB"

# Write: each chunk generated into tmpfs first, so that dd's time is the device's.
blocks=$((CHUNK_MIB * 256))
chunks=$((WRITE_MIB / CHUNK_MIB))
wcs=0
c=0
while [ $c -lt $chunks ]; do
  pattern $((c * blocks)) $blocks > /tmp/chunk
  sum=$(md5sum < /tmp/chunk | cut -d' ' -f1)
  echo "$sum" > "/tmp/expect-$c"
  t=$(centis)
  timeout "$LIMIT" dd if=/tmp/chunk of="$BLK" bs=1M seek=$((c * CHUNK_MIB)) count="$CHUNK_MIB" oflag=direct conv=notrunc 2> /tmp/dd.log ||
    fail "dd writing chunk $c: $(tr '\n' ' ' < /tmp/dd.log)"
  d=$(($(centis) - t))
  wcs=$((wcs + d))
  say "CHUNK phase=write chunk=$c md5=$sum centis=$d"
  c=$((c + 1))
done
rm -f /tmp/chunk
say "WRITTEN bytes=$((chunks * CHUNK_MIB * 1048576)) centis=$wcs"

# The test host reads its RAM disk meanwhile (what arrived there); this side waits, so that the
# read below has the test host's CPU to itself.
got=$(wait_host_signal "$CHECK_WAIT" "$CHECKED_SIGNAL") && checked=1 || checked=0
say "SIGNAL name=$CHECKED_SIGNAL got=$checked"

# Read back: O_DIRECT (no page cache), caches dropped first all the same.
sync
echo 3 > /proc/sys/vm/drop_caches
rcs=0
bad=0
c=0
while [ $c -lt $chunks ]; do
  t=$(centis)
  timeout "$LIMIT" dd if="$BLK" of=/tmp/chunk bs=1M skip=$((c * CHUNK_MIB)) count="$CHUNK_MIB" iflag=direct 2> /tmp/dd.log ||
    fail "dd reading chunk $c: $(tr '\n' ' ' < /tmp/dd.log)"
  d=$(($(centis) - t))
  rcs=$((rcs + d))
  sum=$(md5sum < /tmp/chunk | cut -d' ' -f1)
  if [ "$sum" = "$(cat "/tmp/expect-$c")" ]; then
    say "CHUNK phase=read chunk=$c md5=$sum centis=$d ok=1"
  else
    bad=$((bad + 1))
    # Where: the first byte that differs from the pattern, and what that block's header says.
    pattern $((c * blocks)) $blocks > /tmp/want
    off=$(cmp /tmp/chunk /tmp/want 2> /dev/null | head -n 1 | awk '{ sub(",", "", $5); print $5 - 1 }')
    b=$((${off:-0} / 4096))
    head=$(dd if=/tmp/chunk bs=4096 skip="$b" count=1 2> /dev/null | head -c 28 | tr -c 'a-z0-9 -' '?')
    say "CHUNK phase=read chunk=$c md5=$sum centis=$d ok=0 first_bad_block=$((c * blocks + b)) byte=$((${off:-0} % 4096)) got=$head"
    rm -f /tmp/want
  fi
  c=$((c + 1))
done
rm -f /tmp/chunk
say "READ bytes=$((chunks * CHUNK_MIB * 1048576)) centis=$rcs bad_chunks=$bad"

# mig_watch: while the migration pass runs (until /tmp/mig-end exists), once no round has finished
# for MIG_WATCH seconds (the time of the last is in /tmp/mig-progress), what explains a hung I/O:
# the PVRDMA device's interrupt counts, the tasks blocked in the kernel (SysRq w) and the end of the
# kernel's log at every level (nvme-rdma's timeouts and error recovery are warnings, which the
# `quiet` console leaves out), framed as section mig-stall. Runs in the background: the pass's dd
# is what hangs.
mig_watch() {
  while [ ! -e /tmp/mig-end ]; do
    sleep 5
    if [ $(($(now) - $(cat /tmp/mig-progress))) -ge "${MIG_WATCH:-100}" ]; then
      echo "SECTION-BEGIN mig-stall"
      echo "no round finished for ${MIG_WATCH:-100} s; interrupts:"
      grep -i pvrdma /proc/interrupts
      echo w > /proc/sysrq-trigger
      dmesg | tail -n 200
      echo "SECTION-END mig-stall rc=0"
      return
    fi
  done
}

# migration_pass: the verified read/write stream that the test host live-migrates this guest
# under (issue 14 item 7). Round R writes MIG_MIB of the pattern at slot R (mod the namespace's
# slots of MIG_MIB), numbered from block SIZE_MIB * 256 + R * MIG_MIB * 256: every round's data
# differs from any earlier content of its slot, so a write lost or applied twice across the
# switch-over shows. Each round is written with O_DIRECT and read back with O_DIRECT, and its MD5
# compared with the pattern's. The rounds go on until the test host serves "migrated" (it does
# once send-migration returned: this guest then runs on the destination VMM), then MIG_AFTER more.
# Sets mig_ok.
migration_pass() {
  mblocks=$((MIG_MIB * 256))
  slots=$((SIZE_MIB / MIG_MIB))
  r=0 after=0 migrated=0 mbad=0 merr=0 maxw=0 maxr=0
  mstart=$(centis)
  mend=$(($(now) + MIG_SECONDS))
  now > /tmp/mig-progress
  mig_watch &
  watch_pid=$!
  while [ "$after" -lt "$MIG_AFTER" ]; do
    if [ "$(now)" -ge "$mend" ]; then
      say "FAIL-MIGRATION no end after $MIG_SECONDS s: rounds=$r migrated=$migrated"
      merr=$((merr + 1))
      break
    fi
    slot=$((r % slots))
    pattern $((SIZE_MIB * 256 + r * mblocks)) $mblocks > /tmp/mchunk
    want=$(md5sum < /tmp/mchunk | cut -d' ' -f1)
    t=$(centis)
    if ! timeout "$LIMIT" dd if=/tmp/mchunk of="$BLK" bs=1M seek=$((slot * MIG_MIB)) count="$MIG_MIB" oflag=direct conv=notrunc 2> /tmp/dd.log; then
      say "ROUND r=$r slot=$slot write-error: $(tr '\n' ' ' < /tmp/dd.log)"
      merr=$((merr + 1))
      break
    fi
    w=$(($(centis) - t))
    t=$(centis)
    if ! timeout "$LIMIT" dd if="$BLK" of=/tmp/mback bs=1M skip=$((slot * MIG_MIB)) count="$MIG_MIB" iflag=direct 2> /tmp/dd.log; then
      say "ROUND r=$r slot=$slot read-error: $(tr '\n' ' ' < /tmp/dd.log)"
      merr=$((merr + 1))
      break
    fi
    rd=$(($(centis) - t))
    got=$(md5sum < /tmp/mback | cut -d' ' -f1)
    ok=1
    if [ "$got" != "$want" ]; then
      ok=0
      mbad=$((mbad + 1))
    fi
    [ $w -gt $maxw ] && maxw=$w
    [ $rd -gt $maxr ] && maxr=$rd
    say "ROUND r=$r slot=$slot md5=$got want=$want ok=$ok migrated=$migrated wcentis=$w rcentis=$rd"
    now > /tmp/mig-progress
    [ $r = 0 ] && say "MIGRATION-LOOP running mib=$MIG_MIB"
    r=$((r + 1))
    if [ $migrated = 1 ]; then
      after=$((after + 1))
    elif has_host_signal migrated; then
      migrated=1
    fi
  done
  rm -f /tmp/mchunk /tmp/mback
  : > /tmp/mig-end
  kill "$watch_pid" 2> /dev/null
  mig_ok=0
  [ $mbad = 0 ] && [ $merr = 0 ] && [ $migrated = 1 ] && mig_ok=1
  say "MIGRATION-PASS rounds=$r after=$after bad=$mbad errors=$merr max_wcentis=$maxw max_rcentis=$maxr centis=$(($(centis) - mstart)) ok=$mig_ok"
}

mig_ok=1
[ "${MIG_MIB:-0}" -gt 0 ] && migration_pass

section disconnect nvme disconnect -n "$NQN"
dc_rc=$?
gone() { ! ls /sys/class/nvme/nvme* > /dev/null 2>&1 && [ -z "$(nvme_block)" ]; }
retry 30 gone && gone=1 || gone=0
say "DISCONNECTED rc=$dc_rc gone=$gone"

kernel_log
ok=0
[ $bad = 0 ] && [ $mig_ok = 1 ] && [ $dc_rc = 0 ] && [ $gone = 1 ] && ok=1
say "DONE ok=$ok"
[ $ok = 1 ]
