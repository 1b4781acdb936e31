// SPDX-License-Identifier: Apache-2.0
//! Reading what a scenario left in `$OUT`: `key=value` files and guest serial logs.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// A `key=value` file written by a scenario script (later lines win).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyValues {
    path: PathBuf,
    values: HashMap<String, String>,
}

impl KeyValues {
    pub fn read(path: &Path) -> Result<Self> {
        let text = fs::read_to_string(path).map_err(|e| {
            Error::new(format!(
                "cannot read {}: {e} (did the scenario get that far?)",
                path.display()
            ))
        })?;
        Ok(Self::parse(path, &text))
    }

    fn parse(path: &Path, text: &str) -> Self {
        let values = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        Self {
            path: path.to_path_buf(),
            values,
        }
    }

    /// Adds the values of `other` (e.g. the results of a second machine), which win on a clash.
    pub fn extend(&mut self, other: KeyValues) {
        self.values.extend(other.values);
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    /// The file's name, for messages (`rdma.env`).
    pub fn name(&self) -> String {
        self.path.file_name().map_or_else(
            || self.path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    }

    /// The value of `key` as an integer, or an error naming the file and the key.
    pub fn int(&self, key: &str) -> Result<i64> {
        let raw = self.get(key).ok_or_else(|| {
            Error::new(format!(
                "{}: no {key} (whole file: {:?})",
                self.path.display(),
                self.values
            ))
        })?;
        raw.parse().map_err(|_| {
            Error::new(format!(
                "{}: {key}={raw} is not an integer",
                self.path.display()
            ))
        })
    }
}

/// A guest's serial console log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SerialLog {
    text: String,
}

impl SerialLog {
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = fs::read(path)
            .map_err(|e| Error::new(format!("cannot read {}: {e}", path.display())))?;
        Ok(Self {
            text: String::from_utf8_lossy(&bytes).into_owned(),
        })
    }

    /// One console's text made of several logs in order (a guest's consoles on the VMMs it
    /// migrated through).
    pub fn concat(logs: &[SerialLog]) -> Self {
        Self {
            text: logs
                .iter()
                .map(|l| l.text.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// The rest of the first line carrying `marker` (after it, trimmed). Kernel messages may share
    /// a line with a marker on a serial console, so the marker need not start the line.
    pub fn marker(&self, marker: &str) -> Option<&str> {
        self.text
            .lines()
            .find_map(|l| l.split_once(marker).map(|(_, rest)| rest.trim()))
    }

    /// `key=value` from the first line carrying `marker`, e.g. `cpus` of `PVRDMA-VMM-GUEST cpus=2`.
    pub fn marker_field(&self, marker: &str, key: &str) -> Option<&str> {
        field(self.marker(marker)?, key)
    }

    /// The rest of every line carrying `marker` (after it, trimmed), in order.
    pub fn markers(&self, marker: &str) -> Vec<&str> {
        self.text
            .lines()
            .filter_map(|l| l.split_once(marker).map(|(_, rest)| rest.trim()))
            .collect()
    }

    /// The output a guest script framed with `SECTION-BEGIN <name>` and `SECTION-END <name> rc=N`
    /// lines (the first such section), or None if the section never began.
    pub fn section(&self, name: &str) -> Option<Section> {
        let begin = format!("SECTION-BEGIN {name}");
        let end = format!("SECTION-END {name} ");
        let mut lines = self.text.lines();
        lines.find(|l| l.trim_end() == begin || l.ends_with(&format!(" {begin}")))?;
        let mut body = Vec::new();
        let mut rc = None;
        for line in lines {
            if let Some((_, rest)) = line.split_once(&end) {
                rc = field(rest, "rc").and_then(|v| v.parse().ok());
                break;
            }
            body.push(line.trim_end_matches('\r'));
        }
        Some(Section {
            text: body.join("\n"),
            rc,
        })
    }

    /// What guest/init logged of the guest kernel's log before powering off: the
    /// `GUEST-KERNEL-LOG` lines (each WARNING, BUG and Call Trace line with the lines after it),
    /// or None when this console never reached the check (the guest moved away, or died first).
    pub fn kernel_log(&self) -> Option<Vec<&str>> {
        self.marker("GUEST-KERNEL-CHECK")?;
        Some(self.markers("GUEST-KERNEL-LOG"))
    }

    /// The first line saying the guest kernel crashed (an oops, a panic, a fault in kernel
    /// mode: the patterns scenarios/lib.sh's `wait_for_line` stops at) and the `count` lines
    /// after it, or None. A crash's first lines name its cause; a console's tail shows only
    /// the loop it ended in.
    pub fn first_crash(&self, count: usize) -> Option<String> {
        let lines: Vec<&str> = self.text.lines().collect();
        let start = lines
            .iter()
            .position(|l| KERNEL_CRASH_LINES.iter().any(|p| l.contains(p)))?;
        Some(
            lines
                .iter()
                .skip(start)
                .take(count + 1)
                .copied()
                .collect::<Vec<_>>()
                .join("\n"),
        )
    }

    /// The last `count` lines, to quote in a failure message.
    pub fn tail(&self, count: usize) -> String {
        let lines: Vec<&str> = self.text.lines().collect();
        lines[lines.len().saturating_sub(count)..].join("\n")
    }
}

/// Guest console text that says the kernel crashed (scenarios/lib.sh's `KERNEL_CRASH_RE`).
const KERNEL_CRASH_LINES: [&str; 6] = [
    "Oops: ",
    "Kernel panic",
    "PANIC: ",
    "BUG: unable to handle",
    "general protection fault,",
    "general protection fault:",
];

/// The value of `key` among the whitespace-separated `key=value` words of `text`.
pub fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

/// A framed part of a guest's output (see [`SerialLog::section`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// The lines between the frames.
    pub text: String,
    /// The framed command's exit status; None if the end frame is missing (the guest stopped).
    pub rc: Option<i32>,
}

impl Section {
    /// The value after `key` on the first line whose first word is `key` followed by a colon, as
    /// in `ibv_devinfo`'s `max_qp:   1024` (whitespace-separated, so `state: PORT_ACTIVE (4)`
    /// gives `PORT_ACTIVE (4)`).
    pub fn colon_value(&self, key: &str) -> Option<&str> {
        self.text.lines().find_map(|l| {
            let (k, v) = l.trim().split_once(':')?;
            (k.trim() == key).then(|| v.trim())
        })
    }
}

/// The lines of a VMM log (env_logger format, `[<time> LEVEL ] message`) logged at WARN or ERROR:
/// what a well-behaved guest never causes.
pub fn vmm_log_problems(path: &Path) -> Result<Vec<String>> {
    let log = SerialLog::read(path)?;
    Ok(log
        .text
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .map(|level| level.trim_end_matches(']'))
                .is_some_and(|level| level == "WARN" || level == "ERROR")
        })
        .map(str::to_string)
        .collect())
}

/// Last `count` lines of a file for a failure message, or why it could not be read.
pub fn tail_of(path: &Path, count: usize) -> String {
    match SerialLog::read(path) {
        Ok(log) => format!(
            "---- last lines of {} ----\n{}\n----",
            path.display(),
            log.tail(count)
        ),
        Err(e) => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_values_parse_and_later_lines_win() {
        let kv = KeyValues::parse(
            Path::new("x.env"),
            "rc=1\nname = boot\nrc=0\ngarbage\nfail=\nkv=a=b\n",
        );
        assert_eq!(kv.int("rc"), Ok(0));
        assert_eq!(kv.get("fail"), Some(""));
        assert_eq!(kv.get("kv"), Some("a=b"));
        assert_eq!(kv.get("garbage"), None);
        assert_eq!(kv.get("name"), Some("boot"));
        assert!(kv.int("name").is_err());
        assert!(kv
            .int("missing")
            .unwrap_err()
            .to_string()
            .contains("no missing"));
    }

    #[test]
    fn markers_are_found_inside_lines_and_fields_by_key() {
        let log = SerialLog {
            text: "[    1.0] x\n[ 3.2] ata1: PVRDMA-VMM-GUEST cpus=2 mem_kb=4000 kernel=6.1\r\nROOTDISK-OK id-1 mode=ro\n"
                .to_string(),
        };
        assert_eq!(log.marker_field("PVRDMA-VMM-GUEST", "cpus"), Some("2"));
        assert_eq!(log.marker_field("PVRDMA-VMM-GUEST", "kernel"), Some("6.1"));
        assert_eq!(log.marker_field("PVRDMA-VMM-GUEST", "cpu"), None);
        assert_eq!(log.marker("ROOTDISK-OK"), Some("id-1 mode=ro"));
        assert_eq!(log.marker("GUEST-MARKER-DONE"), None);
        assert_eq!(log.tail(1), "ROOTDISK-OK id-1 mode=ro");
    }

    #[test]
    fn kernel_log_comes_from_the_guest_check() {
        let log = |text: &str| SerialLog {
            text: text.to_string(),
        };
        assert_eq!(log("GUEST-RUN-RC=0\nGUEST-POWEROFF").kernel_log(), None);
        assert_eq!(
            log("x\nGUEST-KERNEL-CHECK problems=0\n").kernel_log(),
            Some(vec![])
        );
        let bad = log(
            "GUEST-KERNEL-LOG [ 0.6] WARNING: CPU: 0 at x\nGUEST-KERNEL-LOG [ 0.6] Call Trace:\n\
             GUEST-KERNEL-CHECK problems=2\n",
        );
        assert_eq!(
            bad.kernel_log(),
            Some(vec!["[ 0.6] WARNING: CPU: 0 at x", "[ 0.6] Call Trace:"])
        );
    }

    #[test]
    fn a_crash_is_quoted_from_its_first_line() {
        let log = SerialLog {
            text: "GUEST-RUN-START\n[ 30.0] BUG: unable to handle page fault for address: 1fb80\n\
                   [ 30.0] #PF: supervisor read access in kernel mode\n[ 30.0] RIP: x\n"
                .to_string(),
        };
        assert_eq!(
            log.first_crash(1).as_deref(),
            Some(
                "[ 30.0] BUG: unable to handle page fault for address: 1fb80\n\
                 [ 30.0] #PF: supervisor read access in kernel mode"
            )
        );
        let clean = SerialLog {
            text: "[ 0.6] WARNING: CPU: 0 at x\n[ 9.1] traps: ib_send_bw[301] general protection \
                   fault ip:7f2d sp:7ffe error:0 in libc.so.6\nGUEST-POWEROFF\n"
                .to_string(),
        };
        assert_eq!(
            clean.first_crash(10),
            None,
            "a WARNING, or a user program's fault, is not a kernel crash"
        );
        let gp = SerialLog {
            text: "[ 5.0] general protection fault, probably for non-canonical address 0xdead: \
                   0000 [#1] PREEMPT SMP NOPTI\n"
                .to_string(),
        };
        assert!(gp.first_crash(0).is_some());
    }

    #[test]
    fn vmm_log_problems_are_warn_and_error_lines() {
        let path = std::env::temp_dir().join(format!("e2e-vmm-log-{}.log", std::process::id()));
        fs::write(
            &path,
            "[2026-11-22T16:59:20Z INFO ] vmxnet3: MAC x\n[2026-11-22T16:59:21Z WARN ] vmxnet3: bad\n\
             [2026-11-22T16:59:22Z ERROR] fatal\nWARN not a log line\n",
        )
        .unwrap();
        let got = vmm_log_problems(&path).unwrap();
        fs::remove_file(&path).unwrap();
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].ends_with("vmxnet3: bad") && got[1].ends_with("fatal"));
    }

    #[test]
    fn repeated_markers_and_fields() {
        let log = SerialLog {
            text: "NET-SENT round=1 secs=2.5\nx\n[ 9.1] NET-SENT round=2 secs=3.0\n".to_string(),
        };
        let rounds = log.markers("NET-SENT ");
        assert_eq!(rounds, ["round=1 secs=2.5", "round=2 secs=3.0"]);
        assert_eq!(field(rounds[1], "secs"), Some("3.0"));
        assert_eq!(field(rounds[1], "sec"), None);
    }

    #[test]
    fn sections_have_their_body_and_exit_status() {
        let log = SerialLog {
            text: "SECTION-BEGIN info\r\n\tmax_qp:\t\t1024\r\n\t\tstate:\t\tPORT_ACTIVE (4)\n\
                   SECTION-END info rc=0\nSECTION-BEGIN cut\nhalf\n"
                .to_string(),
        };
        let info = log.section("info").unwrap();
        assert_eq!(info.rc, Some(0));
        assert_eq!(info.colon_value("max_qp"), Some("1024"));
        assert_eq!(info.colon_value("state"), Some("PORT_ACTIVE (4)"));
        assert_eq!(info.colon_value("max_cq"), None);
        let cut = log.section("cut").unwrap();
        assert_eq!((cut.text.as_str(), cut.rc), ("half", None));
        assert!(log.section("missing").is_none());
    }
}
