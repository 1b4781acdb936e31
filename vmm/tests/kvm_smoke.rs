// SPDX-License-Identifier: Apache-2.0
//! KVM smoke test (issue 2): tiny hand-assembled guests on this host's own
//! `/dev/kvm`, driven through the VMM's own code rather than raw
//! kvm-ioctls.
//!
//! What it proves, one VM per test:
//! - `real_mode_serial_and_mmio`: `memory::create_guest_memory` +
//!   `kvm::Vm::new` give a runnable VM; a 16-bit guest's port writes reach
//!   userspace as `IoOut(0x3f8, ..)` in order, and a 32-bit-addressed
//!   ("unreal mode") store to the PCI MMIO hole exits as `MmioWrite`.
//! - `long_mode_serial_and_mmio`: the VMM's boot GDT, identity page tables,
//!   segment/control registers, CPUID, MSRs, FPU and LINT setup
//!   (`arch::cpu`) put a vCPU straight into working 64-bit code; its port
//!   output and a 4-byte MMIO store (address, size, value) exit as expected.
//! - `ioeventfd_datamatch`: `Vm::ioevent_registrar()` registers a doorbell
//!   that swallows exactly the matching 4-byte value in the kernel (eventfd
//!   counter 1, no exit) while a non-matching value still exits; after
//!   `unregister` the matching value exits to userspace again.
//! - `irqfd_msi_delivery`: `Vm::msi_router()` allocates a GSI + irqfd and
//!   installs an MSI route; a write to the irqfd alone wakes a halted guest
//!   through its interrupt vector (and nothing arrives without that write,
//!   nor a second time after it).
//!
//! If `/dev/kvm` is missing or unusable the tests fail, they do not skip.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_ioctls::{VcpuExit, VcpuFd};
use pci::MsiMessage;
use vm_memory::{Bytes, GuestAddress};
use vmm::arch::{cpu, layout};
use vmm::kvm::Vm;
use vmm::memory::{create_guest_memory, GuestMemory};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::signal::{Killable, SIGRTMIN};

/// Guest RAM for every test: well below the MMIO hole, so everything from
/// `layout::MMIO_HOLE_START` up is unbacked and exits as MMIO.
const MEM_SIZE: u64 = 32 << 20;
/// The legacy COM1 data port the guests "print" to.
const SERIAL_PORT: u16 = 0x3f8;
/// An address in the 32-bit PCI MMIO window (unbacked by RAM).
const MMIO_ADDR: u64 = 0xd000_0000;
/// How long any single expected vCPU exit may take.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long we watch for an exit that must NOT happen.
const QUIET_PERIOD: Duration = Duration::from_millis(300);
/// Where the long-mode tests place their code (where a kernel would go).
const LONG_MODE_ENTRY: u64 = layout::HIMEM_START;
/// Where the real-mode tests place their code (CS base 0).
const REAL_MODE_ENTRY: u16 = 0x1000;

// ---------------------------------------------------------------------------
// VM and vCPU setup through the VMM's own code
// ---------------------------------------------------------------------------

/// Guest memory plus a VM with in-kernel irqchip/PIT and memory slots, as
/// the VMM creates them. Fails loudly if /dev/kvm is unusable.
fn new_vm() -> (GuestMemory, Vm) {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        panic!("KVM smoke test needs a usable /dev/kvm (read-write), and opening it failed: {e}");
    }
    let mem = create_guest_memory(MEM_SIZE).expect("create_guest_memory");
    let vm = Vm::new(&mem).unwrap_or_else(|e| panic!("Vm::new: {}", vmm::error_chain(&e)));
    (mem, vm)
}

fn write_code(mem: &GuestMemory, addr: u64, code: &[u8]) {
    mem.write_slice(code, GuestAddress(addr))
        .expect("write guest code");
}

/// vCPU 0 in real mode with CS base 0 (not the reset vector), at `entry`,
/// stack at 0000:7000. With `flat_ds`, DS gets a 4 GiB limit ("unreal
/// mode"), so 32-bit-address-size accesses can reach the MMIO hole.
fn real_mode_vcpu(vm: &Vm, entry: u16, flat_ds: bool) -> VcpuFd {
    let vcpu = vm.fd().create_vcpu(0).expect("create_vcpu");
    cpu::set_cpuid(&vcpu, vm.supported_cpuid(), 0, 1).expect("set_cpuid");
    cpu::set_lint(&vcpu).expect("set_lint");
    let mut sregs = vcpu.get_sregs().unwrap();
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    if flat_ds {
        sregs.ds.limit = 0xffff_ffff;
        sregs.ds.g = 1;
    }
    vcpu.set_sregs(&sregs).unwrap();
    let mut regs = vcpu.get_regs().unwrap();
    regs.rip = u64::from(entry);
    regs.rsp = 0x7000;
    regs.rflags = 0x2;
    vcpu.set_regs(&regs).unwrap();
    vcpu
}

/// Page directory the test adds for the 4th GiB (0xc000_0000..), so 64-bit
/// code can reach the MMIO hole: the VMM's boot tables map only the first
/// GiB, which is all a Linux kernel needs at entry. 0xc000 is free memory
/// right after the VMM's PD.
const MMIO_PD_START: u64 = layout::PDE_START + 0x1000;

/// vCPU 0 in 64-bit mode at `entry`, set up exactly as the VMM sets up a
/// boot CPU (boot tables, CPUID, MSRs, LINT, regs, sregs, FPU), plus a
/// 2 MiB-page mapping of 0xc000_0000..0x1_0000_0000.
fn long_mode_vcpu(vm: &Vm, mem: &GuestMemory, entry: u64) -> VcpuFd {
    cpu::write_boot_tables(mem).expect("write_boot_tables");
    mem.write_obj(
        MMIO_PD_START | 0x03,
        GuestAddress(layout::PDPTE_START + 3 * 8),
    )
    .unwrap();
    for i in 0..512u64 {
        let pde = (layout::MMIO_HOLE_START + (i << 21)) | 0x83; // present, RW, 2 MiB
        mem.write_obj(pde, GuestAddress(MMIO_PD_START + i * 8))
            .unwrap();
    }
    let vcpu = vm.fd().create_vcpu(0).expect("create_vcpu");
    cpu::set_cpuid(&vcpu, vm.supported_cpuid(), 0, 1).expect("set_cpuid");
    cpu::set_boot_msrs(&vcpu).expect("set_boot_msrs");
    cpu::set_lint(&vcpu).expect("set_lint");
    cpu::set_boot_regs(&vcpu, entry).expect("set_boot_regs");
    cpu::set_boot_sregs(&vcpu).expect("set_boot_sregs");
    cpu::set_boot_fpu(&vcpu).expect("set_boot_fpu");
    vcpu
}

// ---------------------------------------------------------------------------
// A vCPU thread the test steps exit by exit, with timeouts
// ---------------------------------------------------------------------------

/// A vCPU exit, owned, as the test thread sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Exit {
    IoOut(u16, Vec<u8>),
    IoIn(u16, usize),
    MmioWrite(u64, Vec<u8>),
    MmioRead(u64, usize),
    Hlt,
    Shutdown,
    /// KVM_RUN returned EINTR (the runner's kick signal).
    Interrupted,
    /// Anything else, with the guest RIP for diagnosis.
    Other(String),
}

fn out(port: u16, byte: u8) -> Exit {
    Exit::IoOut(port, vec![byte])
}

fn run_once(fd: &mut VcpuFd) -> Exit {
    let exit = match fd.run() {
        Ok(VcpuExit::IoOut(port, data)) => return Exit::IoOut(port, data.to_vec()),
        Ok(VcpuExit::MmioWrite(addr, data)) => return Exit::MmioWrite(addr, data.to_vec()),
        Ok(VcpuExit::IoIn(port, data)) => {
            data.fill(0xff);
            return Exit::IoIn(port, data.len());
        }
        Ok(VcpuExit::MmioRead(addr, data)) => {
            data.fill(0xff);
            return Exit::MmioRead(addr, data.len());
        }
        Ok(VcpuExit::Hlt) => return Exit::Hlt,
        Ok(VcpuExit::Shutdown) => return Exit::Shutdown,
        Err(e) if e.errno() == libc::EINTR => return Exit::Interrupted,
        Ok(other) => format!("{other:?}"),
        Err(e) => format!("KVM_RUN failed: {e}"),
    };
    let rip = fd.get_regs().map(|r| r.rip).unwrap_or(u64::MAX);
    Exit::Other(format!("{exit} at rip {rip:#x}"))
}

/// Runs a `VcpuFd` on its own thread: each `resume` lets it run to its next
/// exit to userspace, which comes back over a channel. Dropping it kicks the
/// thread out of KVM_RUN (the VMM's own kick signal) and joins it.
struct VcpuRunner {
    go: Option<Sender<()>>,
    exits: Receiver<Exit>,
    thread: Option<JoinHandle<()>>,
}

impl VcpuRunner {
    fn spawn(mut fd: VcpuFd) -> Self {
        vmm::vcpu::register_kick_signal().expect("register_kick_signal");
        let (go, go_rx) = mpsc::channel::<()>();
        let (exit_tx, exits) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("smoke-vcpu".into())
            .spawn(move || {
                for () in go_rx {
                    if exit_tx.send(run_once(&mut fd)).is_err() {
                        break;
                    }
                }
                // Out of KVM_RUN for good: close the vCPU, then tell the
                // dropping side (by disconnecting) to stop kicking.
                drop(fd);
                drop(exit_tx);
            })
            .unwrap();
        Self {
            go: Some(go),
            exits,
            thread: Some(thread),
        }
    }

    /// Lets the vCPU run until its next exit.
    fn resume(&self) {
        self.go
            .as_ref()
            .unwrap()
            .send(())
            .expect("vCPU thread is gone");
    }

    /// The pending exit, if it arrives within `timeout`.
    fn wait(&self, timeout: Duration) -> Option<Exit> {
        match self.exits.recv_timeout(timeout) {
            Ok(exit) => Some(exit),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => panic!("vCPU thread ended unexpectedly"),
        }
    }

    /// Resumes the vCPU and returns its next exit; fails the test if none
    /// comes within [`EXIT_TIMEOUT`].
    fn next_exit(&self, waiting_for: &str) -> Exit {
        self.resume();
        self.wait(EXIT_TIMEOUT).unwrap_or_else(|| {
            panic!("no vCPU exit within {EXIT_TIMEOUT:?} (waiting for {waiting_for})")
        })
    }

    /// Steps the vCPU through `expected` exits, comparing each.
    fn expect_exits(&self, expected: &[Exit]) {
        for (i, want) in expected.iter().enumerate() {
            let got = self.next_exit(&format!("{want:?}"));
            assert_eq!(&got, want, "vCPU exit #{i} differs");
        }
    }
}

impl Drop for VcpuRunner {
    fn drop(&mut self) {
        // Ends the thread's loop once it is back from KVM_RUN...
        drop(self.go.take());
        let Some(thread) = self.thread.take() else {
            return;
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.exits.recv_timeout(Duration::from_millis(10)) {
                // The thread dropped its sender: it has left the loop.
                Err(RecvTimeoutError::Disconnected) => break,
                // ...and a kick (the VMM's own signal) gets it out of a
                // KVM_RUN blocked in HLT. A kick that lands just before
                // KVM_RUN is entered is missed, so repeat it.
                Ok(_) | Err(RecvTimeoutError::Timeout) => {}
            }
            if Instant::now() > deadline {
                eprintln!("kvm_smoke: vCPU thread did not leave KVM_RUN; leaving it behind");
                return;
            }
            let _ = thread.kill(SIGRTMIN());
        }
        let _ = thread.join();
    }
}

// ---------------------------------------------------------------------------
// Hand-assembled guest code
// ---------------------------------------------------------------------------

/// 16-bit: print `text` to COM1 (`mov dx, 0x3f8` then `mov al, c; out dx, al`
/// per byte).
fn rm_print(text: &[u8]) -> Vec<u8> {
    let [lo, hi] = SERIAL_PORT.to_le_bytes();
    let mut code = vec![0xba, lo, hi]; // mov dx, 0x3f8
    for &c in text {
        code.extend([0xb0, c]); // mov al, c
        code.push(0xee); //         out dx, al
    }
    code
}

/// 64-bit: same as [`rm_print`] (`66 ba` = mov dx, imm16 in 64-bit code).
fn lm_print(text: &[u8]) -> Vec<u8> {
    let [lo, hi] = SERIAL_PORT.to_le_bytes();
    let mut code = vec![0x66, 0xba, lo, hi]; // mov dx, 0x3f8
    for &c in text {
        code.extend([0xb0, c, 0xee]); //        mov al, c; out dx, al
    }
    code
}

/// `hlt; jmp $-1`: park forever (in the kernel: the irqchip is in-kernel).
const HALT_LOOP: [u8; 3] = [0xf4, 0xeb, 0xfd];

// ---------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------

#[test]
fn real_mode_serial_and_mmio() {
    let (mem, vm) = new_vm();
    let mut code = rm_print(b"RM");
    code.extend([
        0x66, 0xb8, 0x78, 0x56, 0x34, 0x12, //                mov eax, 0x12345678
        0x67, 0x66, 0xa3, 0x00, 0x00, 0x00, 0xd0, //          a32 mov [ds:0xd0000000], eax
    ]);
    code.extend(HALT_LOOP);
    write_code(&mem, u64::from(REAL_MODE_ENTRY), &code);

    let vcpu = VcpuRunner::spawn(real_mode_vcpu(&vm, REAL_MODE_ENTRY, true));
    vcpu.expect_exits(&[
        out(SERIAL_PORT, b'R'),
        out(SERIAL_PORT, b'M'),
        Exit::MmioWrite(MMIO_ADDR, 0x1234_5678u32.to_le_bytes().to_vec()),
    ]);
    // Parked in HLT, handled in the kernel: no further exit.
    vcpu.resume();
    assert_eq!(
        vcpu.wait(QUIET_PERIOD),
        None,
        "a halted guest exited to userspace"
    );
}

#[test]
fn long_mode_serial_and_mmio() {
    let (mem, vm) = new_vm();
    let mut code = lm_print(b"LM");
    code.extend([
        0xbb, 0x00, 0x00, 0x00, 0xd0, //  mov ebx, 0xd0000000   (zero-extends into rbx)
        0xb8, 0x78, 0x56, 0x34, 0x12, //  mov eax, 0x12345678
        0x89, 0x03, //                    mov [rbx], eax
        0x48, 0xb8, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22,
        0x11, // mov rax, 0x1122334455667788
        0x48, 0x89, 0x43, 0x08, //        mov [rbx+8], rax
        0x88, 0x43, 0x10, //              mov [rbx+0x10], al
    ]);
    code.extend(HALT_LOOP);
    write_code(&mem, LONG_MODE_ENTRY, &code);

    let vcpu = VcpuRunner::spawn(long_mode_vcpu(&vm, &mem, LONG_MODE_ENTRY));
    vcpu.expect_exits(&[
        out(SERIAL_PORT, b'L'),
        out(SERIAL_PORT, b'M'),
        Exit::MmioWrite(MMIO_ADDR, 0x1234_5678u32.to_le_bytes().to_vec()),
        Exit::MmioWrite(
            MMIO_ADDR + 8,
            0x1122_3344_5566_7788u64.to_le_bytes().to_vec(),
        ),
        Exit::MmioWrite(MMIO_ADDR + 0x10, vec![0x88]),
    ]);
    vcpu.resume();
    assert_eq!(
        vcpu.wait(QUIET_PERIOD),
        None,
        "a halted guest exited to userspace"
    );
}

#[test]
fn ioeventfd_datamatch() {
    const DOORBELL: u64 = MMIO_ADDR + 0x1000;
    let (mem, vm) = new_vm();
    let mut code = vec![
        0xbb, 0x00, 0x10, 0x00, 0xd0, //  mov ebx, 0xd0001000
        0xb8, 0x41, 0x00, 0x00, 0x00, //  mov eax, 0x41
        0x89, 0x03, //                    mov [rbx], eax   ; no match: exits
        0xb8, 0x42, 0x00, 0x00, 0x00, //  mov eax, 0x42
        0x89, 0x03, //                    mov [rbx], eax   ; match: eventfd only
    ];
    code.extend(lm_print(b"1")); //       phase 1 done (test unregisters now)
    code.extend([
        0xb8, 0x42, 0x00, 0x00, 0x00, //  mov eax, 0x42
        0x89, 0x03, //                    mov [rbx], eax   ; unregistered: exits
    ]);
    code.extend(lm_print(b"2"));
    code.extend(HALT_LOOP);
    write_code(&mem, LONG_MODE_ENTRY, &code);

    let doorbell = EventFd::new(EFD_NONBLOCK).unwrap();
    let ioevents = vm.ioevent_registrar();
    ioevents
        .register(&doorbell, DOORBELL, Some(0x42))
        .expect("register ioeventfd");

    let vcpu = VcpuRunner::spawn(long_mode_vcpu(&vm, &mem, LONG_MODE_ENTRY));
    // Exactly one MMIO exit (0x41); the 0x42 store never left the kernel.
    vcpu.expect_exits(&[
        Exit::MmioWrite(DOORBELL, 0x41u32.to_le_bytes().to_vec()),
        out(SERIAL_PORT, b'1'),
    ]);
    assert_eq!(
        doorbell.read().expect("doorbell eventfd was not signalled"),
        1
    );

    ioevents
        .unregister(&doorbell, DOORBELL, Some(0x42))
        .expect("unregister ioeventfd");
    vcpu.expect_exits(&[
        Exit::MmioWrite(DOORBELL, 0x42u32.to_le_bytes().to_vec()),
        out(SERIAL_PORT, b'2'),
    ]);
    let err = doorbell
        .read()
        .expect_err("eventfd signalled after unregister");
    assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock, "{err}");
}

/// The guest's interrupt vector for the MSI (fixed delivery needs >= 16).
const MSI_VECTOR: u8 = 0x40;
const IRQ_HANDLER: u16 = 0x2000;
const DEFAULT_HANDLER: u16 = 0x2100;

/// 16-bit interrupt handler: print `c` to COM1, `iret`.
fn rm_irq_handler(c: u8) -> Vec<u8> {
    let mut code = vec![0x50, 0x52]; // push ax; push dx
    code.extend(rm_print(&[c]));
    code.extend([0x5a, 0x58, 0xcf]); // pop dx; pop ax; iret
    code
}

fn set_lapic_reg(lapic: &mut kvm_bindings::kvm_lapic_state, reg: usize, value: u32) {
    for (dst, src) in lapic.regs[reg..reg + 4].iter_mut().zip(value.to_le_bytes()) {
        *dst = src as _;
    }
}

#[test]
fn irqfd_msi_delivery() {
    let (mem, vm) = new_vm();
    // IVT: every vector -> a handler printing '?', MSI_VECTOR -> one printing 'I'.
    for v in 0..256u64 {
        let handler = if v == u64::from(MSI_VECTOR) {
            IRQ_HANDLER
        } else {
            DEFAULT_HANDLER
        };
        mem.write_obj(u32::from(handler), GuestAddress(v * 4))
            .unwrap(); // segment 0
    }
    write_code(&mem, u64::from(IRQ_HANDLER), &rm_irq_handler(b'I'));
    write_code(&mem, u64::from(DEFAULT_HANDLER), &rm_irq_handler(b'?'));
    // sti; hlt; jmp $-1  (each interrupt returns into the halt loop)
    write_code(&mem, u64::from(REAL_MODE_ENTRY), &[0xfb, 0xf4, 0xeb, 0xfd]);

    let fd = real_mode_vcpu(&vm, REAL_MODE_ENTRY, false);
    // The VMM's set_lint ran in real_mode_vcpu; enable the LAPIC (spurious
    // vector register: APIC software enable | vector 0xff).
    let mut lapic = fd.get_lapic().unwrap();
    set_lapic_reg(&mut lapic, 0xf0, 0x1ff);
    fd.set_lapic(&lapic).unwrap();

    let router = vm.msi_router();
    let vector = router.allocate().expect("allocate MSI vector");
    assert!(
        vector.gsi >= 24,
        "MSI GSI {} collides with the IOAPIC pins",
        vector.gsi
    );
    // Fixed delivery, edge, physical destination APIC 0.
    let msg = MsiMessage {
        addr_lo: 0xfee0_0000,
        addr_hi: 0,
        data: u32::from(MSI_VECTOR),
    };
    router
        .set_route(vector.gsi, Some(msg))
        .expect("set MSI route");

    let vcpu = VcpuRunner::spawn(fd);
    vcpu.resume();
    assert_eq!(
        vcpu.wait(QUIET_PERIOD),
        None,
        "guest exited before any interrupt was sent"
    );

    vector.irqfd.write(1).unwrap();
    let exit = vcpu
        .wait(EXIT_TIMEOUT)
        .unwrap_or_else(|| panic!("MSI from the irqfd not delivered within {EXIT_TIMEOUT:?}"));
    assert_eq!(exit, out(SERIAL_PORT, b'I'));

    // One edge, one interrupt: back in HLT with nothing more to say.
    vcpu.resume();
    assert_eq!(
        vcpu.wait(QUIET_PERIOD),
        None,
        "more than one interrupt per irqfd write"
    );

    drop(vcpu);
    router.release(&vector).expect("release MSI vector");
}

/// A vCPU's state saved in the middle of a program and restored into a
/// vCPU of another VM (its memory a copy) continues the program where it
/// was, with its registers: the vCPU half of live migration.
#[test]
fn vcpu_state_moves_to_another_vm() {
    use vmm::arch::state;

    let program = |mem: &GuestMemory| {
        let mut code = vec![0x48, 0xbb]; //        mov rbx, imm64
        code.extend(0x1122_3344_5566_7788u64.to_le_bytes());
        code.extend(lm_print(b"A"));
        code.extend(lm_print(b"B"));
        code.extend([
            0xb9, 0x00, 0x00, 0x00, 0xd0, //        mov ecx, 0xd0000000
            0x48, 0x89, 0x19, //                    mov [rcx], rbx
        ]);
        code.extend(HALT_LOOP);
        write_code(mem, LONG_MODE_ENTRY, &code);
    };
    let (mem, vm) = new_vm();
    program(&mem);
    let mut fd = long_mode_vcpu(&vm, &mem, LONG_MODE_ENTRY);
    assert_eq!(run_once(&mut fd), out(SERIAL_PORT, b'A'));
    state::complete_io(&mut fd, |_| false);
    let saved = state::save(&fd, vm.msr_list()).expect("save");
    let json = serde_json::to_vec(&saved).expect("encode");
    drop((fd, vm));

    let (mem2, vm2) = new_vm();
    program(&mem2);
    // The page tables the program runs on, as the source had them.
    cpu::write_boot_tables(&mem2).expect("write_boot_tables");
    mem2.write_obj(
        MMIO_PD_START | 0x03,
        GuestAddress(layout::PDPTE_START + 3 * 8),
    )
    .unwrap();
    for i in 0..512u64 {
        let pde = (layout::MMIO_HOLE_START + (i << 21)) | 0x83;
        mem2.write_obj(pde, GuestAddress(MMIO_PD_START + i * 8))
            .unwrap();
    }
    let mut fd2 = vm2.fd().create_vcpu(0).expect("create_vcpu");
    cpu::set_cpuid(&fd2, vm2.supported_cpuid(), 0, 1).expect("set_cpuid");
    let restored: state::VcpuState = serde_json::from_slice(&json).expect("decode");
    assert_eq!(restored.rip(), saved.rip());
    state::restore(&fd2, &restored).expect("restore");
    assert_eq!(
        run_once(&mut fd2),
        out(SERIAL_PORT, b'B'),
        "continues after A, not again"
    );
    assert_eq!(
        run_once(&mut fd2),
        Exit::MmioWrite(MMIO_ADDR, 0x1122_3344_5566_7788u64.to_le_bytes().to_vec()),
        "with its registers"
    );
}

/// A load that straddles two MMIO pages exits once per page, the second
/// time while KVM completes the first: saving the vCPU after its first exit
/// serves the second (`complete_io`), so the saved vCPU is past the load
/// with all its bytes, not halfway with a part only KVM knew of.
#[test]
fn saving_finishes_a_split_mmio_access() {
    use vmm::arch::state;

    let (mem, vm) = new_vm();
    let at = MMIO_ADDR + 0xffc;
    let mut code = vec![0xb9]; //                  mov ecx, at
    code.extend(u32::try_from(at).unwrap().to_le_bytes());
    code.extend([0x48, 0x8b, 0x19]); //            mov rbx, [rcx]
    code.extend(lm_print(b"B"));
    code.extend(HALT_LOOP);
    write_code(&mem, LONG_MODE_ENTRY, &code);
    let mut fd = long_mode_vcpu(&vm, &mem, LONG_MODE_ENTRY);
    assert_eq!(run_once(&mut fd), Exit::MmioRead(at, 4));
    let mut parts = Vec::new();
    state::complete_io(&mut fd, |exit| match exit {
        VcpuExit::MmioRead(addr, data) => {
            data.fill(0x11);
            parts.push((addr, data.len()));
            true
        }
        _ => false,
    });
    assert_eq!(parts, [(MMIO_ADDR + 0x1000, 4)]);
    let saved = state::save(&fd, vm.msr_list()).expect("save");
    assert_eq!(
        saved.rip(),
        LONG_MODE_ENTRY + 8,
        "the load is complete when saved"
    );
    assert_eq!(fd.get_regs().unwrap().rbx, 0x1111_1111_ffff_ffff);
    assert_eq!(run_once(&mut fd), out(SERIAL_PORT, b'B'));
}

/// The VM-wide KVM state (PICs, IOAPIC, PIT, clock) of one VM, put into
/// another, reads back the same there (the clock goes on from the saved
/// time).
#[test]
fn vm_state_moves_to_another_vm() {
    use vmm::arch::state;

    let (_mem, vm) = new_vm();
    // Something non-default to carry: an IOAPIC redirection entry.
    let mut chip = kvm_bindings::kvm_irqchip {
        chip_id: kvm_bindings::KVM_IRQCHIP_IOAPIC,
        ..Default::default()
    };
    vm.fd().get_irqchip(&mut chip).unwrap();
    // SAFETY: reading and writing the IOAPIC variant of the union, which
    // KVM filled for chip_id IOAPIC.
    unsafe {
        chip.chip.ioapic.redirtbl[4].bits = 0x0001_0000_0000_0034;
    }
    vm.fd().set_irqchip(&chip).unwrap();
    let saved = state::save_vm(vm.fd()).expect("save");
    let json = serde_json::to_vec(&saved).expect("encode");
    let (_mem2, vm2) = new_vm();
    let restored: state::VmState = serde_json::from_slice(&json).expect("decode");
    state::restore_vm(vm2.fd(), &restored).expect("restore");
    let mut back = kvm_bindings::kvm_irqchip {
        chip_id: kvm_bindings::KVM_IRQCHIP_IOAPIC,
        ..Default::default()
    };
    vm2.fd().get_irqchip(&mut back).unwrap();
    // SAFETY: as above.
    let bits = unsafe { back.chip.ioapic.redirtbl[4].bits };
    assert_eq!(bits, 0x0001_0000_0000_0034);
    let clock = vm2.fd().get_clock().unwrap().clock;
    let was = vm.fd().get_clock().unwrap().clock;
    assert!(
        clock + 1_000_000_000 > was,
        "clock carried over ({clock} vs {was})"
    );
}
