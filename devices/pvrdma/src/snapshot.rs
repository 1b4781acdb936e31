// SPDX-License-Identifier: Apache-2.0
//! The device's saved state (live migration, snapshots): registers, the
//! session's DSR, namespace and every object with its IDs, rings, MR
//! mappings and transport engine. Restoring re-creates the objects with
//! the same handles, QPNs and keys, so peers keep their (GID, QPN, rkey),
//! and makes their doorbell eventfds and ioeventfds again.
//!
//! Taking the state lock quiesces the device: the worker runs every QP
//! under it, so a snapshot falls between two runs. Frames in flight then
//! are lost, and RC retransmission brings them back after the restore.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use pci::MsixState;
use serde::{Deserialize, Serialize};
use vm_migration::{MigratableError, Snapshot};

use crate::dsr::LoadedDsr;
use crate::namespace::{Namespace, NamespaceState};
use crate::objects::Objects;
use crate::state::{Session, Shared};

/// The component name in a VM snapshot.
pub(crate) const ID: &str = "pvrdma";
/// Layout of [`Saved`]; bump on any change (postcard is positional: a field
/// added anywhere inside, even `#[serde(default)]`, shifts everything after
/// it). 4: the completer's `retrying` and the responder's held ACK/NAK.
pub(crate) const VERSION: u32 = 4;

/// What is saved; `D` and `O` are references when saving, owned when
/// restoring.
#[derive(Serialize, Deserialize)]
struct Saved<D, O> {
    err: u32,
    dsr_low: u32,
    active: bool,
    imr: u32,
    icr: u32,
    msix: MsixState,
    session: Option<SavedSession<D, O>>,
}

#[derive(Serialize, Deserialize)]
struct SavedSession<D, O> {
    dsr: D,
    ns: NamespaceState,
    objects: O,
    link_up: bool,
}

pub(crate) fn save(shared: &Shared) -> Result<Snapshot, MigratableError> {
    let state = shared.lock();
    let saved = Saved {
        err: state.err,
        dsr_low: state.dsr_low,
        active: state.active,
        imr: shared.env.irq.imr(),
        icr: shared.env.irq.icr(),
        msix: shared.env.irq.msix().state(),
        session: state.session.as_ref().map(|s| SavedSession {
            dsr: &s.dsr,
            ns: s.ns.save(),
            objects: &s.objects,
            link_up: s.link_up,
        }),
    };
    if let Some(s) = &state.session {
        log::info!("pvrdma: saved {}", s.objects.peer_ids());
    }
    Snapshot::new(ID, VERSION, &saved)
}

fn restore_error(e: impl std::error::Error + Send + Sync + 'static) -> MigratableError {
    MigratableError::Restore(ID.into(), Box::new(e))
}

/// Replaces the device's state with `snapshot`'s (the device is fresh or
/// quiesced). Nothing changes unless the whole state is valid.
pub(crate) fn restore(shared: &Shared, snapshot: &Snapshot) -> Result<(), MigratableError> {
    let saved: Saved<LoadedDsr, Objects> = snapshot.state(ID, VERSION)?;
    let env = &shared.env;
    let session = match saved.session {
        Some(s) => {
            let ns = Namespace::restore(&env.config.limits, &s.ns).map_err(restore_error)?;
            Some(Session {
                dsr: s.dsr,
                ns,
                objects: s.objects,
                link_up: s.link_up,
            })
        }
        None => None,
    };
    env.irq
        .msix()
        .set_state(&saved.msix)
        .map_err(restore_error)?;
    let mut state = shared.lock();
    let base = state.uar_base;
    state.session = session;
    if let Some(s) = state.session.as_mut() {
        s.objects
            .attach_doorbells(&env.hub, base)
            .map_err(restore_error)?;
    }
    state.err = saved.err;
    state.dsr_low = saved.dsr_low;
    state.active = saved.active;
    env.irq.set_imr(saved.imr);
    env.irq.set_icr(saved.icr);
    env.wire.inbox.set_open(saved.active);
    if let Some(s) = &state.session {
        log::info!("pvrdma: restored {}", s.objects.peer_ids());
    }
    drop(state);
    shared.kick_all();
    Ok(())
}
