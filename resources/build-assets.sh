#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Builds, or finds in the cache, everything the end-to-end tests boot, from Debian's packages only:
# the stock guest kernel and its modules + out-of-tree vmw_pvrdma.ko, the guest initramfs, the
# guest's ext4 root disk and the test host's (L1) initramfs. Installs the Debian packages it needs.
#
# Usage: resources/build-assets.sh
#   stdout: one line, the assets directory; its assets.env lists every asset as KEY=absolute-path
#   stderr: progress
# Environment: PVRDMA_VMM_CACHE (default ~/.cache/pvrdma-vmm), PVRDMA_GUEST_KVER (default below).
#
# Cache: each stage lives in $CACHE/<stage>-<key>, the key a hash of the stage's recipe files, the
# versions of the packages it uses and the keys of the stages it builds on; a stage is rebuilt only
# when one of those changes. Downloaded .debs are kept in $CACHE/debs.
set -euo pipefail
RES=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$RES/lib/common.sh"

# Debian's kernel ABI name; headers and image must be the same. Any bookworm 6.1 ABI works.
KVER=${PVRDMA_GUEST_KVER:-6.1.0-56-amd64}
[[ -n ${PVRDMA_VMM_CACHE:-} || -n ${HOME:-} ]] || die "neither PVRDMA_VMM_CACHE nor HOME is set: no place for the cache"
CACHE=${PVRDMA_VMM_CACHE:-$HOME/.cache/pvrdma-vmm}
[[ $CACHE != *[[:space:]]* ]] || die "cache path '$CACHE' contains whitespace (assets.env and kernel command lines cannot carry it)"

# Modules the guest loads at boot (their dependencies come from modules.dep, not from this list).
# rdma_ucm: /dev/infiniband/rdma_cm for librdmacm (rping, perftest -R), with rdma_cm and ib_cm.
GUEST_MODULES="virtio_pci virtio_blk ext4 vmxnet3 ib_core ib_uverbs vmw_pvrdma rdma_ucm"
# Modules the guest image carries (with their dependencies) but does not load at boot: a test
# loads them itself. rdma_rxe: Soft-RoCE, the baseline of bench-rdma (its guests run `rdma link add
# rxe0 type rxe netdev eth0`); crc32_generic: rxe's ICRC needs a "crc32" crypto algorithm, which
# the kernel would otherwise request through a /sbin/modprobe the guest does not have; nvme_rdma:
# the NVMe over Fabrics initiator of the nvmeof suite (with nvme_fabrics, nvme_core, rdma_cm);
# nfsv4 and rpcrdma: the NFS client and its RDMA transport, for the nvmeof suite's NFS/RDMA phase
# (with nfs, sunrpc, lockd, fscache, netfs, dns_resolver; busybox's mount hands `-t nfs4` options
# to the kernel as text, so no nfs-common is needed); nvmet_rdma and brd: the NVMe over Fabrics
# target (with nvmet) and its RAM-disk namespace, for the nvmeof suite's guest-to-guest phase;
# 8021q: the guest VLAN interfaces (eth0.100) of the roce suite.
GUEST_EXTRA_MODULES="rdma_rxe crc32_generic nvme_rdma nfsv4 rpcrdma nvmet_rdma brd 8021q"
# Guest userspace; recipes/userspace.sh fails if a binary needs a library outside this set.
# libmnl0, libbsd0, libmd0 and libcap2 are what iproute2's `rdma` loads. libgcc-s1: glibc loads
# libgcc_s.so.1 at run time (no ldd dependency) to unwind a thread in pthread_exit/pthread_cancel,
# which rping's threads do at the end of a run ("libgcc_s.so.1 must be installed", abort).
# nvme-cli (`nvme connect -t rdma` of the nvmeof suite) and what its libnvme and libnvme-mi load:
# libjson-c5, libcrypto (picked from libssl3, below), libdbus-1-3 and through it libsystemd0 with
# its compression and crypto libraries (libgcrypt20, libgpg-error0, liblzma5, libzstd1, liblz4-1).
# nvme-cli's declared uuid-runtime (uuidgen, uuidd) is left out: `nvme connect` is given its host
# NQN and ID. Together they grow the initramfs from 7.2 to about 11 MB.
USERSPACE_PACKAGES=(busybox-static libc6 zlib1g libudev1 libnl-3-200 libnl-route-3-200 libibverbs1 librdmacm1
  libibumad3 libpci3 rdma-core ibverbs-providers ibverbs-utils perftest rdmacm-utils libmnl0 libbsd0 libmd0 libcap2
  libgcc-s1 nvme-cli libnvme1 libjson-c5 libdbus-1-3 libsystemd0 libgcrypt20 libgpg-error0 liblzma5 libzstd1
  liblz4-1)
# Only on the guest's root disk (PVRDMA_ROOTFS), not in its initramfs: UCX and Open MPI for the ucx
# suite (6 MB more of gzip'd initramfs that every guest of every suite would unpack). ucx-utils
# (ucx_perftest, ucx_info) and libucx0 with libnuma1 and libgomp1; openmpi-bin (orterun, orted) and
# libopenmpi3 with what it and the components we keep load (libhwloc15, libevent, libpmix2 and its
# libmunge2); openmpi-common for Open MPI's help texts. Not libopenmpi3's libfabric1, libpsm2-2 and
# libpsm-infinipath1, nor libhwloc-plugins: the components that need them are dropped
# (recipes/userspace.sh), with OpenSHMEM, MPI-IO and the compilers' wrappers; openmpi-bin's
# ssh-client neither (the ucx suite launches with its own rsh agent).
ROOTFS_PACKAGES=(libucx0 ucx-utils libnuma1 libgomp1 openmpi-bin libopenmpi3 openmpi-common libhwloc15
  libevent-core-2.1-7 libevent-pthreads-2.1-7 libpmix2 libmunge2)
# Packages of which the guest gets single files ("package:path"), not the whole package: iproute2
# would bring ip/tc/ss and their libraries (libbpf, libelf, libxtables...) for one binary; of
# libssl3, libnvme needs only libcrypto (not libssl, its engines or its provider modules).
USERSPACE_PICKS=(iproute2:usr/bin/rdma libssl3:usr/lib/x86_64-linux-gnu/libcrypto.so.3)
# Packages unpacked only to build guest programs against (guest/verbs-check.c, guest/access-check.c,
# guest/write-check.c, which also uses librdmacm; guest/mpi-check.c, Open MPI's mpi.h), never shipped.
USERSPACE_BUILD_PACKAGES=(libibverbs-dev librdmacm-dev libopenmpi-dev)
# Build tools, plus qemu for the test host (installing it here makes one command prepare a machine).
# libc6-dev: the guest's verbs-check and write-check programs are compiled here (the kernel module
# build needs no libc).
# rdma-core and its tools: the test host runs this host's binaries, and the e2e rdma suite runs
# Soft-RoCE (rxe) there as the native endpoint the guests talk to (rdma link, libibverbs with the
# rxe provider, ibv_rc_pingpong, perftest, rping). iproute2: the scenarios' bridges and TAPs
# (ip) and the free ports of a test-host pair (ss); iputils-ping: two test hosts check their cable.
# nfs-kernel-server: exportfs and rpc.mountd for the kernel NFS server the nvmeof suite's NFS/RDMA
# phase runs in the test host (nfsd's export upcalls are answered by rpc.mountd). tcpdump: the roce
# suite's capture on the test host's bridge (RoCE v1 frames, 802.1Q tags).
HOST_PACKAGES=(qemu-system-x86 curl cpio e2fsprogs kmod gzip xz-utils make gcc libc6-dev "linux-headers-$KVER" linux-source-6.1
  rdma-core ibverbs-providers ibverbs-utils perftest rdmacm-utils iproute2 iputils-ping nfs-kernel-server openssl tcpdump)

mkdir -p "$CACHE/debs"
CACHE=$(cd "$CACHE" && pwd)
DEBS=$CACHE/debs
export RES KVER DEBS

# One build at a time per cache (parallel test binaries may all call this script).
exec 9>"$CACHE/.lock"
if ! flock -n 9; then
  log "another build-assets.sh holds $CACHE/.lock; waiting (up to 30 min)"
  flock -w 1800 9 || die "timed out waiting for $CACHE/.lock"
fi
# Leftovers of an interrupted build (safe: we hold the lock).
rm -rf "$CACHE"/.tmp-*

ensure_installed "${HOST_PACKAGES[@]}"

# stage_key NAME EXTRA FILE...: hash of NAME, EXTRA (versions, keys of input stages) and the
# contents of FILEs (paths relative to resources/, so that every clone computes the same key).
stage_key() {
  local name=$1 extra=$2; shift 2
  { echo "$name"; echo "$extra"; (cd "$RES" && sha256sum "$@"); } | sha256sum | cut -c1-16
}

# build_stage NAME DIR RECIPE [VAR=VALUE...]: make DIR with RECIPE unless it is complete. Built in a
# temporary directory renamed at the end, so that an interrupted build never looks complete.
build_stage() {
  local name=$1 dir=$2 recipe=$3 tmp t0=$SECONDS; shift 3
  if [[ -f $dir/.complete ]]; then
    touch "$dir/.complete"   # last use, for prune_unused
    log "$name: cached in $dir"
    return 0
  fi
  tmp=$(mktemp -d "$CACHE/.tmp-$name-XXXXXX")
  log "$name: building with ${recipe#"$RES"/}"
  env "$@" OUT="$tmp" bash "$recipe" >&2 || { rm -rf "$tmp"; die "$name: ${recipe#"$RES"/} failed (see above)"; }
  touch "$tmp/.complete"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  log "$name: built in $((SECONDS - t0)) s"
}

image_version=$(candidate_versions "linux-image-$KVER" | cut -d' ' -f2)
userspace_versions=$(candidate_versions "${USERSPACE_PACKAGES[@]}")
pick_versions=$(candidate_versions "${USERSPACE_PICKS[@]%%:*}")
rootfs_versions=$(candidate_versions "${ROOTFS_PACKAGES[@]}")
build_versions=$(candidate_versions "${USERSPACE_BUILD_PACKAGES[@]}")
# Installed tools that shape the outputs: the module build's, and the image builders'.
build_tools=$(for p in "linux-headers-$KVER" linux-source-6.1 make kmod; do echo "$p $(installed_version "$p")"; done
  gcc --version | head -n1)
image_tools=$(for p in kmod e2fsprogs cpio gzip; do echo "$p $(installed_version "$p")"; done)

key=$(stage_key kernel "$KVER $image_version $build_tools" recipes/kernel.sh lib/common.sh)
KERNEL_DIR=$CACHE/kernel-$key
build_stage kernel "$KERNEL_DIR" "$RES/recipes/kernel.sh" IMAGE_VERSION="$image_version"

key=$(stage_key userspace "$userspace_versions $pick_versions ${USERSPACE_PICKS[*]} $build_versions $rootfs_versions $(gcc --version | head -n1)" \
  recipes/userspace.sh guest/check.h guest/verbs-check.c guest/write-check.c guest/access-check.c guest/qps-check.c guest/mpi-check.c \
  lib/common.sh)
USERSPACE_DIR=$CACHE/userspace-$key
build_stage userspace "$USERSPACE_DIR" "$RES/recipes/userspace.sh" PACKAGES="$userspace_versions" \
  PICK_PACKAGES="$pick_versions" PICKS="${USERSPACE_PICKS[*]}" BUILD_PACKAGES="$build_versions" EXTRA_PACKAGES="$rootfs_versions"

key=$(stage_key guest "$KERNEL_DIR $USERSPACE_DIR $GUEST_MODULES | $GUEST_EXTRA_MODULES $image_tools" recipes/guest.sh guest/init lib/common.sh)
GUEST_DIR=$CACHE/guest-$key
ROOTDISK_ID=pvrdma-rootdisk-$key
build_stage guest "$GUEST_DIR" "$RES/recipes/guest.sh" KERNEL_DIR="$KERNEL_DIR" USERSPACE_DIR="$USERSPACE_DIR" \
  GUEST_MODULES="$GUEST_MODULES" GUEST_EXTRA_MODULES="$GUEST_EXTRA_MODULES" ROOTDISK_ID="$ROOTDISK_ID"

key=$(stage_key l1 "$KERNEL_DIR $USERSPACE_DIR $image_tools" test-host/mk-l1-initramfs.sh test-host/l1-init lib/common.sh)
L1_DIR=$CACHE/l1-$key
build_stage l1 "$L1_DIR" "$RES/test-host/mk-l1-initramfs.sh" KERNEL_DIR="$KERNEL_DIR" USERSPACE_DIR="$USERSPACE_DIR"

manifest="PVRDMA_KVER=$KVER
PVRDMA_KERNEL=$KERNEL_DIR/boot/vmlinuz-$KVER
PVRDMA_VMLINUX=$KERNEL_DIR/boot/vmlinux-$KVER
PVRDMA_MODULES=$KERNEL_DIR/lib/modules/$KVER
PVRDMA_GUEST_INITRAMFS=$GUEST_DIR/initramfs.cpio.gz
PVRDMA_ROOTFS=$GUEST_DIR/rootfs.ext4
PVRDMA_ROOTDISK_ID=$ROOTDISK_ID
PVRDMA_USERSPACE=$USERSPACE_DIR/root
PVRDMA_L1_INITRAMFS=$L1_DIR/initramfs.cpio.gz"
ASSETS_DIR=$CACHE/assets-$(sha256sum <<<"$manifest" | cut -c1-16)
if [[ ! -f $ASSETS_DIR/assets.env ]]; then
  mkdir -p "$ASSETS_DIR"
  printf '%s\nPVRDMA_ASSETS_DIR=%s\n' "$manifest" "$ASSETS_DIR" > "$ASSETS_DIR/assets.env.tmp"
  mv "$ASSETS_DIR/assets.env.tmp" "$ASSETS_DIR/assets.env"
fi
touch "$ASSETS_DIR/.complete"

# Every recipe change leaves a stage behind (a kernel stage is 400 MB). Drop the stages no run has
# used for a week: old enough that no test still reads them (other checkouts of another revision
# just rebuild theirs).
find "$CACHE" -mindepth 2 -maxdepth 2 -name .complete -mtime +7 -printf '%h\n' | while read -r old; do
  log "pruning $old (unused for a week)"
  rm -rf "$old"
done
echo "$ASSETS_DIR"
