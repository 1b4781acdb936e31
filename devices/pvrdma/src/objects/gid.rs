// SPDX-License-Identifier: Apache-2.0
//! The port's GID table, filled by the guest (CREATE_BIND / DESTROY_BIND)
//! with the RoCE GIDs it derives from the vmxnet3 netdev's addresses.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use pvrdma_abi::cmd::{CreateBindReq, DestroyBindReq};

use crate::cmd::{check, CmdError};
use crate::state::Ctx;

/// VLAN ids are 12-bit; 0xFFF means "no VLAN".
const MAX_VLAN: u32 = 0xfff;

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct GidTable {
    entries: Vec<Option<[u8; 16]>>,
}

impl GidTable {
    pub(crate) fn new(len: u32) -> Self {
        Self {
            entries: vec![None; usize::try_from(len).unwrap_or(0)],
        }
    }

    fn slot(&mut self, index: u32) -> Result<&mut Option<[u8; 16]>, CmdError> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.entries.get_mut(i))
            .ok_or(CmdError::Invalid("GID index"))
    }

    /// Whether `gid` is bound (a received packet's destination must be).
    pub(crate) fn contains(&self, gid: &[u8; 16]) -> bool {
        self.entries.iter().flatten().any(|g| g == gid)
    }

    /// The GID bound at `index`, if any.
    pub(crate) fn get(&self, index: u32) -> Option<&[u8; 16]> {
        self.entries.get(usize::try_from(index).ok()?)?.as_ref()
    }
}

pub(crate) fn handle_create_bind<M>(
    cx: &mut Ctx<'_, M>,
    req: &CreateBindReq,
) -> Result<(), CmdError> {
    if req.gid_type != cx.env.config.gid_type.abi() {
        return Err(CmdError::Unsupported("GID type"));
    }
    check(req.new_gid != [0; 16], "GID (all zeroes)")?;
    check(req.vlan <= MAX_VLAN, "VLAN id")?;
    *cx.s.objects.gids.slot(req.index)? = Some(req.new_gid);
    Ok(())
}

pub(crate) fn handle_destroy_bind<M>(
    cx: &mut Ctx<'_, M>,
    req: &DestroyBindReq,
) -> Result<(), CmdError> {
    let slot = cx.s.objects.gids.slot(req.index)?;
    check(*slot == Some(req.dest_gid), "GID (not bound at that index)")?;
    *slot = None;
    Ok(())
}
