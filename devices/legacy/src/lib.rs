// SPDX-License-Identifier: Apache-2.0
//! The port-I/O devices every x86 guest expects: a 16550 serial console,
//! the i8042 reset line and the ACPI power-management registers that the
//! guest uses to power off or reset. Each one is a `vm_device::MutDevicePio`
//! so the VMM registers them on its PIO bus unchanged.

// Guest input is hostile: no unwrap/expect outside tests (clippy.toml
// allows them in #[cfg(test)] code).
#![deny(clippy::unwrap_used, clippy::expect_used)]

mod acpi_pm;
mod i8042;
mod serial;

pub use acpi_pm::{AcpiPm, ACPI_PM_PORT, ACPI_PM_PORT_LEN, RESET_VALUE, SLEEP_TYPE_S5};
pub use i8042::{I8042, I8042_PORT, I8042_PORT_LEN};
pub use serial::{InputRoom, Serial, SerialIrq, SERIAL_IRQ, SERIAL_PORT, SERIAL_PORT_LEN};

use vmm_sys_util::eventfd::EventFd;

/// Why the guest asked the machine to stop; the VMM maps it to its exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestExit {
    PowerOff,
    Reset,
}

/// Signals the VMM's event loop that the guest asked to stop. Writes are
/// best effort: a failure here can only mean the VMM is already exiting.
#[derive(Debug)]
pub struct ExitSignal {
    poweroff: EventFd,
    reset: EventFd,
}

impl ExitSignal {
    pub fn new(poweroff: EventFd, reset: EventFd) -> Self {
        Self { poweroff, reset }
    }

    pub fn signal(&self, why: GuestExit) {
        let fd = match why {
            GuestExit::PowerOff => &self.poweroff,
            GuestExit::Reset => &self.reset,
        };
        if let Err(e) = fd.write(1) {
            log::error!("Failed to signal guest {why:?}: {e}");
        }
    }
}
