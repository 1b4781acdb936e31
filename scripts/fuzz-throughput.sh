#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fuzz target throughput of two builds, in the same run (docs/benchmarks.md, issue 17):
#   scripts/fuzz-throughput.sh BASE_BIN_DIR NEW_BIN_DIR [TARGET...]
# where each directory holds the libFuzzer binaries (`cargo +nightly fuzz build --release`
# puts them in fuzz/target/x86_64-unknown-linux-gnu/release). Both builds run the same inputs:
# 100 random 512-byte inputs (seeded, made once in a temporary directory) and then 10 s of
# fuzzing from an empty corpus each, alternately, three times. Prints the median CPU
# milliseconds per input (task-clock, which load on the machine barely moves, unlike wall
# time) and the median executions per second, and the base/new ratios.
set -euo pipefail
base=$1 new=$2
shift 2
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(vmxnet3_device pvrdma_device virtio_blk device_restore)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work/seeds" <<'EOF'
import os, random, sys
os.makedirs(sys.argv[1])
r = random.Random(17)
for i in range(100):
    open(f"{sys.argv[1]}/s{i:03}", "wb").write(bytes(r.getrandbits(8) for _ in range(512)))
EOF
# CPU ms per input over the seeds, and exec/s over 10 s of fuzzing.
measure() {
    local bin=$1 corpus
    local ms
    ms=$(perf stat -x, -e task-clock "$bin" -runs=0 "$work/seeds" 2>&1 >/dev/null |
        awk -F, '/task-clock/ { printf "%.2f", $1 / 100 }')
    corpus=$(mktemp -d -p "$work")
    local eps
    eps=$("$bin" -max_total_time=10 -timeout=20 -malloc_limit_mb=256 "$corpus" 2>&1 |
        awk '/DONE/ { for (i = 1; i <= NF; i++) if ($i == "exec/s:") print $(i + 1) }')
    echo "$ms $eps"
}
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
printf '%-16s %12s %12s %7s %10s %10s %7s\n' target "base ms/in" "new ms/in" ratio \
    "base ex/s" "new ex/s" ratio
for t in "${targets[@]}"; do
    : >"$work/base" && : >"$work/new"
    for _ in 1 2 3; do
        measure "$base/$t" >>"$work/base"
        measure "$new/$t" >>"$work/new"
    done
    bm=$(cut -d' ' -f1 "$work/base" | median) nm=$(cut -d' ' -f1 "$work/new" | median)
    be=$(cut -d' ' -f2 "$work/base" | median) ne=$(cut -d' ' -f2 "$work/new" | median)
    printf '%-16s %12s %12s %7s %10s %10s %7s\n' "$t" "$bm" "$nm" \
        "$(awk "BEGIN { printf \"%.1fx\", $bm / $nm }")" "$be" "$ne" \
        "$(awk "BEGIN { printf \"%.1fx\", $ne / $be }")"
done
