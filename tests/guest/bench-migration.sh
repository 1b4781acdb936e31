# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh
# shellcheck disable=SC2153 # ROLE, MY_IP...: prepended by the scenario
# Guest side of tests/scenarios/bench-migration.sh (issue 6 benchmark): RDMA traffic between two
# L2 guests A and B (busybox sh, `pvtest=run`) through our PVRDMA device (vmw_pvrdma0), one cell
# after the other, while the test host live-migrates B. The test host drives the cells with
# signals (empty files served by busybox httpd on HOST_IP:SIG_PORT, polled with nc): the guests
# know the plan (CELLS), the test host says when each cell starts and when its traffic stops
# (after B's migration). The scenario prepends:
#   ROLE            a (runs the servers) | b (runs the clients; the guest being migrated)
#   MY_IP PEER_IP HOST_IP   eth0's address, the other guest's and the bridge's (/24)
#   SIG_PORT PAIR   the test host's signal server, and this pair's prefix of signal names:
#                   PAIR-start-N (begin cell N), PAIR-stop-N (end cell N's traffic), PAIR-end
#   CELLS           the cells in order, by their number of QPs: 0 = no traffic (B idle while it
#                   is migrated), N > 0 = `ib_write_bw -q N` from B (client) to A (server)
#   SIZE TX_DEPTH QP_TIMEOUT   ib_write_bw -s, -t and -u (the RC ACK timeout, 4.096 us * 2^N)
#   PORT_BASE       TCP port of cell N: PORT_BASE+N (a late client never meets an old server)
#   LIMIT           ib_write_bw -D (seconds): it runs until the stop signal, or this long
#   READY_WAIT      seconds the client tries again while it cannot connect (server not yet up),
#                   and the first set-up waits for the peer
#   STOP_WAIT       seconds a program may take to end after the stop signal (it destroys its QPs)
#   SIGNAL_WAIT     seconds a guest waits for the test host's next signal
#
# The traffic ends the way ib_write_bw's own -D timer ends it: SIGALRM moves its duration state
# machine on (measuring -> last margin -> end), so a client that gets one after the migration
# stops posting, reports and exits with its status after the 2 s margin. Its output goes to a
# file (256 QPs print 512 address lines, and every console byte is a trapped write), where stdio
# buffers it until it exits: so B tells that its traffic runs from its QPs, all in RTS (`rdma res
# show qp`; ib_write_bw posts right after). The console gets the output at the end, framed:
#   BENCH-MIG-GID dev=D idx=N gid=G mtu=M
#   BENCH-MIG-READY role=R                 set up, the peer answers pings
#   BENCH-MIG-IDLE cell=N qps=0            a 0-QP cell: nothing runs
#   BENCH-MIG-TRAFFIC cell=N qps=Q attempts=K   B: the client's QPs are all in RTS: it posts
#   BENCH-MIG-STOP cell=N                  the stop signal came; SIGALRM sent
#   BENCH-MIG-BEGIN cell=N side=S ... BENCH-MIG-END cell=N qps=Q side=S rc=R connected=C
#     the program's output without its per-QP address and GID lines, then its exit status and how many
#     QPs it connected (its "remote address" lines)
#   BENCH-MIG-DONE role=R
# A failed program is a result (its rc), not the end of the script; a set-up failure prints
# BENCH-MIG-FAIL and ends the script with status 1.

say() { echo "BENCH-MIG-$*"; }
fail() {
  say "FAIL role=$ROLE $*"
  driver_log
  exit 1
}

# rts_qps: how many RC QPs of ib_write_bw are in RTS (rdma's resource tracking; the state is the
# device's answer to QUERY_QP).
rts_qps() {
  rdma res show qp link "$DEV/1" 2> /dev/null | awk '/type RC / && /state RTS / && /ib_write_bw/ { n++ } END { print n + 0 }'
}

# report CELL QPS SIDE RC LOG: the program's output without its per-QP address and GID lines,
# framed.
report() {
  say "BEGIN cell=$1 side=$3"
  grep -vE 'local address|remote address|^ *GID: ' "$5" | tail -n 40
  say "END cell=$1 qps=$2 side=$3 rc=$4 connected=$(grep -c 'remote address' "$5")"
}

# traffic CELL QPS: one cell's ib_write_bw. A serves; B connects (again while the server is not
# listening yet, for READY_WAIT at most), says when its traffic runs, and ends it with SIGALRM on
# the stop signal. Both sides are bounded: the program by -D LIMIT (and `timeout`), a side whose
# peer never shows up by the stop signal (plus 60 s).
traffic() {
  _cell=$1 _qps=$2
  _log=/tmp/cell-$_cell.log
  set -- ib_write_bw -d "$DEV" -x "$GIDX" -F -q "$_qps" -s "$SIZE" -t "$TX_DEPTH" -u "$QP_TIMEOUT" -D "$LIMIT" -p $((PORT_BASE + _cell))
  _side=server
  _attempts=1
  if [ "$ROLE" = a ]; then
    timeout $((LIMIT + 60)) "$@" > "$_log" 2>&1 &
    _pid=$!
  else
    _side=client
    _end=$(($(now) + READY_WAIT))
    while :; do
      timeout $((LIMIT + 60)) "$@" "$PEER_IP" > "$_log" 2>&1 &
      _pid=$!
      # Until all its QPs are in RTS (it posts right after), the program ends, or READY_WAIT.
      until [ "$(rts_qps)" -ge "$_qps" ] || ! kill -0 "$_pid" 2> /dev/null || [ "$(now)" -ge "$_end" ]; do
        sleep 1
      done
      if kill -0 "$_pid" 2> /dev/null && [ "$(rts_qps)" -ge "$_qps" ]; then
        say "TRAFFIC cell=$_cell qps=$_qps attempts=$_attempts"
        break
      fi
      if kill -0 "$_pid" 2> /dev/null; then
        echo "bench-migration: $(rts_qps) of $_qps QPs in RTS after $READY_WAIT s: killing the client"
        kill -KILL "$_pid" 2> /dev/null
        break
      fi
      wait "$_pid"
      _rc=$?
      if ! grep -q "Couldn't connect to" "$_log" || [ "$(now)" -ge "$_end" ]; then
        report "$_cell" "$_qps" client "$_rc" "$_log"
        return 0
      fi
      _attempts=$((_attempts + 1))
      sleep 1
    done
  fi
  # Until the program ends; on the stop signal, B's client gets SIGALRM (once more every 10 s if
  # it is still measuring), and after STOP_WAIT s more either side's program is killed.
  _stopped=
  while kill -0 "$_pid" 2> /dev/null; do
    if [ -z "$_stopped" ] && has_host_signal "$PAIR-stop-$_cell"; then
      _stopped=$(now)
      [ "$ROLE" = b ] && kill -ALRM "$_pid" 2> /dev/null
      say "STOP cell=$_cell"
    elif [ -n "$_stopped" ]; then
      _for=$(($(now) - _stopped))
      if [ "$_for" -ge "$STOP_WAIT" ]; then
        echo "bench-migration: $_side still running $STOP_WAIT s after the stop signal: killing it"
        kill -KILL "$_pid" 2> /dev/null
      elif [ "$ROLE" = b ] && [ "$_for" -gt 0 ] && [ $((_for % 10)) = 0 ]; then
        kill -ALRM "$_pid" 2> /dev/null
      fi
    fi
    sleep 1
  done
  wait "$_pid"
  report "$_cell" "$_qps" "$_side" $? "$_log"
}

ip link set lo up
ip link set eth0 up || fail "ip link set eth0 up"
ip addr add "$MY_IP/24" dev eth0 || fail "ip addr add $MY_IP"
retry 30 carrier_up || fail "eth0 has no carrier after 30 s"
retry 120 ping -c 1 -W 1 "$HOST_IP" || fail "no ping answer from the test host $HOST_IP"

DEV=vmw_pvrdma0
device_ready
retry "$READY_WAIT" ping -c 1 -W 1 "$PEER_IP" || fail "no ping answer from the peer $PEER_IP"
say "READY role=$ROLE"

n=0
for qps in $CELLS; do
  n=$((n + 1))
  got=$(wait_host_signal "$SIGNAL_WAIT" "$PAIR-start-$n" "$PAIR-end") || fail "no start signal for cell $n after $SIGNAL_WAIT s"
  # The test host gave up on this pair.
  [ "$got" = "$PAIR-end" ] && break
  if [ "$qps" = 0 ]; then
    say "IDLE cell=$n qps=0"
  else
    traffic "$n" "$qps"
  fi
done
wait_host_signal "$SIGNAL_WAIT" "$PAIR-end" > /dev/null || echo "bench-migration: no end signal after $SIGNAL_WAIT s"
say "DONE role=$ROLE"
