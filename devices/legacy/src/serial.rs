// SPDX-License-Identifier: Apache-2.0
//! COM1: vm-superio's 16550 model on port 0x3f8, IRQ 4, its interrupt
//! delivered through an irqfd so the VMM never injects by hand.

use std::io::{self, Write};

use vm_device::bus::{PioAddress, PioAddressOffset};
use vm_device::MutDevicePio;
use vm_superio::serial::SerialEvents;
use vm_superio::{Serial as Uart, Trigger};
use vmm_sys_util::eventfd::EventFd;

pub const SERIAL_PORT: u16 = 0x3f8;
pub const SERIAL_PORT_LEN: u16 = 8;
/// ISA IRQ (and IOAPIC pin) of COM1.
pub const SERIAL_IRQ: u32 = 4;

/// The serial interrupt line: an eventfd the VMM registers as irqfd on
/// GSI [`SERIAL_IRQ`].
#[derive(Debug)]
pub struct SerialIrq(pub EventFd);

impl Trigger for SerialIrq {
    type E = io::Error;

    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// Tells the VMM that the guest emptied the receive FIFO, so console input
/// held back while it was full can be offered again (backpressure instead
/// of dropping what the user typed or pasted).
#[derive(Debug)]
pub struct InputRoom(pub EventFd);

impl SerialEvents for InputRoom {
    fn buffer_read(&self) {}
    fn out_byte(&self) {}
    fn tx_lost_byte(&self) {}
    fn in_buffer_empty(&self) {
        if let Err(e) = self.0.write(1) {
            log::warn!("Failed to signal serial input room: {e}");
        }
    }
}

pub struct Serial {
    uart: Uart<SerialIrq, InputRoom, Box<dyn Write + Send>>,
}

impl std::fmt::Debug for Serial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Serial")
    }
}

impl Serial {
    /// A UART whose transmitted bytes go to `out` (stdout, a file, or
    /// `io::sink()` when the console is off); `room` fires whenever the
    /// guest has read the receive FIFO empty.
    pub fn new(irq: SerialIrq, room: InputRoom, out: Box<dyn Write + Send>) -> Self {
        Self {
            uart: Uart::with_events(irq, room, out),
        }
    }

    /// Queues console input for the guest; returns how many bytes fit in
    /// the receive FIFO (the rest must be offered again later).
    pub fn enqueue_input(&mut self, input: &[u8]) -> usize {
        let room = self.uart.fifo_capacity().min(input.len());
        let Some(chunk) = input.get(..room) else {
            return 0;
        };
        match self.uart.enqueue_raw_bytes(chunk) {
            Ok(n) => n,
            Err(e) => {
                log::warn!("Serial input dropped: {e:?}");
                0
            }
        }
    }
}

impl MutDevicePio for Serial {
    fn pio_read(&mut self, _base: PioAddress, offset: PioAddressOffset, data: &mut [u8]) {
        match (u8::try_from(offset), data) {
            (Ok(reg), [byte]) => *byte = self.uart.read(reg),
            (_, data) => data.fill(0xff),
        }
    }

    fn pio_write(&mut self, _base: PioAddress, offset: PioAddressOffset, data: &[u8]) {
        if let (Ok(reg), [byte]) = (u8::try_from(offset), data) {
            if let Err(e) = self.uart.write(reg, *byte) {
                log::warn!("Serial write failed: {e:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    use super::*;

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl Write for Capture {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn transmits_bytes_and_raises_irq() {
        let out = Capture::default();
        let irq = EventFd::new(EFD_NONBLOCK).unwrap();
        let room = InputRoom(EventFd::new(EFD_NONBLOCK).unwrap());
        let mut serial = Serial::new(
            SerialIrq(irq.try_clone().unwrap()),
            room,
            Box::new(out.clone()),
        );
        let base = PioAddress(SERIAL_PORT);
        // Enable the THR-empty interrupt, then send "hi".
        serial.pio_write(base, 1, &[0x02]);
        serial.pio_write(base, 0, b"h");
        serial.pio_write(base, 0, b"i");
        assert_eq!(out.0.lock().unwrap().as_slice(), b"hi");
        assert!(irq.read().unwrap() >= 1);
        // Multi-byte and out-of-range accesses are ignored, reads give all-ones.
        serial.pio_write(base, 0, b"xy");
        let mut wide = [0u8; 2];
        serial.pio_read(base, 0, &mut wide);
        assert_eq!(wide, [0xff, 0xff]);
        assert_eq!(out.0.lock().unwrap().as_slice(), b"hi");
    }

    #[test]
    fn input_is_bounded_by_the_fifo_and_room_is_signalled() {
        let irq = EventFd::new(EFD_NONBLOCK).unwrap();
        let room = EventFd::new(EFD_NONBLOCK).unwrap();
        let mut serial = Serial::new(
            SerialIrq(irq),
            InputRoom(room.try_clone().unwrap()),
            Box::new(io::sink()),
        );
        let big = vec![b'a'; 1000];
        let taken = serial.enqueue_input(&big);
        assert!(taken > 0 && taken < big.len());
        assert_eq!(serial.enqueue_input(&big), 0, "a full FIFO takes nothing");
        let base = PioAddress(SERIAL_PORT);
        let mut byte = [0u8];
        for _ in 0..taken {
            assert!(
                room.read().is_err(),
                "no room signalled before the FIFO is empty"
            );
            serial.pio_read(base, 0, &mut byte);
            assert_eq!(byte, [b'a']);
        }
        assert!(room.read().unwrap() >= 1, "emptying the FIFO signals room");
        assert!(serial.enqueue_input(&big) > 0);
    }
}
