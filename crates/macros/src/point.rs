//! `probe!("name")`: a 5-byte NOP at a point, and its record.
//!
//! The record, in the `fastinst_points` section, is two addresses: the
//! NOP's and its NUL-terminated name's (written as bytes, so any name needs
//! no escaping). The section is kept by the linker (`R`) even though no
//! code refers to it, and keeps the function it points into.
//!
//! The `asm!` block declares the C ABI's caller-saved registers clobbered
//! and leaves the stack usable (no `nostack`), which makes the point an
//! ordinary call site to the compiler: the runtime's call there needs no
//! register saving of its own beyond what its sled trampoline already does.

use proc_macro2::TokenStream;
use quote::quote;
use syn::LitStr;

/// The section the points are recorded in (read by the runtime: keep in
/// step with `providers::points::SECTION`).
pub(crate) const SECTION: &str = "fastinst_points";

pub(crate) fn expand(item: TokenStream) -> syn::Result<TokenStream> {
    let name: LitStr = syn::parse2(item)
        .map_err(|e| syn::Error::new(e.span(), "fastinst::probe! takes one string literal: its name"))?;
    let value = name.value();
    if value.is_empty() || value.contains('\0') {
        return Err(syn::Error::new_spanned(
            &name,
            "a probe's name is not empty and has no NUL",
        ));
    }
    let bytes: Vec<String> = value.bytes().chain([0]).map(|b| format!("{b:#04x}")).collect();
    let record = format!(
        "2:\n.byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n\
         .pushsection {SECTION},\"awR\",@progbits\n.p2align 3\n.quad 2b\n.quad 3f\n.popsection\n\
         .pushsection .rodata.{SECTION},\"aR\",@progbits\n3:\n.byte {}\n.popsection\n{}",
        bytes.join(", "),
        usdt(&value)
    );
    Ok(quote! {
        {
            // SAFETY: a NOP, and a record in sections of its own; the
            // block is declared to clobber what a C call may, so the
            // runtime may turn the NOP into one.
            #[allow(clippy::undocumented_unsafe_blocks)]
            unsafe {
                ::core::arch::asm!(#record, clobber_abi("C"));
            }
        }
    })
}

/// The USDT provider every point is listed under.
pub(crate) const USDT_PROVIDER: &str = "fastinst";

/// The point as a USDT probe (`sys/sdt.h`'s note, version 3), so that
/// `perf probe sdt_fastinst:NAME`, bpftrace's `usdt:` and SystemTap see it
/// too: a one-byte NOP of its own right after the point's NOP, never the
/// bytes fastinst toggles, so a uprobe's `int3` and fastinst's writes never
/// meet. The name is the point's, with every byte that is not a letter, a
/// digit or `_` as `_` (the tools' syntax); no arguments, no semaphore.
/// `_.stapsdt.base` is kept (`R`) and lies among the code (`x`): `perf`
/// turns a note's address into a file offset by the base's offset, which
/// is right only where the two share a segment (lld gives the read-only
/// and the code segments different offsets from their addresses).
fn usdt(name: &str) -> String {
    let ident: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .collect();
    format!(
        "990:\nnop\n\
         .pushsection .note.stapsdt,\"\",@note\n.balign 4\n.4byte 992f-991f, 994f-993f, 3\n\
         991:\n.asciz \"stapsdt\"\n992:\n.balign 4\n993:\n.8byte 990b\n.8byte _.stapsdt.base\n.8byte 0\n\
         .asciz \"{USDT_PROVIDER}\"\n.asciz \"{ident}\"\n.asciz \"\"\n994:\n.balign 4\n.popsection\n\
         .ifndef _.stapsdt.base\n\
         .pushsection .stapsdt.base,\"axGR\",@progbits,.stapsdt.base,comdat\n\
         .weak _.stapsdt.base\n.hidden _.stapsdt.base\n_.stapsdt.base:\n.space 1\n.size _.stapsdt.base, 1\n\
         .popsection\n.endif"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_is_written_as_bytes_after_the_record() {
        let s = expand(quote!("a\"b")).unwrap().to_string();
        assert!(s.contains(".quad 2b"), "{s}");
        assert!(s.contains(".byte 0x61, 0x22, 0x62, 0x00"), "{s}");
        assert!(s.contains("clobber_abi"), "{s}");
        // The USDT probe: its own NOP, the name made an identifier.
        assert!(s.contains("990:\\nnop"), "{s}");
        assert!(s.contains(".asciz \\\"a_b\\\""), "{s}");
    }

    #[test]
    fn a_name_is_one_non_empty_string() {
        for bad in [quote!(""), quote!(name), quote!("a", "b")] {
            assert!(expand(bad).is_err());
        }
    }
}
