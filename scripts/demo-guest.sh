# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh
# shellcheck disable=SC2153 # ROLE, MY_IP, PEER_IP: prepended by scripts/demo.sh
# Guest side of scripts/demo.sh: bring up eth0, find the RoCE v2 GID of its address on
# vmw_pvrdma0, then run ibv_rc_pingpong (data checked) and rping (rdma_cm, data verified) against
# the other guest: ROLE=server serves, ROLE=client connects (trying again while the server is not
# listening yet). Prints DEMO-OK or DEMO-FAIL at the end.
DEV=vmw_pvrdma0
fail() { echo "DEMO-FAIL $*"; exit 1; }
ip link set lo up
ip link set eth0 up && ip addr add "$MY_IP/24" dev eth0 || fail "network set-up"
want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' $(echo "$MY_IP" | tr . ' '))
i=0
while [ $i -lt 120 ]; do
  for f in /sys/class/infiniband/$DEV/ports/1/gids/*; do
    [ "$(cat "$f" 2>/dev/null)" = "$want" ] && GIDX=${f##*/}
  done
  [ -n "${GIDX:-}" ] && break
  sleep 1
  i=$((i + 1))
done
[ -n "${GIDX:-}" ] || fail "no RoCE v2 GID of $MY_IP on $DEV"
echo "demo: $DEV port $(cat /sys/class/infiniband/$DEV/ports/1/state), GID[$GIDX] = ::ffff:$MY_IP"

# again CMD...: runs CMD until it succeeds, for at most 120 s (the server may not listen yet).
again() {
  n=0
  until "$@"; do
    n=$((n + 1))
    [ $n -lt 60 ] || return 1
    sleep 2
  done
}
if [ "$ROLE" = server ]; then
  timeout 300 ibv_rc_pingpong -d $DEV -g "$GIDX" -c -n 500 -s 4096 || fail "ibv_rc_pingpong"
  timeout 300 rping -s -a "$MY_IP" -v -C 10 || fail "rping"
else
  again timeout 300 ibv_rc_pingpong -d $DEV -g "$GIDX" -c -n 500 -s 4096 "$PEER_IP" || fail "ibv_rc_pingpong"
  sleep 2
  again timeout 300 rping -c -a "$PEER_IP" -v -C 10 || fail "rping"
fi
echo "DEMO-OK $ROLE"
