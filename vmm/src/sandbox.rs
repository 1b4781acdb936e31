// SPDX-License-Identifier: Apache-2.0
//! Least privilege: a seccomp filter per kind of VMM thread, and no
//! capability kept once the VM's host resources (TAPs) are open.
//!
//! As in Firecracker and cloud-hypervisor, each thread installs the
//! filter of its kind when it starts ([`enter`]). A thread inherits its
//! creator's filter and adds its own, so the two intersect: device workers
//! are started by the VMM thread (at build) or by a vCPU (when the driver
//! activates the device), which is why [`Kind::Vmm`] and [`Kind::Vcpu`]
//! allow everything [`Kind::Device`] does. The allow-lists are listed in
//! docs/security.md.
//!
//! A forbidden syscall raises SIGSYS; the handler names the thread and the
//! syscall on stderr and ends the process (`--seccomp log` lets it through
//! and has the kernel log it instead, for finding what a new code path
//! needs).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// What `--seccomp` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SeccompMode {
    /// A forbidden syscall ends the VMM with a message naming it.
    #[value(name = "true")]
    Enforce,
    /// Forbidden syscalls are allowed and logged by the kernel (audit).
    Log,
    /// No filters.
    #[value(name = "false")]
    Off,
}

/// The kinds of threads, each with its own allow-list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The main thread (VM creation, control loop, snapshots) and the
    /// migration threads.
    Vmm,
    /// A vCPU: KVM_RUN and the device register handlers it runs.
    Vcpu,
    /// A device worker (PVRDMA, vmxnet3, virtio-blk).
    Device,
    /// The HTTP API server.
    Api,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Vmm => "vmm",
            Kind::Vcpu => "vcpu",
            Kind::Device => "device",
            Kind::Api => "api",
        }
    }
}

/// Why the sandbox could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot build the seccomp filter of the {0:?} threads: {1}")]
    Filter(Kind, seccompiler::BackendError),
    #[error("cannot install the SIGSYS handler: {0}")]
    Handler(std::io::Error),
    #[error("cannot install the seccomp filter of a {0:?} thread: {1}")]
    Apply(Kind, seccompiler::Error),
    #[error("cannot drop the capabilities: {0}")]
    Capabilities(caps::errors::CapsError),
}

/// The compiled filters (none with `--seccomp false`).
struct Filters {
    /// By kind: VMM, vCPU, device, API.
    kinds: [BpfProgram; 4],
    /// For every kind but the VMM's: opening a file fails with EACCES.
    /// glibc's allocator opens `/proc/sys/vm/overcommit_memory` the first
    /// time a thread's heap shrinks (and `/sys/.../cpu/online` when it
    /// sizes its arenas), and copes with a refusal; a trap would kill the
    /// VMM for it.
    no_open: BpfProgram,
}

static FILTERS: OnceLock<Option<Filters>> = OnceLock::new();

/// Compiles the filters for `mode` and installs the SIGSYS handler. Call
/// once, before any thread of the VM starts.
pub fn init(mode: SeccompMode) -> Result<(), SandboxError> {
    let on_mismatch = match mode {
        SeccompMode::Enforce => SeccompAction::Trap,
        SeccompMode::Log => SeccompAction::Log,
        SeccompMode::Off => {
            let _ = FILTERS.set(None);
            return Ok(());
        }
    };
    if mode == SeccompMode::Enforce {
        install_sigsys_handler()?;
    }
    let compile = |kind| {
        SeccompFilter::new(
            rules(kind),
            on_mismatch.clone(),
            SeccompAction::Allow,
            TargetArch::x86_64,
        )
        .and_then(BpfProgram::try_from)
        .map_err(|e| SandboxError::Filter(kind, e))
    };
    let kinds = [
        compile(Kind::Vmm)?,
        compile(Kind::Vcpu)?,
        compile(Kind::Device)?,
        compile(Kind::Api)?,
    ];
    let no_open = SeccompFilter::new(
        [libc::SYS_open, libc::SYS_openat]
            .into_iter()
            .map(|nr| (nr, Vec::new()))
            .collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
        TargetArch::x86_64,
    )
    .and_then(BpfProgram::try_from)
    .map_err(|e| SandboxError::Filter(Kind::Device, e))?;
    let _ = FILTERS.set(Some(Filters { kinds, no_open }));
    Ok(())
}

/// Installs the filter of `kind` on the calling thread.
pub fn apply(kind: Kind) -> Result<(), SandboxError> {
    let Some(Some(filters)) = FILTERS.get() else {
        return Ok(());
    };
    let [vmm, vcpu, device, api] = &filters.kinds;
    let filter = match kind {
        Kind::Vmm => vmm,
        Kind::Vcpu => vcpu,
        Kind::Device => device,
        Kind::Api => api,
    };
    // The kernel runs every filter and takes the strictest answer: with
    // `no_open` installed, open and openat (allowed by the kind's list)
    // fail with EACCES.
    if kind != Kind::Vmm {
        seccompiler::apply_filter(&filters.no_open).map_err(|e| SandboxError::Apply(kind, e))?;
    }
    seccompiler::apply_filter(filter).map_err(|e| SandboxError::Apply(kind, e))?;
    KIND.set(kind);
    Ok(())
}

thread_local! {
    /// The filter this thread installed last, for the SIGSYS message.
    static KIND: std::cell::Cell<Kind> = const { std::cell::Cell::new(Kind::Vmm) };
}

/// [`apply`] for a thread that has no way to report an error: a VMM
/// thread never runs unfiltered when filters were asked for. Every thread
/// but the VMM's own (which opens the TAPs, then drops them when the VM
/// starts) also drops its capabilities first: they are per thread, and
/// the API server and device workers start before that drop.
pub fn enter(kind: Kind) {
    let dropped = match kind {
        Kind::Vcpu | Kind::Device | Kind::Api => drop_capabilities(),
        Kind::Vmm => Ok(()),
    };
    if let Err(e) = dropped.and_then(|()| apply(kind)) {
        log::error!("{e}");
        std::process::exit(crate::outcome::EXIT_ERROR);
    }
}

/// Drops every capability (effective, permitted, inheritable, ambient and
/// bounding): once the TAPs are open the VMM needs none, and a guest that
/// took over a thread must not be able to use them.
pub fn drop_capabilities() -> Result<(), SandboxError> {
    use caps::{CapSet, Capability};
    // The bounding set first: dropping from it needs CAP_SETPCAP, which an
    // unprivileged VMM does not have (and then has nothing to drop).
    let may_shrink_bounding = caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP)
        .map_err(SandboxError::Capabilities)?;
    if may_shrink_bounding {
        caps::clear(None, CapSet::Bounding).map_err(SandboxError::Capabilities)?;
    }
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(SandboxError::Capabilities)?;
    }
    Ok(())
}

/// `ioctl` request types (bits 8..16 of the request number).
const IOCTL_KVM: u64 = 0xAE;
/// TUN (TUNSETIFF, ...) and the terminal/file ones (TCGETS, FIONBIO, ...).
const IOCTL_TTY_TUN: u64 = b'T' as u64;
/// Socket interface requests (SIOCGIFFLAGS, SIOCSIFMTU, ...).
const IOCTL_SOCKET: u64 = 0x89;

fn ioctl_type(t: u64) -> SeccompRule {
    rule(1, SeccompCmpOp::MaskedEq(0xff00), t << 8)
}

fn rule(arg: u8, op: SeccompCmpOp, value: u64) -> SeccompRule {
    #[allow(clippy::expect_used)] // Constant arguments, checked by the filter tests.
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
        .and_then(|c| SeccompRule::new(vec![c]))
        .expect("a valid seccomp condition")
}

/// Syscalls every thread makes: memory, locks, signals, time, logging,
/// and ending; opening files, which only the VMM thread may do (the other
/// threads get EACCES from the `no_open` filter).
const COMMON: &[libc::c_long] = &[
    libc::SYS_open,
    libc::SYS_openat,
    libc::SYS_brk,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_futex,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_sched_yield,
    libc::SYS_getrandom,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_close,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

/// A device worker: its event loop, guest I/O (TAP, disk image), the
/// same-host channel (unix datagrams, memfd rings), timers.
const DEVICE: &[libc::c_long] = &[
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_eventfd2,
    libc::SYS_readv,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_preadv2,
    libc::SYS_pwritev2,
    libc::SYS_lseek,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_fcntl,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_connect,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    libc::SYS_dup,
    libc::SYS_memfd_create,
    libc::SYS_ftruncate,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
    libc::SYS_timerfd_gettime,
    libc::SYS_poll,
    libc::SYS_ppoll,
];

/// Starting a thread (a vCPU activating a device starts its worker) and
/// placing it on its host CPUs (`worker_cpus=`), which then drops its
/// capabilities (capset can only take them away) and installs its own
/// filter.
const THREADS: &[libc::c_long] = &[
    libc::SYS_seccomp,
    libc::SYS_capget,
    libc::SYS_capset,
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_prctl,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_setaffinity,
    libc::SYS_tgkill,
];

/// What only the VMM thread does: build the VM (KVM, files, TAPs),
/// serve migrations and snapshots.
const VMM: &[libc::c_long] = &[
    libc::SYS_mkdir,
    libc::SYS_mkdirat,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_getdents64,
    libc::SYS_readlink,
    libc::SYS_readlinkat,
    libc::SYS_fchmod,
    libc::SYS_chmod,
    libc::SYS_fchmodat,
    libc::SYS_fallocate,
    libc::SYS_dup3,
    libc::SYS_pipe2,
    libc::SYS_socket,
    libc::SYS_socketpair,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_accept4,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_shutdown,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_prlimit64,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_uname,
    libc::SYS_sysinfo,
    // A restore's step line: its own page faults, CPU time, preemptions.
    libc::SYS_getrusage,
];

/// The API server: one connection at a time on its unix socket.
const API: &[libc::c_long] = &[
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_accept4,
    libc::SYS_recvfrom,
    libc::SYS_sendto,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    libc::SYS_shutdown,
    libc::SYS_fcntl,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_statx,
    libc::SYS_newfstatat,
    libc::SYS_unlink,
];

/// The allow-list of `kind`: syscall number → rules on its arguments (no
/// rule: any arguments).
fn rules(kind: Kind) -> BTreeMap<i64, Vec<SeccompRule>> {
    let lists: &[&[libc::c_long]] = match kind {
        Kind::Vmm => &[COMMON, DEVICE, THREADS, VMM],
        Kind::Vcpu => &[COMMON, DEVICE, THREADS],
        Kind::Device => &[COMMON, DEVICE],
        Kind::Api => &[COMMON, API],
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = lists
        .iter()
        .flat_map(|l| l.iter())
        .map(|&nr| (nr, Vec::new()))
        .collect();
    // ioctl: by request type. A device worker may read its TAP's link
    // state (SIOCGIFFLAGS); only the VMM thread configures interfaces.
    let ioctls = match kind {
        Kind::Vmm => vec![
            ioctl_type(IOCTL_KVM),
            ioctl_type(IOCTL_TTY_TUN),
            ioctl_type(IOCTL_SOCKET),
        ],
        Kind::Vcpu | Kind::Device => vec![
            ioctl_type(IOCTL_KVM),
            ioctl_type(IOCTL_TTY_TUN),
            rule(1, SeccompCmpOp::Eq, libc::SIOCGIFFLAGS),
        ],
        Kind::Api => vec![ioctl_type(IOCTL_TTY_TUN)],
    };
    rules.insert(libc::SYS_ioctl, ioctls);
    // Sockets a device or vCPU thread opens: the same-host channel's
    // unix datagrams only.
    if matches!(kind, Kind::Vcpu | Kind::Device) {
        rules.insert(
            libc::SYS_socket,
            vec![rule(0, SeccompCmpOp::Eq, libc::AF_UNIX as u64)],
        );
    }
    rules
}

/// Writes "seccomp: a <kind> thread made forbidden syscall <nr>" and
/// ends the process (exit code 1). Only async-signal-safe calls (no allocation, no locks), and only
/// syscalls every filter allows: a second SIGSYS in the handler would kill
/// the process without a word.
extern "C" fn on_sigsys(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // For SIGSYS, the kernel's siginfo has after si_signo, si_errno and
    // si_code (16 bytes with padding) `void *si_call_addr`, then
    // `int si_syscall`.
    const SI_SYSCALL: usize = 24;
    // SAFETY: the kernel passes a valid siginfo_t (128 bytes) for SIGSYS.
    let nr = unsafe {
        info.cast::<u8>()
            .add(SI_SYSCALL)
            .cast::<i32>()
            .read_unaligned()
    };
    let mut msg = [0u8; 96];
    let mut len = 0;
    let mut push = |bytes: &[u8]| {
        for &b in bytes {
            if let Some(slot) = msg.get_mut(len) {
                *slot = b;
                len += 1;
            }
        }
    };
    push(b"pvrdma-vmm: seccomp: a ");
    // A const-initialised thread-local without destructor: a plain read.
    push(KIND.get().name().as_bytes());
    push(b" thread made forbidden syscall ");
    let mut digits = [0u8; 10];
    let mut at = digits.len();
    let mut n = nr.unsigned_abs();
    loop {
        at -= 1;
        if let Some(d) = digits.get_mut(at) {
            *d = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || at == 0 {
            break;
        }
    }
    push(digits.get(at..).unwrap_or_default());
    push(b" (see --seccomp)\n");
    // SAFETY: write(2) and _exit(2) are async-signal-safe; `msg` holds
    // `len` initialised bytes.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), len);
        libc::_exit(crate::outcome::EXIT_ERROR);
    }
}

fn install_sigsys_handler() -> Result<(), SandboxError> {
    // SAFETY: a zeroed sigaction is valid; the handler only makes
    // async-signal-safe calls.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigsys as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO;
        if libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) != 0 {
            return Err(SandboxError::Handler(std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;

    /// `name`'s value in this thread's /proc status (`CapEff`, `Seccomp`).
    fn thread_status(name: &str) -> String {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with(&format!("{name}:")))
            .unwrap();
        line.split_whitespace().nth(1).unwrap().to_string()
    }

    /// A device worker, vCPU or API thread keeps no capability, whatever
    /// its spawner had (the tests run as root, with all of them).
    #[test]
    fn guest_driven_threads_drop_their_capabilities() {
        let none = "0000000000000000";
        for kind in [Kind::Device, Kind::Vcpu, Kind::Api] {
            let (before, after) = std::thread::spawn(move || {
                let before = thread_status("CapEff");
                enter(kind);
                (before, thread_status("CapEff"))
            })
            .join()
            .unwrap();
            assert_ne!(
                before, none,
                "{kind:?}: the test needs capabilities to drop (run as root)"
            );
            assert_eq!(after, none, "{kind:?}: CapEff {before} -> {after}");
        }
    }

    #[test]
    fn every_kind_compiles_and_the_inherited_filters_are_supersets() {
        for kind in [Kind::Vmm, Kind::Vcpu, Kind::Device, Kind::Api] {
            let filter = SeccompFilter::new(
                rules(kind),
                SeccompAction::Trap,
                SeccompAction::Allow,
                TargetArch::x86_64,
            )
            .unwrap();
            assert!(!BpfProgram::try_from(filter).unwrap().is_empty());
        }
        // Device workers start under a VMM or a vCPU filter.
        let device = rules(Kind::Device);
        for parent in [Kind::Vmm, Kind::Vcpu] {
            let parent_rules = rules(parent);
            for nr in device.keys() {
                assert!(
                    parent_rules.contains_key(nr),
                    "{parent:?} lacks syscall {nr}"
                );
            }
        }
        assert!(!rules(Kind::Device).contains_key(&libc::SYS_mkdir));
        assert!(!rules(Kind::Api).contains_key(&libc::SYS_clone3));
    }

    /// In a child process (a filter cannot be removed): the VMM thread
    /// starts a vCPU, which starts a device worker, each installing its
    /// filter; an allowed syscall works, a forbidden one ends the process
    /// with the message.
    #[test]
    fn a_forbidden_syscall_ends_the_process_with_its_name() {
        if std::env::var_os("PVRDMA_SANDBOX_CHILD").is_some() {
            init(SeccompMode::Enforce).unwrap();
            enter(Kind::Vmm);
            let nested = std::thread::spawn(|| {
                enter(Kind::Vcpu);
                std::thread::spawn(|| enter(Kind::Device)).join().unwrap();
            });
            nested.join().unwrap();
            println!("threads started");
            enter(Kind::Api);
            // Allowed: write.
            println!("filtered");
            // Refused, not fatal: opening a file.
            let open = std::fs::File::open("/dev/null").map_err(|e| e.kind());
            println!("open: {open:?}");
            // Forbidden for the API thread: creating a socket.
            let _ = std::net::UdpSocket::bind("127.0.0.1:0");
            println!("still alive");
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "sandbox::tests::a_forbidden_syscall_ends_the_process_with_its_name",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("PVRDMA_SANDBOX_CHILD", "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(crate::outcome::EXIT_ERROR));
        assert!(stdout.contains("threads started"), "{stdout}");
        assert!(stdout.contains("filtered"), "{stdout}");
        assert!(stdout.contains("open: Err(PermissionDenied)"), "{stdout}");
        assert!(!stdout.contains("still alive"), "{stdout}");
        assert!(
            stderr.contains(&format!("made forbidden syscall {}", libc::SYS_socket)),
            "{stderr}"
        );
    }
}
