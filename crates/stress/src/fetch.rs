//! How executors fetch the site: from a warm cache, or with the line that
//! holds its back part flushed before every call.

use std::fmt;
use std::str::FromStr;

/// How an executor fetches the toggled instruction.
///
/// A protocol without its wait tears when an executor fetched the front
/// line in the old state and fetches the back line after the patcher wrote
/// it. From a warm cache both lines are fetched within a few cycles, so that
/// window is rarely hit: on a 2-vCPU VM the no-wait control tore once in
/// 10^7 to 10^9 toggles. Flushing the back line (`clflush`) before each call
/// makes its fetch a miss served from memory or from the patcher's cache, a
/// gap of hundreds of cycles, which is what a cold or contended line gives
/// real code. It is the adversarial case for every protocol, and the one in
/// which the negative control tears within a trial.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// Calls back to back, both lines cached.
    Warm,
    /// The back line flushed before every call.
    Cold,
}

impl Fetch {
    /// Both, in the order runs use them.
    pub const ALL: [Fetch; 2] = [Fetch::Warm, Fetch::Cold];

    /// Run by the executor before each call of the site whose last byte is
    /// at `last_byte`.
    #[inline(always)]
    pub(crate) fn prepare(self, last_byte: *const u8) {
        if self == Fetch::Cold {
            // SAFETY: clflush needs only a mapped address; `last_byte` is in
            // the fixture's code island, which outlives the executors.
            unsafe { core::arch::x86_64::_mm_clflush(last_byte) };
        }
    }
}

impl fmt::Display for Fetch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fetch::Warm => "warm",
            Fetch::Cold => "cold",
        })
    }
}

impl FromStr for Fetch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "warm" => Ok(Fetch::Warm),
            "cold" => Ok(Fetch::Cold),
            _ => Err(format!("unknown fetch `{s}` (warm, cold)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for f in Fetch::ALL {
            assert_eq!(f.to_string().parse::<Fetch>(), Ok(f));
        }
        assert!("hot".parse::<Fetch>().is_err());
    }
}
