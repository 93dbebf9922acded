//! Fixed-point decimals for the text report and the flame graph, written
//! through integers.
//!
//! The text report prints about ten numbers per function and two per edge
//! (~15,000 on SQLite) with `{:.N}`, and the flame graph three per frame;
//! `{:.N}` formats an `f64` exactly: Grisu, and where that gives up (most
//! values, at four places), Dragon4's big-integer arithmetic, ~250 ns a
//! number here. The same digits come from the value's own bits: an `f64`
//! is `m * 2^e` with `m < 2^53`, so `m * 10^N` fits a `u128` for the few
//! places these reports print, and one shift with the remainder rounds it
//! half to even exactly as `{:.N}` does, never from a rounded product.

use std::fmt;

/// The most places [`Fixed`] writes through integers (`10^6 * 2^53` still
/// leaves a `u128` room to shift).
const MAX_PLACES: u32 = 6;

/// `|x| * 10^places` rounded half to even, exactly; `None` where it is not
/// a finite number below 2^63 (or `places` is past [`MAX_PLACES`]).
fn scaled(x: f64, places: u32) -> Option<u64> {
    if places > MAX_PLACES || !x.is_finite() {
        return None;
    }
    let bits = x.abs().to_bits();
    let (biased, fraction) = ((bits >> 52) as i32, bits & ((1 << 52) - 1));
    // Subnormals have no hidden bit and the smallest exponent.
    let (m, e) = if biased == 0 {
        (fraction, -1074)
    } else {
        (fraction | (1 << 52), biased - 1075)
    };
    let n = m as u128 * 10u128.pow(places);
    let q = if e >= 0 {
        // An integer: exact if it fits.
        if e > 40 {
            return None;
        }
        n << e
    } else {
        let s = e.unsigned_abs();
        if s >= 127 {
            // `n < 2^73`, so the value is below 2^-54: rounds to 0.
            0
        } else {
            let (q, r, half) = (n >> s, n & ((1u128 << s) - 1), 1u128 << (s - 1));
            q + u128::from(r > half || (r == half && q & 1 == 1))
        }
    };
    u64::try_from(q).ok().filter(|&q| q < 1 << 63)
}

/// Writes `x` with `places` digits after the point into `out` as `{:.N}`
/// writes it (rounding half to even), through [`scaled`].
pub(crate) fn push_fixed(out: &mut String, x: f64, places: u32) {
    let mut buf = [0u8; 32];
    match digits(&mut buf, x, places) {
        Some(s) => out.push_str(s),
        None => {
            use fmt::Write as _;
            let _ = write!(out, "{x:.*}", places as usize);
        }
    }
}

/// `x`'s digits as [`push_fixed`] writes them, at the end of `buf`.
fn digits(buf: &mut [u8; 32], x: f64, places: u32) -> Option<&str> {
    let mut n = scaled(x, places)?;
    let mut at = buf.len();
    let mut written = 0;
    loop {
        if written == places && places > 0 {
            at -= 1;
            buf[at] = b'.';
        }
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        written += 1;
        if n == 0 && written > places {
            break;
        }
    }
    if x.is_sign_negative() {
        at -= 1;
        buf[at] = b'-';
    }
    Some(std::str::from_utf8(&buf[at..]).expect("digits, a point and a sign are ASCII"))
}

#[cfg(test)]
mod tests {
    use super::{push_fixed, MAX_PLACES};
    use testkit::Rng;

    #[test]
    fn writes_what_std_writes() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut values = vec![
            0.0,
            -0.0,
            0.5,
            1.5,
            2.5,
            0.125,
            0.375,
            1e-9,
            -1e-9,
            999.9995,
            0.00005,
            0.00015,
            1e14,
            1e16,
            1e19,
            9.3e18,
            f64::MIN_POSITIVE,
            5e-324,
            f64::MAX,
            f64::NAN,
        ];
        values.extend([f64::INFINITY, f64::NEG_INFINITY, -3.25, 12345.678]);
        // Exact ties at every place count, and their neighbours.
        for k in 0..2_000u32 {
            for places in 0..=MAX_PLACES {
                let tie = (2 * k + 1) as f64 / 2.0 / 10f64.powi(places as i32);
                values.extend([
                    tie,
                    f64::from_bits(tie.to_bits() + 1),
                    f64::from_bits(tie.to_bits() - 1),
                ]);
            }
            // Binary fractions, exact in an f64: halves at 2 and 4 places.
            values.push(k as f64 / 8.0 + 0.125);
            values.push(k as f64 / 32.0 + 0.03125 / 16.0);
        }
        for _ in 0..50_000 {
            let r = rng.next_u64();
            // Magnitudes from 1e-6 to 1e9 (a report's times and counts,
            // a flame graph's percentages), and both signs.
            let mag = 10f64.powi((r % 16) as i32 - 6);
            let x = rng.unit() * mag;
            values.push(if r & (1 << 40) != 0 { -x } else { x });
            // And any bits at all.
            values.push(f64::from_bits(rng.next_u64()));
        }
        for &x in &values {
            for places in [0u32, 1, 2, 3, 4, 6, 7] {
                let mut pushed = String::new();
                push_fixed(&mut pushed, x, places);
                assert_eq!(pushed, format!("{x:.*}", places as usize), "{x:e} to {places} places");
            }
        }
        // Exact halves round to even, as std's do.
        for (x, places, want) in [
            (1234.5, 0, "1234"),
            (2.5, 0, "2"),
            (0.125, 2, "0.12"),
            (0.375, 2, "0.38"),
            (0.004, 2, "0.00"),
        ] {
            let mut pushed = String::new();
            push_fixed(&mut pushed, x, places);
            assert_eq!(pushed, want);
            assert_eq!(format!("{x:.*}", places as usize), want);
        }
    }
}
