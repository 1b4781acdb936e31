# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh
# shellcheck disable=SC2153 # ROLE, MY_IP...: prepended by the scenario
# Guest side of tests/scenarios/rdma.sh (issue 5): RDMA traffic through the PVRDMA device with
# the unmodified tools (rdma-core's pingpongs, perftest, rping). Runs in each of three guests A, B
# and C (busybox sh, `pvtest=run`) whose --pvrdma slots sit on one bridge of the test host (L1),
# which also runs Linux Soft-RoCE (rxe0 on the bridge). The scenario prepends:
#   ROLE            a | b | c
#   MY_IP           eth0's address (/24); IP_A IP_B IP_C HOST_IP: the guests' and the bridge's
#   SIG_PORT        TCP port of each party's signal server (below)
#   LIMIT           seconds any one RDMA program may run (it is killed then: `timeout`)
#   READY_WAIT      seconds a client waits for its server to listen
#   RETRY_WAIT      seconds a client tries again while it cannot connect
#   GATE_WAIT       seconds a server waits for its client to reach the step, and a step for the
#                   test host's go-ahead (loss steps: netem is on)
#   PP_ITERS PERF_ITERS PING_COUNT  iteration counts (pingpongs, perftest, rping)
#   LOSS_PP_ITERS   iterations of the pingpong under loss (enough frames for netem to hit)
#
# The steps run in the order of the table at the end; each has a server party, a client party
# (a, b, c, or l for L1) and a TCP port (or rdma_cm port) of its own. A party not in a step skips it.
#   client: signals "at-STEP" (it is done with its previous step)
#   server: waits for "at-STEP" (or "skip-STEP": the client will not run) at the client, starts the program (bounded by LIMIT), waits until
#           it listens (its TCP port, or its
#           rdma_cm ID in LISTEN), then signals "ready-STEP" (or "skip-STEP" if it never
#           listened) and waits for the program to end
#   client: waits for "ready-STEP"/"skip-STEP" at the server, then runs the program (bounded by
#           LIMIT), again while it fails only because it could not connect, for RETRY_WAIT at most
# Signals between the guests: empty files under /tmp/sig served by busybox httpd on SIG_PORT,
# polled with nc (addresses as signals would add GIDs to the device under test). The test host
# serves its own (gates, and its rxe servers); it reads the guests' serial consoles for theirs.
#
# Output, parsed by tests/tests/rdma.rs:
#   RDMA-GID idx=N gid=G type=T      the GID index used: the RoCE v2 GID of MY_IP
#   RDMA-AT step=S                   this party reached step S
#   RDMA-READY step=S | RDMA-NOTREADY step=S   server side: listening, or not
#   SECTION-BEGIN S-SIDE ... SECTION-END S-SIDE rc=N   the program's whole output (SIDE: server,
#                                    client; a client's retries one after the other, separated by
#                                    RDMA-RETRY lines); N is its exit status, "none" if it never ran
#   RDMA-RESULT step=S side=SIDE rc=N secs=T attempts=K [why=...]
#   RDMA-DONE role=R                 every step was gone through
#   RDMA-ALIVE role=R uptime=S       every 30 s (also inside sections)
# A failed RDMA program is a result, not the end of the script; a set-up failure (no network, no
# device, no GID) prints "RDMA-FAIL <why>" and ends the script with status 1.

DEV=vmw_pvrdma0
SIG_DIR=/tmp/sig
# A client failing with one of these could not reach a listening server (yet): worth another try.
RETRY_RE="Couldn't connect to|RDMA_CM_EVENT_REJECTED"

say() { echo "RDMA-$*"; }
fail() {
  say "FAIL role=$ROLE $*"
  driver_log
  exit 1
}

ip_of() {
  case $1 in
    a) echo "$IP_A" ;;
    b) echo "$IP_B" ;;
    c) echo "$IP_C" ;;
    l) echo "$HOST_IP" ;;
  esac
}

signal() { : > "$SIG_DIR/$1"; }
# has_signal HOST NAME: HOST's signal server has NAME (HTTP by hand: this static busybox's wget
# crashes).
has_signal() {
  printf 'GET /%s HTTP/1.0\r\n\r\n' "$2" | timeout 5 nc -w 3 "$1" "$SIG_PORT" 2> /dev/null | head -n 1 | grep -q ' 200 '
}

# wait_signal SECS HOST NAME...: until HOST serves one of the NAMEs; prints that one.
wait_signal() {
  _end=$(($(now) + $1))
  _host=$2
  shift 2
  while :; do
    for _s in "$@"; do
      if has_signal "$_host" "$_s"; then
        echo "$_s"
        return 0
      fi
    done
    [ "$(now)" -lt "$_end" ] || return 1
    sleep 0.5
  done
}

# listening KIND PORT: a server of this guest listens: KIND tcp: a TCP socket (IPv4 or IPv6) in
# LISTEN on PORT; KIND cm or cmep: an rdma_cm ID in LISTEN on PORT.
listening() {
  case $1 in
    tcp)
      _hex=$(printf '%04X' "$2")
      cat /proc/net/tcp /proc/net/tcp6 2> /dev/null | awk -v p=":$_hex" '$4 == "0A" && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }'
      ;;
    cm | cmep) rdma resource show cm_id 2> /dev/null | grep 'LISTEN' | grep -qE ":$2( |\$)" ;;
  esac
}

# result STEP SIDE RC SECS ATTEMPTS [WHY]: the result line.
result() {
  say "RESULT step=$1 side=$2 rc=$3 secs=$4 attempts=$5${6:+ why=$6}"
}

# not_run STEP SIDE WHY: a side that did not run its program: an empty section and the result.
not_run() {
  echo "SECTION-BEGIN $1-$2"
  echo "SECTION-END $1-$2 rc=none"
  result "$1" "$2" none 0 0 "$3"
}

# The programs write straight to the console: to a terminal their stdout is line-buffered, so a
# program killed by `timeout` still leaves everything it printed (into a file or a pipe, stdio
# would keep it in a buffer that dies with the program). Only one program runs at a time here.

# serve STEP KIND PORT CMD...: the server side of a step.
serve() {
  _step=$1 _kind=$2 _port=$3
  shift 3
  [ "$_kind" = cm ] && set -- "$@" -s -a "$MY_IP"
  [ "$_kind" = cmep ] && set -- "$@" -b "$MY_IP"
  _t0=$(now)
  echo "SECTION-BEGIN $_step-server"
  timeout "$LIMIT" "$@" &
  _pid=$!
  _ready=0
  _end=$(($(now) + READY_WAIT))
  while kill -0 "$_pid" 2> /dev/null && [ "$(now)" -lt "$_end" ]; do
    if listening "$_kind" "$_port"; then
      _ready=1
      break
    fi
    sleep 0.2
  done
  if [ $_ready = 1 ]; then
    signal "ready-$_step"
    say "READY step=$_step"
  else
    signal "skip-$_step"
    say "NOTREADY step=$_step"
    kill "$_pid" 2> /dev/null
  fi
  wait "$_pid"
  _rc=$?
  echo "SECTION-END $_step-server rc=$_rc"
  if [ $_ready = 1 ]; then
    result "$_step" server "$_rc" $(($(now) - _t0)) 1
  else
    result "$_step" server "$_rc" $(($(now) - _t0)) 1 "never-listened"
  fi
}

# connect STEP SERVER KIND CMD...: the client side of a step whose server party is SERVER. Its
# stderr (where the programs report a failed connection) also goes to a file, to decide on a retry.
connect() {
  _step=$1 _kind=$3
  _sip=$(ip_of "$2")
  shift 3
  _err=/tmp/$_step-client.err
  _t0=$(now)
  _got=$(wait_signal "$READY_WAIT" "$_sip" "ready-$_step" "skip-$_step") || _got=nothing
  if [ "$_got" != "ready-$_step" ]; then
    not_run "$_step" client "server-not-ready($_got)"
    return 0
  fi
  case $_kind in
    tcp) set -- "$@" "$_sip" ;;
    cm) set -- "$@" -c -V -a "$_sip" ;;
    cmep) set -- "$@" -s "$_sip" ;;
  esac
  echo "SECTION-BEGIN $_step-client"
  _attempts=0
  _end=$(($(now) + RETRY_WAIT))
  while :; do
    _attempts=$((_attempts + 1))
    _t0=$(now)
    timeout "$LIMIT" "$@" 2> "$_err"
    _rc=$?
    cat "$_err"
    if [ $_rc -eq 0 ] || ! grep -qE "$RETRY_RE" "$_err" || [ "$(now)" -ge "$_end" ]; then
      break
    fi
    echo "RDMA-RETRY step=$_step attempt=$_attempts"
    sleep 1
  done
  echo "SECTION-END $_step-client rc=$_rc"
  result "$_step" client "$_rc" $(($(now) - _t0)) "$_attempts"
}

# step NAME SERVER CLIENT GATE KIND PORT CMD...: one program between two parties. GATE: "-" or a
# signal of the test host both sides wait for first. KIND: tcp (the client gets the server's
# address as its last argument), cm (rping: -s/-c -a ADDR added) or cmep (librdmacm's examples:
# the server gets -b OWN_ADDR, the client -s SERVER_ADDR).
step() {
  _name=$1 _srv=$2 _cli=$3 _gate=$4 _kind=$5 _port=$6
  shift 6
  if [ "$ROLE" = "$_srv" ]; then _side=server; elif [ "$ROLE" = "$_cli" ]; then _side=client; else return 0; fi
  say "AT step=$_name"
  if [ "$_gate" != - ] && ! wait_signal "$GATE_WAIT" "$HOST_IP" "$_gate" > /dev/null; then
    signal "skip-$_name"
    [ $_side = server ] && say "NOTREADY step=$_name"
    not_run "$_name" $_side "no-gate($_gate)"
    return 0
  fi
  if [ $_side = server ]; then
    # Start only once the client is here: its previous step (which may have hung until its
    # LIMIT) is over, so that this program's LIMIT is all for this step.
    _got=$(wait_signal "$GATE_WAIT" "$(ip_of "$_cli")" "at-$_name" "skip-$_name") || _got=nothing
    if [ "$_got" != "at-$_name" ]; then
      signal "skip-$_name"
      say "NOTREADY step=$_name"
      not_run "$_name" server "client-not-there($_got)"
      return 0
    fi
    serve "$_name" "$_kind" "$_port" "$@"
  else
    signal "at-$_name"
    connect "$_name" "$_srv" "$_kind" "$@"
  fi
}

ip link set lo up
ip link set eth0 up || fail "ip link set eth0 up"
ip addr add "$MY_IP/24" dev eth0 || fail "ip addr add $MY_IP"
retry 30 carrier_up || fail "eth0 has no carrier after 30 s"
retry 120 ping -c 1 -W 1 "$HOST_IP" || fail "no ping answer from the test host $HOST_IP"
say "NET-OK role=$ROLE ip=$MY_IP mac=$(cat /sys/class/net/eth0/address)"

# A guest that goes silent is told apart from one whose program is still running.
(while sleep 30; do echo "RDMA-ALIVE role=$ROLE uptime=$(now)"; done) &

mkdir -p "$SIG_DIR"
httpd -f -p "$SIG_PORT" -h "$SIG_DIR" &

[ -d "/sys/class/infiniband/$DEV" ] || fail "no /sys/class/infiniband/$DEV: vmw_pvrdma did not register"
retry 60 find_gid || fail "no RoCE v2 GID of $MY_IP in the GID table after 60 s"
find_gid
say "GID idx=$GIDX gid=$(cat "/sys/class/infiniband/$DEV/ports/1/gids/$GIDX") type=RoCE_v2"
echo "SECTION-BEGIN devinfo"
ibv_devinfo -v -d "$DEV" 2>&1
echo "SECTION-END devinfo rc=$?"

# librdmacm's rdma_server and rdma_client (rdma_create_ep) as one program for the step table:
# -b ADDR serves there, -s ADDR connects to it.
cat > /tmp/rdma-ep << 'EOS'
#!/bin/sh
# rdma-ep -p PORT -b|-s ADDR
case $3 in
  -b) exec rdma_server -s "$4" -p "$2" ;;
  *) exec rdma_client -s "$4" -p "$2" ;;
esac
EOS
chmod +x /tmp/rdma-ep

PP="-d $DEV -g $GIDX"
PERF="-d $DEV -x $GIDX -F"
# shellcheck disable=SC2086 # PP and PERF: word lists
{
  # Between the guests: A serves, B connects.
  step rc-data a b - tcp 18601 ibv_rc_pingpong $PP -c -n "$PP_ITERS" -s 4096 -p 18601
  step rc-events a b - tcp 18602 ibv_rc_pingpong $PP -e -n "$PP_ITERS" -s 4096 -p 18602
  step ud a b - tcp 18603 ibv_ud_pingpong $PP -c -n "$PP_ITERS" -s 512 -p 18603
  step srq a b - tcp 18604 ibv_srq_pingpong $PP -q 4 -n "$PP_ITERS" -s 4096 -p 18604
  step write-bw a b - tcp 18611 ib_write_bw $PERF -n "$PERF_ITERS" -s 16384 -p 18611
  step read-bw a b - tcp 18612 ib_read_bw $PERF -n "$PERF_ITERS" -s 16384 -p 18612
  step send-bw a b - tcp 18613 ib_send_bw $PERF -n "$PERF_ITERS" -s 16384 -p 18613
  step atomic-bw a b - tcp 18614 ib_atomic_bw $PERF -n "$PERF_ITERS" -p 18614
  step write-lat a b - tcp 18621 ib_write_lat $PERF -n "$PERF_ITERS" -s 64 -p 18621
  step read-lat a b - tcp 18622 ib_read_lat $PERF -n "$PERF_ITERS" -s 64 -p 18622
  step send-lat a b - tcp 18623 ib_send_lat $PERF -n "$PERF_ITERS" -s 64 -p 18623
  step rping a b - cm 18631 rping -v -C "$PING_COUNT" -p 18631
  # rdma_cm's endpoint API and its connection tests, each way: rdma_server/rdma_client
  # (rdma_create_ep), ucmatose (RC, two connections) and udaddy (UD; its port is fixed: 7174).
  step ep-ab a b - cmep 18641 /tmp/rdma-ep -p 18641
  step ep-ba b a - cmep 18642 /tmp/rdma-ep -p 18642
  step ucmatose-ab a b - cmep 18643 ucmatose -p 18643 -c 2 -C 10 -S 1024
  step ucmatose-ba b a - cmep 18644 ucmatose -p 18644 -c 2 -C 10 -S 1024
  step udaddy-ab a b - cmep 7174 udaddy -c 2 -C 10 -S 512
  step udaddy-ba b a - cmep 7174 udaddy -c 2 -C 10 -S 512
  # Against Linux Soft-RoCE (rxe0 in the test host): each side once as server, once as client.
  step rxe-rc-host-server l a - tcp 18701 ibv_rc_pingpong $PP -c -n "$PP_ITERS" -s 4096 -p 18701
  step rxe-rc-guest-server a l - tcp 18702 ibv_rc_pingpong $PP -c -n "$PP_ITERS" -s 4096 -p 18702
  step rxe-write-bw-host-server l a - tcp 18703 ib_write_bw $PERF -n "$PERF_ITERS" -s 16384 -p 18703
  step rxe-write-bw-guest-server a l - tcp 18704 ib_write_bw $PERF -n "$PERF_ITERS" -s 16384 -p 18704
  # Loss: the test host drops RoCE frames towards C (netem on C's TAP; C's VMM has no same-host
  # channel) while these run; C receives the data of the second one.
  step loss-rc a c netem-on tcp 18801 ibv_rc_pingpong $PP -c -n "$LOSS_PP_ITERS" -s 4096 -p 18801
  step loss-write-bw c a loss-rc-counted tcp 18802 ib_write_bw $PERF -n "$PERF_ITERS" -s 16384 -p 18802
}

echo "SECTION-BEGIN dmesg-end"
dmesg | grep -E 'vmw_pvrdma|infiniband|ib_core|rdma' | tail -n 30
echo "SECTION-END dmesg-end rc=0"
say "DONE role=$ROLE"
