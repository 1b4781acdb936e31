// SPDX-License-Identifier: Apache-2.0
//! The guest-visible ABI of VMware's paravirtual RDMA device (PCI 15ad:0820)
//! as the unmodified Linux `vmw_pvrdma` driver and rdma-core's
//! `libvmw_pvrdma` use it. Source of truth: `docs/pvrdma-abi.md`.
//!
//! Definitions only: register offsets ([`regs`]), the device shared region
//! and capabilities ([`dsr`]), the command channel ([`cmd`]), verbs
//! attribute structures ([`verbs`]), ring entries and work requests
//! ([`wqe`]) and the ring index arithmetic of `pvrdma_ring.h` ([`ring`]).
//! Every wire structure is `#[repr(C)]` with integer fields and explicit
//! reserved padding; its size is checked at compile time against the ABI
//! and, by `wire_struct!`, against the sum of its fields (no hidden
//! padding), which is what makes the `ByteValued` impls sound.

#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

/// Declares a wire structure: `#[repr(C)]`, integer fields, `Default` as
/// all-zeroes, a compile-time check of its ABI size and of the absence of
/// implicit padding, and the `ByteValued` impl those checks justify.
macro_rules! wire_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident = $size:literal {
            $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty ),*
        }

        const _: () = assert!(::core::mem::size_of::<$name>() == $size, "ABI size");
        const _: () = assert!(
            0 $( + ::core::mem::size_of::<$ty>() )* == $size,
            "implicit padding"
        );

        // SAFETY: `$name` is `repr(C)`, its fields are integers, integer
        // arrays or other wire structs, and the assertions above prove that
        // they fill all `$size` bytes, so there is no padding and every bit
        // pattern is a valid value.
        unsafe impl ::vm_memory::ByteValued for $name {}

        // Saved device state carries wire structs as their bytes.
        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(<Self as ::vm_memory::ByteValued>::as_slice(self))
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_bytes($crate::WireVisitor(::core::marker::PhantomData::<$name>))
            }
        }

        impl Default for $name {
            fn default() -> Self {
                <Self as ::vm_memory::ByteValued>::zeroed()
            }
        }
    };
}

/// Reads a wire struct from saved state: a byte string of exactly its
/// size (one copy, not one call per byte), or a sequence of byte values
/// (what self-describing formats such as JSON make of bytes).
#[doc(hidden)]
pub struct WireVisitor<T>(pub core::marker::PhantomData<T>);

impl<'de, T: vm_memory::ByteValued + Default> serde::de::Visitor<'de> for WireVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut core::fmt::Formatter) -> core::fmt::Result {
        write!(f, "{} bytes", core::mem::size_of::<T>())
    }

    fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<T, E> {
        let mut v = T::default();
        let dst = v.as_mut_slice();
        if dst.len() != bytes.len() {
            return Err(E::invalid_length(bytes.len(), &self));
        }
        dst.copy_from_slice(bytes);
        Ok(v)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
        let mut v = T::default();
        let dst = v.as_mut_slice();
        let size = dst.len();
        for (i, byte) in dst.iter_mut().enumerate() {
            *byte = seq
                .next_element()?
                .ok_or_else(|| serde::de::Error::invalid_length(i, &self))?;
        }
        if seq.next_element::<u8>()?.is_some() {
            return Err(serde::de::Error::invalid_length(
                size.saturating_add(1),
                &self,
            ));
        }
        Ok(v)
    }
}

pub mod cmd;
pub mod dsr;
pub mod regs;
pub mod ring;
pub mod verbs;
pub mod wqe;

/// The guest page size: the driver and the provider use 4 KiB pages for
/// every ring, page directory and UAR page (PVRDMA is x86-only).
pub const PAGE_SIZE: u64 = 4096;
/// log2 of [`PAGE_SIZE`].
pub const PAGE_SHIFT: u32 = 12;

/// Page directory geometry (`pvrdma_pdir`): one directory page of table
/// GPAs, each table page holding this many data-page GPAs.
pub const PDIR_ENTRIES_PER_PAGE: u32 = 512;
/// `PVRDMA_PAGE_DIR_MAX_PAGES`: one directory of 512 tables of 512 pages.
pub const PDIR_MAX_PAGES: u32 = PDIR_ENTRIES_PER_PAGE * PDIR_ENTRIES_PER_PAGE;

/// `PVRDMA_UAR_HANDLE_MASK`: object handles are 24-bit everywhere.
pub const HANDLE_MASK: u32 = 0x00ff_ffff;
/// IB queue pair numbers are 24-bit.
pub const QPN_MASK: u32 = 0x00ff_ffff;
