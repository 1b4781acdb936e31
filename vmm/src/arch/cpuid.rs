// SPDX-License-Identifier: Apache-2.0
//! The guest's CPUID. A booting VM's is built from KVM's supported set
//! ([`for_vcpu`]); a migrated or restored VM keeps the one it booted with,
//! which travels in each vCPU's state: a guest picks its instructions
//! (AVX-512, XSAVES, PCID, ...) from CPUID once, at boot, and crashes if
//! they vanish under it. So before a restored vCPU gets its source's CPUID,
//! [`check`] proves this host offers every feature the guest was told
//! about, as cloud-hypervisor does: feature bits a subset of what this host
//! would give a booting guest, sizes no larger, the XSAVE layout the same.

use std::collections::BTreeMap;
use std::fmt;

use kvm_bindings::{kvm_cpuid_entry2, CpuId, KVM_MAX_CPUID_ENTRIES};

/// Tailors KVM's supported CPUID to vCPU `id` of `count`: APIC IDs, the
/// logical-processor count and the hypervisor bit (so the guest looks for
/// KVM's paravirtual clock and features).
pub fn for_vcpu(supported: &CpuId, id: u8, count: u8) -> CpuId {
    let mut cpuid = supported.clone();
    for entry in cpuid.as_mut_slice() {
        match entry.function {
            1 => {
                entry.ebx = (u32::from(id) << 24) | (u32::from(count) << 16) | (8 << 8);
                entry.ecx |= 1 << 31; // hypervisor present
                if count > 1 {
                    entry.edx |= 1 << 28; // HTT: more than one logical CPU
                }
            }
            // Extended topology: x2APIC ID of this CPU in every sub-leaf.
            0xb | 0x1f => entry.edx = u32::from(id),
            _ => {}
        }
    }
    cpuid
}

/// The entries of a KVM_GET_CPUID2 answer. Linux 6.1 (the test hosts')
/// does not set the count on success, so the buffer's whole size comes
/// back, its tail zeroed entries: those are dropped (a real leaf 0 has the
/// highest leaf and the vendor in it, never all zeros).
pub fn held(cpuid: &CpuId) -> Vec<kvm_cpuid_entry2> {
    let empty = kvm_cpuid_entry2::default();
    cpuid
        .as_slice()
        .iter()
        .filter(|e| **e != empty)
        .copied()
        .collect()
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CpuidError {
    #[error("{0} CPUID entries, more than the {KVM_MAX_CPUID_ENTRIES} KVM takes")]
    TooMany(usize),
    #[error("No CPUID leaf 0x1")]
    NoLeaf1,
    #[error("CPUID leaf 0x1 EBX gives APIC ID {found}, this vCPU's is {expected}")]
    ApicId { found: u32, expected: u32 },
    #[error("CPUID {0}: the guest has bits {1:#010x} this host lacks{2}")]
    Missing(Register, u32, Absent),
    #[error("CPUID {0}: the guest's {1:#x} is over this host's {2:#x}")]
    Greater(Register, u32, u32),
    #[error(
        "CPUID leaf 0xd.{component:#x}: XSAVE component {component} is {size} bytes at {offset} \
         for the guest, {here_size} bytes at {here_offset} here"
    )]
    XsaveLayout {
        component: u32,
        size: u32,
        offset: u32,
        here_size: u32,
        here_offset: u32,
    },
}

/// Whether this host has no such leaf at all (said in the error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Absent(bool);

impl fmt::Display for Absent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 {
            f.write_str(" (this host has no such leaf)")
        } else {
            Ok(())
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reg {
    Eax,
    Ebx,
    Ecx,
    Edx,
}

/// One register of one leaf, named for errors: "leaf 0x7.0x0 EBX (extended features)".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Register {
    leaf: u32,
    index: u32,
    reg: Reg,
    what: &'static str,
}

impl fmt::Display for Register {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reg = match self.reg {
            Reg::Eax => "EAX",
            Reg::Ebx => "EBX",
            Reg::Ecx => "ECX",
            Reg::Edx => "EDX",
        };
        write!(
            f,
            "leaf {:#x}.{:#x} {reg} ({})",
            self.leaf, self.index, self.what
        )
    }
}

fn value(entry: &kvm_cpuid_entry2, reg: Reg) -> u32 {
    match reg {
        Reg::Eax => entry.eax,
        Reg::Ebx => entry.ebx,
        Reg::Ecx => entry.ecx,
        Reg::Edx => entry.edx,
    }
}

#[derive(Debug, Clone, Copy)]
enum Rule {
    /// Feature flags: every bit of `mask` the guest has, this host has.
    Subset(u32),
    /// A number in the bits of `mask`: the guest's is not over this host's.
    AtMost(u32),
}

/// Bits KVM changes while the guest runs, from its control registers
/// (KVM_GET_CPUID2 returns them as they are now): leaf 1 ECX OSXSAVE
/// (CR4.OSXSAVE) and leaf 7 ECX OSPKE (CR4.PKE). Not features.
const OSXSAVE: u32 = 1 << 27;
const OSPKE: u32 = 1 << 4;
const ALL: u32 = !0;
const EXT: &str = "extended features";

/// What a guest reads to choose instructions and paravirtual interfaces.
/// Leaf 0xD's EBX (XSAVE size for the XCR0/XSS now set) changes with them
/// at run time and is not here; the size for all components (0xD.0 ECX)
/// and each component's place are.
const FEATURES: &[(u32, u32, Reg, Rule, &str)] = &[
    (0x1, 0, Reg::Ecx, Rule::Subset(!OSXSAVE), "features"),
    (0x1, 0, Reg::Edx, Rule::Subset(ALL), "features"),
    (0x6, 0, Reg::Eax, Rule::Subset(ALL), "thermal and power"),
    (0x7, 0, Reg::Ebx, Rule::Subset(ALL), EXT),
    (0x7, 0, Reg::Ecx, Rule::Subset(!OSPKE), EXT),
    (0x7, 0, Reg::Edx, Rule::Subset(ALL), EXT),
    (0x7, 1, Reg::Eax, Rule::Subset(ALL), EXT),
    (0x7, 1, Reg::Edx, Rule::Subset(ALL), EXT),
    (0x7, 2, Reg::Edx, Rule::Subset(ALL), "speculation controls"),
    (0xd, 0, Reg::Eax, Rule::Subset(ALL), "XCR0 components"),
    (0xd, 0, Reg::Edx, Rule::Subset(ALL), "XCR0 components"),
    (0xd, 0, Reg::Ecx, Rule::AtMost(ALL), "XSAVE area size"),
    (0xd, 1, Reg::Eax, Rule::Subset(ALL), "XSAVE instructions"),
    (0xd, 1, Reg::Ecx, Rule::Subset(ALL), "XSS components"),
    (0xd, 1, Reg::Edx, Rule::Subset(ALL), "XSS components"),
    (0x4000_0001, 0, Reg::Eax, Rule::Subset(ALL), "KVM features"),
    (0x4000_0001, 0, Reg::Edx, Rule::Subset(ALL), "KVM hints"),
    (0x8000_0001, 0, Reg::Ecx, Rule::Subset(ALL), EXT),
    (0x8000_0001, 0, Reg::Edx, Rule::Subset(ALL), EXT),
    (0x8000_0007, 0, Reg::Edx, Rule::Subset(ALL), "invariant TSC"),
    (0x8000_0008, 0, Reg::Eax, Rule::AtMost(0xff), "address bits"),
    (0x8000_0008, 0, Reg::Ebx, Rule::Subset(ALL), EXT),
    (0x8000_0021, 0, Reg::Eax, Rule::Subset(ALL), EXT),
];

/// CPUID entries by (leaf, sub-leaf); a hostile list is refused for its
/// size. Of a repeated leaf the first counts, as in KVM's lookup.
fn by_leaf(
    entries: &[kvm_cpuid_entry2],
) -> Result<BTreeMap<(u32, u32), &kvm_cpuid_entry2>, CpuidError> {
    if entries.len() > KVM_MAX_CPUID_ENTRIES {
        return Err(CpuidError::TooMany(entries.len()));
    }
    let mut map = BTreeMap::new();
    for e in entries {
        map.entry((e.function, e.index)).or_insert(e);
    }
    Ok(map)
}

/// Checks that `guest`, a restored vCPU's saved CPUID (untrusted), asks
/// nothing of this host that `here` does not offer; also that it names
/// the same APIC ID, as the vCPU's KVM ID is its index. `here` is the CPUID
/// KVM holds for the same vCPU of a booting guest ([`for_vcpu`] set, read
/// back with KVM_GET_CPUID2): KVM may give a vCPU more than its supported
/// list says (the development host's kvm-pvm adds SSE3, AVX and a dozen more
/// to leaf 1 ECX), and what a saved CPUID holds is what KVM gave.
pub fn check(guest: &[kvm_cpuid_entry2], here: &[kvm_cpuid_entry2]) -> Result<(), CpuidError> {
    let guest = by_leaf(guest)?;
    let here = by_leaf(here)?;
    let leaf1 = guest.get(&(1, 0)).ok_or(CpuidError::NoLeaf1)?;
    let apic_id = |e: &kvm_cpuid_entry2| e.ebx >> 24;
    let expected = here.get(&(1, 0)).map_or(0, |e| apic_id(e));
    if apic_id(leaf1) != expected {
        return Err(CpuidError::ApicId {
            found: apic_id(leaf1),
            expected,
        });
    }
    for &(leaf, index, reg, rule, what) in FEATURES {
        let name = Register {
            leaf,
            index,
            reg,
            what,
        };
        let theirs = guest.get(&(leaf, index)).map_or(0, |e| value(e, reg));
        let ours = here.get(&(leaf, index)).map(|e| value(e, reg));
        match rule {
            Rule::Subset(mask) => {
                let missing = theirs & mask & !ours.unwrap_or(0);
                if missing != 0 {
                    return Err(CpuidError::Missing(name, missing, Absent(ours.is_none())));
                }
            }
            Rule::AtMost(mask) => {
                let ours = ours.unwrap_or(0) & mask;
                if theirs & mask > ours {
                    return Err(CpuidError::Greater(name, theirs & mask, ours));
                }
            }
        }
    }
    check_xsave_layout(&guest, &here)
}

/// Every XSAVE component the guest may enable (XCR0 or XSS bits of leaf
/// 0xD) has the same size and offset here: KVM_SET_XSAVE and the guest's
/// own XSAVE area depend on them.
fn check_xsave_layout(
    guest: &BTreeMap<(u32, u32), &kvm_cpuid_entry2>,
    here: &BTreeMap<(u32, u32), &kvm_cpuid_entry2>,
) -> Result<(), CpuidError> {
    let xcr0 = guest
        .get(&(0xd, 0))
        .map_or(0, |e| u64::from(e.eax) | u64::from(e.edx) << 32);
    let xss = guest
        .get(&(0xd, 1))
        .map_or(0, |e| u64::from(e.ecx) | u64::from(e.edx) << 32);
    let components = xcr0 | xss;
    // Components 0 and 1 (x87, SSE) live in the legacy area.
    for component in (2..64u32).filter(|&c| components & (1 << c) != 0) {
        let layout = |m: &BTreeMap<(u32, u32), &kvm_cpuid_entry2>| {
            m.get(&(0xd, component)).map_or((0, 0), |e| (e.eax, e.ebx))
        };
        let ((size, offset), (here_size, here_offset)) = (layout(guest), layout(here));
        if (size, offset) != (here_size, here_offset) {
            return Err(CpuidError::XsaveLayout {
                component,
                size,
                offset,
                here_size,
                here_offset,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, index: u32, [eax, ebx, ecx, edx]: [u32; 4]) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            eax,
            ebx,
            ecx,
            edx,
            ..Default::default()
        }
    }

    /// A small host: SSE3 and x2APIC, AVX2 and BMI2, x87+SSE+AVX in XCR0
    /// (AVX's 256 bytes at 576), XSAVEOPT, LM.
    fn host() -> Vec<kvm_cpuid_entry2> {
        vec![
            entry(0, 0, [0xd, 0, 0, 0]),
            entry(1, 0, [0x806f8, 0, 1 | 1 << 21, 1]),
            entry(7, 0, [0, 1 << 5 | 1 << 8, 0, 0]),
            entry(0xd, 0, [0b111, 832, 832, 0]),
            entry(0xd, 1, [1, 0, 0, 0]),
            entry(0xd, 2, [256, 576, 0, 0]),
            entry(0x8000_0001, 0, [0, 0, 0, 1 << 29]),
        ]
    }

    fn here(entries: &[kvm_cpuid_entry2]) -> Vec<kvm_cpuid_entry2> {
        for_vcpu(&CpuId::from_entries(entries).unwrap(), 0, 1)
            .as_slice()
            .to_vec()
    }

    fn guest() -> Vec<kvm_cpuid_entry2> {
        here(&host())
    }

    fn leaf(entries: &mut [kvm_cpuid_entry2], function: u32, index: u32) -> &mut kvm_cpuid_entry2 {
        entries
            .iter_mut()
            .find(|e| (e.function, e.index) == (function, index))
            .unwrap()
    }

    /// A KVM_GET_CPUID2 answer whose count was left at the buffer's size
    /// (Linux 6.1) holds the real entries and no zeroed tail.
    #[test]
    fn a_zeroed_tail_is_not_cpuid() {
        let mut buffer = host();
        buffer.resize(KVM_MAX_CPUID_ENTRIES, kvm_cpuid_entry2::default());
        assert_eq!(held(&CpuId::from_entries(&buffer).unwrap()), host());
    }

    #[test]
    fn the_same_cpuid_fits() {
        assert_eq!(check(&guest(), &here(&host())), Ok(()));
    }

    /// Fewer features than the host has, a smaller XSAVE area, and the
    /// bits KVM sets at run time (OSXSAVE) are fine.
    #[test]
    fn fewer_features_and_run_time_bits_fit() {
        let mut g = guest();
        leaf(&mut g, 7, 0).ebx = 1 << 5;
        leaf(&mut g, 1, 0).ecx |= OSXSAVE;
        leaf(&mut g, 0xd, 0).ecx = 576;
        leaf(&mut g, 0xd, 0).ebx = 4096;
        assert_eq!(check(&g, &here(&host())), Ok(()));
    }

    #[test]
    fn a_missing_feature_is_refused_by_name() {
        let mut g = guest();
        leaf(&mut g, 7, 0).ebx |= 1 << 16; // AVX512F
        let e = check(&g, &here(&host())).unwrap_err();
        assert_eq!(
            e.to_string(),
            "CPUID leaf 0x7.0x0 EBX (extended features): the guest has bits 0x00010000 this host \
             lacks"
        );
        let mut g = guest();
        leaf(&mut g, 0xd, 0).eax |= 1 << 5; // AVX-512 opmask state
        let e = check(&g, &here(&host())).unwrap_err().to_string();
        assert!(e.contains("leaf 0xd.0x0 EAX (XCR0 components)"), "{e}");
    }

    #[test]
    fn a_leaf_this_host_lacks_is_refused() {
        let mut g = guest();
        g.push(entry(0x8000_0007, 0, [0, 0, 0, 1 << 8]));
        let e = check(&g, &here(&host())).unwrap_err().to_string();
        assert_eq!(
            e,
            "CPUID leaf 0x80000007.0x0 EDX (invariant TSC): the guest has bits 0x00000100 this \
             host lacks (this host has no such leaf)"
        );
    }

    #[test]
    fn a_larger_xsave_area_or_another_layout_is_refused() {
        let mut g = guest();
        leaf(&mut g, 0xd, 0).ecx = 1088;
        let e = check(&g, &here(&host())).unwrap_err();
        assert!(matches!(e, CpuidError::Greater(_, 1088, 832)), "{e}");
        let mut g = guest();
        leaf(&mut g, 0xd, 2).ebx = 640;
        let e = check(&g, &here(&host())).unwrap_err();
        assert!(
            matches!(
                e,
                CpuidError::XsaveLayout {
                    component: 2,
                    offset: 640,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn malformed_cpuid_is_refused() {
        let host = here(&host());
        let too_many = vec![entry(1, 0, [0; 4]); KVM_MAX_CPUID_ENTRIES + 1];
        assert_eq!(
            check(&too_many, &host),
            Err(CpuidError::TooMany(KVM_MAX_CPUID_ENTRIES + 1))
        );
        // A repeated leaf: the first counts, as in KVM.
        let mut twice = guest();
        twice.push(entry(7, 0, [0, !0, 0, 0]));
        assert_eq!(check(&twice, &host), Ok(()));
        twice.insert(0, entry(7, 0, [0, 1 << 16, 0, 0]));
        assert!(matches!(
            check(&twice, &host),
            Err(CpuidError::Missing(_, 0x1_0000, _))
        ));
        let mut no_leaf1 = guest();
        no_leaf1.retain(|e| e.function != 1);
        assert_eq!(check(&no_leaf1, &host), Err(CpuidError::NoLeaf1));
        assert_eq!(check(&[], &host), Err(CpuidError::NoLeaf1));
        let other_vcpu = for_vcpu(&CpuId::from_entries(&super::tests::host()).unwrap(), 3, 4);
        assert_eq!(
            check(other_vcpu.as_slice(), &host),
            Err(CpuidError::ApicId {
                found: 3,
                expected: 0
            })
        );
    }
}
