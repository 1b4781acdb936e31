# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Scenario of tests/tests/pvrdma.rs (issue 4): one guest with the PVRDMA slot (--pvrdma: vmxnet3 at
# function 0, PVRDMA at function 1 sharing its port) on a TAP of this host, running
# tests/guest/pvrdma.sh: probe and pairing, ibv_devinfo, GIDs, `rdma link`, the verbs program,
# link down/up, rmmod + insmod. Results: $OUT/pvrdma.env, $OUT/pvrdma-{serial,vmm}.log.

isolate_network

# The guest boots in ~30 s of L1 time and its script takes about as long.
PVRDMA_LIMIT=${PVRDMA_LIMIT:-300}
MAC=52:54:00:11:00:01

t0=$(now_us)
l1_tap tap0
ip addr add 10.11.0.254/24 dev tap0
guest_script_disk "$WORK/pvrdma-run.img" "MY_IP=10.11.0.1 MY_IP6=fd00:11::1 HOST_IP=10.11.0.254" "$GUEST_SCRIPTS/pvrdma.sh"
VMM_CPUS=2 run_guest pvrdma "$WORK/pvrdma-run.img" --pvrdma "tap=tap0,mac=$MAC"
wait_for_exit "$VMM_PID" "$PVRDMA_LIMIT"
record pvrdma "exit=$EXIT_STATUS" "seconds=$(since "$t0")"
log "pvrdma: $(tr '\n' ' ' < "$OUT/pvrdma.env")"
