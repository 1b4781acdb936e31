// SPDX-License-Identifier: Apache-2.0
//! pvrdma-vmm: a KVM virtual machine monitor on rust-vmm crates.
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod arch;
pub mod cli;
pub mod config;
mod console;
pub mod device_manager;
pub mod incoming;
pub mod ioevents;
pub mod kvm;
pub mod logging;
pub mod machine;
pub mod memory;
pub mod migration;
pub mod outcome;
mod requests;
pub mod sandbox;
pub mod vcpu;
pub mod vmm;

/// Locks `m`, poisoned or not: a thread that panicked while holding it
/// took the process down (`panic = "abort"`), so the data is as it was
/// left and there is nothing to recover.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The calling thread's CPU time so far. Set against a stage's wall time
/// it tells work from waiting (for the CPU, a lock, the kernel).
pub(crate) fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the struct passed, which lives
    // through the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// "outer: inner: innermost", for one-line error messages.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

/// Each ioeventfd and irqfd holds a file descriptor; the default soft limit
/// of 1024 runs out with a few hundred RDMA objects, so raise it to the
/// hard limit.
pub fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read/write the struct we pass.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
    if ok && lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            log::warn!(
                "Could not raise the open-file limit: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}
