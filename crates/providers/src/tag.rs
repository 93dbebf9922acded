//! Tagged probe ids: values of `this_fn` that can never be a code address.
//!
//! Two encodings, one per instruction form the rewrite can produce:
//! - *sign*: `0xFFFF_FFFF_8000_0000 | id`, what a sign-extended imm32 (`mov
//!   r64, simm32`) or an imm64 can load. Negative as `i64`: a kernel-half
//!   address, which user code never has. Ids below 2^31.
//! - *low*: `id + 1`, what a zero-extending `mov r32, imm32` can load.
//!   Sound only below the lowest mappable address (`vm.mmap_min_addr`, 64 KiB
//!   by default), which the runtime reads and passes as `low_limit`; below
//!   it no code can exist.

/// Largest id the sign encoding holds.
pub const MAX_SIGN_ID: u32 = 0x7FFF_FFFF;

/// The sign encoding of `id` (`id <= MAX_SIGN_ID`).
pub const fn sign(id: u32) -> u64 {
    0xFFFF_FFFF_8000_0000 | (id & MAX_SIGN_ID) as u64
}

/// The low encoding of `id`, or `None` if it does not fit under `low_limit`.
pub const fn low(id: u32, low_limit: u64) -> Option<u64> {
    let v = id as u64 + 1;
    if v < low_limit {
        Some(v)
    } else {
        None
    }
}

/// The id a tagged `this_fn` carries, or `None` for an ordinary address.
#[inline(always)]
pub const fn decode(v: u64, low_limit: u64) -> Option<u32> {
    if (v as i64) < 0 {
        Some((v & MAX_SIGN_ID as u64) as u32)
    } else if v != 0 && v < low_limit {
        Some((v - 1) as u32)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_addresses_are_not_tags() {
        for id in [0, 1, 4095, 65534, MAX_SIGN_ID] {
            assert_eq!(decode(sign(id), 65536), Some(id));
        }
        assert_eq!(decode(low(0, 65536).unwrap(), 65536), Some(0));
        assert_eq!(decode(low(65534, 65536).unwrap(), 65536), Some(65534));
        assert_eq!(low(65535, 65536), None);
        for addr in [0x401000u64, 0x5555_5555_4000, 0x7fff_ffff_f000, 65536] {
            assert_eq!(decode(addr, 65536), None);
        }
        assert_eq!(decode(0, 65536), None);
        // With no safe low range, only the sign form decodes.
        assert_eq!(decode(5, 0), None);
    }
}
