// SPDX-License-Identifier: Apache-2.0
//! The part of the i8042 keyboard controller Linux uses to reset the
//! machine (`reboot=k`, and the fallback after ACPI reset): command 0xFE on
//! port 0x64 pulses the CPU reset line. No keyboard is emulated.

use std::sync::Arc;

use vm_device::bus::{PioAddress, PioAddressOffset};
use vm_device::MutDevicePio;

use crate::{ExitSignal, GuestExit};

/// Ports 0x60 (data) .. 0x64 (command/status).
pub const I8042_PORT: u16 = 0x60;
pub const I8042_PORT_LEN: u16 = 5;
const COMMAND_OFFSET: u64 = 4;
const CMD_RESET_CPU: u8 = 0xfe;

/// Stateless (status reads 0, only the reset command acts): nothing to
/// migrate.
#[derive(Debug)]
pub struct I8042 {
    exit: Arc<ExitSignal>,
}

impl I8042 {
    pub fn new(exit: Arc<ExitSignal>) -> Self {
        Self { exit }
    }
}

impl MutDevicePio for I8042 {
    fn pio_read(&mut self, _base: PioAddress, _offset: PioAddressOffset, data: &mut [u8]) {
        // Status 0: output buffer empty, input buffer empty, no keyboard.
        data.fill(0);
    }

    fn pio_write(&mut self, _base: PioAddress, offset: PioAddressOffset, data: &[u8]) {
        if u64::from(offset) == COMMAND_OFFSET && data.first() == Some(&CMD_RESET_CPU) {
            log::info!("Guest requested reset through the i8042");
            self.exit.signal(GuestExit::Reset);
        }
    }
}

#[cfg(test)]
mod tests {
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    use super::*;

    #[test]
    fn reset_command_signals_reset_only() {
        let exit = Arc::new(ExitSignal::new(
            EventFd::new(EFD_NONBLOCK).unwrap(),
            EventFd::new(EFD_NONBLOCK).unwrap(),
        ));
        let mut dev = I8042::new(exit.clone());
        let base = PioAddress(I8042_PORT);
        dev.pio_write(base, 0, &[CMD_RESET_CPU]);
        dev.pio_write(base, 4, &[0x20]);
        dev.pio_write(base, 4, &[]);
        assert!(exit.reset.read().is_err(), "no reset before the command");
        dev.pio_write(base, 4, &[CMD_RESET_CPU]);
        assert_eq!(exit.reset.read().unwrap(), 1);
        assert!(exit.poweroff.read().is_err());
        let mut status = [0xff];
        dev.pio_read(base, 4, &mut status);
        assert_eq!(status, [0]);
    }
}
