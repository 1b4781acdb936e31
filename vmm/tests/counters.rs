// SPDX-License-Identifier: Apache-2.0
//! `vm.counters` on the VMM side: the device manager reads every device's
//! counters from the handles it kept (here two virtio-blk disks on a real
//! KVM VM, which needs /dev/kvm), and a VMM without a VM yet refuses the
//! request through its API socket.

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use api::client::{ApiClient, ClientError};
use api::ApiRequest;
use legacy_devices::ExitSignal;
use vmm::config::{DiskConfig, SerialConfig, VmConfig};
use vmm::device_manager::DeviceManager;
use vmm::kvm::Vm;
use vmm::memory::create_guest_memory;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::tempdir::TempDir;
use vmm_sys_util::tempfile::TempFile;

/// A disk image of `sectors` 512-byte sectors.
fn image(sectors: usize) -> TempFile {
    let file = TempFile::new().unwrap();
    file.as_file().write_all(&vec![0; sectors * 512]).unwrap();
    file
}

#[test]
fn device_manager_reads_every_disk_in_pci_order() {
    let (a, b) = (image(8), image(16));
    let config = VmConfig {
        kernel: "/unused".into(),
        initramfs: None,
        cmdline: String::new(),
        cpus: 1,
        memory: 32 << 20,
        disks: vec![
            DiskConfig {
                path: a.as_path().to_owned(),
                readonly: false,
            },
            DiskConfig {
                path: b.as_path().to_owned(),
                readonly: true,
            },
        ],
        nets: Vec::new(),
        pvrdma: Vec::new(),
        serial: SerialConfig::Off,
    };
    let mem = Arc::new(create_guest_memory(config.memory).unwrap());
    let vm = Vm::new(&mem).unwrap_or_else(|e| panic!("needs /dev/kvm: {}", vmm::error_chain(&e)));
    let eventfd = || EventFd::new(0).unwrap();
    let exit = Arc::new(ExitSignal::new(eventfd(), eventfd()));
    let devices = DeviceManager::new(&config, &mem, &vm, exit, false).unwrap();

    let counters = devices.counters();
    let placed: Vec<_> = counters
        .iter()
        .map(|d| (d.kind.as_str(), d.pci.as_str(), d.qps.is_none()))
        .collect();
    assert_eq!(
        placed,
        [
            ("virtio-blk", "00:01.0", true),
            ("virtio-blk", "00:02.0", true)
        ]
    );
    for disk in &counters {
        assert_eq!(disk.counters.get("read_requests"), Some(&0), "{disk:?}");
        assert_eq!(disk.counters.get("chain_dropped"), Some(&0), "{disk:?}");
        assert!(disk.counters.values().all(|v| *v == 0), "{disk:?}");
    }
}

/// A `pvrdma-vmm` waiting for an incoming migration; killed on drop.
struct Receiver {
    child: Child,
    client: ApiClient,
    _dir: TempDir,
}

impl Receiver {
    fn start() -> Self {
        let dir = TempDir::new().unwrap();
        let socket = dir.as_path().join("api.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_pvrdma-vmm"))
            .args(["--serial", "off", "--api-socket"])
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let client = ApiClient::new(&socket);
        let deadline = Instant::now() + Duration::from_secs(20);
        while client.call(&ApiRequest::Ping).is_err() {
            assert!(Instant::now() < deadline, "the VMM never answered");
            thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            client,
            _dir: dir,
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_vmm_without_a_vm_refuses_counters() {
    let mut vmm = Receiver::start();
    match vmm.client.call(&ApiRequest::Counters) {
        Err(ClientError::Http { status, message }) => {
            assert_eq!(status, 409);
            assert!(message.contains("no VM here yet"), "{message}");
        }
        other => panic!("expected 409, got {other:?}"),
    }
    assert_eq!(vmm.client.call(&ApiRequest::Shutdown).unwrap(), None);
    let status = vmm.child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}
