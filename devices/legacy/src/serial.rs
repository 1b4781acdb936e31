// SPDX-License-Identifier: Apache-2.0
//! COM1: vm-superio's 16550 model on port 0x3f8, IRQ 4, its interrupt
//! delivered through an irqfd so the VMM never injects by hand.
//!
//! For live migration the registers and the receive FIFO travel as
//! [`SavedSerial`], a serde mirror of vm-superio's `SerialState` (which has
//! no serde support); the output and the eventfds stay the destination's.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::io::{self, Write};

use serde::{Deserialize, Serialize};
use vm_device::bus::{PioAddress, PioAddressOffset};
use vm_device::MutDevicePio;
use vm_migration::{MigratableError, Pausable, Snapshot, Snapshottable};
use vm_superio::serial::{SerialEvents, SerialState};
use vm_superio::{Serial as Uart, Trigger};
use vmm_sys_util::eventfd::EventFd;

pub const SERIAL_PORT: u16 = 0x3f8;
pub const SERIAL_PORT_LEN: u16 = 8;
/// ISA IRQ (and IOAPIC pin) of COM1.
pub const SERIAL_IRQ: u32 = 4;

/// The serial port's name in a VM snapshot.
const SNAPSHOT_ID: &str = "serial";
/// Layout of [`SavedSerial`]; bump on any change.
const SNAPSHOT_VERSION: u32 = 1;

/// vm-superio's receive FIFO size (its `FIFO_SIZE`, which is private).
const FIFO_SIZE: usize = 64;
/// Bits vm-superio keeps in each register it alone sets (interrupt enable
/// as masked on write; identification, line and modem status as it
/// produces them). Anything else cannot come from a real source.
const IER_BITS: u8 = 0x0f;
const IIR_BITS: u8 = 0x07;
const LSR_BITS: u8 = 0x61;
const MSR_BITS: u8 = 0xf0;

/// Why a saved serial state was refused.
#[derive(Debug, thiserror::Error)]
enum SerialStateError {
    #[error("Receive FIFO holds {0} bytes, more than {FIFO_SIZE}")]
    FifoTooLong(usize),
    #[error("Register {name} has bits {value:#x} the UART never sets")]
    Register { name: &'static str, value: u8 },
    #[error("Failed to duplicate the serial eventfds")]
    EventFd(#[source] io::Error),
    #[error("Failed to raise the restored interrupt")]
    Interrupt(#[source] vm_superio::serial::Error<io::Error>),
}

/// The 16550's registers and receive FIFO, for snapshots. Untrusted on
/// restore.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct SavedSerial {
    baud_divisor_low: u8,
    baud_divisor_high: u8,
    interrupt_enable: u8,
    interrupt_identification: u8,
    line_control: u8,
    line_status: u8,
    modem_control: u8,
    modem_status: u8,
    scratch: u8,
    in_buffer: Vec<u8>,
}

impl From<SerialState> for SavedSerial {
    fn from(s: SerialState) -> Self {
        Self {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }
}

impl SavedSerial {
    /// vm-superio's state, if every register holds what the UART could.
    /// The guest writes the divisor, LCR, MCR and scratch freely.
    fn to_state(&self) -> Result<SerialState, SerialStateError> {
        if self.in_buffer.len() > FIFO_SIZE {
            return Err(SerialStateError::FifoTooLong(self.in_buffer.len()));
        }
        for (name, value, bits) in [
            ("IER", self.interrupt_enable, IER_BITS),
            ("IIR", self.interrupt_identification, IIR_BITS),
            ("LSR", self.line_status, LSR_BITS),
            ("MSR", self.modem_status, MSR_BITS),
        ] {
            if value & !bits != 0 {
                return Err(SerialStateError::Register { name, value });
            }
        }
        Ok(SerialState {
            baud_divisor_low: self.baud_divisor_low,
            baud_divisor_high: self.baud_divisor_high,
            interrupt_enable: self.interrupt_enable,
            interrupt_identification: self.interrupt_identification,
            line_control: self.line_control,
            line_status: self.line_status,
            modem_control: self.modem_control,
            modem_status: self.modem_status,
            scratch: self.scratch,
            in_buffer: self.in_buffer.clone(),
        })
    }
}

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

    /// Replaces the UART's registers and FIFO with `saved`; nothing changes
    /// on error. The new UART gets duplicates of the current eventfds (the
    /// same kernel objects, so the VMM's irqfd and input wiring still hold)
    /// and the current output. It raises the interrupt at once if one is
    /// enabled and pending, as the guest's driver expects.
    fn set_state(&mut self, saved: &SavedSerial) -> Result<(), SerialStateError> {
        let state = saved.to_state()?;
        let dup = |fd: &EventFd| fd.try_clone().map_err(SerialStateError::EventFd);
        let irq = SerialIrq(dup(&self.uart.interrupt_evt().0)?);
        let room = InputRoom(dup(&self.uart.events().0)?);
        // A placeholder output until the swap below.
        let sink: Box<dyn Write + Send> = Box::new(io::sink());
        let mut uart =
            Uart::from_state(&state, irq, room, sink).map_err(SerialStateError::Interrupt)?;
        std::mem::swap(uart.writer_mut(), self.uart.writer_mut());
        self.uart = uart;
        Ok(())
    }
}

/// No thread of its own: it only moves when a vCPU or the VMM's input
/// loop calls it.
impl Pausable for Serial {}

impl Snapshottable for Serial {
    fn id(&self) -> String {
        SNAPSHOT_ID.into()
    }

    fn snapshot(&mut self) -> Result<Snapshot, MigratableError> {
        Snapshot::new(
            SNAPSHOT_ID,
            SNAPSHOT_VERSION,
            &SavedSerial::from(self.uart.state()),
        )
    }

    fn restore(&mut self, snapshot: &Snapshot) -> Result<(), MigratableError> {
        let saved: SavedSerial = snapshot.state(SNAPSHOT_ID, SNAPSHOT_VERSION)?;
        self.set_state(&saved)
            .map_err(|e| MigratableError::Restore(SNAPSHOT_ID.into(), Box::new(e)))
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
    #![allow(
        clippy::unwrap_used,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )]

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

    /// A UART writing to a capture, with its irq and room eventfds.
    fn serial() -> (Serial, Capture, EventFd, EventFd) {
        let out = Capture::default();
        let irq = EventFd::new(EFD_NONBLOCK).unwrap();
        let room = EventFd::new(EFD_NONBLOCK).unwrap();
        let serial = Serial::new(
            SerialIrq(irq.try_clone().unwrap()),
            InputRoom(room.try_clone().unwrap()),
            Box::new(out.clone()),
        );
        (serial, out, irq, room)
    }

    fn read(serial: &mut Serial, reg: u16) -> u8 {
        let mut byte = [0u8];
        serial.pio_read(PioAddress(SERIAL_PORT), reg, &mut byte);
        byte[0]
    }

    fn write(serial: &mut Serial, reg: u16, value: u8) {
        serial.pio_write(PioAddress(SERIAL_PORT), reg, &[value]);
    }

    #[test]
    fn snapshot_round_trip_keeps_registers_and_fifo() {
        let (mut src, ..) = serial();
        // Divisor 0x0201 behind DLAB, then 7N2 with break, RX interrupt on.
        write(&mut src, 3, 0x80);
        write(&mut src, 0, 0x01);
        write(&mut src, 1, 0x02);
        write(&mut src, 3, 0x47);
        write(&mut src, 1, 0x01);
        write(&mut src, 4, 0x0b);
        write(&mut src, 7, 0x5a);
        assert_eq!(src.enqueue_input(b"hello"), 5);
        let saved = Snapshot::from_bytes(&src.snapshot().unwrap().to_bytes()).unwrap();

        let (mut dst, out, irq, room) = serial();
        dst.restore(&saved).unwrap();
        // Data pending with the RX interrupt enabled: raised on restore.
        assert!(irq.read().unwrap() >= 1);
        assert_eq!(
            [1, 3, 4, 7].map(|reg| read(&mut dst, reg)),
            [0x01, 0x47, 0x0b, 0x5a]
        );
        assert_eq!(read(&mut dst, 5) & 0x01, 0x01, "LSR data ready");
        write(&mut dst, 3, 0xc7);
        assert_eq!([read(&mut dst, 0), read(&mut dst, 1)], [0x01, 0x02]);
        write(&mut dst, 3, 0x47);
        let fifo: Vec<u8> = (0..5).map(|_| read(&mut dst, 0)).collect();
        assert_eq!(fifo, b"hello");
        // The destination's own room eventfd, output and irq still serve.
        assert!(room.read().unwrap() >= 1);
        write(&mut dst, 1, 0x02);
        write(&mut dst, 0, b'!');
        assert_eq!(out.0.lock().unwrap().as_slice(), b"!");
        assert!(irq.read().unwrap() >= 1);
    }

    #[test]
    fn hostile_serial_states_are_refused() {
        let (mut dst, ..) = serial();
        assert_eq!(
            dst.uart.fifo_capacity(),
            FIFO_SIZE,
            "vm-superio's FIFO size"
        );
        write(&mut dst, 7, 0x33);
        let good = SavedSerial::from(SerialState::default());
        let mutations: [fn(&mut SavedSerial); 5] = [
            |s| s.interrupt_enable = 0x10,
            |s| s.interrupt_identification = 0x08,
            |s| s.line_status |= 0x02,
            |s| s.modem_status |= 0x01,
            |s| s.in_buffer = vec![b'x'; FIFO_SIZE + 1],
        ];
        for mutate in mutations {
            let mut bad = good.clone();
            mutate(&mut bad);
            let snapshot = Snapshot::new(SNAPSHOT_ID, SNAPSHOT_VERSION, &bad).unwrap();
            assert!(
                matches!(dst.restore(&snapshot), Err(MigratableError::Restore(..))),
                "{bad:?}"
            );
        }
        let noise = Snapshot {
            id: SNAPSHOT_ID.into(),
            version: SNAPSHOT_VERSION,
            data: b"{\"scratch\": 300}".to_vec(),
        };
        assert!(dst.restore(&noise).is_err());
        assert_eq!(read(&mut dst, 7), 0x33, "nothing changed");

        let full = SavedSerial {
            in_buffer: vec![b'y'; FIFO_SIZE],
            ..good
        };
        let snapshot = Snapshot::new(SNAPSHOT_ID, SNAPSHOT_VERSION, &full).unwrap();
        dst.restore(&snapshot).unwrap();
        assert_eq!(dst.enqueue_input(b"z"), 0, "restored FIFO is full");
    }
}
