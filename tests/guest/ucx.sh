# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=sh
# shellcheck disable=SC2153 # ROLE, MY_IP...: prepended by the scenario
# Guest side of tests/scenarios/ucx.sh (issue 14 item 3 and the UCX/MPI part of item 7): UCX and
# Open MPI over the PVRDMA device, with Debian's ucx-utils and openmpi-bin. Runs in guests A and B
# (busybox sh, `pvtest=run`), whose --pvrdma slots sit on one bridge of the test host; and in the
# Soft-RoCE baseline's pair (plain vmxnet3 NICs, RDMA_DEV=rxe0), which runs step 1 only. The
# scenario prepends:
#   ROLE            a | b
#   RDMA_DEV        vmw_pvrdma0 (the device under test; the default), or rxe0 (the baseline: this
#                   script loads rdma_rxe and adds rxe0 on eth0)
#   MY_IP           eth0's address (/24); IP_A IP_B HOST_IP: the guests' and the bridge's
#   SIG_PORT        TCP port of each party's signal server (tests/guest/lib.sh's two-party steps)
#   LIMIT READY_WAIT RETRY_WAIT GATE_WAIT   the steps' waits (lib.sh)
#   RC_TLS UD_TLS   UCX_TLS of the RC and the UD runs (rc_v: rc_verbs, with ud_verbs only as the
#                   auxiliary transport of the connection set-up; ud_v: ud_verbs)
#   LAT_SIZE LAT_ITERS BW_SIZE BW_ITERS WARMUP   ucx_perftest's message sizes and iterations
#   MPI_BYTES MPI_ROUNDS MPI_SKEW   pvrdma-mpi-check's message size, rounds, and the error added
#                   to the sum it expects (0; another value must fail the job)
#   MIG_AFTER MIG_SECONDS   the migration run: rounds after the test host said "migrated", and
#                   its bound in seconds
#   RSH_PORT        TCP port of each guest's rsh daemon (Open MPI's launcher, below)
#
# 1. ucx_perftest, B serving and A connecting, one two-party step each (lib.sh's `step`), with
#    UCX_NET_DEVICES=RDMA_DEV:1, UCX_IB_GID_INDEX = the RoCE v2 GID of MY_IP, UCX_LOG_LEVEL=info
#    (UCX then prints the transports each endpoint uses: "ep_cfg[N]: tag(rc_verbs/vmw_pvrdma0:1)"):
#    tag_lat, tag_bw and ucp_put_bw over RC_TLS, then over UD_TLS.
# 2. Open MPI over UCX, A launching on A and B: `orterun --mca pml ucx --mca btl self` (no TCP or
#    shared-memory BTL), UCX_TLS=self,RC_TLS (then self,UD_TLS), running pvrdma-mpi-check (ring
#    exchange + MPI_Allreduce, every byte checked). Guests have no ssh: Open MPI's rsh launcher
#    (plm_rsh_agent) runs /tmp/rsh, which hands the command line to the other guest's rsh daemon
#    (busybox `nc -ll -e`, a shell reading one line) and relays its output until it ends: what ssh
#    would do, minus the security (a private test network).
# 3. The migration run: pvrdma-mpi-check over RC_TLS until told to stop; once its first round is
#    verified A says "UCX-MIGRATION-LOOP running", the test host live-migrates B, then serves
#    "migrated"; A lets MIG_AFTER more rounds pass and stops the job.
#
# Output, parsed by tests/tests/ucx.rs:
#   UCX-GID dev=D idx=N gid=G mtu=M
#   UCX-PERF-DONE                                       (A) the ucx_perftest steps are over
#   SECTION-BEGIN S-SIDE ... SECTION-END S-SIDE rc=N   a step's program (lib.sh)
#   UCX-RESULT step=S side=SIDE rc=N secs=T attempts=K [why=...]
#   SECTION-BEGIN mpi-NAME ... SECTION-END mpi-NAME rc=N   orterun's whole output (A)
#   UCX-MIGRATION-LOOP running | UCX-MIGRATION-LOOP never-started   (A)
#   UCX-MIGRATED rounds_before=N                        (A) rounds done when "migrated" came
#   UCX-NO-MPI-DONE from the test host   (B) the test host never said A was done
#   UCX-DONE role=R, or UCX-FAIL role=R <why> (set-up failure; the script then ends with status 1)

DEV=${RDMA_DEV:-vmw_pvrdma0}
SIG_DIR=/tmp/sig
# ucx_perftest's client says this while its server does not listen yet.
AGAIN_RE="$AGAIN_RE|connect\\(\\) failed"

say() { echo "UCX-$*"; }
fail() {
  say "FAIL role=$ROLE $*"
  driver_log
  exit 1
}

ip_of() {
  case $1 in
    a) echo "$IP_A" ;;
    b) echo "$IP_B" ;;
    l) echo "$HOST_IP" ;;
  esac
}

# The prefix of UCX's log lines names the host: each guest's own.
hostname "ucx-$ROLE"
ip link set lo up
ip link set eth0 up || fail "ip link set eth0 up"
ip addr add "$MY_IP/24" dev eth0 || fail "ip addr add $MY_IP"
retry 30 carrier_up || fail "eth0 has no carrier after 30 s"
retry 120 ping -c 1 -W 1 "$HOST_IP" || fail "no ping answer from the test host $HOST_IP"

(while sleep 30; do echo "UCX-ALIVE role=$ROLE uptime=$(now)"; done) &
mkdir -p "$SIG_DIR"
httpd -f -p "$SIG_PORT" -h "$SIG_DIR" &

[ "$DEV" = rxe0 ] && rxe_up
device_ready
# UCX and Open MPI live on the image's root disk (/dev/vdb; resources/build-assets.sh keeps them out
# of the initramfs): its library directory (a superset of the initramfs's), ld.so.cache and Open
# MPI's help texts over this root's, its programs on PATH.
mkdir -p /mnt/full /usr/share/openmpi
mount -t ext4 -o ro /dev/vdb /mnt/full || fail "mount the root disk /dev/vdb"
for d in usr/lib/x86_64-linux-gnu etc/ld.so.cache usr/share/openmpi; do
  mount --bind "/mnt/full/$d" "/$d" || fail "bind /mnt/full/$d"
done
export PATH="$PATH:/mnt/full/usr/bin"
# UCX's shared-memory transports look for /dev/shm even when UCX_TLS leaves them out.
mkdir -p /dev/shm && mount -t tmpfs shm /dev/shm
# Every UCX program of this guest (perftest, and the MPI ranks its orted starts) uses DEV's port 1
# and the RoCE v2 GID of MY_IP, and says which transports it picked.
export UCX_NET_DEVICES="$DEV:1" UCX_IB_GID_INDEX="$GIDX" UCX_LOG_LEVEL=info
# Soft-RoCE only: UCX 1.13's UD (ud_v, and rc_v's connection set-up) takes a datagram's IP version
# from its completion's sl (mlx5's convention, which our device follows), and Linux 6.1's rxe
# leaves sl 0 there, so UCX reads an IPv4 frame's GRH as IPv6, its destination check fails and it
# drops every datagram: no endpoint ever connects ("UD endpoint ... unhandled timeout error",
# 2026-11-26). The baseline turns that check off; the PVRDMA guests keep it on.
[ "$DEV" = rxe0 ] && export UCX_UD_VERBS_ETH_DGID_CHECK=n
section ucx-info sh -c 'ucx_info -v; ucx_info -d | grep -E "^# +(Memory domain|Transport|Device|Component):"'

perf() {
  _port=$1 _tls=$2
  shift 2
  echo env UCX_TLS="$_tls" ucx_perftest -p "$_port" -w "$WARMUP" "$@"
}
# shellcheck disable=SC2046 # perf: a word list
{
  step rc-tag-lat b a - tcp 13401 $(perf 13401 "$RC_TLS" -t tag_lat -s "$LAT_SIZE" -n "$LAT_ITERS")
  step rc-tag-bw b a - tcp 13402 $(perf 13402 "$RC_TLS" -t tag_bw -s "$BW_SIZE" -n "$BW_ITERS")
  step rc-put-bw b a - tcp 13403 $(perf 13403 "$RC_TLS" -t ucp_put_bw -s "$BW_SIZE" -n "$BW_ITERS")
  step ud-tag-lat b a - tcp 13411 $(perf 13411 "$UD_TLS" -t tag_lat -s "$LAT_SIZE" -n "$LAT_ITERS")
  step ud-tag-bw b a - tcp 13412 $(perf 13412 "$UD_TLS" -t tag_bw -s "$BW_SIZE" -n "$BW_ITERS")
  step ud-put-bw b a - tcp 13413 $(perf 13413 "$UD_TLS" -t ucp_put_bw -s "$BW_SIZE" -n "$BW_ITERS")
}
# The test host takes both devices' counters now (what arrived, what was dropped and why).
[ "$ROLE" = a ] && say "PERF-DONE"
# The Soft-RoCE baseline measures ucx_perftest only: B's server of the last step has ended, so A
# is done with B.
if [ "$DEV" = rxe0 ]; then
  say "DONE role=$ROLE"
  exit 0
fi

# Open MPI's launcher between the guests: /tmp/rsh HOST COMMAND... (its options, such as ssh's -x,
# skipped) sends COMMAND's words as one line to HOST's daemon and relays the output until the
# command ends there; the daemon runs that line with sh.
cat > /tmp/rsh << EOS
#!/bin/sh
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1
shift
printf '%s\n' "\$*" | exec nc "\$host" $RSH_PORT
EOS
cat > /tmp/rshd << 'EOS'
#!/bin/sh
read -r line
exec sh -c "$line"
EOS
chmod +x /tmp/rsh /tmp/rshd
export SHELL=/bin/sh
nc -ll -p "$RSH_PORT" -e /tmp/rshd &
signal rshd-ready

# mpi NAME TLS ARGS...: pvrdma-mpi-check with ARGS on A and B (one rank each) over pml ucx with
# UCX_TLS=self,TLS, its output in the section mpi-NAME and in /tmp/mpi-NAME.log.
mpi() {
  _name=$1 _tls=$2
  shift 2
  echo "SECTION-BEGIN mpi-$_name"
  timeout "$LIMIT" orterun --allow-run-as-root -np 2 --host "$IP_A:1,$IP_B:1" --bind-to none \
    --mca plm_rsh_agent /tmp/rsh --mca pml ucx --mca btl self --mca pml_ucx_devices 'vmw_pvrdma*' \
    -x UCX_TLS="self,$_tls" pvrdma-mpi-check -s "$MPI_BYTES" -x "$MPI_SKEW" "$@" > "/tmp/mpi-$_name.log" 2>&1 &
  _pid=$!
  tail -f "/tmp/mpi-$_name.log" &
  _tail=$!
  wait $_pid
  _rc=$?
  sleep 1
  kill $_tail
  echo "SECTION-END mpi-$_name rc=$_rc"
  return $_rc
}

# rounds FILE: how many rounds pvrdma-mpi-check reported so far.
rounds() { grep -c '^MPI-ROUND ' "$1" 2> /dev/null; }

if [ "$ROLE" = a ]; then
  wait_signal "$GATE_WAIT" "$IP_B" rshd-ready > /dev/null || fail "B's rsh daemon is not there"
  mpi rc "$RC_TLS" -r "$MPI_ROUNDS"
  mpi ud "$UD_TLS" -r "$MPI_ROUNDS"

  # The migration run: until /tmp/stop exists (at least 2 rounds).
  rm -f /tmp/stop
  mpi migration "$RC_TLS" -r 2 -f /tmp/stop &
  mig=$!
  log=/tmp/mpi-migration.log
  end=$(($(now) + MIG_SECONDS))
  until [ "$(rounds $log)" -ge 1 ] || ! running $mig || [ "$(now)" -ge "$end" ]; do sleep 1; done
  if [ "$(rounds $log)" -ge 1 ]; then
    say "MIGRATION-LOOP running"
    wait_host_signal "$MIG_SECONDS" migrated > /dev/null
    before=$(rounds $log)
    say "MIGRATED rounds_before=$before"
    until [ "$(rounds $log)" -ge $((before + MIG_AFTER)) ] || ! running $mig || [ "$(now)" -ge "$end" ]; do sleep 1; done
  else
    say "MIGRATION-LOOP never-started"
  fi
  touch /tmp/stop
  wait $mig
else
  # A's jobs, and the migration, take minutes: this guest serves them meanwhile, until the test
  # host serves "mpi-done", once A said DONE (not A's own signal server: A powers off at once,
  # before B, just migrated, may have polled it).
  wait_host_signal $((GATE_WAIT + MIG_SECONDS)) mpi-done > /dev/null || say "NO-MPI-DONE from the test host"
fi
say "DONE role=$ROLE"
