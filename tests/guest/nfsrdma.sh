# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh
# shellcheck disable=SC2153 # MY_IP, HOST_IP...: prepended by the scenario
# Guest side of the NFS/RDMA phase of tests/scenarios/nvmeof.sh (issue 14, item 2): the kernel's
# NFS client over RDMA. On the PVRDMA device, it mounts the test host's kernel NFS server (nfsd +
# svcrdma on Soft-RoCE, port 20049, a tmpfs exported as NFSv4's root) with `proto=rdma`, copies a
# tree of files with known checksums onto it, unmounts, drops its caches, mounts again and copies
# the tree back, checking every file against the checksums it took before writing; then unmounts
# cleanly. The test host checks the same checksums on its side of the export meanwhile.
# The same script measures the Soft-RoCE baseline: in a guest with a plain vmxnet3 NIC, whose own
# kernel runs Soft-RoCE (rxe0 on eth0) under rpcrdma.
# rpcrdma is a kernel RDMA user: it fast-registers its buffers (FRWR, REG_MR), the server RDMA-READs
# what the client writes and RDMA-WRITEs what it reads, and the client invalidates (LOCAL_INV) or
# is told to (SEND_WITH_INV).
# No nfs-common here: busybox's mount hands `-t nfs4` options to the kernel as text (with the
# server's address as addr=), which is all the kernel's NFSv4 client needs.
# The scenario prepends:
#   RDMA_DEV        vmw_pvrdma0 (the device under test; the default), or rxe0 (the baseline: this
#                   script loads rdma_rxe and adds rxe0 on eth0)
#   MY_IP HOST_IP   eth0's address and the test host's bridge (the NFS server's address) (/24)
#   SIG_PORT        TCP port of the test host's signal server: "nfs-ready"/"nfs-failed" (its
#                   server listens on RDMA, or will not), "nfs-checked" (it checked the tree)
#   NFS_PORT        the port the mount asks for (the server's RDMA port is 20049)
#   SMALL_FILES LARGE_FILES LARGE_MIB  the tree: SMALL_FILES files of 1 to 64 KiB (file I is
#                   1024 + (I * 40961) % 64513 bytes) and LARGE_FILES of LARGE_MIB MiB, all random
#   LIMIT           seconds any one command may run (`timeout`)
#   READY_WAIT CHECK_WAIT  seconds to wait for "nfs-ready" and for "nfs-checked"
#
# The mount is `soft` with timeo=600,retrans=2: a data path that stops answering fails the copy
# with EIO after minutes instead of hanging the guest in an uninterruptible wait.
#
# Output, parsed by tests/tests/nvmeof.rs:
#   NFSRDMA-GID dev=D idx=N gid=G mtu=M     the RoCE v2 GID of MY_IP on RDMA_DEV
#   NFSRDMA-MODULES nfsv4=1 rpcrdma=1 ...
#   NFSRDMA-TREE files=N bytes=B manifest_md5=M   the tree generated in tmpfs, and the MD5 of its
#                                           manifest (`md5sum` of every file, paths tree/...,
#                                           sorted), which it also writes to the export as
#                                           MANIFEST.md5
#   SECTION-BEGIN mount-wrong-port|mount-1|mount-2|umount-1|umount-2 ... SECTION-END NAME rc=N
#   NFSRDMA-WRONG-PORT port=P rc=N mounted=1|0   the negative control: a mount of port NFS_PORT + 1
#                                           (where nothing listens) must fail
#   NFSRDMA-MOUNTED n=1|2 line=<its /proc/mounts line, spaces as '|'>
#   NFSRDMA-WRITTEN files=N bytes=B centis=T   cp -r of the tree onto the mount, sync included
#   NFSRDMA-SIGNAL name=nfs-checked got=1|0
#   NFSRDMA-READ files=N bytes=B centis=T ok=N bad=N manifest_same=1|0   cp -r of the tree back
#                                           from a fresh mount, caches dropped; ok/bad: files whose
#                                           MD5 matches the manifest or not
#   NFSRDMA-BAD <md5sum -c line>            up to 10 of the files that did not match
#   NFSRDMA-UNMOUNTED rc=N gone=1|0         no NFS mount left
#   SECTION-BEGIN nfs-kernel-log ... SECTION-END nfs-kernel-log rc=0
#   NFSRDMA-DONE ok=1|0, or NFSRDMA-FAIL <why> (the script then ends with status 1)

DEV=${RDMA_DEV:-vmw_pvrdma0}
MNT=/mnt/nfs
say() { echo "NFSRDMA-$*"; }
kernel_log() {
  echo "SECTION-BEGIN nfs-kernel-log"
  dmesg | grep -E 'nfs|NFS|rpcrdma|rpc|RPC|rdma|pvrdma|WARNING|BUG|Call Trace|RIP:|not responding|timed out|I/O error'
  echo "SECTION-END nfs-kernel-log rc=0"
}
fail() {
  say "FAIL $*"
  driver_log
  kernel_log
  exit 1
}

# nfs_mounted: the /proc/mounts line of MNT (empty if none).
nfs_mounted() { awk -v m="$MNT" '$2 == m' /proc/mounts; }
# mount_nfs N: mounts the export's root on MNT over RDMA (section mount-N), says MOUNTED.
mount_nfs() {
  section "mount-$1" mount -t nfs4 -o "vers=4.1,proto=rdma,port=$NFS_PORT,sec=sys,soft,timeo=600,retrans=2,clientaddr=$MY_IP" \
    "$HOST_IP:/" "$MNT" || fail "mount $1 of $HOST_IP:/ over RDMA failed"
  [ -n "$(nfs_mounted)" ] || fail "mount $1: nothing mounted on $MNT"
  say "MOUNTED n=$1 line=$(nfs_mounted | tr ' ' '|')"
}

[ "$DEV" = rxe0 ] && rxe_up
eth0_up_with_gid
say "GID dev=$DEV idx=$GIDX gid=$(cat "/sys/class/infiniband/$DEV/ports/1/gids/$GIDX") mtu=$(cat /sys/class/net/eth0/mtu)"

# The image carries the NFS client and its RDMA transport without loading them (GUEST_EXTRA_MODULES);
# the kernel would ask a /sbin/modprobe this guest does not have for either.
for m in rpcrdma nfsv4; do
  modprobe "$m" || fail "modprobe $m"
done
say "MODULES$(for m in sunrpc rpcrdma nfs nfsv4 rdma_cm; do printf ' %s=%s' "$m" "$([ -d "/sys/module/$m" ] && echo 1 || echo 0)"; done)"

# The tree, in tmpfs: random content, sizes fixed (tests/tests/nvmeof.rs computes the total).
mkdir -p /tmp/src/tree/small /tmp/src/tree/large "$MNT" || fail "mkdir"
i=0
while [ $i -lt "$SMALL_FILES" ]; do
  head -c $((1024 + (i * 40961) % 64513)) /dev/urandom > "/tmp/src/tree/small/f$(printf %03d $i)" || fail "generating small file $i"
  i=$((i + 1))
done
i=0
while [ $i -lt "$LARGE_FILES" ]; do
  head -c $((LARGE_MIB * 1048576)) /dev/urandom > "/tmp/src/tree/large/big$i" || fail "generating large file $i"
  i=$((i + 1))
done
(cd /tmp/src && find tree -type f | sort | xargs md5sum) > /tmp/manifest || fail "the manifest"
files=$(wc -l < /tmp/manifest)
bytes=$(find /tmp/src/tree -type f | xargs cat | wc -c)
manifest_md5=$(md5sum < /tmp/manifest | cut -d' ' -f1)
say "TREE files=$files bytes=$bytes manifest_md5=$manifest_md5"

got=$(wait_host_signal "$READY_WAIT" nfs-ready nfs-failed) || got=nothing
[ "$got" = nfs-ready ] || fail "the test host's NFS server is not ready: $got"

# The negative control: the same mount on a port where nothing listens (NFS_PORT + 1) must fail,
# so that the mounts below succeeding means that the server's RDMA port answered.
echo "SECTION-BEGIN mount-wrong-port"
timeout 90 mount -t nfs4 -o "vers=4.1,proto=rdma,port=$((NFS_PORT + 1)),sec=sys,soft,timeo=100,retrans=1,clientaddr=$MY_IP" \
  "$HOST_IP:/" "$MNT" 2>&1
wrong_rc=$?
echo "SECTION-END mount-wrong-port rc=$wrong_rc"
if [ -n "$(nfs_mounted)" ]; then
  umount "$MNT"
  say "WRONG-PORT port=$((NFS_PORT + 1)) rc=$wrong_rc mounted=1"
else
  say "WRONG-PORT port=$((NFS_PORT + 1)) rc=$wrong_rc mounted=0"
fi

# Write: the whole tree and its manifest, flushed to the server (sync) inside the time.
mount_nfs 1
t=$(centis)
timeout "$LIMIT" cp -r /tmp/src/tree "$MNT/" 2> /tmp/cp.log || fail "cp -r onto NFS: $(tr '\n' ' ' < /tmp/cp.log)"
timeout "$LIMIT" sync || fail "sync after the copy onto NFS"
d=$(($(centis) - t))
cp /tmp/manifest "$MNT/MANIFEST.md5" && timeout "$LIMIT" sync || fail "writing MANIFEST.md5"
say "WRITTEN files=$files bytes=$bytes centis=$d"
section umount-1 umount "$MNT" || fail "umount after writing"
rm -rf /tmp/src

# The test host reads its side of the export meanwhile; this side waits, so that the read below
# has the test host's CPU to itself.
got=$(wait_host_signal "$CHECK_WAIT" nfs-checked) && checked=1 || checked=0
say "SIGNAL name=nfs-checked got=$checked"

# Read back from a fresh mount, caches dropped: every byte comes over the wire again.
sync
echo 3 > /proc/sys/vm/drop_caches
mount_nfs 2
mkdir -p /tmp/back
t=$(centis)
timeout "$LIMIT" cp -r "$MNT/tree" /tmp/back/ 2> /tmp/cp.log || fail "cp -r from NFS: $(tr '\n' ' ' < /tmp/cp.log)"
d=$(($(centis) - t))
cmp -s "$MNT/MANIFEST.md5" /tmp/manifest && same=1 || same=0
(cd /tmp/back && md5sum -c /tmp/manifest) > /tmp/check.log 2>&1
ok=$(grep -c ': OK$' /tmp/check.log)
bad=$((files - ok))
rbytes=$(find /tmp/back/tree -type f | xargs cat | wc -c)
rfiles=$(find /tmp/back/tree -type f | wc -l)
say "READ files=$rfiles bytes=$rbytes centis=$d ok=$ok bad=$bad manifest_same=$same"
grep -v ': OK$' /tmp/check.log | head -n 10 | while read -r l; do say "BAD $l"; done
rm -rf /tmp/back

section umount-2 umount "$MNT"
um_rc=$?
no_nfs() { [ -z "$(nfs_mounted)" ]; }
retry 30 no_nfs && gone=1 || gone=0
say "UNMOUNTED rc=$um_rc gone=$gone"

kernel_log
ok=0
[ "$bad" = 0 ] && [ "$same" = 1 ] && [ "$um_rc" = 0 ] && [ "$gone" = 1 ] && ok=1
say "DONE ok=$ok"
[ $ok = 1 ]
