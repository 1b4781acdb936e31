// SPDX-License-Identifier: Apache-2.0
//! Where a live migration's blackout went, read off the two VMMs' logs: the source's switch-over
//! line (pause and save, the last dirty memory, the state sent and restored, the hand-over) and
//! the destination's restore and start lines. The source's blackout ends when the destination
//! answers `Complete`; the guest runs again only once the destination has resumed its devices
//! and let its vCPUs go, so [`Stages::guest_ms`] adds that (split per PCI function).

use std::path::Path;

/// One migration's stages, in milliseconds.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Stages {
    /// The source: pausing the vCPUs and devices and saving their state.
    pub pause_save_ms: u64,
    /// The source: the memory dirtied since the last pre-copy pass, and its size.
    pub last_memory_ms: u64,
    pub last_memory_bytes: u64,
    /// The state sent, restored by the destination and acknowledged.
    pub state_ms: u64,
    /// Of that, the destination restoring its devices.
    pub devices_ms: Option<u64>,
    /// `Complete` answered.
    pub handover_ms: u64,
    /// What the source measured: the sum of the above.
    pub blackout_ms: u64,
    /// The destination after the hand-over: devices resumed, vCPUs let go (their threads are
    /// spawned before it, with the restore; older VMMs spawned them here).
    pub start_ms: Option<u64>,
    /// Of that, the devices resuming, and each PCI function's share (`"02.1"`, ms).
    pub resume_ms: Option<u64>,
    pub resumed: Vec<(String, u64)>,
    /// Of the PVRDMA function's, its same-host channel: taking over the MAC's socket (and,
    /// before blackout4, offering a new ring to each peer).
    pub pvrdma_channel_ms: Option<u64>,
}

impl Stages {
    /// The blackout as the guest sees it: the source's and the destination's start.
    pub fn guest_ms(&self) -> u64 {
        self.blackout_ms + self.start_ms.unwrap_or(0)
    }

    /// The stages of the migration to `url` (`tcp:HOST:PORT`, as the receiver listened on it),
    /// from the VMM logs `logs`: the source is the log that completed a migration to `url`, the
    /// destination the one that listened on it. `None` without the source's switch-over line.
    pub fn read(logs: &[String], url: &str) -> Option<Self> {
        let source = logs
            .iter()
            .find(|l| l.contains(&format!("Migration to {url} completed")))?;
        let mut stages = source.lines().find_map(parse_switchover)?;
        if let Some(dest) = logs
            .iter()
            .find(|l| l.contains(&format!("Listening for a migration on {url}")))
        {
            stages.devices_ms = dest.lines().find_map(|l| {
                number_before(l.split("Restored vCPUs in ").nth(1)?, "devices in ", " ms")
            });
            stages.start_ms = dest.lines().find_map(|l| {
                number_before(
                    l.split("Migration received; ").nth(1)?,
                    "started in ",
                    " ms",
                )
            });
            stages.resume_ms = dest.lines().find_map(|l| {
                number_before(l.split("Started: ").nth(1)?, "devices resumed in ", " ms")
            });
            stages.resumed = dest
                .lines()
                .find_map(|l| l.split("PCI functions resumed: ").nth(1))
                .map(parse_functions)
                .unwrap_or_default();
            stages.pvrdma_channel_ms = dest.lines().find_map(|l| {
                let rest = l.split("pvrdma: same-host socket claimed in ").nth(1)?;
                let claim: u64 = rest.split(" ms").next()?.parse().ok()?;
                // VMMs before blackout4 also offered the rings there, on the same line (now
                // the worker does, after the start).
                Some(claim + number_before(rest, " peers in ", " ms").unwrap_or(0))
            });
        }
        Some(stages)
    }
}

/// "00.0 0 ms, 02.1 35 ms" as (function, ms) pairs; what does not parse is left out.
fn parse_functions(text: &str) -> Vec<(String, u64)> {
    text.split(", ")
        .filter_map(|f| {
            let (devfn, ms) = f.trim().strip_suffix(" ms")?.split_once(' ')?;
            Some((devfn.to_string(), ms.parse().ok()?))
        })
        .collect()
}

/// The number between `before` and `after` in `text`.
fn number_before(text: &str, before: &str, after: &str) -> Option<u64> {
    text.split(before).nth(1)?.split(after).next()?.parse().ok()
}

/// The source's "Migration switch-over: paused and saved in A ms, last N bytes of memory in B
/// ms, S bytes of state restored in C ms, handed over in D ms, blackout E ms".
fn parse_switchover(line: &str) -> Option<Stages> {
    let rest = line.split("Migration switch-over: ").nth(1)?;
    Some(Stages {
        pause_save_ms: number_before(rest, "paused and saved in ", " ms")?,
        last_memory_bytes: number_before(rest, ", last ", " bytes")?,
        last_memory_ms: number_before(rest, "bytes of memory in ", " ms")?,
        state_ms: number_before(rest, "bytes of state restored in ", " ms")?,
        handover_ms: number_before(rest, "handed over in ", " ms")?,
        blackout_ms: number_before(rest, "blackout ", " ms")?,
        ..Stages::default()
    })
}

/// The contents of every `*-vmm.log` in `dir` whose name starts with `prefix`.
pub fn vmm_logs(dir: &Path, prefix: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(prefix) && name.ends_with("-vmm.log")
        })
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = "[2026-11-26T11:41:01Z INFO ] Migration pass 1: 536870912 bytes\n\
        [2026-11-26T11:41:02Z INFO ] Migration switch-over: paused and saved in 51 ms, last 5038080 \
        bytes of memory in 142 ms, 105156 bytes of state restored in 212 ms, handed over in 5 ms, \
        blackout 411 ms\n\
        [2026-11-26T11:41:02Z INFO ] Migration to tcp:127.0.0.1:6709 completed in 24100 ms\n";
    const DEST: &str = "[x INFO ] Listening for a migration on tcp:127.0.0.1:6709\n\
        [x INFO ] PCI functions restored: 00.0 0 ms, 01.0 42 ms, 02.0 32 ms, 02.1 107 ms\n\
        [x INFO ] Restored vCPUs in 21 ms, the VM's irqchip and clocks in 0 ms, devices in 186 ms\n\
        [x INFO ] Prepared 1 vCPU threads (parked) in 1 ms\n\
        [x INFO ] pvrdma: same-host socket claimed in 2 ms, rings offered to 1 peers in 30 ms\n\
        [x INFO ] PCI functions resumed: 00.0 0 ms, 01.0 2 ms, 02.0 4 ms, 02.1 35 ms\n\
        [x INFO ] Started: vCPU threads in 0 ms, devices resumed in 43 ms, then vCPUs let go in 0 ms\n\
        [x INFO ] Migration received; the VM runs here now (started in 76 ms)\n";
    const OTHER: &str = "[x INFO ] Listening for a migration on tcp:127.0.0.1:6708\n\
        [x INFO ] Migration to tcp:127.0.0.1:6708 completed in 1 ms\n";

    #[test]
    fn stages_from_the_source_and_the_destination() {
        let logs = [OTHER.to_string(), DEST.to_string(), SOURCE.to_string()];
        let s = Stages::read(&logs, "tcp:127.0.0.1:6709").unwrap();
        assert_eq!(
            s,
            Stages {
                pause_save_ms: 51,
                last_memory_ms: 142,
                last_memory_bytes: 5_038_080,
                state_ms: 212,
                devices_ms: Some(186),
                handover_ms: 5,
                blackout_ms: 411,
                start_ms: Some(76),
                resume_ms: Some(43),
                resumed: [("00.0", 0), ("01.0", 2), ("02.0", 4), ("02.1", 35)]
                    .map(|(f, ms)| (f.to_string(), ms))
                    .to_vec(),
                pvrdma_channel_ms: Some(32),
            }
        );
        assert_eq!(s.guest_ms(), 487);
        // Without the destination's log: the source's figures only.
        let s = Stages::read(&[SOURCE.to_string()], "tcp:127.0.0.1:6709").unwrap();
        assert_eq!((s.devices_ms, s.start_ms, s.guest_ms()), (None, None, 411));
        assert_eq!(
            (s.resume_ms, s.resumed.len(), s.pvrdma_channel_ms),
            (None, 0, None)
        );
        // The socket claimed in resume, the rings offered by the worker after the start.
        let dest = DEST.replace(", rings offered to 1 peers in 30 ms", "");
        let logs = [OTHER.to_string(), dest, SOURCE.to_string()];
        let s = Stages::read(&logs, "tcp:127.0.0.1:6709").unwrap();
        assert_eq!(s.pvrdma_channel_ms, Some(2));
        // A migration whose source printed no switch-over has no stages.
        assert!(Stages::read(&logs, "tcp:127.0.0.1:6708").is_none());
        assert!(Stages::read(&logs, "tcp:127.0.0.1:6700").is_none());
    }
}
