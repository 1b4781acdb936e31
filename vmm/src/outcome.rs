// SPDX-License-Identifier: Apache-2.0
//! How a VM ends, and the process exit code each ending maps to (see
//! `--help`).

/// How a VM ended. Each maps to a documented process exit code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The guest powered off (ACPI S5).
    PowerOff,
    /// The guest asked for a reset (reboot); the VMM ends, as Firecracker does.
    Reset,
    /// `vm.shutdown` through the API.
    ApiShutdown,
    /// The guest triple-faulted.
    GuestCrash,
    /// KVM failed to run the guest.
    Error(String),
    /// The VM was handed over to another VMM (live migration).
    Migrated,
}

/// Process exit codes, documented in `--help`.
pub const EXIT_OK: i32 = 0;
pub const EXIT_ERROR: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_GUEST_CRASH: i32 = 3;

impl Outcome {
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::PowerOff | Self::Reset | Self::ApiShutdown | Self::Migrated => EXIT_OK,
            Self::GuestCrash => EXIT_GUEST_CRASH,
            Self::Error(_) => EXIT_ERROR,
        }
    }
}
