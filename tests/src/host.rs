// SPDX-License-Identifier: Apache-2.0
//! Where a stock Linux guest can boot: directly on this host, or only inside the test host.
//!
//! DIRECT needs a `/dev/kvm` that runs unmodified kernels: the CPU has VMX or SVM and the KVM
//! module is not kvm-pvm (which only runs PVM-patched guests and dies on a stock kernel's
//! `cmpxchg16b`/`xrstor`). Everything else uses TEST-HOST: a nested L1 under QEMU TCG whose
//! emulated SVM gives it a real `/dev/kvm`. `PVRDMA_E2E_MODE=direct|test-host` overrides the
//! choice (e.g. to reproduce CI's TEST-HOST runs on a machine with VMX).

use std::fmt;
use std::fs;
use std::path::Path;
use std::sync::OnceLock;

use crate::{announce, Error, Result};

/// Name of the environment variable that overrides mode detection.
pub const MODE_ENV: &str = "PVRDMA_E2E_MODE";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Guests run on this host's `/dev/kvm`.
    Direct,
    /// Guests run inside the nested test host (L1).
    TestHost,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Direct => "DIRECT",
            Self::TestHost => "TEST-HOST",
        })
    }
}

/// What the host offers, as read from /dev, /sys and /proc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    pub has_dev_kvm: bool,
    pub is_kvm_pvm: bool,
    pub cpu_has_vmx_or_svm: bool,
}

impl HostFacts {
    pub fn read() -> Self {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Self {
            has_dev_kvm: Path::new("/dev/kvm").exists(),
            is_kvm_pvm: Path::new("/sys/module/kvm_pvm").exists(),
            cpu_has_vmx_or_svm: cpu_flags_have_virtualization(&cpuinfo),
        }
    }

    /// The mode these facts allow, and why.
    pub fn mode(&self) -> (Mode, &'static str) {
        if !self.has_dev_kvm {
            (Mode::TestHost, "no /dev/kvm on this host")
        } else if self.is_kvm_pvm {
            (
                Mode::TestHost,
                "/dev/kvm is kvm-pvm, which cannot boot a stock kernel",
            )
        } else if !self.cpu_has_vmx_or_svm {
            (Mode::TestHost, "the CPU has neither vmx nor svm")
        } else {
            (Mode::Direct, "/dev/kvm with hardware virtualization")
        }
    }
}

fn cpu_flags_have_virtualization(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .flat_map(|l| l.split_whitespace())
        .any(|flag| flag == "vmx" || flag == "svm")
}

/// The mode of this process's e2e runs: detected (or overridden) once and announced on stderr.
pub fn mode() -> Result<Mode> {
    static MODE: OnceLock<Result<Mode>> = OnceLock::new();
    MODE.get_or_init(|| {
        let facts = HostFacts::read();
        let (detected, why) = facts.mode();
        let mode = match std::env::var(MODE_ENV).ok().as_deref() {
            None | Some("") => detected,
            Some("direct") => Mode::Direct,
            Some("test-host") => Mode::TestHost,
            Some(other) => {
                return Err(Error::new(format!(
                    "{MODE_ENV}={other}: expected 'direct' or 'test-host'"
                )))
            }
        };
        let how = if mode == detected {
            format!("detected: {why}")
        } else {
            format!("forced by {MODE_ENV}; detection said {detected}: {why}")
        };
        announce(&format!("======== MODE: {mode} ({how}) ========"));
        Ok(mode)
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(has_dev_kvm: bool, is_kvm_pvm: bool, cpu_has_vmx_or_svm: bool) -> HostFacts {
        HostFacts {
            has_dev_kvm,
            is_kvm_pvm,
            cpu_has_vmx_or_svm,
        }
    }

    #[test]
    fn direct_only_with_real_hardware_kvm() {
        assert_eq!(facts(true, false, true).mode().0, Mode::Direct);
        assert_eq!(facts(false, false, true).mode().0, Mode::TestHost);
        assert_eq!(facts(true, true, true).mode().0, Mode::TestHost);
        assert_eq!(facts(true, false, false).mode().0, Mode::TestHost);
    }

    #[test]
    fn virtualization_flag_is_a_whole_word_of_a_flags_line() {
        assert!(cpu_flags_have_virtualization("flags\t\t: fpu vme svm lm\n"));
        assert!(cpu_flags_have_virtualization(
            "processor: 0\nflags : sse vmx\n"
        ));
        assert!(!cpu_flags_have_virtualization(
            "flags : fpu svm_lock vmxe\n"
        ));
        assert!(!cpu_flags_have_virtualization("model name : svm vmx\n"));
    }
}
