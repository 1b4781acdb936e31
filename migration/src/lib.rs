// SPDX-License-Identifier: Apache-2.0
//! Live migration for pvrdma-vmm, modelled on cloud-hypervisor's
//! vm-migration: small traits with default bodies that every stateful
//! component implements. The protocol, versioned state and dirty tracking
//! land here as live migration is built.

/// Errors of a migration step, named after the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum MigratableError {
    #[error("Failed to pause")]
    Pause(#[source] std::io::Error),
    #[error("Failed to resume")]
    Resume(#[source] std::io::Error),
}

/// A component that can be stopped and restarted in place: vCPUs now,
/// devices (quiesce) as migration arrives.
pub trait Pausable {
    fn pause(&mut self) -> Result<(), MigratableError> {
        Ok(())
    }
    fn resume(&mut self) -> Result<(), MigratableError> {
        Ok(())
    }
}
