//! The commands' option reader: the workspace's shared one
//! ([`fastinst_args`]), with errors that name the `fastinst` command.

use crate::error::{CliError, Result};
pub use fastinst_args::Item;
use fastinst_args::{ArgError, Argv};
use std::str::FromStr;

/// The arguments of one command, read front to back ([`fastinst_args`]),
/// with its errors naming the command.
pub struct Args<'a> {
    argv: Argv<'a>,
    command: &'static str,
}

impl<'a> Args<'a> {
    /// Reads `args` (the command's own, without its name) for `command`.
    pub fn new(command: &'static str, args: &'a [String]) -> Self {
        Args {
            argv: Argv::new(args),
            command,
        }
    }

    /// The next item, or `None` at the end.
    pub fn next_item(&mut self) -> Option<Item<'a>> {
        self.argv.next_item()
    }

    /// What is left, unread.
    pub fn remaining(&mut self) -> &'a [String] {
        self.argv.remaining()
    }

    /// The value of option `name`: the `=VALUE` part, or the next argument.
    pub fn value(&mut self, name: &str, inline: Option<&'a str>) -> Result<&'a str> {
        self.argv.value(name, inline).map_err(|e| self.arg_error(e))
    }

    /// The value of option `name`, parsed.
    pub fn parsed<T: FromStr>(&mut self, name: &str, inline: Option<&'a str>, what: &str) -> Result<T> {
        self.argv.parsed(name, inline, what).map_err(|e| self.arg_error(e))
    }

    fn arg_error(&self, e: ArgError) -> CliError {
        self.usage(e)
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
