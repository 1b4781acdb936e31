# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# shellcheck disable=SC2034 # pid_*: read through ${!pid_var}
# Scenario of tests/tests/migration_peers.rs (issue 6): guest B is live-migrated twice, each time
# while a different kind of peer keeps it busy (tests/guest/migration-peers.sh):
#   1. Linux Soft-RoCE on this host (rxe0 on bridge br0, 10.16.0.254) runs the servers of
#      ibv_rc_pingpong -c and rping -V; B runs the clients. B migrates to B2 over TCP. The
#      unmodified Soft-RoCE peer must not notice: both programs finish with their data checked.
#   2. Guest A (10.16.0.1, same host: shared-memory channel) streams RDMA WRITEs into B's memory
#      with pvrdma-write-check while B's CPU rewrites memory of its own; every round is verified by
#      checksum and pattern wherever B runs. B2 migrates to B3 over a Unix socket mid-stream: a page
#      written by the device or the CPU and not sent again shows as a failed round. A and B have
#      share_memory=on (issue 15; B2 and B3 inherit it with B's configuration): the stream takes
#      the one-copy path, B2 and B3 each map the view of A's memory that A hands over with a new
#      ring (migration.sh keeps a same-host peer with the option off). B's PVRDMA worker is kept
#      on host CPU 0 (worker_cpus=), which B2 and B3 inherit too.
# Results: $OUT/migration-peers.env, the consoles $OUT/peers-{a,b,b2,b3}-serial.log, the VMM logs
# $OUT/peers-*-vmm.log, pvrdma-remote's output $OUT/peers-*-remote.log, the Soft-RoCE side's
# $OUT/peers-rxe-{pp,rping}.log.

isolate_network

PEERS_LIMIT=${PEERS_LIMIT:-900}
PP_ITERS=${PP_ITERS:-6000}
RPING_COUNT=${RPING_COUNT:-1200}
WRITE_MIB=${WRITE_MIB:-8}
WRITE_SECONDS=${WRITE_SECONDS:-60}
HOST_IP=10.16.0.254
MAC_B=52:54:00:16:00:02

start_clock "$PEERS_LIMIT"

l1_bridge br0
ip addr add "$HOST_IP/24" dev br0
for t in tapa tapb tapb2 tapb3; do l1_tap "$t" br0; done
rxe_ok=0
if modprobe rdma_rxe && rdma link add rxe0 type rxe netdev br0; then
  rxe_ok=1
fi
record migration-peers "rxe_setup=$rxe_ok"

header="HOST_IP=$HOST_IP PP_ITERS=$PP_ITERS RPING_COUNT=$RPING_COUNT WRITE_MIB=$WRITE_MIB WRITE_SECONDS=$WRITE_SECONDS"
guest_script_disk "$WORK/peers-a-run.img" "$header ROLE=a MY_IP=10.16.0.1 PEER_IP=10.16.0.2" "$GUEST_SCRIPTS/migration-peers.sh"
guest_script_disk "$WORK/peers-b-run.img" "$header ROLE=b MY_IP=10.16.0.2 PEER_IP=10.16.0.1" "$GUEST_SCRIPTS/migration-peers.sh"

run_guest peers-a "$WORK/peers-a-run.img" --pvrdma "tap=tapa,mac=52:54:00:16:00:01,share_memory=on"
pid_a=$VMM_PID
run_guest peers-b "$WORK/peers-b-run.img" --pvrdma "tap=tapb,mac=$MAC_B,share_memory=on,worker_cpus=[0]" --api-socket "$WORK/peers-b.api"
pid_b=$VMM_PID

# Soft-RoCE's servers, once its port is active with the RoCE v2 GID of HOST_IP (the bridge has
# carrier once a VMM is on a TAP).
RXE_GIDX=''
if ((rxe_ok)); then
  RXE_GIDX=$(wait_rxe_gid rxe0 "$HOST_IP" 120) || RXE_GIDX=''
fi
record migration-peers "rxe_gid_index=${RXE_GIDX:-none}"
if [[ -n $RXE_GIDX ]]; then
  timeout 900 ibv_rc_pingpong -d rxe0 -g "$RXE_GIDX" -c -n "$PP_ITERS" -s 4096 -p 18801 > "$OUT/peers-rxe-pp.log" 2>&1 &
  pid_rxe_pp=$!
  timeout 900 rping -s -a "$HOST_IP" -p 18802 -V -C "$RPING_COUNT" > "$OUT/peers-rxe-rping.log" 2>&1 &
  pid_rxe_rping=$!
fi

# migrate FROM TO URL: B's VM from VMM FROM to a new receiver VMM TO (with TAP tapTO), through
# pvrdma-remote on both API sockets; records FROM's and TO's remote exit statuses. Sets VMM_PID to
# TO's process.
migrate() {
  local from=$1 to=$2 url=$3
  start_receiver "peers-$to" "$WORK/peers-$to.api"
  record migration-peers "${to}_receive_rc=$(remote_cmd "peers-$to" --api-socket "$WORK/peers-$to.api" receive-migration "$url" --tap "$MAC_B=tap$to" --disk-dir "$WORK" --no-wait)"
  record migration-peers "${to}_send_rc=$(remote_cmd "peers-$from-to-$to" --api-socket "$WORK/peers-$from.api" send-migration "$url" --downtime-ms 300)"
}

# 1. Soft-RoCE peer.
wait_for_line "$OUT/peers-b-serial.log" 'MIGPEER-TRAFFIC' "$(remaining)" "$pid_b" || record migration-peers "traffic=never-started"
sleep 5
migrate b b2 tcp:127.0.0.1:6701
pid_b2=$VMM_PID
wait_for_exit "$pid_b" 30
record migration-peers "b_exit=$EXIT_STATUS"
for p in pp rping; do
  pid_var=pid_rxe_$p
  if [[ -n ${!pid_var:-} ]]; then
    wait_for_exit "${!pid_var}" "$(remaining)"
    record migration-peers "rxe_${p}_rc=$EXIT_STATUS"
  fi
done

# 2. RDMA WRITE stream from A, while B's CPU writes too.
wait_for_line "$OUT/peers-b2-serial.log" 'WRITE-CHECK-CONNECTED|MIGPEER-FAIL' "$(remaining)" "$pid_b2" || record migration-peers "writes=never-started"
sleep 5
migrate b2 b3 "unix:$WORK/peers-b3.sock"
pid_b3=$VMM_PID
wait_for_exit "$pid_b2" 30
record migration-peers "b2_exit=$EXIT_STATUS"

end_guests migration-peers peers a b3
record migration-peers "seconds=$(since "$t0")"
record_panics migration-peers peers a b b2 b3
log "migration-peers: $(tr '\n' ' ' < "$OUT/migration-peers.env")"
