#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The project's test command (README; .ci/run calls exactly this). It checks formatting and lints,
# builds the release binaries the end-to-end tests run, then runs every test of the workspace:
# unit tests, the KVM smoke test on this host's /dev/kvm, and the end-to-end tests with real Linux
# guests (directly, or inside the nested test host when this host's KVM cannot boot a stock kernel;
# the tests say which), side by side on two CPUs (scripts/e2e.sh).
# The first run also builds the guest assets from Debian's packages (needs root for apt, ~5 min),
# cached in ${PVRDMA_VMM_CACHE:-$HOME/.cache/pvrdma-vmm} and rebuilt only when their inputs change.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
resources/build-assets.sh >/dev/null
cargo fmt --all --check
cargo clippy --release --workspace --all-targets --locked -- -D warnings
cargo build --release --workspace --bins --locked
(($# == 0)) || { echo "test.sh takes no arguments (cargo test -p CRATE for one crate's tests, scripts/e2e.sh SUITE for end-to-end suites)" >&2; exit 2; }
# Every part runs even when an earlier one failed (as --no-fail-fast): one run shows every failure.
rc=0
cargo test --release --workspace --exclude e2e --locked --no-fail-fast || rc=1
cargo test --release -p e2e --lib --bins --locked --no-fail-fast || rc=1
# The end-to-end suites, two at a time on two CPUs (scripts/e2e.sh says why).
scripts/e2e.sh || rc=1
exit $rc
