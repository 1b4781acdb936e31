#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Stage "userspace": the guest's user land, unpacked from Debian's packages: busybox (static) and
# rdma-core + providers + ibverbs-utils + perftest + rdmacm-utils, iproute2's `rdma`, nvme-cli (and,
# in the root disk's tree only, UCX's ucx-utils and Open MPI), with every library they load; plus
# pvrdma-verbs-check (guest/verbs-check.c), pvrdma-access-check (guest/access-check.c), pvrdma-write-check
# (guest/write-check.c), pvrdma-qps-check (guest/qps-check.c) and pvrdma-mpi-check (guest/mpi-check.c) compiled against libibverbs-dev,
# librdmacm-dev and libopenmpi-dev.
# Inputs (env): RES OUT DEBS PACKAGES (lines "pkg version": unpacked whole), PICK_PACKAGES (lines
# "pkg version") and PICKS ("pkg:path" words: only these files of those packages), BUILD_PACKAGES
# (lines "pkg version": headers to compile against, not shipped), EXTRA_PACKAGES (lines "pkg
# version": only in OUT/full). Output: OUT/root/, the guest's root tree (its initramfs), and
# OUT/full/, the same plus EXTRA_PACKAGES and pvrdma-mpi-check (its root disk).
set -euo pipefail
. "$RES/lib/common.sh"
LOG_TAG=userspace

root=$OUT/root
mkdir -p "$root"
while read -r pkg ver; do
  dpkg-deb -x "$(fetch_deb "$DEBS" "$pkg" "$ver")" "$root"
done <<<"$PACKAGES"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
while read -r pkg ver; do
  [[ -n $pkg ]] || continue
  dpkg-deb -x "$(fetch_deb "$DEBS" "$pkg" "$ver")" "$work/pick-$pkg"
done <<<"$PICK_PACKAGES"
for pick in $PICKS; do
  pkg=${pick%%:*} path=${pick#*:}
  [[ -f $work/pick-$pkg/$path ]] || die "package $pkg has no $path"
  install -D -m 0755 "$work/pick-$pkg/$path" "$root/$path"
done

# pvrdma-verbs-check, pvrdma-access-check and pvrdma-write-check: compiled against the -dev headers, linked to the tree's
# own libibverbs.so.1 (and librdmacm.so.1) by path, so that their DT_NEEDED are the sonames the
# guest resolves.
while read -r pkg ver; do
  [[ -n $pkg ]] || continue
  dpkg-deb -x "$(fetch_deb "$DEBS" "$pkg" "$ver")" "$work/dev"
done <<<"$BUILD_PACKAGES"
gcc -std=gnu11 -O2 -Wall -Wextra -Werror -I"$work/dev/usr/include" -o "$root/usr/bin/pvrdma-verbs-check" \
  "$RES/guest/verbs-check.c" "$root/usr/lib/x86_64-linux-gnu/libibverbs.so.1" \
  || die "compiling guest/verbs-check.c failed"
gcc -std=gnu11 -O2 -Wall -Wextra -Werror -I"$work/dev/usr/include" -o "$root/usr/bin/pvrdma-access-check" \
  "$RES/guest/access-check.c" "$root/usr/lib/x86_64-linux-gnu/libibverbs.so.1" \
  || die "compiling guest/access-check.c failed"
gcc -std=gnu11 -O2 -Wall -Wextra -Werror -I"$work/dev/usr/include" -o "$root/usr/bin/pvrdma-write-check" \
  "$RES/guest/write-check.c" "$root/usr/lib/x86_64-linux-gnu/libibverbs.so.1" \
  "$root/usr/lib/x86_64-linux-gnu/librdmacm.so.1" \
  || die "compiling guest/write-check.c failed"
gcc -std=gnu11 -O2 -Wall -Wextra -Werror -I"$work/dev/usr/include" -o "$root/usr/bin/pvrdma-qps-check" \
  "$RES/guest/qps-check.c" "$root/usr/lib/x86_64-linux-gnu/libibverbs.so.1" \
  || die "compiling guest/qps-check.c failed"
# What a guest without systemd/udev/locales never uses; keeps the initramfs small (TCG boots
# decompress it at ~50x native cost). The two daemons also need libsystemd, which we do not ship.
rm -rf "${root:?}"/usr/share "$root"/usr/lib/x86_64-linux-gnu/gconv "$root"/lib/udev "$root"/lib/systemd \
  "$root"/etc/init.d "$root"/usr/sbin/iwpmd "$root"/usr/sbin/rdma-ndd "$root"/usr/libexec

# The root disk's tree: the same plus EXTRA_PACKAGES (UCX and Open MPI: 6 MB more of gzip'd
# initramfs that every guest of every suite would decompress at nested speed and hold in RAM; a
# disk is read on demand, by the one suite that uses them) and pvrdma-mpi-check.
full=$OUT/full
cp -a "$root" "$full"
while read -r pkg ver; do
  [[ -n $pkg ]] || continue
  dpkg-deb -x "$(fetch_deb "$DEBS" "$pkg" "$ver")" "$full"
done <<<"$EXTRA_PACKAGES"
# pvrdma-mpi-check: against Open MPI's mpi.h (Debian keeps it under its gfortran module directory),
# linked to the tree's libmpi.so.40, whose own libraries the linker finds in the tree (-rpath-link).
gcc -std=gnu11 -O2 -Wall -Wextra -Werror -I"$work/dev/usr/lib/x86_64-linux-gnu/fortran/gfortran-mod-15/openmpi" \
  -Wl,-rpath-link,"$full/usr/lib/x86_64-linux-gnu:$full/usr/lib/x86_64-linux-gnu/pmix2/lib" \
  -o "$full/usr/bin/pvrdma-mpi-check" "$RES/guest/mpi-check.c" "$full/usr/lib/x86_64-linux-gnu/libmpi.so.40" \
  || die "compiling guest/mpi-check.c failed"
# Of the extra packages' /usr/share only Open MPI's help texts stay (what its errors print).
mv "$full/usr/share/openmpi" "$work/openmpi-share"
rm -rf "${full:?}/usr/share"
mkdir -p "$full/usr/share"
mv "$work/openmpi-share" "$full/usr/share/openmpi"
# Open MPI without what an MPI job over UCX never loads: the components of fabrics whose libraries
# we do not ship (libfabric: ofi; PSM, PSM2), OpenSHMEM, MPI-IO, the Fortran, C++ and Java bindings,
# the compilers' wrappers; and ucx-utils' io_demo (the one user of libstdc++).
lib=$full/usr/lib/x86_64-linux-gnu
mca=$lib/openmpi/lib/openmpi3
rm -f "$mca"/mca_{btl_ofi,mtl_ofi,mtl_psm,mtl_psm2}.so "$lib"/libmca_common_ofi.so* \
  "$lib"/liboshmem.so* "$mca"/mca_{atomic,memheap,scoll,spml,sshmem}_*.so \
  "$lib"/libmca_common_ompio.so* "$mca"/mca_{io,fbtl,fcoll,fs,sharedfp}_*.so \
  "$lib"/libmpi_{mpifh,usempi_ignore_tkr,usempif08,cxx,java}.so* \
  "$full"/usr/bin/{mpicc,mpic++,mpiCC,mpicxx,mpif77,mpif90,mpifort}.openmpi "$full"/usr/bin/{opal_wrapper,opalcc,opalc++,ortecc} \
  "$full"/usr/bin/{mpijavac,mpijavac.pl,oshmem_info,oshrun,oshcc,oshCC,oshc++,oshcxx,oshfort,shmemrun,shmemcc,shmemCC,shmemc++,shmemcxx,shmemfort} \
  "$full"/usr/bin/io_demo

# check_tree DIR FILE...: DIR's ld.so.cache, then: every ELF file resolves its libraries inside DIR
# (a miss means a package is missing from the lists in build-assets.sh), and every FILE (a glob
# relative to DIR) exists.
check_tree() {
  local t=$1 ldso libpath unresolved f
  shift
  # The libc6 deb ships /etc/ld.so.conf.d but not /etc/ld.so.conf (libc-bin does): add it and build
  # the tree's own ld.so.cache so that binaries find /usr/lib/x86_64-linux-gnu without LD_LIBRARY_PATH.
  echo 'include /etc/ld.so.conf.d/*.conf' > "$t/etc/ld.so.conf"
  ldconfig -r "$t"
  # The tree's own ld.so does the resolution, as it will in the guest. (UCX's transport modules and
  # libpmix live in directories of their own, found in the guest by their users' RUNPATH, which
  # --library-path would otherwise let resolve to this host's copies.)
  ldso=$t/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
  [[ -x $ldso ]] || die "no dynamic loader in $t (is libc6 in the package list?)"
  libpath=$t/lib/x86_64-linux-gnu:$t/usr/lib/x86_64-linux-gnu:$t/usr/lib/x86_64-linux-gnu/ucx
  libpath+=:$t/usr/lib/x86_64-linux-gnu/pmix2/lib:$t/usr/lib/x86_64-linux-gnu/openmpi/lib
  unresolved=$(find "$t" -type f \( -perm -u+x -o -name '*.so*' \) -print0 | while IFS= read -r -d '' f; do
    [[ $(head -c4 "$f" | tr -d '\0') == $'\x7fELF' ]] || continue
    [[ $f == */bin/busybox ]] && continue   # static
    "$ldso" --inhibit-cache --library-path "$libpath" --list "$f" 2>&1 \
      | awk -v r="$t" -v f="${f#"$t"}" '/=>/ && index($3, r) != 1 {print f ": " $1 " => " $3}'
  done)
  [[ -z $unresolved ]] || die "libraries resolved outside $t (add their packages):"$'\n'"$unresolved"
  for f in "$@"; do
    compgen -G "$t/$f" >/dev/null || die "expected $f in $t"
  done
}
check_tree "$root" bin/busybox etc/libibverbs.d/vmw_pvrdma.driver 'usr/lib/x86_64-linux-gnu/libibverbs/libvmw_pvrdma-rdmav*.so' \
  usr/bin/ibv_devinfo usr/bin/ib_write_bw usr/bin/rping usr/bin/rdma usr/bin/pvrdma-verbs-check \
  usr/bin/pvrdma-write-check usr/bin/pvrdma-access-check usr/bin/pvrdma-qps-check usr/sbin/nvme
check_tree "$full" usr/bin/ucx_perftest usr/bin/ucx_info usr/bin/orterun usr/bin/orted usr/bin/pvrdma-mpi-check \
  usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/mca_pml_ucx.so usr/lib/x86_64-linux-gnu/ucx/libuct_ib.so.0 \
  usr/share/openmpi/help-mpi-runtime.txt
