# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh
# shellcheck disable=SC2153 # ROLE, SIG_DIR, LIMIT...: set by the script that uses these
# The step protocol of the guest scripts whose programs run between two parties (tests/guest/rdma.sh,
# tests/guest/roce.sh): the scenario puts this file between tests/guest/lib.sh and the script
# (guest_script_disk ... steps.sh SCRIPT). The script defines `say` (its marker prefix, which must
# be RDMA-) and `ip_of PARTY` (the address a party serves and signals on; `ip_of "$ROLE"` is this
# guest's own) and sets ROLE, SIG_DIR, SIG_PORT, HOST_IP, LIMIT, READY_WAIT, RETRY_WAIT, GATE_WAIT
# and RETRY_RE.
#
# A step has a server party, a client party and a TCP port (or rdma_cm port) of its own; a party
# not in a step skips it.
#   client: signals "at-STEP" (it is done with its previous step)
#   server: waits for "at-STEP" (or "skip-STEP": the client will not run) at the client, starts
#           the program (bounded by LIMIT), waits until it listens (its TCP port, or its rdma_cm ID
#           in LISTEN), then signals "ready-STEP" (or "skip-STEP" if it never listened) and waits
#           for the program to end
#   client: waits for "ready-STEP"/"skip-STEP" at the server, then runs the program (bounded by
#           LIMIT), again while it fails only because it could not connect, for RETRY_WAIT at most
# Signals between the guests: empty files under SIG_DIR served by busybox httpd on SIG_PORT,
# polled with nc (addresses as signals would add GIDs to the device under test).
#
# Output:
#   RDMA-AT step=S                   this party reached step S
#   RDMA-READY step=S | RDMA-NOTREADY step=S   server side: listening, or not
#   SECTION-BEGIN S-SIDE ... SECTION-END S-SIDE rc=N   the program's whole output (SIDE: server,
#                                    client; a client's retries one after the other, separated by
#                                    RDMA-RETRY lines); N is its exit status, "none" if it never ran
#   RDMA-RESULT step=S side=SIDE rc=N secs=T attempts=K [why=...]
# A failed program is a result, not the end of the script.

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
