// SPDX-License-Identifier: Apache-2.0
//! Scatter/gather over a WQE's SGE list, through the caller's MR table.
//!
//! The requester gathers payload from send SGEs, the completer scatters
//! READ responses and atomic results into them, the responder scatters
//! SEND payload into receive SGEs. All three use the one walker here, so
//! bounds, keys and offsets are checked in one place: every SGE is
//! validated with [`check_mr`] for the part actually touched.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use thiserror::Error;

use crate::verbs::{check_mr, Access, MemError, MrCheckError, MrTable, Sge};

/// Most SGEs per WQE: bounds the walk of one scatter/gather (PVRDMA's
/// `max_sge` is 16; this leaves room without trusting the guest's count).
pub const MAX_SGE: usize = 32;

/// Why a scatter/gather failed.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum SglError {
    /// The SGE list is shorter than the message offset plus length.
    #[error("SGE list too short")]
    TooShort,
    /// An SGE's key, PD, rights or bounds were refused.
    #[error("SGE refused")]
    Mr(#[from] MrCheckError),
    /// The MR table failed the copy.
    #[error("Memory copy failed")]
    Mem(#[from] MemError),
}

/// Sum of the SGE lengths, `None` if it overflows a u32 or the list is
/// longer than [`MAX_SGE`].
pub fn sge_total(sges: &[Sge]) -> Option<u32> {
    if sges.len() > MAX_SGE {
        return None;
    }
    sges.iter().try_fold(0u32, |acc, s| acc.checked_add(s.len))
}

/// Calls `f(sge, iova, range in the message window)` for each SGE piece
/// covering message bytes `[off, off + len)`.
fn walk(
    sges: &[Sge],
    off: u32,
    len: usize,
    mut f: impl FnMut(&Sge, u64, std::ops::Range<usize>) -> Result<(), SglError>,
) -> Result<(), SglError> {
    let mut skip = u64::from(off);
    let mut done = 0usize;
    for sge in sges.iter().take(MAX_SGE) {
        if done >= len {
            break;
        }
        let sl = u64::from(sge.len);
        if skip >= sl {
            skip = skip.saturating_sub(sl);
            continue;
        }
        let avail = usize::try_from(sl.saturating_sub(skip)).unwrap_or(usize::MAX);
        let n = avail.min(len.saturating_sub(done));
        let end = done.saturating_add(n);
        f(sge, sge.addr.saturating_add(skip), done..end)?;
        done = end;
        skip = 0;
    }
    if done < len {
        return Err(SglError::TooShort);
    }
    Ok(())
}

/// Writes `data` into the SGE list at message offset `off`.
pub fn scatter(
    mr: &mut dyn MrTable,
    pd: u32,
    sges: &[Sge],
    off: u32,
    data: &[u8],
) -> Result<(), SglError> {
    walk(sges, off, data.len(), |sge, iova, r| {
        let part = data.get(r).ok_or(SglError::TooShort)?;
        let n = part.len() as u64;
        check_mr(mr, sge.lkey, pd, iova, n, Access::LOCAL_WRITE)?;
        Ok(mr.write(sge.lkey, iova, part)?)
    })
}

/// Reads `out.len()` message bytes at offset `off` from the SGE list
/// into `out` (the payload area of the frame being built). The length is
/// bounded by the caller (one path MTU).
pub fn gather(
    mr: &dyn MrTable,
    pd: u32,
    sges: &[Sge],
    off: u32,
    out: &mut [u8],
) -> Result<(), SglError> {
    walk(sges, off, out.len(), |sge, iova, r| {
        let part = out.get_mut(r).ok_or(SglError::TooShort)?;
        let n = part.len() as u64;
        check_mr(mr, sge.lkey, pd, iova, n, Access::empty())?;
        Ok(mr.read(sge.lkey, iova, part)?)
    })
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]
mod tests {
    use super::*;
    use crate::verbs::TestMr as Mem;

    #[test]
    fn scatter_gather_across_sges() {
        let mut m = Mem(vec![0; 64]);
        let sges = [
            Sge {
                addr: 10,
                len: 3,
                lkey: 1,
            },
            Sge {
                addr: 30,
                len: 5,
                lkey: 1,
            },
        ];
        scatter(&mut m, 0, &sges, 1, &[1, 2, 3, 4]).unwrap();
        assert_eq!(&m.0[11..13], &[1, 2]);
        assert_eq!(&m.0[30..32], &[3, 4]);
        let mut out = [0u8; 4];
        gather(&m, 0, &sges, 1, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4]);
        assert_eq!(
            scatter(&mut m, 0, &sges, 6, &[0; 3]),
            Err(SglError::TooShort)
        );
        let bad = [Sge {
            addr: 60,
            len: 8,
            lkey: 1,
        }];
        assert!(matches!(
            gather(&m, 0, &bad, 0, &mut [0u8; 8]),
            Err(SglError::Mr(MrCheckError::OutOfBounds(1)))
        ));
        assert_eq!(sge_total(&sges), Some(8));
        assert_eq!(sge_total(&[bad[0]; MAX_SGE + 1]), None);
    }
}
