# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh
# Helpers for every guest script (busybox sh in a `pvtest=run` guest): the scenario's
# guest_script_disk, and scripts/demo.sh, put this file between the scenario's variables and the
# script. A script defines its own say/fail (its marker prefix) and DEV (the RDMA device).

now() { cut -d. -f1 /proc/uptime; }

# retry SECS CMD...: runs CMD, quietly, until it succeeds, for at most SECS seconds (a state the
# guest waits for: link up, a GID, a signal).
retry() {
  _end=$(($(now) + $1))
  shift
  until "$@" > /dev/null 2>&1; do
    [ "$(now)" -lt "$_end" ] || return 1
    sleep 0.2
  done
}

# again SECS CMD...: runs CMD, with its output, and again (2 s apart, for at most SECS seconds)
# while it fails only because its server does not listen yet: its output then says so
# (AGAIN_RE: ibv_rc_pingpong's "Couldn't connect to" a refused TCP port, rdma_cm's
# RDMA_CM_EVENT_REJECTED from a port nobody listens on). Any other failure is CMD's result at once:
# a client that failed on its data must not get another chance.
AGAIN_RE="Couldn't connect to|RDMA_CM_EVENT_REJECTED"
again() {
  _end=$(($(now) + $1))
  shift
  _out=$(mktemp /tmp/again.XXXXXX)
  while :; do
    # Its output goes to ours as it comes, and to $_out to decide on another try.
    { "$@"; echo $? > "$_out.rc"; } 2>&1 | tee "$_out"
    _rc=$(cat "$_out.rc")
    [ "$_rc" = 0 ] && break
    grep -qE "$AGAIN_RE" "$_out" || break
    [ "$(now)" -lt "$_end" ] || break
    echo "again: could not connect (rc=$_rc), trying again: $*"
    sleep 2
  done
  rm -f "$_out" "$_out.rc"
  return "$_rc"
}

# pingpong_rts: an ibv_rc_pingpong of this guest has its RC QP on DEV in RTS: it exchanged QPs
# with its server and posts its rounds (its own output reaches a file only when it ends).
pingpong_rts() {
  rdma res show qp link "$DEV/1" 2> /dev/null |
    awk '/type RC / && /state RTS / && /comm ibv_rc_pingpong/ { f = 1 } END { exit !f }'
}

# rping_verified FILE: rping -v -V (client) wrote to FILE rounds whose data it checked, one
# "ping data: ..." line each (its stdout reaches the file 4 KiB, ~55 rounds, at a time).
rping_verified() { grep -q '^ping data: ' "$1" 2> /dev/null; }

# running PID: process PID runs (a job that ended stays a zombie until the script waits for it).
running() { [ -e "/proc/$1/status" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2> /dev/null; }

# wait_traffic SECS RPING_LOG PID...: until ibv_rc_pingpong runs in RTS and rping verified rounds
# (RPING_LOG), for at most SECS seconds; fails (with why in TRAFFIC_WHY) at once if one of the PIDs
# (the programs' jobs) ended before, or after SECS seconds. A marker that says "traffic ran"
# follows this, never a sleep.
wait_traffic() {
  _secs=$1 _log=$2
  _end=$(($(now) + _secs))
  shift 2
  until pingpong_rts && rping_verified "$_log"; do
    for _p in "$@"; do
      running "$_p" && continue
      TRAFFIC_WHY="a program ended before traffic flowed"
      return 1
    done
    if [ "$(now)" -ge "$_end" ]; then
      TRAFFIC_WHY="no traffic after $_secs s (pingpong in RTS: $(pingpong_rts && echo yes || echo no), rping rounds verified: $(rping_verified "$_log" && echo yes || echo no))"
      return 1
    fi
    sleep 0.5
  done
  TRAFFIC_WHY=
}

# section NAME CMD...: CMD's output (stdout and stderr) between "SECTION-BEGIN NAME" and
# "SECTION-END NAME rc=N" lines, for the test to parse; bounded by LIMIT seconds when the script
# sets LIMIT. Returns CMD's status.
section() {
  _name=$1
  shift
  echo "SECTION-BEGIN $_name"
  if [ -n "${LIMIT:-}" ]; then
    timeout "$LIMIT" "$@" 2>&1
  else
    "$@" 2>&1
  fi
  _rc=$?
  echo "SECTION-END $_name rc=$_rc"
  return $_rc
}

# has_host_signal NAME: the test host's signal server (HOST_IP:SIG_PORT) has NAME (HTTP by hand
# over nc: this static busybox's wget crashes).
has_host_signal() {
  printf 'GET /%s HTTP/1.0\r\n\r\n' "$1" | timeout 5 nc -w 3 "$HOST_IP" "$SIG_PORT" 2> /dev/null | head -n 1 | grep -q ' 200 '
}

# wait_host_signal SECS NAME...: until the test host serves one of the NAMEs (polled once a second,
# at least once, so that an idle guest stays nearly idle); prints that one.
wait_host_signal() {
  _end=$(($(now) + $1))
  shift
  while :; do
    for _s in "$@"; do
      if has_host_signal "$_s"; then
        echo "$_s"
        return 0
      fi
    done
    [ "$(now)" -lt "$_end" ] || return 1
    sleep 1
  done
}

# centis: the uptime in hundredths of a second (the clock of the guests' throughput figures).
centis() { awk '{ printf "%d\n", $1 * 100 }' /proc/uptime; }

# kernel_log_section RE: the kernel's log lines that match RE (extended), framed as section
# "kernel-log" for the test to read (the console shows only errors: `quiet`).
kernel_log_section() {
  echo "SECTION-BEGIN kernel-log"
  dmesg | grep -E "$1"
  echo "SECTION-END kernel-log rc=0"
}

# driver_log: the kernel's last lines about the RDMA and NIC drivers, for a failure report.
driver_log() { dmesg | grep -E 'rxe|vmw_pvrdma|vmxnet3|infiniband|ib_core' | tail -n 20; }

# rxe_up: Linux Soft-RoCE in this guest, rdma_rxe's rxe0 on eth0 (the Soft-RoCE baselines: a guest
# with a plain vmxnet3 NIC). The image carries rdma_rxe and crc32_generic without loading them
# (resources/build-assets.sh, GUEST_EXTRA_MODULES); crc32_generic first: rxe's ICRC needs the
# "crc32" algorithm and this guest has no /sbin/modprobe for the kernel to ask for it. Fails with
# a message.
rxe_up() {
  for _m in crc32_generic rdma_rxe; do
    modprobe "$_m" || fail "modprobe $_m"
  done
  [ -d /sys/module/rdma_rxe ] || fail "rdma_rxe is not loaded after modprobe"
  ip link set eth0 up
  rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0 type rxe netdev eth0"
}

carrier_up() { [ "$(cat /sys/class/net/eth0/carrier 2> /dev/null)" = 1 ]; }
port_active() { grep -q ACTIVE "/sys/class/infiniband/$DEV/ports/1/state" 2> /dev/null; }

# ipv4_mapped_gid IP: ::ffff:IP as sysfs prints GIDs.
ipv4_mapped_gid() {
  echo "$1" | awk -F. '{ printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x\n", $1, $2, $3, $4 }'
}

# find_gid [IP [TYPE...]]: GIDX := the index of the GID of IP (default MY_IP) in DEV's port 1 whose
# type (as sysfs says it) is the first TYPE the table has (default "RoCE v2").
find_gid() {
  _want=$(ipv4_mapped_gid "${1:-$MY_IP}")
  _port=/sys/class/infiniband/$DEV/ports/1
  [ $# -gt 0 ] && shift
  [ $# -gt 0 ] || set -- "RoCE v2"
  for _type in "$@"; do
    for _f in "$_port"/gids/*; do
      _i=${_f##*/}
      [ "$(cat "$_f" 2> /dev/null)" = "$_want" ] || continue
      [ "$(cat "$_port/gid_attrs/types/$_i" 2> /dev/null)" = "$_type" ] || continue
      GIDX=$_i
      return 0
    done
  done
  return 1
}

# device_ready [IP [TYPE...]]: DEV is there, its port 1 ACTIVE and GIDX := find_gid IP TYPE... (up
# to 60 s each), said as "GID dev=D idx=N gid=G type=T mtu=M"; fails with a message.
device_ready() {
  [ -d "/sys/class/infiniband/$DEV" ] || fail "no /sys/class/infiniband/$DEV"
  retry 60 port_active || fail "$DEV port 1 not ACTIVE after 60 s: $(cat "/sys/class/infiniband/$DEV/ports/1/state")"
  retry 60 find_gid "$@" || fail "no ${2:-RoCE v2} GID of ${1:-$MY_IP} on $DEV after 60 s"
  find_gid "$@"
  _port=/sys/class/infiniband/$DEV/ports/1
  say "GID dev=$DEV idx=$GIDX gid=$(cat "$_port/gids/$GIDX") type=$(tr ' ' _ < "$_port/gid_attrs/types/$GIDX") mtu=$(cat /sys/class/net/eth0/mtu)"
}

# eth0_up_with_gid: eth0 up with MY_IP/24, then GIDX := its RoCE v2 GID on DEV (ib_core adds it
# asynchronously: up to 120 s); fails with a message.
eth0_up_with_gid() {
  ip link set lo up
  { ip link set eth0 up && ip addr add "$MY_IP/24" dev eth0; } || fail "network set-up"
  retry 120 find_gid || fail "no RoCE v2 GID of $MY_IP on $DEV"
  find_gid
}

# ---- Two-party steps (tests/guest/rdma.sh's table, tests/guest/ucx.sh's): one program between a
# server party and a client party, each on its own guest, synchronised through signals (empty
# files under SIG_DIR served by busybox httpd on SIG_PORT; a party's address from ip_of). The
# script defines say, ROLE (its party), MY_IP, ip_of PARTY, SIG_DIR, SIG_PORT, HOST_IP and the
# waits LIMIT, READY_WAIT, RETRY_WAIT, GATE_WAIT (see tests/guest/rdma.sh's header for the
# protocol); a client retries while its output matches AGAIN_RE.
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
  [ "$_kind" = cm ] && set -- "$@" -s -a "$(ip_of "$ROLE")"
  [ "$_kind" = cmep ] && set -- "$@" -b "$(ip_of "$ROLE")"
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
    if [ $_rc -eq 0 ] || ! grep -qE "$AGAIN_RE" "$_err" || [ "$(now)" -ge "$_end" ]; then
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
