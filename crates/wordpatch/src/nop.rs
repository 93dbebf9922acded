//! The NOP of each length, one instruction each: what a switched-off site
//! or a placeholder becomes, the same bytes everywhere in the workspace.

/// The recommended multi-byte NOPs (Intel SDM, `NOP` instruction), by
/// length 1 to 8.
const NOPS: [&[u8]; 8] = [
    &[0x90],
    &[0x66, 0x90],
    &[0x0F, 0x1F, 0x00],
    &[0x0F, 0x1F, 0x40, 0x00],
    &[0x0F, 0x1F, 0x44, 0x00, 0x00],
    &[0x66, 0x0F, 0x1F, 0x44, 0x00, 0x00],
    &[0x0F, 0x1F, 0x80, 0x00, 0x00, 0x00, 0x00],
    &[0x0F, 0x1F, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00],
];

/// The 5-byte NOP (`nopl 0x0(%rax,%rax,1)`): a switched-off `call rel32`.
pub const NOP5: [u8; 5] = [0x0F, 0x1F, 0x44, 0x00, 0x00];

/// The single-instruction NOP of `len` bytes (1 to 8).
///
/// ```
/// assert_eq!(wordpatch::nop(5), &wordpatch::NOP5);
/// assert_eq!(wordpatch::nop(6), &[0x66, 0x0F, 0x1F, 0x44, 0x00, 0x00]);
/// ```
///
/// # Panics
/// If `len` is 0 or more than 8.
pub fn nop(len: usize) -> &'static [u8] {
    assert!((1..=8).contains(&len), "no NOP of {len} bytes");
    NOPS[len - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_nop_has_its_length_and_the_five_byte_one_is_nop5() {
        for len in 1..=8 {
            assert_eq!(nop(len).len(), len);
        }
        assert_eq!(nop(5), &NOP5);
    }
}
