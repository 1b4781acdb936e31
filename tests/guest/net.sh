# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh
# shellcheck disable=SC2153 # ROLE, DATA_MB...: prepended by the scenario
# Guest side of tests/scenarios/net.sh (issue 3) and bench-net.sh: runs in each of two L2 guests
# (busybox sh, `pvtest=run`), whose vmxnet3 NICs sit on one bridge. The scenario prepends the
# variables below and ships the result as the guest's pvrun= disk.
#
#   ROLE       a | b. A receives and observes; B sends and changes its own link, MTU and MAC.
#   MODE       test (every check of issue 3) | bench (BENCH_ROUNDS timed transfers only)
#   MY_IP PEER_IP  addresses on eth0 (/16)
#   MY_SIG PEER_SIG HOST_SIG  third octet of the "signal" addresses (below)
#   DATA_MB    size of the TCP transfers (test: one at MTU 1500, one at 9000; bench: each round)
#   PORT       the TCP port of the transfers
#   NEW_MAC    B's MAC after the MAC change
#   DOWN_WINDOW  seconds B keeps its link down for A to observe
#   BENCH_ROUNDS  transfers in bench mode
#
# Synchronisation between the guests goes over the network only: a guest signals "I reached step
# N" by adding the address 10.10.MY_SIG.N to its eth0, and the peer waits for that address to
# answer pings. The L1 host signals the same way on the bridge (10.10.HOST_SIG.N). Every wait is
# a retry loop with a deadline; the only fixed sleep is B's down window, an observation window.
#
# Output: one marker line per result, "NET-<WHAT> key=value...", read by tests/tests/net.rs; the
# first failed step prints "NET-FAIL <why>" and ends the script with status 1.

say() { echo "NET-$*"; }
fail() {
  say "FAIL role=$ROLE $*"
  grep eth0 /proc/net/dev
  echo "$(tcp_counters) $(ip_frag_counters)"
  exit 1
}
uptime_s() { cut -d' ' -f1 /proc/uptime; }

pings() { ping -c 1 -W 1 "$@"; }
unreachable() { ! ping -c 1 -W 1 "$1"; }
signal() { ip addr add "10.10.$MY_SIG.$1/16" dev eth0 || fail "cannot add signal address $1"; }
# wait_signal SECS N [OCTET]: until the peer (or the host: OCTET=HOST_SIG) reached step N.
wait_signal() { retry "$1" pings "10.10.${3:-$PEER_SIG}.$2"; }

sysnet() { cat "/sys/class/net/eth0/$1" 2> /dev/null || echo none; }
link_is_up() { [ "$(sysnet carrier)" = 1 ] && [ "$(sysnet operstate)" = up ]; }
link_is_down() { [ "$(sysnet operstate)" = down ]; }
link_state() { echo "carrier=$(sysnet carrier) operstate=$(sysnet operstate) mtu=$(sysnet mtu) mac=$(sysnet address)"; }

md5() { md5sum "$1" | cut -d' ' -f1; }
size() { wc -c < "$1" | tr -d ' '; }

# snmp PROTO NAME: a counter of /proc/net/snmp, e.g. snmp Tcp InCsumErrors.
snmp() {
  awk -v p="$1:" -v n="$2" '$1 == p {
    if (!(p in hdr)) { for (i = 2; i <= NF; i++) col[i] = $i; hdr[p] = 1; next }
    for (i = 2; i <= NF; i++) if (col[i] == n) print $i
  }' /proc/net/snmp
}

# IP fragmentation counters: an 8000-byte ping that crossed the bridge without fragmenting (DF set,
# as Linux does for a packet that fits the route's MTU) leaves both at 0.
ip_frag_counters() { echo "FragCreates=$(snmp Ip FragCreates) ReasmReqds=$(snmp Ip ReasmReqds)"; }
# TCP segments this guest received with a bad checksum (dropped and retransmitted by the sender).
tcp_counters() { echo "csum_errors=$(snmp Tcp InCsumErrors) retrans=$(snmp Tcp RetransSegs)"; }

net_up() {
  ip link set lo up
  ip link set eth0 up || fail "ip link set eth0 up"
  ip addr add "$MY_IP/16" dev eth0 || fail "ip addr add $MY_IP"
  retry 30 link_is_up || fail "eth0 not up with carrier after 30 s: $(link_state)"
  say "UP role=$ROLE $(link_state)"
}

# A's receiver: one connection into FILE; nc's stdin is never read (with -e the program gets the
# socket), so nc cannot half-close the connection early.
start_receiver() {
  printf '#!/bin/sh\ncat > %s\n' "$1" > /tmp/recv.sh
  chmod +x /tmp/recv.sh
  rm -f "$1"
  nc -l -p "$PORT" -e /tmp/recv.sh &
  RECV_PID=$!
}

# wait_receiver SECS: waits for the receiver started last; its exit status in RECV_RC.
wait_receiver() {
  _end=$(($(now) + $1))
  while kill -0 "$RECV_PID" 2> /dev/null; do
    if [ "$(now)" -ge "$_end" ]; then
      kill "$RECV_PID" 2> /dev/null
      RECV_RC=timeout
      return 1
    fi
    sleep 0.2
  done
  wait "$RECV_PID"
  RECV_RC=$?
}

# send_file FILE SECS: connects (retrying while A is not listening yet) and sends FILE; sets
# SEND_SECS to the duration of the successful transfer.
send_file() {
  _end=$(($(now) + $2))
  while :; do
    _t0=$(uptime_s)
    if timeout "$2" nc -w 5 "$PEER_IP" "$PORT" < "$1" > /dev/null 2> /tmp/nc.err; then
      SEND_SECS=$(awk -v a="$_t0" -v b="$(uptime_s)" 'BEGIN { printf "%.2f", b - a }')
      return 0
    fi
    [ "$(now)" -lt "$_end" ] || return 1
    sleep 0.2
  done
}

# gen_data FILE MIB: random data; its md5 in DATA_MD5.
gen_data() {
  dd if=/dev/urandom of="$1" bs=1M count="$2" 2> /dev/null || fail "cannot generate $2 MiB"
  DATA_MD5=$(md5 "$1")
  say "TCP-DATA file=$1 bytes=$(size "$1") md5=$DATA_MD5"
}

# bench_mtu: both sides at BENCH_MTU (default 1500); B then waits until a full-size ping passes.
bench_mtu() {
  [ "${BENCH_MTU:-1500}" = 1500 ] && return 0
  ip link set eth0 mtu "$BENCH_MTU" || fail "ip link set eth0 mtu $BENCH_MTU"
  retry 30 link_is_up || fail "eth0 not up after the MTU change: $(link_state)"
}

# The same DATA_MB of random data goes from B to A twice: at MTU 1500, then at MTU 9000.
role_a_test() {
  net_up
  start_receiver /tmp/recv
  retry 240 pings "$PEER_IP" || fail "no ping answer from $PEER_IP in 240 s"
  say "PING from=$MY_IP to=$PEER_IP ok"
  wait_receiver 240 || fail "no complete transfer at MTU 1500 within 240 s (receiver $RECV_RC)"
  say "TCP-RECV mtu=1500 rc=$RECV_RC bytes=$(size /tmp/recv) md5=$(md5 /tmp/recv) $(tcp_counters)"
  rm -f /tmp/recv

  # Link: B takes its eth0 down for DOWN_WINDOW s once it sees signal 1.
  signal 1
  retry 120 unreachable "$PEER_IP" || fail "peer never stopped answering (link down not seen)"
  say "PEER-DOWN-SEEN peer=$PEER_IP"
  retry 120 pings "$PEER_IP" || fail "peer did not answer again after its link came back"
  say "PEER-UP-SEEN peer=$PEER_IP"

  # MTU 9000 on both sides, then 8000-byte pings (unfragmented: see ip_frag_counters).
  ip link set eth0 mtu 9000 || fail "ip link set eth0 mtu 9000"
  retry 30 link_is_up || fail "eth0 not up after the MTU change: $(link_state)"
  say "MTU-SET $(link_state)"
  start_receiver /tmp/recv
  signal 2
  wait_signal 120 2 || fail "peer did not reach MTU 9000"
  retry 60 ping -c 1 -W 2 -s 8000 "$PEER_IP" || fail "no answer to an 8000-byte ping"
  say "JUMBO-PING from=$MY_IP to=$PEER_IP size=8000 ok"
  wait_receiver 240 || fail "no complete transfer at MTU 9000 within 240 s (receiver $RECV_RC)"
  say "TCP-RECV mtu=9000 rc=$RECV_RC bytes=$(size /tmp/recv) md5=$(md5 /tmp/recv) $(tcp_counters)"
  rm -f /tmp/recv

  # MAC: B changes its MAC, then signals 3; A must end up with the new MAC in its neighbour table
  # (B announces it with a gratuitous ARP) and still reach B.
  wait_signal 120 3 || fail "peer did not signal its MAC change"
  retry 60 peer_has_new_mac || fail "neighbour entry of $PEER_IP never showed $NEW_MAC: $(ip neigh show "$PEER_IP")"
  say "PEER-MAC-SEEN peer=$PEER_IP neigh=$(ip neigh show "$PEER_IP" | tr ' ' _)"

  say "IP-FRAG role=$ROLE $(ip_frag_counters)"
  signal 9
  retry 120 unreachable "$PEER_IP" || fail "peer still answering 120 s after the end"
  say "DONE role=$ROLE"
}

peer_has_new_mac() {
  pings "$PEER_IP" && ip neigh show "$PEER_IP" | grep -qi "lladdr $NEW_MAC"
}

role_b_test() {
  net_up
  gen_data /tmp/data "$DATA_MB"
  retry 240 pings "$PEER_IP" || fail "no ping answer from $PEER_IP in 240 s"
  say "PING from=$MY_IP to=$PEER_IP ok"
  send_file /tmp/data 240 || fail "sending to $PEER_IP:$PORT at MTU 1500 failed: $(cat /tmp/nc.err)"
  say "TCP-SENT mtu=1500 bytes=$(size /tmp/data) md5=$DATA_MD5 secs=$SEND_SECS $(tcp_counters)"

  wait_signal 120 1 || fail "peer never got ready to watch the link"
  ip link set eth0 down || fail "ip link set eth0 down"
  retry 10 link_is_down || fail "operstate not down after ip link set down: $(link_state)"
  _state=$(link_state)
  if pings "$PEER_IP"; then fail "ping answered while eth0 was down"; fi
  say "LINK-DOWN $_state ping=fail"
  # Observation window for A (not a wait for an event): A must see B stop answering.
  sleep "$DOWN_WINDOW"
  ip link set eth0 up || fail "ip link set eth0 up"
  retry 30 link_is_up || fail "eth0 not back up with carrier after 30 s: $(link_state)"
  say "LINK-UP-AGAIN $(link_state)"
  retry 60 pings "$PEER_IP" || fail "no ping answer from $PEER_IP after link up"
  say "PING-AFTER-UP from=$MY_IP to=$PEER_IP ok"

  ip link set eth0 mtu 9000 || fail "ip link set eth0 mtu 9000"
  retry 30 link_is_up || fail "eth0 not up after the MTU change: $(link_state)"
  say "MTU-SET $(link_state)"
  signal 2
  wait_signal 120 2 || fail "peer did not reach MTU 9000"
  retry 60 ping -c 1 -W 2 -s 8000 "$PEER_IP" || fail "no answer to an 8000-byte ping"
  say "JUMBO-PING from=$MY_IP to=$PEER_IP size=8000 ok"
  send_file /tmp/data 240 || fail "sending to $PEER_IP:$PORT at MTU 9000 failed: $(cat /tmp/nc.err)"
  say "TCP-SENT mtu=9000 bytes=$(size /tmp/data) md5=$DATA_MD5 secs=$SEND_SECS $(tcp_counters)"
  rm -f /tmp/data

  # A gratuitous ARP on the address change tells A (and the bridge) about the new MAC.
  echo 1 > /proc/sys/net/ipv4/conf/eth0/arp_notify
  _old=$(sysnet address)
  ip link set eth0 address "$NEW_MAC" || fail "ip link set eth0 address $NEW_MAC"
  [ "$(sysnet address)" = "$NEW_MAC" ] || fail "eth0 address is $(sysnet address) after setting $NEW_MAC"
  say "MAC-SET old=$_old new=$NEW_MAC $(link_state)"
  signal 3
  retry 60 pings "$PEER_IP" || fail "no ping answer from $PEER_IP after the MAC change"
  say "PING-AFTER-MAC from=$MY_IP to=$PEER_IP ok"
  # The host checks its bridge's forwarding database for the new MAC, then signals 1.
  if wait_signal 120 1 "$HOST_SIG"; then say "HOST-SIGNAL fdb-checked"; else say "HOST-SIGNAL timeout"; fi
  wait_signal 120 9 || fail "peer never finished"
  say "IP-FRAG role=$ROLE $(ip_frag_counters)"
  say "DONE role=$ROLE"
}

# Bench: BENCH_ROUNDS transfers of DATA_MB MiB from B to A, timed by B (guest clock). A signals
# each round once it listens, so that B never sends while A is still checksumming the last one
# (both guests share one L1 vCPU: that would be measured too).
role_a_bench() {
  net_up
  bench_mtu
  round=1
  while [ "$round" -le "$BENCH_ROUNDS" ]; do
    start_receiver /tmp/recv
    signal "$round"
    wait_receiver 600 || fail "round $round: no complete transfer within 600 s"
    say "TCP-RECV round=$round bytes=$(size /tmp/recv) md5=$(md5 /tmp/recv) $(tcp_counters)"
    round=$((round + 1))
  done
  say "DONE role=$ROLE"
}

role_b_bench() {
  net_up
  bench_mtu
  gen_data /tmp/data "$DATA_MB"
  retry 240 ping -c 1 -W 1 -s $((${BENCH_MTU:-1500} - 28)) "$PEER_IP" || fail "no full-size ping answer from $PEER_IP in 240 s"
  round=1
  while [ "$round" -le "$BENCH_ROUNDS" ]; do
    wait_signal 600 "$round" || fail "round $round: the receiver never got ready"
    send_file /tmp/data 600 || fail "round $round: sending failed: $(cat /tmp/nc.err)"
    say "TCP-SENT round=$round bytes=$(size /tmp/data) md5=$DATA_MD5 secs=$SEND_SECS $(tcp_counters)"
    round=$((round + 1))
  done
  say "DONE role=$ROLE"
}

"role_${ROLE}_${MODE}"
