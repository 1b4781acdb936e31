# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh
# shellcheck disable=SC2153 # MY_IP, NQN...: prepended by the scenario
# Guest side of tests/scenarios/nvmeof.sh's guest-to-guest phase (issue 14 item 1): a Linux NVMe
# over Fabrics target (nvmet + nvmet-rdma) on this guest's PVRDMA device, whose initiators are other
# guests of the same test host. Its namespace is a brd RAM disk; the port listens on MY_IP (the
# RoCE v2 GID of eth0's address). For each initiator in turn, once the test host says it wrote its
# pattern, this guest reports the MD5 of every chunk of what arrived on the RAM disk; once the
# test host says the initiator is done (it read back and disconnected), it zeroes what was
# written, so that the next initiator's data cannot pass for the last one's.
# The scenario prepends:
#   MY_IP HOST_IP SIG_PORT  eth0's address; the test host's signal server (see nvmeof.sh)
#   NQN PORT        the subsystem's NQN and the port (4420)
#   SIZE_MIB        the RAM disk (the namespace)
#   WRITE_MIB CHUNK_MIB  what each initiator writes from its start, and per chunk
#   INITIATORS      names of the initiators, in order: for each NAME the test host serves
#                   "check-NAME" once NAME wrote and "done-NAME" once it ended; "g2g-done" once
#                   all are done
#   LIMIT CHECK_WAIT  seconds one command may run; seconds to wait for each signal
#
# Output, parsed by tests/tests/nvmeof.rs:
#   NVMET-READY gid=G                   the port listens (nvmet-rdma bound MY_IP)
#   NVMET-CHUNK initiator=NAME chunk=N md5=M   what NAME's chunk N is on the RAM disk
#   NVMET-CHECKED initiator=NAME        all of NAME's chunks reported
#   NVMET-ZEROED initiator=NAME         NAME done and its data zeroed: the next may write
#   NVMET-DONE ok=1, or NVMET-FAIL <why>
#   SECTION-BEGIN kernel-log ... SECTION-END kernel-log rc=0   dmesg about nvmet and RDMA

DEV=vmw_pvrdma0
CFG=/sys/kernel/config/nvmet
say() { echo "NVMET-$*"; }
kernel_log() { kernel_log_section 'nvmet|rdma|pvrdma|WARNING|BUG|Call Trace|RIP:'; }
fail() {
  say "FAIL $*"
  driver_log
  kernel_log
  exit 1
}

eth0_up_with_gid
modprobe brd rd_nr=1 rd_size=$((SIZE_MIB * 1024)) max_part=0 || fail "modprobe brd"
[ -b /dev/ram0 ] || fail "no /dev/ram0"
modprobe nvmet-rdma || fail "modprobe nvmet-rdma"
mount -t configfs none /sys/kernel/config 2> /dev/null || [ -d "$CFG" ] || fail "mount configfs"
s=$CFG/subsystems/$NQN
p=$CFG/ports/1
{ mkdir "$s" && echo 1 > "$s/attr_allow_any_host" &&
  mkdir "$s/namespaces/1" && printf %s /dev/ram0 > "$s/namespaces/1/device_path" &&
  echo 1 > "$s/namespaces/1/enable"; } || fail "configfs subsystem"
{ mkdir "$p" && echo rdma > "$p/addr_trtype" && echo ipv4 > "$p/addr_adrfam" &&
  echo "$MY_IP" > "$p/addr_traddr" && echo "$PORT" > "$p/addr_trsvcid" &&
  ln -s "$s" "$p/subsystems/$NQN"; } || fail "configfs port: nvmet-rdma cannot listen on $MY_IP:$PORT"
say "READY gid=$(cat "/sys/class/infiniband/$DEV/ports/1/gids/$GIDX")"

chunks=$((WRITE_MIB / CHUNK_MIB))
for name in $INITIATORS; do
  got=$(wait_host_signal "$CHECK_WAIT" "check-$name" g2g-done) || got=nothing
  [ "$got" = "check-$name" ] || break
  c=0
  while [ $c -lt $chunks ]; do
    # O_DIRECT: nvmet writes the RAM disk with bios, past the page cache.
    sum=$(timeout "$LIMIT" dd if=/dev/ram0 bs=1M skip=$((c * CHUNK_MIB)) count="$CHUNK_MIB" iflag=direct 2> /dev/null | md5sum | cut -d' ' -f1)
    say "CHUNK initiator=$name chunk=$c md5=$sum"
    c=$((c + 1))
  done
  say "CHECKED initiator=$name"
  got=$(wait_host_signal "$CHECK_WAIT" "done-$name" g2g-done) || got=nothing
  [ "$got" = "done-$name" ] || break
  timeout "$LIMIT" dd if=/dev/zero of=/dev/ram0 bs=1M count="$WRITE_MIB" oflag=direct 2> /dev/null || fail "zeroing the RAM disk"
  say "ZEROED initiator=$name"
done
wait_host_signal "$CHECK_WAIT" g2g-done > /dev/null || true
# Down in reverse; a port with a live controller is the initiator's to end (nvme disconnect).
rm -f "$p/subsystems/$NQN" && rmdir "$p" && echo 0 > "$s/namespaces/1/enable" &&
  rmdir "$s/namespaces/1" "$s" || fail "tearing the target down"
say "DONE ok=1"
kernel_log
