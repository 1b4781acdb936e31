// SPDX-License-Identifier: Apache-2.0
//! ACPI hardware-reduced power management: the FADT points the guest's
//! sleep-control register and reset register here. Linux powers off by
//! writing SLP_TYP(S5) | SLP_EN to sleep control, and resets by writing the
//! FADT reset value to the reset register.

use std::sync::Arc;

use vm_device::bus::{PioAddress, PioAddressOffset};
use vm_device::MutDevicePio;

use crate::{ExitSignal, GuestExit};

/// Port base: offset 0 is sleep control/status, offset 1 the reset register.
pub const ACPI_PM_PORT: u16 = 0x3c0;
pub const ACPI_PM_PORT_LEN: u16 = 2;
/// The S5 sleep type the DSDT's `_S5_` package advertises.
pub const SLEEP_TYPE_S5: u8 = 5;
/// The value the FADT tells the guest to write to the reset register.
pub const RESET_VALUE: u8 = 1;

const SLEEP_CONTROL_OFFSET: u64 = 0;
const RESET_OFFSET: u64 = 1;
/// ACPI 6.x, 4.8.3.7: SLP_TYP is bits 4:2 and SLP_EN bit 5 of sleep control.
const SLP_TYP_SHIFT: u8 = 2;
const SLP_TYP_MASK: u8 = 0b111;
const SLP_EN: u8 = 1 << 5;

/// Stateless (reads return 0, writes act at once): nothing to migrate.
#[derive(Debug)]
pub struct AcpiPm {
    exit: Arc<ExitSignal>,
}

impl AcpiPm {
    pub fn new(exit: Arc<ExitSignal>) -> Self {
        Self { exit }
    }
}

impl MutDevicePio for AcpiPm {
    fn pio_read(&mut self, _base: PioAddress, _offset: PioAddressOffset, data: &mut [u8]) {
        // Sleep status: WAK_STS is never set because we never resume from sleep.
        data.fill(0);
    }

    fn pio_write(&mut self, _base: PioAddress, offset: PioAddressOffset, data: &[u8]) {
        let Some(&value) = data.first() else { return };
        match u64::from(offset) {
            SLEEP_CONTROL_OFFSET if value & SLP_EN != 0 => {
                let sleep_type = (value >> SLP_TYP_SHIFT) & SLP_TYP_MASK;
                if sleep_type == SLEEP_TYPE_S5 {
                    log::info!("Guest requested power off (ACPI S5)");
                    self.exit.signal(GuestExit::PowerOff);
                } else {
                    log::warn!("Ignoring unsupported ACPI sleep type {sleep_type}");
                }
            }
            RESET_OFFSET if value == RESET_VALUE => {
                log::info!("Guest requested reset through the ACPI reset register");
                self.exit.signal(GuestExit::Reset);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    use super::*;

    fn dev() -> (AcpiPm, Arc<ExitSignal>) {
        let exit = Arc::new(ExitSignal::new(
            EventFd::new(EFD_NONBLOCK).unwrap(),
            EventFd::new(EFD_NONBLOCK).unwrap(),
        ));
        (AcpiPm::new(exit.clone()), exit)
    }

    #[test]
    fn s5_with_slp_en_powers_off() {
        let (mut pm, exit) = dev();
        let base = PioAddress(ACPI_PM_PORT);
        // SLP_TYP without SLP_EN, and another sleep state: nothing happens.
        pm.pio_write(base, 0, &[SLEEP_TYPE_S5 << SLP_TYP_SHIFT]);
        pm.pio_write(base, 0, &[(3 << SLP_TYP_SHIFT) | SLP_EN]);
        assert!(exit.poweroff.read().is_err());
        pm.pio_write(base, 0, &[(SLEEP_TYPE_S5 << SLP_TYP_SHIFT) | SLP_EN]);
        assert_eq!(exit.poweroff.read().unwrap(), 1);
        assert!(exit.reset.read().is_err());
    }

    #[test]
    fn reset_register_resets() {
        let (mut pm, exit) = dev();
        let base = PioAddress(ACPI_PM_PORT);
        pm.pio_write(base, 1, &[RESET_VALUE + 1]);
        pm.pio_write(base, 1, &[]);
        assert!(exit.reset.read().is_err());
        pm.pio_write(base, 1, &[RESET_VALUE]);
        assert_eq!(exit.reset.read().unwrap(), 1);
    }
}
