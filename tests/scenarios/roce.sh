# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# shellcheck disable=SC2034 # pid_a..pid_e: read through ${!pid_var}
# Scenario of tests/tests/roce.rs (issue 14, items 5 and 6): RoCE v1 and guest VLANs. Five guests,
# each with a PVRDMA slot on one bridge br0 (10.17.0.254) of this host, all running
# tests/guest/roce.sh at once:
#   A (10.17.0.1), B (10.17.0.2)   --pvrdma ...,gid=roce-v1,local=off: RoCE v1 between them, on
#                                  the bridge (ibv_rc_pingpong -c, rping -v -V)
#   C (10.17.0.3)                  local=off, with eth0.100 (10.117.0.3)
#   D (10.17.0.4), E (10.17.0.5)   the same-host channel (default), with eth0.100 (10.117.0.4/.5)
# C <-> D and D <-> E run ibv_rc_pingpong -c, ibv_ud_pingpong -c and rping -v -V over VLAN 100
# with the RoCE v2 GIDs of their eth0.100 addresses: C's frames and D's frames to C cross the
# bridge (C has no same-host socket), D <-> E is a memory copy between their VMMs.
# tcpdump captures everything that crosses br0 for the whole run ($OUT/roce.pcap, 128 bytes of
# each frame); once the guests are done, this host counts in it, per pair and while both of its
# VMMs ran, the RoCE v1 frames (EtherType 0x8915), the RoCE v2 frames (UDP 4791) and both tagged
# with VLAN 100.
# Results: $OUT/roce.env (capture counts "cap.PAIR.KIND=N", VMM exits and panics),
# $OUT/roce-{a,b,c,d,e}-{serial,vmm}.log (the guests' results: see tests/guest/roce.sh; each VMM
# logs its device's counters when it exits), $OUT/roce-capture-*.txt (the first frames of each
# kind, decoded), $OUT/roce.pcap.

isolate_network

# The whole run, boots included: typically ~4-5 min; every program that hangs costs PROG_LIMIT.
ROCE_LIMIT=${ROCE_LIMIT:-1200}
PROG_LIMIT=${PROG_LIMIT:-60}
READY_WAIT=${READY_WAIT:-600}
RETRY_WAIT=${RETRY_WAIT:-60}
GATE_WAIT=${GATE_WAIT:-600}
PP_ITERS=${PP_ITERS:-50}
PING_COUNT=${PING_COUNT:-10}
# rping over the VLAN cannot connect (see tests/tests/roce.rs): long enough for several REQs.
CM_LIMIT=${CM_LIMIT:-30}
VLAN=100
HOST_IP=10.17.0.254
SIG_PORT=8000
declare -A MAC=([a]=52:54:00:17:00:01 [b]=52:54:00:17:00:02 [c]=52:54:00:17:00:03
  [d]=52:54:00:17:00:04 [e]=52:54:00:17:00:05)
declare -A PVRDMA=([a]='gid=roce-v1,local=off' [b]='gid=roce-v1,local=off' [c]='local=off' [d]='' [e]='')
GUESTS=(a b c d e)

start_clock "$ROCE_LIMIT"

l1_bridge br0
ip addr add "$HOST_IP/24" dev br0
for g in "${GUESTS[@]}"; do
  l1_tap "tap$g" br0
done

# Everything that crosses the bridge: in promiscuous mode br0 also passes up the frames it
# forwards between the TAPs. tcpdump stays root (-Z root) to write into $OUT.
tcpdump -i br0 -Z root -s 128 -U -w "$OUT/roce.pcap" > "$OUT/tcpdump.log" 2>&1 &
tcpdump_pid=$!
# It listens once it said so (or gave up).
wait_for_line "$OUT/tcpdump.log" 'listening on|tcpdump:' 30 "$tcpdump_pid" || true
record roce "tcpdump=$(grep -q 'listening on' "$OUT/tcpdump.log" && echo ok || echo fail)"

header="IP_A=10.17.0.1 IP_B=10.17.0.2 IP_C=10.17.0.3 IP_D=10.17.0.4 IP_E=10.17.0.5 HOST_IP=$HOST_IP
VLAN=$VLAN VIP_C=10.117.0.3 VIP_D=10.117.0.4 VIP_E=10.117.0.5 SIG_PORT=$SIG_PORT LIMIT=$PROG_LIMIT
READY_WAIT=$READY_WAIT RETRY_WAIT=$RETRY_WAIT GATE_WAIT=$GATE_WAIT PP_ITERS=$PP_ITERS PING_COUNT=$PING_COUNT
CM_LIMIT=$CM_LIMIT"
n=0
for g in "${GUESTS[@]}"; do
  n=$((n + 1))
  gid_type='RoCE v2'
  [[ ${PVRDMA[$g]} == *roce-v1* ]] && gid_type='IB/RoCE v1'
  guest_script_disk "$WORK/roce-$g-run.img" "$header ROLE=$g MY_IP=10.17.0.$n GID_TYPE='$gid_type'" \
    "$GUEST_SCRIPTS/roce.sh"
done

# One vCPU each: the guests share L1's single vCPU.
for g in "${GUESTS[@]}"; do
  run_guest "roce-$g" "$WORK/roce-$g-run.img" --pvrdma "tap=tap$g,mac=${MAC[$g]}${PVRDMA[$g]:+,${PVRDMA[$g]}}"
  declare "pid_$g=$VMM_PID"
done

# watch_pair X Y: writes to $WORK/end-XY when the first of X's and Y's VMMs ended (EPOCHREALTIME,
# the clock of tcpdump's time stamps, within 0.1 s): a pair's frames are counted until then, for
# once a VMM is gone a frame for it rightly takes the wire (a CM message of the other guest's
# kernel, say), even between VMMs that shared the same-host channel.
watch_pair() {
  local px=pid_$1 py=pid_$2
  (
    while kill -0 "${!px}" 2>/dev/null && kill -0 "${!py}" 2>/dev/null; do sleep 0.1; done
    echo "$EPOCHREALTIME" > "$WORK/end-$1$2"
  ) &
}
watch_pair a b
watch_pair c d
watch_pair d e

end_guests roce roce "${GUESTS[@]}"
kill -INT "$tcpdump_pid" 2>/dev/null || true
wait "$tcpdump_pid" || true

# count NAME FILTER [END]: frames of the capture that FILTER matches (captured before END, an
# EPOCHREALTIME), as roce.env's cap.NAME (reading a file, the filter sees 802.1Q tags in the frame:
# "udp port 4791" alone matches untagged frames only, "vlan 100 and udp port 4791" tagged ones).
# One line per frame starts with its time stamp (tcpdump adds a hex dump of protocols it does not
# decode, RoCE v1's among them).
count() {
  local n=error
  if tcpdump -r "$OUT/roce.pcap" -tt -nn "$2" > "$WORK/count.txt" 2>/dev/null; then
    n=$(awk -v end="${3:-}" '/^[0-9]/ && (end == "" || $1 < end + 0) { n++ } END { print n + 0 }' "$WORK/count.txt")
  fi
  record roce "cap.$1=$n"
}
# pair X Y: frames between guests X and Y, either way.
pair() { echo "ether host ${MAC[$1]} and ether host ${MAC[$2]}"; }
v2="udp port 4791"
v1="ether proto 0x8915"
roce="($v1 or $v2 or (vlan and ($v1 or $v2)))"
for p in ab cd de; do
  x=${p:0:1} y=${p:1:1}
  end=$(cat "$WORK/end-$p" 2>/dev/null) || end=
  record roce "cap.$p.end=${end:-none}"
  count "$p.v1" "$(pair "$x" "$y") and $v1" "$end"
  count "$p.v2" "$(pair "$x" "$y") and $v2" "$end"
  count "$p.vlan$VLAN.v1" "$(pair "$x" "$y") and vlan $VLAN and $v1" "$end"
  count "$p.vlan$VLAN.v2" "$(pair "$x" "$y") and vlan $VLAN and $v2" "$end"
  count "$p.vlan.any_roce" "$(pair "$x" "$y") and vlan and ($v1 or $v2)" "$end"
  count "$p.from_$x.roce" "ether src ${MAC[$x]} and ether dst ${MAC[$y]} and $roce" "$end"
  count "$p.from_$y.roce" "ether src ${MAC[$y]} and ether dst ${MAC[$x]} and $roce" "$end"
  # Also after the first of their VMMs ended (for the record).
  count "$p.all_roce" "$(pair "$x" "$y") and $roce"
done
count all "greater 0"
tcpdump -r "$OUT/roce.pcap" -nn -e -c 8 "$(pair a b) and $v1" > "$OUT/roce-capture-v1.txt" 2>&1 || true
tcpdump -r "$OUT/roce.pcap" -nn -e -c 8 "$(pair c d) and vlan $VLAN and $v2" > "$OUT/roce-capture-vlan.txt" 2>&1 || true

record roce "seconds=$(since "$t0")"
record_panics roce roce "${GUESTS[@]}"
log "roce: $(tr '\n' ' ' < "$OUT/roce.env")"
