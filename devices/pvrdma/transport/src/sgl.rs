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

use crate::packet::{Located, Payload};
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

/// Writes `data` into the SGE list at message offset `off`: where one
/// SGE holds all of it (the usual case), with one MR check and one
/// [`MrTable::write_payload`] of all its pieces; else piece by piece.
pub fn scatter(
    mr: &mut dyn MrTable,
    pd: u32,
    sges: &[Sge],
    off: u32,
    data: Payload<'_>,
) -> Result<(), SglError> {
    let len = data.len();
    let mut whole = None;
    walk(sges, off, len, |sge, iova, r| {
        if r == (0..len) {
            whole = Some((sge.lkey, iova));
        }
        Ok(())
    })?;
    if let Some((lkey, iova)) = whole {
        check_mr(mr, lkey, pd, iova, len as u64, Access::LOCAL_WRITE)?;
        return Ok(mr.write_payload(lkey, iova, data)?);
    }
    let mut at = off;
    for piece in data.pieces() {
        walk(sges, at, piece.len(), |sge, iova, r| {
            let part = piece.get(r).ok_or(SglError::TooShort)?;
            let n = part.len() as u64;
            check_mr(mr, sge.lkey, pd, iova, n, Access::LOCAL_WRITE)?;
            Ok(mr.write(sge.lkey, iova, part)?)
        })?;
        let n = u32::try_from(piece.len()).map_err(|_| SglError::TooShort)?;
        at = at.checked_add(n).ok_or(SglError::TooShort)?;
    }
    Ok(())
}

/// Appends to `out` where message bytes `[off, off + len)` of the SGE
/// list lie in the memory the peer maps ([`MrTable::locate`]), after the
/// checks [`gather`] makes; an error, and `out` to be ignored, where
/// they are refused or take more than [`MAX_RUNS`].
pub fn locate(
    mr: &dyn MrTable,
    pd: u32,
    sges: &[Sge],
    off: u32,
    len: usize,
    out: &mut Located,
) -> Result<(), SglError> {
    walk(sges, off, len, |sge, iova, r| {
        let n = r.len();
        check_mr(mr, sge.lkey, pd, iova, n as u64, Access::empty())?;
        out.key(sge.lkey);
        Ok(mr.locate(sge.lkey, iova, n, out)?)
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
    use crate::packet::{Run, MAX_RUNS};
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
        scatter(&mut m, 0, &sges, 1, Payload::from(&[1, 2, 3, 4][..])).unwrap();
        assert_eq!(&m.0[11..13], &[1, 2]);
        assert_eq!(&m.0[30..32], &[3, 4]);
        let mut out = [0u8; 4];
        gather(&m, 0, &sges, 1, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4]);
        assert_eq!(
            scatter(&mut m, 0, &sges, 6, Payload::from(&[0; 3][..])),
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

    /// Scatter makes gather's checks whether one SGE holds the payload
    /// (one check for all of it) or several do: another PD's MR, a key
    /// that is none and bytes past the MR's end are refused, and nothing
    /// is written.
    #[test]
    fn scatter_checks_the_sges_whether_one_or_several_hold_the_payload() {
        let sge = |addr, len, lkey| Sge { addr, len, lkey };
        let payload = Payload::from(&[7u8; 8][..]);
        for sges in [vec![sge(0, 8, 1)], vec![sge(0, 4, 1), sge(4, 4, 1)]] {
            let mut m = Mem(vec![0; 64]);
            let other_pd = scatter(&mut m, 5, &sges, 0, payload);
            assert!(matches!(
                other_pd,
                Err(SglError::Mr(MrCheckError::WrongPd(1)))
            ));
            let mut bad = sges.clone();
            bad[0].lkey = 2;
            let no_key = scatter(&mut m, 0, &bad, 0, payload);
            assert!(matches!(no_key, Err(SglError::Mr(MrCheckError::BadKey(2)))));
            assert!(m.0.iter().all(|&b| b == 0), "nothing written");
        }
        let past = scatter(&mut Mem(vec![0; 64]), 0, &[sge(60, 8, 1)], 0, payload);
        assert!(matches!(
            past,
            Err(SglError::Mr(MrCheckError::OutOfBounds(1)))
        ));
    }

    /// The runs of a message are found with gather's checks, merged where
    /// they follow each other, and a payload of runs is placed piece by
    /// piece as its bytes would be.
    #[test]
    fn runs_are_located_and_scattered_like_bytes() {
        let view: Vec<u8> = (0..64).collect();
        let m = Mem(view.clone());
        let sge = |addr, len| Sge { addr, len, lkey: 1 };
        let sges = [sge(10, 3), sge(13, 2), sge(30, 5)];
        let mut found = Located::default();
        locate(&m, 0, &sges, 1, 6, &mut found).unwrap();
        // 11..15 is one run (two SGEs that follow each other), then 30..32.
        let runs = &found.runs;
        assert_eq!(runs, &[Run { at: 11, len: 4 }, Run { at: 30, len: 2 }]);
        assert_eq!(found.keys, [1], "each MR's key once");
        let payload = Payload::runs(&view, runs, 64).unwrap();
        assert_eq!(payload.len(), 6);
        let mut dst = Mem(vec![0; 64]);
        scatter(&mut dst, 0, &[sge(40, 8)], 1, payload).unwrap();
        assert_eq!(&dst.0[40..48], &[0, 11, 12, 13, 14, 30, 31, 0]);
        // Gather's checks: bounds, and a key of another PD.
        assert!(locate(&m, 0, &[sge(60, 8)], 0, 8, &mut Located::default()).is_err());
        assert!(locate(&m, 1, &sges, 0, 4, &mut Located::default()).is_err());
        // More than MAX_RUNS runs: refused, the caller copies instead.
        let scattered: Vec<Sge> = (0..MAX_SGE as u64).map(|i| sge(i * 2, 1)).collect();
        assert!(locate(&m, 0, &scattered, 0, MAX_SGE, &mut Located::default()).is_ok());
        let mut many = Located {
            runs: vec![Run { at: 0, len: 1 }; MAX_RUNS],
            keys: Vec::new(),
        };
        assert!(locate(&m, 0, &[sge(2, 1)], 0, 1, &mut many).is_err());
    }

    /// A peer's runs: outside the view, overflowing, empty, too many or
    /// too long in all are refused.
    #[test]
    fn hostile_runs_are_refused() {
        let view = [0u8; 64];
        let ok = |runs: &[Run], max| Payload::runs(&view, runs, max).is_some();
        let run = |at, len| Run { at, len };
        assert!(ok(&[run(0, 64)], 64));
        assert!(!ok(&[run(1, 64)], 64), "past the end");
        assert!(!ok(&[run(64, 1)], 64), "outside");
        assert!(!ok(&[run(u64::MAX, 2)], 64), "overflowing");
        assert!(!ok(&[run(0, u32::MAX)], usize::MAX), "huge");
        assert!(!ok(&[run(0, 0)], 64), "empty");
        assert!(!ok(&[run(0, 40), run(0, 40)], 64), "more than max in all");
        assert!(!ok(&vec![run(0, 1); MAX_RUNS + 1], 1 << 20), "too many");
    }
}
