// SPDX-License-Identifier: Apache-2.0
//! Why a command fails, and the errno the guest sees for it: the error
//! every command handler returns, below the objects it validates.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::io;

use crate::pdir::PdirError;
use crate::ring::RingError;

/// Linux errno values reported in ERR and `hdr.err`.
pub(crate) mod errno {
    pub(crate) const EPERM: u32 = 1;
    pub(crate) const ENOMEM: u32 = 12;
    pub(crate) const EFAULT: u32 = 14;
    pub(crate) const EBUSY: u32 = 16;
    pub(crate) const EINVAL: u32 = 22;
    pub(crate) const EOPNOTSUPP: u32 = 95;
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CmdError {
    #[error("Unknown command {0}")]
    Unknown(u32),
    #[error("Invalid {0}")]
    Invalid(&'static str),
    #[error("No {kind} with handle {handle}")]
    NoObject { kind: &'static str, handle: u32 },
    #[error("{kind} {handle} belongs to another context")]
    WrongOwner { kind: &'static str, handle: u32 },
    #[error("{kind} {handle} is still in use")]
    Busy { kind: &'static str, handle: u32 },
    #[error("Out of {0}")]
    Exhausted(&'static str),
    #[error("{0} is not supported")]
    Unsupported(&'static str),
    #[error("Invalid page directory")]
    Pdir(#[from] PdirError),
    #[error("Invalid ring")]
    Ring(#[from] RingError),
    #[error("Failed to set up doorbells")]
    Doorbell(#[source] io::Error),
}

impl CmdError {
    pub(crate) fn errno(&self) -> u32 {
        match self {
            CmdError::Unknown(_)
            | CmdError::Invalid(_)
            | CmdError::NoObject { .. }
            | CmdError::Ring(_) => errno::EINVAL,
            CmdError::WrongOwner { .. } => errno::EPERM,
            CmdError::Busy { .. } => errno::EBUSY,
            CmdError::Exhausted(_) | CmdError::Doorbell(_) => errno::ENOMEM,
            CmdError::Unsupported(_) => errno::EOPNOTSUPP,
            CmdError::Pdir(_) => errno::EFAULT,
        }
    }
}

/// Fails with [`CmdError::Invalid`] naming `what` unless `ok`.
pub(crate) fn check(ok: bool, what: &'static str) -> Result<(), CmdError> {
    if ok {
        Ok(())
    } else {
        Err(CmdError::Invalid(what))
    }
}
