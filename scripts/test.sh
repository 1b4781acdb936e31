#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The project's test command (README; .ci/run calls exactly this). It checks formatting and lints,
# builds the release binaries the end-to-end tests run, then runs every test of the workspace:
# unit tests, the KVM smoke test
# on this host's /dev/kvm, and the end-to-end tests with real Linux guests (directly, or inside the
# nested test host when this host's KVM cannot boot a stock kernel; the tests say which).
# The first run also builds the guest assets from Debian's packages (needs root for apt, ~5 min),
# cached in ${PVRDMA_VMM_CACHE:-$HOME/.cache/pvrdma-vmm} and rebuilt only when their inputs change.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
resources/build-assets.sh >/dev/null
cargo fmt --all --check
cargo clippy --release --workspace --all-targets --locked -- -D warnings
cargo build --release --workspace --bins --locked
cargo test --release --workspace --locked --no-fail-fast "$@"
