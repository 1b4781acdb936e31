// SPDX-License-Identifier: Apache-2.0
//! Port state and change notification.

use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};

use crate::vlans::{GuestVlans, SeenVlans};

/// A snapshot of the port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortState {
    /// The MAC the guest's vmxnet3 driver currently uses (it may change it).
    pub mac: [u8; 6],
    /// Carrier of the host backend (a TAP that exists and is up).
    pub carrier: bool,
    /// The guest has activated the NIC (vmxnet3 ACTIVATE_DEV, not quiesced).
    pub active: bool,
    /// MTU the guest configured (DriverShared `mtu`), 1500 until it says.
    pub mtu: u16,
}

impl PortState {
    /// The port can carry traffic: what PVRDMA reports as PORT_ACTIVE.
    pub fn link_up(&self) -> bool {
        self.carrier && self.active
    }
}

/// A change of the port, delivered to every subscriber.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortEvent {
    /// `link_up()` changed; carries the new value.
    Link(bool),
    /// The MAC changed; carries the new one.
    Mac([u8; 6]),
    /// The MTU changed; carries the new one.
    Mtu(u16),
}

type Listener = Box<dyn Fn(PortEvent) + Send + Sync>;
type Steering = Box<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// The shared port. Writers are the NIC model and the backend; readers and
/// subscribers are the functions that share the port.
pub struct Port {
    state: Mutex<PortState>,
    listeners: Mutex<Vec<Listener>>,
    /// The RDMA function's claim on received frames (RoCE).
    rdma: RwLock<Option<Steering>>,
    /// The VLANs of the guest's addresses, from the frames its NIC sent.
    vlans: GuestVlans,
}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port")
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

/// Ethernet's default MTU, until the guest configures another.
pub const DEFAULT_MTU: u16 = 1500;

impl Port {
    pub fn new(mac: [u8; 6], carrier: bool) -> Self {
        let state = PortState {
            mac,
            carrier,
            active: false,
            mtu: DEFAULT_MTU,
        };
        Self {
            state: Mutex::new(state),
            listeners: Mutex::new(Vec::new()),
            rdma: RwLock::new(None),
            vlans: GuestVlans::default(),
        }
    }

    /// Notes the source address of a frame the guest's NIC sent and its
    /// VLAN (see the `vlans` module): the NIC calls it for every frame.
    pub fn note_guest_frame(&self, frame: &[u8]) {
        self.vlans.note(frame);
    }

    /// The VLANs the guest sent from `addr` on, if it was ever seen.
    pub fn guest_vlans(&self, addr: IpAddr) -> Option<SeenVlans> {
        self.vlans.get(addr)
    }

    /// Moves whenever [`Port::guest_vlans`] would answer differently.
    pub fn guest_vlans_generation(&self) -> u64 {
        self.vlans.generation()
    }

    /// Lets the RDMA function of the port claim received frames: `f` is
    /// offered every frame before the NIC and returns whether it took it,
    /// as a converged NIC steers RoCE traffic to its RDMA engine.
    pub fn set_rdma_steering(&self, f: impl Fn(&[u8]) -> bool + Send + Sync + 'static) {
        *self.rdma.write().unwrap_or_else(PoisonError::into_inner) = Some(Box::new(f));
    }

    /// Offers a received frame to the RDMA function; true if it took it
    /// (the NIC must then not deliver it).
    pub fn steer_to_rdma(&self, frame: &[u8]) -> bool {
        self.rdma
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|f| f(frame))
    }

    fn lock(&self) -> MutexGuard<'_, PortState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn state(&self) -> PortState {
        *self.lock()
    }

    /// Registers `f` for every later change. Listeners run on the thread
    /// that made the change and must not call back into the port's setters.
    pub fn subscribe(&self, f: impl Fn(PortEvent) + Send + Sync + 'static) {
        self.listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::new(f));
    }

    fn notify(&self, events: &[PortEvent]) {
        if events.is_empty() {
            return;
        }
        let listeners = self
            .listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for event in events {
            for l in listeners.iter() {
                l(*event);
            }
        }
    }

    /// Applies `change` and tells subscribers what actually changed.
    fn update(&self, change: impl FnOnce(&mut PortState)) {
        let events = {
            let mut state = self.lock();
            let before = *state;
            change(&mut state);
            let mut events = Vec::new();
            if before.link_up() != state.link_up() {
                events.push(PortEvent::Link(state.link_up()));
            }
            if before.mac != state.mac {
                events.push(PortEvent::Mac(state.mac));
            }
            if before.mtu != state.mtu {
                events.push(PortEvent::Mtu(state.mtu));
            }
            events
        };
        self.notify(&events);
    }

    pub fn set_mac(&self, mac: [u8; 6]) {
        self.update(|s| s.mac = mac);
    }

    pub fn set_carrier(&self, carrier: bool) {
        self.update(|s| s.carrier = carrier);
    }

    pub fn set_active(&self, active: bool) {
        self.update(|s| s.active = active);
    }

    pub fn set_mtu(&self, mtu: u16) {
        self.update(|s| s.mtu = mtu);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn link_needs_carrier_and_activation_and_events_report_changes_only() {
        let port = Port::new([2, 0, 0, 0, 0, 1], true);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        port.subscribe(move |e| s.lock().unwrap().push(e));
        assert!(!port.state().link_up());
        port.set_active(true);
        port.set_active(true);
        port.set_mac([2, 0, 0, 0, 0, 2]);
        port.set_mtu(9000);
        port.set_carrier(false);
        port.set_active(false);
        assert_eq!(
            *seen.lock().unwrap(),
            vec![
                PortEvent::Link(true),
                PortEvent::Mac([2, 0, 0, 0, 0, 2]),
                PortEvent::Mtu(9000),
                PortEvent::Link(false),
            ]
        );
        assert_eq!(port.state().mtu, 9000);
    }
}
