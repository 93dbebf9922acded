//! A small option reader shared by the commands: `--name VALUE`,
//! `--name=VALUE`, flags, and positional arguments; `--` ends the options.

use crate::error::{CliError, Result};
use std::str::FromStr;

/// The arguments of one command, read front to back.
pub struct Args<'a> {
    rest: &'a [String],
    command: &'static str,
}

/// One item of the command line.
#[derive(Debug, PartialEq, Eq)]
pub enum Item<'a> {
    /// `--name` or `-n` (with `=VALUE` split off into [`Args::value`]).
    Opt(&'a str, Option<&'a str>),
    /// A positional argument.
    Positional(&'a str),
    /// `--`: everything after it is positional.
    EndOfOptions,
}

impl<'a> Args<'a> {
    /// Reads `args` (the command's own, without its name) for `command`.
    pub fn new(command: &'static str, args: &'a [String]) -> Self {
        Args { rest: args, command }
    }

    /// The next item, or `None` at the end.
    pub fn next_item(&mut self) -> Option<Item<'a>> {
        let (first, rest) = self.rest.split_first()?;
        self.rest = rest;
        let a = first.as_str();
        Some(if a == "--" {
            Item::EndOfOptions
        } else if a.starts_with('-') && a.len() > 1 {
            match a.split_once('=') {
                Some((name, v)) if name.starts_with("--") => Item::Opt(name, Some(v)),
                _ => Item::Opt(a, None),
            }
        } else {
            Item::Positional(a)
        })
    }

    /// What is left, unread.
    pub fn remaining(&mut self) -> &'a [String] {
        std::mem::take(&mut self.rest)
    }

    /// The value of option `name`: the `=VALUE` part, or the next argument.
    pub fn value(&mut self, name: &str, inline: Option<&'a str>) -> Result<&'a str> {
        if let Some(v) = inline {
            return Ok(v);
        }
        let (v, rest) = self
            .rest
            .split_first()
            .ok_or_else(|| self.usage(format!("{name} needs a value")))?;
        self.rest = rest;
        Ok(v)
    }

    /// The value of option `name`, parsed.
    pub fn parsed<T: FromStr>(&mut self, name: &str, inline: Option<&'a str>, what: &str) -> Result<T> {
        let v = self.value(name, inline)?;
        v.parse()
            .map_err(|_| self.usage(format!("{name}: `{v}` is not {what}")))
    }

    /// Takes `p` as the command's one file argument (`what` names it in
    /// the error for a second one).
    pub fn one_file(&self, file: &mut Option<std::path::PathBuf>, p: &str, what: &str) -> Result<()> {
        if file.is_some() {
            return Err(self.usage(format!("one {what} at a time (`{p}` is a second)")));
        }
        *file = Some(p.into());
        Ok(())
    }

    /// Takes everything after `--` as the one file argument.
    pub fn one_file_after_options(&mut self, file: &mut Option<std::path::PathBuf>, what: &str) -> Result<()> {
        for p in self.remaining() {
            self.one_file(file, p, what)?;
        }
        Ok(())
    }

    /// A usage error of this command.
    pub fn usage(&self, msg: impl std::fmt::Display) -> CliError {
        CliError::Usage(format!("fastinst {}: {msg}", self.command))
    }

    /// The error for an option this command does not know.
    pub fn unknown(&self, opt: &str) -> CliError {
        self.usage(format!("unknown option {opt} (try `fastinst {} --help`)", self.command))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_values_and_positionals() {
        let a = v(&["--tool", "off", "--out=/tmp/x", "-h", "prog", "--", "--not-an-option"]);
        let mut r = Args::new("run", &a);
        let Some(Item::Opt(n, i)) = r.next_item() else { panic!() };
        assert_eq!(r.value(n, i).unwrap(), "off");
        let Some(Item::Opt(n, i)) = r.next_item() else { panic!() };
        assert_eq!((n, r.value(n, i).unwrap()), ("--out", "/tmp/x"));
        assert_eq!(r.next_item(), Some(Item::Opt("-h", None)));
        assert_eq!(r.next_item(), Some(Item::Positional("prog")));
        assert_eq!(r.next_item(), Some(Item::EndOfOptions));
        assert_eq!(r.remaining(), &v(&["--not-an-option"])[..]);
        assert_eq!(r.next_item(), None);
    }

    #[test]
    fn missing_and_bad_values_are_usage_errors() {
        let a = v(&["--samples"]);
        let mut r = Args::new("run", &a);
        let Some(Item::Opt(n, i)) = r.next_item() else { panic!() };
        let e = r.value(n, i).unwrap_err().to_string();
        assert_eq!(e, "fastinst run: --samples needs a value");
        let a = v(&["--samples", "ten"]);
        let mut r = Args::new("run", &a);
        let Some(Item::Opt(n, i)) = r.next_item() else { panic!() };
        let e = r.parsed::<u32>(n, i, "a number").unwrap_err();
        assert_eq!(e.to_string(), "fastinst run: --samples: `ten` is not a number");
        assert_eq!(e.exit_code(), 2);
    }
}
