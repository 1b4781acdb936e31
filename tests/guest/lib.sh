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

carrier_up() { [ "$(cat /sys/class/net/eth0/carrier 2> /dev/null)" = 1 ]; }
port_active() { grep -q ACTIVE "/sys/class/infiniband/$DEV/ports/1/state" 2> /dev/null; }

# ipv4_mapped_gid IP: ::ffff:IP as sysfs prints GIDs.
ipv4_mapped_gid() {
  echo "$1" | awk -F. '{ printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x\n", $1, $2, $3, $4 }'
}

# find_gid: GIDX := the index of the RoCE v2 GID of MY_IP in DEV's port 1.
find_gid() {
  _want=$(ipv4_mapped_gid "$MY_IP")
  _port=/sys/class/infiniband/$DEV/ports/1
  for _f in "$_port"/gids/*; do
    _i=${_f##*/}
    [ "$(cat "$_f" 2> /dev/null)" = "$_want" ] || continue
    [ "$(cat "$_port/gid_attrs/types/$_i" 2> /dev/null)" = "RoCE v2" ] || continue
    GIDX=$_i
    return 0
  done
  return 1
}

# device_ready: DEV is there, its port 1 ACTIVE and GIDX := the RoCE v2 GID of MY_IP (up to 60 s
# each), said as "GID dev=D idx=N gid=G mtu=M"; fails with a message.
device_ready() {
  [ -d "/sys/class/infiniband/$DEV" ] || fail "no /sys/class/infiniband/$DEV"
  retry 60 port_active || fail "$DEV port 1 not ACTIVE after 60 s: $(cat "/sys/class/infiniband/$DEV/ports/1/state")"
  retry 60 find_gid || fail "no RoCE v2 GID of $MY_IP on $DEV after 60 s"
  find_gid
  say "GID dev=$DEV idx=$GIDX gid=$(cat "/sys/class/infiniband/$DEV/ports/1/gids/$GIDX") mtu=$(cat /sys/class/net/eth0/mtu)"
}

# eth0_up_with_gid: eth0 up with MY_IP/24, then GIDX := its RoCE v2 GID on DEV (ib_core adds it
# asynchronously: up to 120 s); fails with a message.
eth0_up_with_gid() {
  ip link set lo up
  { ip link set eth0 up && ip addr add "$MY_IP/24" dev eth0; } || fail "network set-up"
  retry 120 find_gid || fail "no RoCE v2 GID of $MY_IP on $DEV"
  find_gid
}
