// SPDX-License-Identifier: Apache-2.0
//! Several PVRDMA devices in one VM, in process: the device manager gives
//! each its own slot (vmxnet3 at function 0, PVRDMA at 1) after the disks
//! and NICs, labels each one's counters, and their state travels together
//! (a VM's state restores only onto the same devices). Needs /dev/kvm and
//! CAP_NET_ADMIN for the TAPs (created here, gone when the devices close).

use std::sync::Arc;

use legacy_devices::ExitSignal;
use vmm::config::{NetConfig, PvrdmaConfig, SerialConfig, VmConfig};
use vmm::device_manager::DeviceManager;
use vmm::kvm::Vm;
use vmm::memory::{create_guest_memory, GuestMemory};
use vmm_sys_util::eventfd::EventFd;

/// A TAP name of this process (tests of other runs may use TAPs too).
fn tap(name: &str) -> String {
    format!("mp{}{name}", std::process::id() % 100_000)
}

fn config(pvrdma: usize) -> VmConfig {
    let rdma = |i: usize| -> PvrdmaConfig {
        format!(
            "tap={},mac=02:00:00:00:01:{i:02x},local=off",
            tap(&format!("r{i}"))
        )
        .parse()
        .unwrap()
    };
    let net: NetConfig = format!("tap={},mac=02:00:00:00:00:01", tap("n"))
        .parse()
        .unwrap();
    VmConfig {
        kernel: "/unused".into(),
        initramfs: None,
        cmdline: String::new(),
        cpus: 1,
        memory: 32 << 20,
        disks: Vec::new(),
        nets: vec![net],
        pvrdma: (0..pvrdma).map(rdma).collect(),
        serial: SerialConfig::Off,
    }
}

fn build(config: &VmConfig) -> (DeviceManager, Arc<GuestMemory>, Vm) {
    let mem = Arc::new(create_guest_memory(config.memory).unwrap());
    let vm = Vm::new(&mem).unwrap_or_else(|e| panic!("needs /dev/kvm: {}", vmm::error_chain(&e)));
    let eventfd = || EventFd::new(0).unwrap();
    let exit = Arc::new(ExitSignal::new(eventfd(), eventfd()));
    let devices = DeviceManager::new(config, &mem, &vm, exit, false)
        .unwrap_or_else(|e| panic!("needs CAP_NET_ADMIN: {}", vmm::error_chain(&e)));
    (devices, mem, vm)
}

#[test]
fn two_pvrdma_devices_get_a_slot_each_and_migrate_together() {
    let two = config(2);
    let (devices, _mem, _vm) = build(&two);
    let placed: Vec<_> = devices
        .counters()
        .into_iter()
        .map(|d| (d.kind, d.id, d.mac.unwrap_or_default(), d.pci))
        .collect();
    let row = |kind: &str, id: &str, mac: &str, pci: &str| {
        (
            kind.to_owned(),
            id.to_owned(),
            mac.to_owned(),
            pci.to_owned(),
        )
    };
    assert_eq!(
        placed,
        [
            row("vmxnet3", "net0", "02:00:00:00:00:01", "00:01.0"),
            row("vmxnet3", "pvrdma0", "02:00:00:00:01:00", "00:02.0"),
            row("pvrdma", "pvrdma0", "02:00:00:00:01:00", "00:02.1"),
            row("vmxnet3", "pvrdma1", "02:00:00:00:01:01", "00:03.0"),
            row("pvrdma", "pvrdma1", "02:00:00:00:01:01", "00:03.1"),
        ]
    );

    devices.pause().unwrap();
    let saved = devices.snapshot().unwrap();
    drop(devices);
    // The same devices take the state (the TAPs are free again).
    let (again, _mem, _vm) = build(&two);
    again.restore(&saved).unwrap();
    drop(again);
    // A VM with one device fewer refuses it rather than drop a device's state.
    let (fewer, _mem, _vm) = build(&config(1));
    let err = fewer.restore(&saved).unwrap_err();
    assert!(
        vmm::error_chain(&err).contains("functions differ"),
        "{}",
        vmm::error_chain(&err)
    );
}
