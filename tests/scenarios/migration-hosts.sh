# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Scenario of tests/tests/migration_hosts.rs (issue 6): live migration between two machines, with
# traffic. It runs on BOTH test hosts of a pair (e2e::testhost::Hosts::Pair), each with a bridge
# br0 that spans both over their cable (eth0); PVRDMA_HOST says which one this is:
#   a (10.15.0.253): guests A (10.15.0.1) and B (10.15.0.2) run ibv_rc_pingpong -c and rping -V
#      against each other (scripts/demo-guest.sh); mid-run B is migrated to host b over TCP with
#      TLS (certificates of a CA that host b makes in $OUT/tls before it listens);
#   b (10.15.0.254): a VMM waiting for the migration, which then runs B as B2 on its TAP tapb
#      (--tap), and B's disk from the storage both hosts share (/share/disks, allowed with
#      --disk-dir; a migration without storage copy needs it). From then on A and B2 talk
#      RoCE v2 over the cable.
# Hosts meet in $OUT (/share, seen by both): b writes hosts-b2-listening once its VMM receives;
# a writes hosts-a-sent (send-migration's exit status) and hosts-a-done when A has finished.
# Results: $OUT/migration-hosts-{a,b}.env (each host's records: two machines appending to one file
# over 9p could overwrite each other's lines), the consoles hosts-{a,b,b2}-serial.log, the VMM
# logs hosts-*-vmm.log, pvrdma-remote's output hosts-*-remote.log.

HOSTS_LIMIT=${HOSTS_LIMIT:-900}
PP_ITERS=${PP_ITERS:-12000}
RPING_COUNT=${RPING_COUNT:-2000}
MAC_A=52:54:00:15:00:01
MAC_B=52:54:00:15:00:02
HOST_B_IP=10.15.0.254
PORT=6700
TLS=$OUT/tls

start_clock "$HOSTS_LIMIT"
rec() { record "migration-hosts-$PVRDMA_HOST" "$@"; }

l1_bridge br0
l1_link br0

# RoCE v2 frames (UDP 4791) this host sends over the cable (eth0) are counted apart from the rest
# (frame_counter). The cable's own frame counters would not do: the migration stream
# alone is hundreds of thousands of frames.
modprobe -a sch_prio cls_u32 || true
if frame_counter eth0; then
  rec "cable_counter_$PVRDMA_HOST=ok"
else
  rec "cable_counter_$PVRDMA_HOST=failed"
fi

# link_counters NAME: the RoCE v2 frames this host sent over the cable so far, recorded as
# NAME_roce_tx, and the cable's frame counters (everything), as NAME_{rx,tx}_packets.
link_counters() {
  rec "$1_roce_tx=$(frames_counted eth0)" \
    "$1_rx_packets=$(cat /sys/class/net/eth0/statistics/rx_packets)" \
    "$1_tx_packets=$(cat /sys/class/net/eth0/statistics/tx_packets)"
}

# wait_for_file PATH: until host b or a writes PATH, within the scenario's time.
wait_for_file() {
  wait_for_path "$1" "$(remaining)"
}

# make_tls: a CA in $TLS and, signed by it, host b's certificate (IP SAN $HOST_B_IP, which
# send-migration checks) and host a's (which receive-migration requires), keys beside them.
make_tls() {
  mkdir -p "$TLS"
  local key=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
  openssl req -x509 "${key[@]}" -days 2 -subj /CN=migration-hosts-ca -keyout "$TLS/ca-key.pem" \
    -out "$TLS/ca.pem" -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign,cRLSign 2> "$TLS/openssl.log"
  local end ip
  for end in a b; do
    ip=10.15.0.253
    [[ $end == b ]] && ip=$HOST_B_IP
    openssl req "${key[@]}" -subj "/CN=host-$end" -keyout "$TLS/$end-key.pem" -out "$WORK/$end.csr" \
      2>> "$TLS/openssl.log"
    # A file, not <(...): the test host's /dev has no /dev/fd.
    printf '%s\n' "subjectAltName=IP:$ip" basicConstraints=CA:FALSE \
      extendedKeyUsage=serverAuth,clientAuth > "$WORK/$end.ext"
    openssl x509 -req -in "$WORK/$end.csr" -CA "$TLS/ca.pem" -CAkey "$TLS/ca-key.pem" -CAcreateserial \
      -days 2 -out "$TLS/$end.pem" -extfile "$WORK/$end.ext" 2>> "$TLS/openssl.log"
  done
}

host_a() {
  ip addr add 10.15.0.253/24 dev br0
  l1_tap tapa br0
  l1_tap tapb br0
  # The cable works before anything rides on it (host b may still be booting).
  local i
  for ((i = 0; i < 60; i++)); do
    ping -c 1 -W 1 "$HOST_B_IP" > /dev/null 2>&1 && break
  done
  rec "link_ping=$(ping -c 3 -W 2 "$HOST_B_IP" > /dev/null 2>&1 && echo ok || echo failed)"

  local iters="PP_ITERS=$PP_ITERS RPING_COUNT=$RPING_COUNT"
  local guest=$E2E_RESOURCES/../scripts/demo-guest.sh
  guest_script_disk "$WORK/hosts-a-run.img" "ROLE=server MY_IP=10.15.0.1 PEER_IP=10.15.0.2 $iters" "$guest"
  mkdir -p "$OUT/disks"
  guest_script_disk "$OUT/disks/hosts-b-run.img" "ROLE=client MY_IP=10.15.0.2 PEER_IP=10.15.0.1 $iters" "$guest"
  run_guest hosts-a "$WORK/hosts-a-run.img" --pvrdma "tap=tapa,mac=$MAC_A"
  local pid_a=$VMM_PID
  # 256 MiB: the migration crosses the emulated cable over TLS, which TCG makes slow (2.4 MiB/s
  # on a loaded machine, 2026-11-26), and the suite is about the move, not the memory size.
  VMM_MEMORY=256M run_guest hosts-b "$OUT/disks/hosts-b-run.img" --pvrdma "tap=tapb,mac=$MAC_B" --api-socket "$WORK/b.api"
  local pid_b=$VMM_PID

  if wait_for_line "$OUT/hosts-b-serial.log" 'DEMO-TRAFFIC' "$(remaining)" "$pid_b"; then
    sleep 5
    link_counters a_before
    wait_for_file "$OUT/hosts-b2-listening" || true
    local t_mig rc
    t_mig=$(now_us)
    rc=$(remote_cmd hosts-send --api-socket "$WORK/b.api" send-migration "tcp:$HOST_B_IP:$PORT" --downtime-ms 300 \
      --tls-cert "$TLS/a.pem" --tls-key "$TLS/a-key.pem" --tls-ca "$TLS/ca.pem")
    echo "$rc" > "$OUT/hosts-a-sent"
    rec "send_rc=$rc" "migration_seconds=$(since "$t_mig")"
  else
    rec "traffic=never-started"
    echo never-started > "$OUT/hosts-a-sent"
  fi
  wait_for_exit "$pid_b" 30
  rec "source_exit=$EXIT_STATUS"
  wait_for_line "$OUT/hosts-a-serial.log" 'GUEST-POWEROFF' "$(remaining)" "$pid_a" || true
  wait_for_exit "$pid_a" 60
  rec "a_exit=$EXIT_STATUS"
  link_counters a_after
  touch "$OUT/hosts-a-done"
  for g in a b; do
    rec "${g}_panics=$(panics "$OUT/hosts-$g-vmm.log")"
  done
}

host_b() {
  ip addr add "$HOST_B_IP/24" dev br0
  l1_tap tapb br0
  start_receiver hosts-b2 "$WORK/b2.api"
  local pid_b2=$VMM_PID
  local rc
  make_tls
  # Host a writes B's disk there later; an allowed directory must exist when receiving starts.
  mkdir -p "$OUT/disks"
  rc=$(remote_cmd hosts-b2 --api-socket "$WORK/b2.api" receive-migration "tcp:$HOST_B_IP:$PORT" \
    --tap "$MAC_B=tapb" --disk-dir "$OUT/disks" \
    --tls-cert "$TLS/b.pem" --tls-key "$TLS/b-key.pem" --tls-ca "$TLS/ca.pem" --no-wait)
  rec "receive_rc=$rc"
  touch "$OUT/hosts-b2-listening"

  # B2 runs until its guest powers off. If the migration failed, or A's programs did, B2 cannot
  # finish: it is shut down over the API, so that its VMM logs its counters.
  wait_for_file "$OUT/hosts-a-sent" || true
  local ended=''
  while [[ -z $ended ]]; do
    if grep -q 'GUEST-POWEROFF' "$OUT/hosts-b2-serial.log" 2>/dev/null || ! kill -0 "$pid_b2" 2>/dev/null; then
      ended=1
    elif [[ $(cat "$OUT/hosts-a-sent" 2>/dev/null) != 0 ]] ||
      { [[ -e $OUT/hosts-a-done ]] && grep -q 'DEMO-FAIL' "$OUT/hosts-a-serial.log"; } ||
      (($(remaining) <= 30)); then
      log "B2 cannot finish: shutting it down"
      timeout 10 "$PVRDMA_REMOTE_BIN" --api-socket "$WORK/b2.api" shutdown > /dev/null 2>&1 || true
      ended=1
    else
      sleep 1
    fi
  done
  wait_for_exit "$pid_b2" 60
  rec "b2_exit=$EXIT_STATUS"
  link_counters b
  rec "b2_panics=$(panics "$OUT/hosts-b2-vmm.log")"
  # Host a powers off once A is done; the pair ends with the later of the two.
  wait_for_file "$OUT/hosts-a-done" || true
}

case ${PVRDMA_HOST:-} in
  a) host_a ;;
  b) host_b ;;
  *) log "PVRDMA_HOST must be a or b (this scenario runs on a pair of test hosts), got '${PVRDMA_HOST:-}'"; exit 1 ;;
esac
log "host $PVRDMA_HOST done after $(since "$t0") s"
