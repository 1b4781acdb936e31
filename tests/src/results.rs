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

    pub fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
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

    /// The rest of the first line carrying `marker` (after it, trimmed). Kernel messages may share
    /// a line with a marker on a serial console, so the marker need not start the line.
    pub fn marker(&self, marker: &str) -> Option<&str> {
        self.text
            .lines()
            .find_map(|l| l.split_once(marker).map(|(_, rest)| rest.trim()))
    }

    /// `key=value` from the first line carrying `marker`, e.g. `cpus` of `PVRDMA-VMM-GUEST cpus=2`.
    pub fn marker_field(&self, marker: &str, key: &str) -> Option<&str> {
        self.marker(marker)?
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
    }

    /// The last `count` lines, to quote in a failure message.
    pub fn tail(&self, count: usize) -> String {
        let lines: Vec<&str> = self.text.lines().collect();
        lines[lines.len().saturating_sub(count)..].join("\n")
    }
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
        let kv = KeyValues::parse(Path::new("x.env"), "rc=1\nname = boot\nrc=0\ngarbage\n");
        assert_eq!(kv.int("rc"), Ok(0));
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
}
