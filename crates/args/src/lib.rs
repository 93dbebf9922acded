//! The option reader every command of the workspace uses (`fastinst`,
//! `fastinst-stress`, `fastinst-calibrate`, the evaluation harnesses):
//! `--name VALUE` and `--name=VALUE`, flags, comma-separated lists and
//! positional arguments, with `--` ending the options. Each command
//! matches the names itself; this crate reads values and says what is
//! wrong with one in the same words everywhere.
//!
//! ```
//! use fastinst_args::{Argv, Item};
//!
//! let args: Vec<String> = ["--runs=3", "--forms", "call,jmp", "-q", "prog", "--", "-x"]
//!     .iter().map(|s| s.to_string()).collect();
//! let mut argv = Argv::new(&args);
//! let (mut runs, mut forms, mut quiet, mut rest) = (1u32, Vec::<String>::new(), false, Vec::new());
//! while let Some(item) = argv.next_item() {
//!     match item {
//!         Item::Opt("--runs", v) => runs = argv.parsed("--runs", v, "a count")?,
//!         Item::Opt("--forms", v) => forms = argv.list("--forms", v, "a form")?,
//!         Item::Opt("-q", _) => quiet = true,
//!         Item::Opt(other, _) => return Err(fastinst_args::ArgError::unknown(other)),
//!         Item::Positional(p) => rest.push(p.to_string()),
//!         Item::EndOfOptions => rest.extend(argv.remaining().iter().cloned()),
//!     }
//! }
//! assert_eq!((runs, forms, quiet, rest), (3, vec!["call".into(), "jmp".into()], true, vec!["prog".into(), "-x".into()]));
//! # Ok::<(), fastinst_args::ArgError>(())
//! ```

use std::str::FromStr;

/// What is wrong with a command line, in words for its user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgError(pub String);

impl ArgError {
    /// An option the command does not have.
    pub fn unknown(name: &str) -> ArgError {
        ArgError(format!("unknown option {name}"))
    }
}

impl std::fmt::Display for ArgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ArgError {}

impl From<ArgError> for String {
    fn from(e: ArgError) -> String {
        e.0
    }
}

/// One item of a command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Item<'a> {
    /// `--name` or `-n`, with the `VALUE` of `--name=VALUE` if given.
    Opt(&'a str, Option<&'a str>),
    /// A positional argument.
    Positional(&'a str),
    /// `--`: everything after it is positional ([`Argv::remaining`]).
    EndOfOptions,
}

/// A command's arguments (without its name), read front to back.
pub struct Argv<'a> {
    rest: &'a [String],
}

impl<'a> Argv<'a> {
    /// Reads `args`.
    pub fn new(args: &'a [String]) -> Self {
        Argv { rest: args }
    }

    /// The next item, or `None` at the end.
    pub fn next_item(&mut self) -> Option<Item<'a>> {
        let a = self.next_raw()?;
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

    /// The next argument as it is, or `None` at the end.
    pub fn next_raw(&mut self) -> Option<&'a str> {
        let (first, rest) = self.rest.split_first()?;
        self.rest = rest;
        Some(first)
    }

    /// What is left, unread.
    pub fn remaining(&mut self) -> &'a [String] {
        std::mem::take(&mut self.rest)
    }

    /// The value of option `name`: `inline` (the `=VALUE` part) if given,
    /// else the next argument.
    pub fn value(&mut self, name: &str, inline: Option<&'a str>) -> Result<&'a str, ArgError> {
        match inline {
            Some(v) => Ok(v),
            None => self.next_raw().ok_or_else(|| ArgError(format!("{name} needs a value"))),
        }
    }

    /// The value of option `name`, parsed; `what` names what it must be
    /// ("a count") in the error.
    pub fn parsed<T: FromStr>(&mut self, name: &str, inline: Option<&'a str>, what: &str) -> Result<T, ArgError> {
        let v = self.value(name, inline)?;
        v.trim()
            .parse()
            .map_err(|_| ArgError(format!("{name}: `{v}` is not {what}")))
    }

    /// The value of option `name`, a comma-separated list, each item
    /// parsed (empty items skipped).
    pub fn list<T: FromStr>(&mut self, name: &str, inline: Option<&'a str>, what: &str) -> Result<Vec<T>, ArgError> {
        let v = self.value(name, inline)?;
        split_list(v, |x| x.parse().map_err(|_| format!("{name}: `{x}` is not {what}"))).map_err(ArgError)
    }
}

/// The items of a comma-separated list, each read by `f` (empty items
/// skipped, spaces trimmed).
pub fn split_list<T>(s: &str, f: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    s.split(',').map(str::trim).filter(|x| !x.is_empty()).map(f).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_values_flags_and_positionals_are_told_apart() {
        let a = v(&["--n", "4", "--m=5", "-x", "p", "-", "--", "--n"]);
        let mut r = Argv::new(&a);
        assert_eq!(r.next_item(), Some(Item::Opt("--n", None)));
        assert_eq!(r.parsed::<u32>("--n", None, "a count"), Ok(4));
        assert_eq!(r.next_item(), Some(Item::Opt("--m", Some("5"))));
        assert_eq!(r.next_item(), Some(Item::Opt("-x", None)));
        assert_eq!(r.next_item(), Some(Item::Positional("p")));
        assert_eq!(r.next_item(), Some(Item::Positional("-")), "a lone dash is an argument");
        assert_eq!(r.next_item(), Some(Item::EndOfOptions));
        assert_eq!(r.remaining(), &v(&["--n"])[..]);
        assert_eq!(r.next_item(), None);
    }

    #[test]
    fn a_missing_or_bad_value_is_named_in_the_error() {
        let a = v(&["--runs"]);
        let mut r = Argv::new(&a);
        r.next_item();
        assert_eq!(r.value("--runs", None).unwrap_err().to_string(), "--runs needs a value");
        let a = v(&["x"]);
        let mut r = Argv::new(&a);
        assert_eq!(
            r.parsed::<u32>("--runs", None, "a count").unwrap_err().to_string(),
            "--runs: `x` is not a count"
        );
        let a = v(&["1,,2, 3,z"]);
        let mut r = Argv::new(&a);
        assert_eq!(
            r.list::<u32>("--w", None, "a count").unwrap_err().to_string(),
            "--w: `z` is not a count"
        );
        let a = v(&["1,,2, 3"]);
        assert_eq!(Argv::new(&a).list::<u32>("--w", None, "a count"), Ok(vec![1, 2, 3]));
        assert_eq!(ArgError::unknown("--bogus").to_string(), "unknown option --bogus");
    }
}
