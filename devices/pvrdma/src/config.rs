// SPDX-License-Identifier: Apache-2.0
//! What the VMM configures: the GID type and the per-VM resource limits
//! (which become the advertised capabilities).
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::str::FromStr;

use pvrdma_abi::dsr::{GID_TYPE_ROCE_V1, GID_TYPE_ROCE_V2};
use pvrdma_abi::wqe::{rq_stride, sq_stride};
use pvrdma_abi::{HANDLE_MASK, PAGE_SIZE, PDIR_MAX_PAGES};
use rdma_transport::net::RoceVersion;

/// The RoCE flavour the port's GIDs use (`caps.gid_types`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum GidType {
    /// RoCE v1: Ethertype 0x8915.
    RoceV1,
    /// RoCE v2: UDP port 4791 (the default).
    #[default]
    RoceV2,
}

impl GidType {
    /// The ABI value (`caps.gid_types`, CREATE_BIND `gid_type`).
    pub const fn abi(self) -> u8 {
        match self {
            GidType::RoceV1 => GID_TYPE_ROCE_V1,
            GidType::RoceV2 => GID_TYPE_ROCE_V2,
        }
    }

    /// The frames of a GID of this type.
    pub const fn version(self) -> RoceVersion {
        match self {
            GidType::RoceV1 => RoceVersion::V1,
            GidType::RoceV2 => RoceVersion::V2,
        }
    }
}

impl FromStr for GidType {
    type Err = String;

    /// `roce-v1` or `roce-v2`, as on the command line.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "roce-v1" => Ok(GidType::RoceV1),
            "roce-v2" => Ok(GidType::RoceV2),
            other => Err(format!("unknown GID type {other:?} (roce-v1 or roce-v2)")),
        }
    }
}

/// Per-VM bounds on everything the guest can make the device allocate.
/// They are advertised as the device capabilities, so the guest driver
/// checks most of them itself; the device enforces all of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// QPs, including the GSI QP (handles stay below it; at most
    /// [`MAX_QP`]). The default leaves a guest room for 4096 busy QPs
    /// besides its kernel's.
    pub max_qp: u32,
    /// Send or receive queue entries per QP (a power of two).
    pub max_qp_wr: u32,
    /// SGEs per send or receive WQE.
    pub max_sge: u32,
    /// CQs. The default gives each QP of the default `max_qp` its own send and receive CQ,
    /// as rdma_cm programs make them: a CQ costs the host no file and a few hundred bytes.
    pub max_cq: u32,
    /// Entries per CQ (a power of two).
    pub max_cqe: u32,
    /// MRs: by default two per QP of the default `max_qp`, for the same reason.
    pub max_mr: u32,
    /// Bytes per user MR.
    pub max_mr_size: u64,
    pub max_pd: u32,
    /// 0 hides the SRQ verbs from the guest.
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    /// UAR pages = BAR2 pages = user contexts + 1 (a power of two).
    pub max_uar: u32,
    /// GID table entries (at most 256: AVs carry a `u8` index).
    pub gid_tbl_len: u32,
    /// Address handles (guest-side objects; only advertised).
    pub max_ah: u32,
    /// Guest pages all objects together may map (rings and MRs): bounds
    /// the host memory the page lists take, 8 bytes per page.
    pub max_mapped_pages: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_qp: 8192,
            max_qp_wr: 4096,
            max_sge: 16,
            max_cq: 16384,
            max_cqe: 32768,
            max_mr: 16384,
            max_mr_size: 1 << 30,
            max_pd: 1024,
            max_srq: 512,
            max_srq_wr: 4096,
            max_srq_sge: 16,
            max_uar: 512,
            gid_tbl_len: 32,
            max_ah: 1024,
            max_mapped_pages: 1 << 21,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LimitsError {
    #[error("{name} = {value} is out of range ({min} to {max})")]
    Range {
        name: &'static str,
        value: u64,
        min: u64,
        max: u64,
    },
    #[error("{name} = {value} is not a power of two")]
    NotPowerOfTwo { name: &'static str, value: u32 },
    #[error("A QP of {0} entries with {1} SGEs needs more pages than CREATE_QP can describe")]
    QpTooLarge(u32, u32),
}

fn check_range(name: &'static str, value: u64, min: u64, max: u64) -> Result<(), LimitsError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(LimitsError::Range {
            name,
            value,
            min,
            max,
        })
    }
}

fn check_pow2(name: &'static str, value: u32) -> Result<(), LimitsError> {
    if value.is_power_of_two() {
        Ok(())
    } else {
        Err(LimitsError::NotPowerOfTwo { name, value })
    }
}

/// Pages holding `entries` of `stride` bytes (0 if it does not fit).
pub(crate) fn pages_for(entries: u32, stride: u32) -> Option<u32> {
    let bytes = u64::from(entries).checked_mul(u64::from(stride))?;
    u32::try_from(bytes.div_ceil(PAGE_SIZE)).ok()
}

/// Most QPs a device may be configured for. Each costs the VMM an eventfd
/// and two KVM ioeventfds (send and receive doorbells): KVM copies its
/// whole I/O bus on every registration and removal, so N doorbells cost N²
/// (8192 took 267 ms on a quiet host, 78 s in the nested test host), and
/// the host keeps about 2 KiB per QP besides (its state, engine, eventfd).
/// rdma-core's own limit, `qp_handle & 0xFFFF`, is four times higher.
pub const MAX_QP: u32 = 16384;

/// Largest SGE count whose WQE stride still fits one page.
const MAX_SGE: u32 = 251;
/// Largest handle-like count: handles stay below it and below 2^24.
const MAX_HANDLES: u64 = HANDLE_MASK as u64;

impl Limits {
    pub fn check(&self) -> Result<(), LimitsError> {
        // The GSI QP plus at least one more.
        check_range("max_qp", self.max_qp.into(), 3, MAX_QP.into())?;
        for (name, value) in [
            ("max_cq", self.max_cq),
            ("max_mr", self.max_mr),
            ("max_pd", self.max_pd),
        ] {
            check_range(name, value.into(), 2, MAX_HANDLES)?;
        }
        check_range("max_srq", self.max_srq.into(), 0, MAX_HANDLES)?;
        check_range("max_sge", self.max_sge.into(), 1, MAX_SGE.into())?;
        check_range("max_srq_sge", self.max_srq_sge.into(), 1, MAX_SGE.into())?;
        check_range("max_ah", self.max_ah.into(), 0, MAX_HANDLES)?;
        check_range("gid_tbl_len", self.gid_tbl_len.into(), 1, 256)?;
        check_range("max_uar", self.max_uar.into(), 2, 1 << 16)?;
        check_pow2("max_uar", self.max_uar)?;
        for (name, value) in [
            ("max_qp_wr", self.max_qp_wr),
            ("max_cqe", self.max_cqe),
            ("max_srq_wr", self.max_srq_wr),
        ] {
            check_range(name, value.into(), 1, 1 << 20)?;
            check_pow2(name, value)?;
        }
        let pdir_pages = u64::from(PDIR_MAX_PAGES);
        check_range(
            "max_mr_size",
            self.max_mr_size,
            PAGE_SIZE,
            pdir_pages * PAGE_SIZE,
        )?;
        check_range("max_mapped_pages", self.max_mapped_pages, 1, 1 << 32)?;
        // CREATE_QP counts pages in u16 fields, header page included.
        let sq = sq_stride(self.max_sge).and_then(|s| pages_for(self.max_qp_wr, s));
        let rq = rq_stride(self.max_sge).and_then(|s| pages_for(self.max_qp_wr, s));
        let total = sq
            .zip(rq)
            .and_then(|(sq, rq)| sq.checked_add(rq)?.checked_add(1));
        if total.is_none_or(|t| t > u32::from(u16::MAX)) {
            return Err(LimitsError::QpTooLarge(self.max_qp_wr, self.max_sge));
        }
        Ok(())
    }
}

/// The device as the user configured it (`--pvrdma ...,gid=roce-v2`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PvrdmaConfig {
    pub gid_type: GidType,
    pub limits: Limits,
    /// Directory of the same-host channel (`None`: frames always take the
    /// port's backend).
    pub local_dir: Option<std::path::PathBuf>,
    /// Replace a live same-host socket of our MAC instead of failing: the
    /// VM is migrating here from a VMM of this host that still holds it.
    pub local_takeover: bool,
    /// Lets same-host peers that share theirs map **all** of guest memory
    /// read-only, so that each copies payloads straight from the sender's
    /// memory into its own (one copy; `datapath::view`,
    /// docs/security.md). Only for VMs of one trust domain; off by
    /// default, and used towards a peer only when both turned it on.
    pub share_memory: bool,
    /// How long the worker busy-polls (its same-host rings in shared
    /// memory, its descriptors without sleeping, yielding the CPU between
    /// looks) after data-path work before it sleeps; zero: never. While
    /// it polls, peers need not kick it and it need not be woken: each
    /// saves a thread wake-up on a small message (docs/benchmarks.md). An
    /// idle worker sleeps.
    pub busy_poll: std::time::Duration,
    /// A busy-polling worker whose yield of the CPU took longer than this
    /// stops polling and sleeps: other threads want the CPU (vCPUs, other
    /// VMMs), a yield hands it to them for a whole time slice, whereas a
    /// kick wakes a sleeping worker ahead of them. A yield that only lets
    /// the peer's worker or a polling vCPU take a turn takes a few
    /// microseconds.
    pub busy_yield: std::time::Duration,
    /// The host CPUs the worker may run on (any of the process's where
    /// empty). A worker that busy-polls and a polling vCPU, or the two
    /// workers of a same-host pair, that the scheduler puts on one CPU
    /// take turns at each hand-off: an 8-byte WRITE between two devices
    /// then takes about 1.5x as long (docs/benchmarks.md).
    pub worker_cpus: Vec<usize>,
}

/// [`PvrdmaConfig::busy_poll`] unless configured: a few wake-ups' worth,
/// enough to catch the ACK of a small message without sleeping.
pub const DEFAULT_BUSY_POLL: std::time::Duration = std::time::Duration::from_micros(50);
/// [`PvrdmaConfig::busy_yield`].
pub const DEFAULT_BUSY_YIELD: std::time::Duration = std::time::Duration::from_micros(20);

impl Default for PvrdmaConfig {
    fn default() -> Self {
        Self {
            gid_type: GidType::default(),
            limits: Limits::default(),
            local_dir: None,
            local_takeover: false,
            share_memory: false,
            busy_poll: DEFAULT_BUSY_POLL,
            busy_yield: DEFAULT_BUSY_YIELD,
            worker_cpus: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn gid_type_parses() {
        assert_eq!("roce-v1".parse(), Ok(GidType::RoceV1));
        assert_eq!("roce-v2".parse(), Ok(GidType::RoceV2));
        assert!("rocev2".parse::<GidType>().is_err());
        assert_eq!(GidType::default().abi(), 2);
        assert_eq!(GidType::RoceV1.abi(), 1);
    }

    #[test]
    fn default_limits_are_valid() {
        Limits::default().check().unwrap();
        // Issue 16: room for 4096 busy QPs besides the kernel's, and up to
        // 16384 when the operator asks.
        assert!(Limits::default().max_qp >= 4096 + 2);
        Limits {
            max_qp: 16384,
            ..Limits::default()
        }
        .check()
        .unwrap();
    }

    #[test]
    fn bad_limits_are_rejected() {
        let bad = [
            Limits {
                max_qp: MAX_QP + 1,
                ..Limits::default()
            },
            Limits {
                max_uar: 384,
                ..Limits::default()
            },
            Limits {
                max_cqe: 1000,
                ..Limits::default()
            },
            Limits {
                gid_tbl_len: 257,
                ..Limits::default()
            },
            Limits {
                max_sge: 252,
                ..Limits::default()
            },
            Limits {
                max_cq: 1 << 24,
                ..Limits::default()
            },
            Limits {
                max_qp_wr: 1 << 20,
                max_sge: 251,
                ..Limits::default()
            },
        ];
        for limits in bad {
            assert!(limits.check().is_err(), "{limits:?}");
        }
        assert_eq!(pages_for(4096, 512), Some(512));
        assert_eq!(pages_for(1, 32), Some(1));
        assert_eq!(pages_for(0, 32), Some(0));
    }
}
