//! Fixed-point decimals for the text report, written through integers.
//!
//! The text report prints about ten numbers per function and two per edge
//! (~15,000 on SQLite) with `{:.N}`, which formats an `f64` exactly: Grisu,
//! and where that gives up, Dragon4's big-integer arithmetic. That was most
//! of the time the text report took at the program's exit. Scaled and
//! rounded to an integer, the same digits are a few divisions.

use std::fmt;

/// `self.0` with `self.1` digits after the point, as `{:.N}` writes it
/// (rounding half to even). Widths and alignment apply (`{:>10}`); a
/// precision does not (the digits are `self.1`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fixed(pub f64, pub u32);

impl fmt::Display for Fixed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Fixed(x, places) = *self;
        let scaled = (x * 10f64.powi(places as i32)).abs().round_ties_even();
        // Past 10^15 an f64 no longer holds every integer's neighbours
        // apart from it, and NaN and infinities are not numbers to scale.
        if !scaled.is_finite() || scaled >= 1e15 {
            return f.pad(&format!("{x:.*}", places as usize));
        }
        let mut n = scaled as u64;
        let mut buf = [0u8; 24];
        let mut at = buf.len();
        let mut digits = 0;
        loop {
            if digits == places && places > 0 {
                at -= 1;
                buf[at] = b'.';
            }
            at -= 1;
            buf[at] = b'0' + (n % 10) as u8;
            n /= 10;
            digits += 1;
            if n == 0 && digits > places {
                break;
            }
        }
        if x.is_sign_negative() {
            at -= 1;
            buf[at] = b'-';
        }
        f.pad(std::str::from_utf8(&buf[at..]).expect("digits, a point and a sign are ASCII"))
    }
}

#[cfg(test)]
mod tests {
    use super::Fixed;
    use crate::profile::test_rng::Rng;

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
            1e14,
            1e16,
            f64::NAN,
        ];
        values.extend([f64::INFINITY, f64::NEG_INFINITY, -3.25, 12345.678]);
        for _ in 0..200_000 {
            let r = rng.next_u64();
            // Magnitudes from 1e-6 to 1e9 (a report's times and counts),
            // and both signs.
            let mag = 10f64.powi((r % 16) as i32 - 6);
            let x = rng.unit() * mag;
            values.push(if r & (1 << 40) != 0 { -x } else { x });
        }
        let mut near_ties = 0;
        for &x in &values {
            for places in [0u32, 2, 3] {
                let ours = format!("{:>12}", Fixed(x, places));
                let std = format!("{x:>12.*}", places as usize);
                if ours == std {
                    continue;
                }
                // The scaling multiply rounds: a value within an ulp or so
                // of a half may round the other way. Nothing else differs.
                let scaled = (x * 10f64.powi(places as i32)).abs();
                let off_half = (scaled - scaled.floor() - 0.5).abs();
                assert!(
                    off_half <= scaled * 1e-15,
                    "{x} to {places} places: {ours:?}, std {std:?}"
                );
                near_ties += 1;
            }
        }
        assert!(
            near_ties * 10_000 < values.len(),
            "{near_ties} near-ties in {}",
            values.len()
        );
        assert_eq!(format!("{:<7}|", Fixed(1.5, 2)), "1.50   |");
        assert_eq!(format!("{}", Fixed(0.004, 2)), "0.00");
        // Exact halves round to even, as std's do.
        for (x, places, want) in [
            (1234.5, 0, "1234"),
            (2.5, 0, "2"),
            (0.125, 2, "0.12"),
            (0.375, 2, "0.38"),
        ] {
            assert_eq!(Fixed(x, places).to_string(), want);
            assert_eq!(format!("{x:.*}", places as usize), want);
        }
    }
}
