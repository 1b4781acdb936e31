// SPDX-License-Identifier: Apache-2.0
//! The serial console's input: the VMM's stdin fed into the guest's UART.

use std::io::Read;
use std::os::fd::AsRawFd;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use crate::device_manager::DeviceManager;
use crate::machine::VmmError;

/// Moves console input from the VMM's stdin into the guest's UART with
/// backpressure: while the receive FIFO is full, stdin is not read (the
/// bytes wait in the terminal or pipe), and the guest draining the FIFO
/// resumes the flow. Nothing typed or pasted is dropped.
pub(crate) struct ConsoleInput {
    /// stdin is a console source (tty mode) and has not reached EOF.
    open: bool,
    /// stdin is in the epoll set (only while nothing is pending).
    watched: bool,
    /// stdin cannot be polled (a regular file): it is always readable, so
    /// it is read whenever the FIFO has room.
    pub(crate) always_ready: bool,
    pending: Vec<u8>,
}

impl ConsoleInput {
    pub(crate) fn new(enabled: bool) -> Self {
        Self {
            open: enabled,
            watched: false,
            always_ready: false,
            pending: Vec::new(),
        }
    }

    fn set_watch(&mut self, epoll: &Epoll, token: u64, on: bool) -> Result<(), VmmError> {
        if self.watched == on {
            return Ok(());
        }
        let fd = std::io::stdin().as_raw_fd();
        let result = if on {
            epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, token),
            )
        } else {
            epoll.ctl(ControlOperation::Delete, fd, EpollEvent::default())
        };
        match result {
            Ok(()) => self.watched = on,
            // Regular files (and /dev/null) cannot be polled: always readable.
            Err(e) if on && e.raw_os_error() == Some(libc::EPERM) => self.always_ready = true,
            Err(e) => return Err(VmmError::EventLoop(e)),
        }
        Ok(())
    }

    pub(crate) fn watch(&mut self, epoll: &Epoll, token: u64) -> Result<(), VmmError> {
        let on = self.open && self.pending.is_empty() && !self.always_ready;
        self.set_watch(epoll, token, on)
    }

    pub(crate) fn read_stdin(
        &mut self,
        devices: &DeviceManager,
        epoll: &Epoll,
        token: u64,
    ) -> Result<(), VmmError> {
        let mut buf = [0u8; 256];
        match std::io::stdin().lock().read(&mut buf) {
            Ok(0) | Err(_) => self.open = false,
            Ok(n) => self
                .pending
                .extend_from_slice(buf.get(..n).unwrap_or_default()),
        }
        self.feed(devices, epoll, token)
    }

    /// Offers pending input to the guest, then decides whether to read
    /// more: only once everything pending has been taken.
    pub(crate) fn feed(
        &mut self,
        devices: &DeviceManager,
        epoll: &Epoll,
        token: u64,
    ) -> Result<(), VmmError> {
        let taken = devices.serial_input(&self.pending);
        self.pending.drain(..taken.min(self.pending.len()));
        self.watch(epoll, token)?;
        if self.always_ready && self.open && self.pending.is_empty() && taken > 0 {
            return self.read_stdin(devices, epoll, token);
        }
        Ok(())
    }
}
