#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Stage "userspace": the guest's user land, unpacked from Debian's packages: busybox (static) and
# rdma-core + providers + ibverbs-utils + perftest + rdmacm-utils with every library they load.
# Inputs (env): RES OUT DEBS PACKAGES (lines "pkg version"). Output: OUT/root/, a guest root tree.
set -euo pipefail
. "$RES/lib/common.sh"
LOG_TAG=userspace

root=$OUT/root
mkdir -p "$root"
while read -r pkg ver; do
  dpkg-deb -x "$(fetch_deb "$DEBS" "$pkg" "$ver")" "$root"
done <<<"$PACKAGES"

# What a guest without systemd/udev/locales never uses; keeps the initramfs small (TCG boots
# decompress it at ~50x native cost). The two daemons also need libsystemd, which we do not ship.
rm -rf "${root:?}"/usr/share "$root"/usr/lib/x86_64-linux-gnu/gconv "$root"/lib/udev "$root"/lib/systemd \
  "$root"/etc/init.d "$root"/usr/sbin/iwpmd "$root"/usr/sbin/rdma-ndd "$root"/usr/libexec

# The libc6 deb ships /etc/ld.so.conf.d but not /etc/ld.so.conf (libc-bin does): add it and build
# the tree's own ld.so.cache so that binaries find /usr/lib/x86_64-linux-gnu without LD_LIBRARY_PATH.
echo 'include /etc/ld.so.conf.d/*.conf' > "$root/etc/ld.so.conf"
ldconfig -r "$root"

# Every ELF file must resolve its libraries inside the tree; a miss means a package is missing
# from the list in build-assets.sh. The tree's own ld.so does the resolution, as it will in the guest.
ldso=$root/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
[[ -x $ldso ]] || die "no dynamic loader in the tree (is libc6 in the package list?)"
libpath=$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu
unresolved=$(find "$root" -type f \( -perm -u+x -o -name '*.so*' \) -print0 | while IFS= read -r -d '' f; do
  [[ $(head -c4 "$f" | tr -d '\0') == $'\x7fELF' ]] || continue
  [[ $f == */bin/busybox ]] && continue   # static
  "$ldso" --inhibit-cache --library-path "$libpath" --list "$f" 2>&1 \
    | awk -v r="$root" -v f="${f#"$root"}" '/=>/ && index($3, r) != 1 {print f ": " $1 " => " $3}'
done)
[[ -z $unresolved ]] || die "libraries resolved outside the guest tree (add their packages):"$'\n'"$unresolved"
for f in bin/busybox etc/libibverbs.d/vmw_pvrdma.driver 'usr/lib/x86_64-linux-gnu/libibverbs/libvmw_pvrdma-rdmav*.so' \
         usr/bin/ibv_devinfo usr/bin/ib_write_bw usr/bin/rping; do
  compgen -G "$root/$f" >/dev/null || die "expected $f in the guest tree"
done
