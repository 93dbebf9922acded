//! The machine config that `calibrate` writes and wordpatch reads.
//!
//! A small TOML-compatible file of `key = value` lines (strings quoted,
//! numbers bare, `#` comments). Path, in order: env `FASTINST_CONFIG`;
//! `$XDG_CONFIG_HOME/fastinst/machine.toml` (or `~/.config/fastinst/machine.toml`)
//! if it exists; `/etc/fastinst/machine.toml`. Unknown keys are kept, so a
//! newer writer does not lose fields when an older reader rewrites the file.

use crate::wait::Wait;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Errors reading or parsing the machine config.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A line is not `key = value`, or a known key has a value of the wrong kind.
    #[error("{path}:{line}: {msg}")]
    Syntax {
        /// The file (empty when parsing a string).
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        msg: String,
    },
}

/// One machine's calibration result.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MachineConfig {
    /// Recommended T_max in TSC ticks (already including the safety margin).
    pub tmax_ticks: Option<u64>,
    /// Recommended default wait strategy: `"tmax"` or `"synccore"`.
    pub wait: Option<String>,
    /// Every other `key = value` pair, in file order, values as written.
    pub extra: Vec<(String, String)>,
}

impl MachineConfig {
    /// Parses the text of a config file.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let mut cfg = MachineConfig::default();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('[') {
                continue;
            }
            let err = |msg: &str| ConfigError::Syntax {
                path: PathBuf::new(),
                line: i + 1,
                msg: msg.to_string(),
            };
            let (k, v) = line.split_once('=').ok_or_else(|| err("expected `key = value`"))?;
            let (k, v) = (k.trim(), v.trim());
            match k {
                "tmax_ticks" => cfg.tmax_ticks = Some(v.parse().map_err(|_| err("tmax_ticks must be a whole number"))?),
                "wait" => {
                    let s = unquote(v).ok_or_else(|| err("wait must be a quoted string"))?;
                    if s.parse::<Wait>().is_err() && s != "tmax" {
                        return Err(err("wait must be \"tmax\" or \"synccore\""));
                    }
                    cfg.wait = Some(s);
                }
                _ => cfg.extra.push((k.to_string(), v.to_string())),
            }
        }
        Ok(cfg)
    }

    /// Renders the config as file text; [`parse`](Self::parse) reads it back equal.
    pub fn render(&self) -> String {
        let mut s = String::from("# fastinst machine config (written by `fastinst-calibrate`)\n");
        if let Some(t) = self.tmax_ticks {
            let _ = writeln!(s, "tmax_ticks = {t}");
        }
        if let Some(w) = &self.wait {
            let _ = writeln!(s, "wait = \"{w}\"");
        }
        for (k, v) in &self.extra {
            let _ = writeln!(s, "{k} = {v}");
        }
        s
    }

    /// Reads and parses a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            ConfigError::Syntax { line, msg, .. } => ConfigError::Syntax {
                path: path.to_path_buf(),
                line,
                msg,
            },
            other => other,
        })
    }

    /// The wait strategy this config recommends, if it names one.
    pub fn recommended_wait(&self) -> Option<Wait> {
        match self.wait.as_deref() {
            Some("synccore") => Some(Wait::SyncCore),
            _ => self.tmax_ticks.map(Wait::Tmax),
        }
    }
}

fn unquote(v: &str) -> Option<String> {
    v.strip_prefix('"')?.strip_suffix('"').map(str::to_string)
}

/// The config path wordpatch reads: `FASTINST_CONFIG` if set, else the first
/// existing of the per-user and the system path, else the per-user path (where
/// `calibrate` writes by default).
pub fn config_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FASTINST_CONFIG") {
        return PathBuf::from(p);
    }
    let user = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .map(|d| d.join("fastinst").join("machine.toml"));
    let system = PathBuf::from("/etc/fastinst/machine.toml");
    match user {
        Some(u) if u.exists() || !system.exists() => u,
        _ => system,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let cfg = MachineConfig {
            tmax_ticks: Some(2400),
            wait: Some("tmax".into()),
            extra: vec![
                ("cpu_model".into(), "\"AMD EPYC\"".into()),
                ("cores".into(), "2".into()),
            ],
        };
        let back = MachineConfig::parse(&cfg.render()).unwrap();
        assert_eq!(back, cfg);
        assert_eq!(back.recommended_wait(), Some(Wait::Tmax(2400)));
    }

    #[test]
    fn bad_lines_name_the_line() {
        let e = MachineConfig::parse("# c\ntmax_ticks = lots\n").unwrap_err();
        assert!(e.to_string().contains(":2:"), "{e}");
        assert!(MachineConfig::parse("wait = \"sometimes\"").is_err());
        assert!(MachineConfig::parse("just words").is_err());
    }

    #[test]
    fn synccore_recommendation() {
        let c = MachineConfig::parse("tmax_ticks = 900\nwait = \"synccore\"\n").unwrap();
        assert_eq!(c.recommended_wait(), Some(Wait::SyncCore));
    }
}
