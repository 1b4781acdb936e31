# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Scenario of tests/tests/net.rs (issue 3): two guests, each with a vmxnet3 NIC on a TAP (--net),
# on one Linux bridge of this host, run tests/guest/net.sh at the same time:
#   A (10.10.0.1): its TAP "tapa" created by the VMM with mtu=9000 (this script then adds it to
#                  the bridge and brings it up); receives 64 MiB over TCP at MTU 1500 and again at
#                  MTU 9000, watches B's link go down and up, sees B's new MAC in its neighbour table
#   B (10.10.0.2): its TAP "tapb" made here; sends, takes its link down and up, sets MTU 9000 (both
#                  do) and changes its MAC
# This script watches the bridge's forwarding database for B's new MAC and tells B it has looked
# (address 10.10.3.1 on the bridge). Results: $OUT/net.env, $OUT/net-{a,b}-{serial,vmm}.log,
# $OUT/net-fdb.txt; the guests' markers are described in tests/guest/net.sh.

isolate_network

# Both guests' whole run, boot included; typically ~3 min with one L1 vCPU shared by both.
NET_LIMIT=${NET_LIMIT:-480}
MAC_A=52:54:00:0a:00:01
MAC_B=52:54:00:0b:00:02
NEW_MAC_B=52:54:00:0b:00:99
DATA_MB=${DATA_MB:-64}

t0=$(now_us)
l1_bridge br0
ip addr add 10.10.0.254/16 dev br0
l1_tap tapb br0
ip link set tapb mtu 9000

header="MODE=test PORT=5001 DATA_MB=$DATA_MB HOST_SIG=3 DOWN_WINDOW=8 NEW_MAC=$NEW_MAC_B"
guest_script_disk "$WORK/net-a-run.img" "$header ROLE=a MY_IP=10.10.0.1 PEER_IP=10.10.0.2 MY_SIG=1 PEER_SIG=2" "$GUEST_SCRIPTS/net.sh"
guest_script_disk "$WORK/net-b-run.img" "$header ROLE=b MY_IP=10.10.0.2 PEER_IP=10.10.0.1 MY_SIG=2 PEER_SIG=1" "$GUEST_SCRIPTS/net.sh"

# One vCPU each: both guests share L1's single vCPU.
cmdline="$GUEST_CMDLINE pvtest=run pvrun=/dev/vda pvmods=vmxnet3"
VMM_CPUS=1 start_vmm net-a --cmdline "$cmdline" --disk "path=$WORK/net-a-run.img,readonly=on" \
  --serial "file=$OUT/net-a-serial.log" --net "tap=tapa,mac=$MAC_A,mtu=9000"
pid_a=$VMM_PID
VMM_CPUS=1 start_vmm net-b --cmdline "$cmdline" --disk "path=$WORK/net-b-run.img,readonly=on" \
  --serial "file=$OUT/net-b-serial.log" --net "tap=tapb,mac=$MAC_B"
pid_b=$VMM_PID

# The TAP A's VMM creates: down until this host brings it up, with the MTU it was asked for. Read
# once the VMM says the NIC is on it: the interface exists a moment before its MTU is set.
if wait_for_line "$OUT/net-a-vmm.log" 'vmxnet3 on TAP tapa ' 60 "$pid_a" && [[ -e /sys/class/net/tapa ]]; then
  record net "tapa_created_mtu=$(</sys/class/net/tapa/mtu)" "tapa_created_flags=$(</sys/class/net/tapa/flags)"
  ip link set tapa master br0
  ip link set tapa up
else
  record net "tapa_created_mtu=none"
fi
ip link set br0 mtu 9000
record net "br0_mtu=$(</sys/class/net/br0/mtu)" "tapb_mtu=$(</sys/class/net/tapb/mtu)"

# After B's MAC change: the bridge must learn the new MAC on B's port.
if wait_for_line "$OUT/net-b-serial.log" 'NET-MAC-SET ' "$NET_LIMIT" "$pid_b"; then
  deadline=$(($(now_us) + 60 * 1000000))
  until bridge fdb show br br0 | grep -qi "^$NEW_MAC_B dev tapb "; do
    (($(now_us) < deadline)) || break
    sleep 0.5
  done
  bridge fdb show br br0 > "$OUT/net-fdb.txt"
  port=$(awk -v m="$NEW_MAC_B" 'tolower($1) == m && $2 == "dev" {print $3; exit}' "$OUT/net-fdb.txt")
  record net "fdb_new_mac_port=${port:-missing}"
  ip addr add 10.10.3.1/16 dev br0
else
  record net "fdb_new_mac_port=not-reached"
fi

wait_for_exit "$pid_a" "$NET_LIMIT"
record net "a_exit=$EXIT_STATUS"
wait_for_exit "$pid_b" 60
record net "b_exit=$EXIT_STATUS" "seconds=$(since "$t0")"
log "net: $(tr '\n' ' ' < "$OUT/net.env")"
