// SPDX-License-Identifier: Apache-2.0
//! x86_64 specifics: memory map, boot protocol, ACPI and vCPU setup.

pub mod acpi;
pub mod boot;
pub mod cpu;
pub mod cpuid;
pub mod layout;
pub mod state;
