//! `#[instrument]`: a function split into the function callers see (always
//! inlined), a naked *sled function* (`nop5; jmp body`, recorded in
//! `__patchable_function_entries`) and the body.
//!
//! Why naked and `extern "C-unwind"`: the sled must be the first bytes of
//! a function that callers call, with the return address on top of the
//! stack, which only a naked function gives; stable Rust allows naked
//! functions only with an explicit ABI. The sled function and the body
//! share one signature and ABI, so the jump hands the body exactly the
//! registers and stack the caller set up, whatever the types; `C-unwind`
//! lets a panic unwind through. The caller-facing function keeps the
//! signature it had, so its callers, function pointers to it and its
//! documentation do not change.
//!
//! Two shapes, chosen from the tokens alone (a macro cannot see whether it
//! sits in an `impl` block):
//! - *nested*: the sled and body functions are nested in the caller-facing
//!   function, which works at module level and in an `impl` block alike,
//!   but a nested function cannot use `Self`;
//! - *associated*: for a method, or a function that names `Self`, they
//!   are emitted beside it as associated functions. Where `Self` can
//!   appear, the function is in an `impl` block.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{format_ident, quote};
use syn::punctuated::Punctuated;
use syn::visit_mut::VisitMut;
use syn::{FnArg, GenericParam, Ident, ItemFn, Pat, ReturnType, Signature, Token, Type};

/// The prefix of a sled function's name. The runtime drops it (and the
/// nesting it implies) when it names the function: keep the two in step
/// (`providers::elf::rust_sled_name`).
pub(crate) const SLED_PREFIX: &str = "__fastinst_sled_";
const BODY_PREFIX: &str = "__fastinst_body_";

/// The sled function's code: the NOP the runtime toggles, the jump to the
/// body, and the table entry, kept or dropped with the function by the
/// linker (`o`: linked to its section).
const SLED_ASM: &str = concat!(
    ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n",
    "jmp {body}\n",
    ".pushsection __patchable_function_entries,\"awo\",@progbits,{me}\n",
    ".p2align 3\n",
    ".quad {me}\n",
    ".popsection",
);

pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    if !attr.is_empty() {
        return Err(syn::Error::new_spanned(
            attr,
            "#[fastinst::instrument] takes no arguments",
        ));
    }
    let mut f: ItemFn = syn::parse2(item)?;
    refuse(&f.sig)?;
    lift_impl_trait_args(&mut f.sig);
    let associated = f.sig.receiver().is_some() || names_self(&f);
    let name = f.sig.ident.clone();
    let sled = format_ident!("{}{}", SLED_PREFIX, name);
    let body = format_ident!("{}{}", BODY_PREFIX, name);
    let turbofish = turbofish(&f.sig);

    // The caller-facing function: the user's attributes (but `inline`),
    // arguments it can name.
    let attrs: Vec<_> = f.attrs.iter().filter(|a| !a.path().is_ident("inline")).collect();
    let vis = &f.vis;
    let mut outer_sig = f.sig.clone();
    let mut args = Vec::new();
    let mut sled_inputs: Punctuated<FnArg, Token![,]> = Punctuated::new();
    for (k, input) in outer_sig.inputs.iter_mut().enumerate() {
        match input {
            FnArg::Receiver(r) => {
                sled_inputs.push(FnArg::Typed(syn::PatType {
                    attrs: Vec::new(),
                    pat: Box::new(syn::parse_quote!(__fastinst_this)),
                    colon_token: Default::default(),
                    ty: r.ty.clone(),
                }));
                if r.reference.is_none() {
                    r.mutability = None;
                }
                args.push(quote!(self));
            }
            FnArg::Typed(t) => {
                let arg = match &*t.pat {
                    Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => p.ident.clone(),
                    _ => format_ident!("__fastinst_arg{}", k),
                };
                *t.pat = syn::parse_quote!(#arg);
                t.attrs.clear();
                let ty = &t.ty;
                sled_inputs.push(syn::parse_quote!(#arg: #ty));
                args.push(quote!(#arg));
            }
        }
    }
    let mut sled_sig = f.sig.clone();
    sled_sig.ident = sled.clone();
    sled_sig.inputs = sled_inputs;
    sled_sig.abi = Some(syn::parse_quote!(extern "C-unwind"));
    let mut body_sig = f.sig.clone();
    body_sig.ident = body.clone();
    body_sig.abi = Some(syn::parse_quote!(extern "C-unwind"));
    let block = &f.block;
    let unsafety = f.sig.unsafety.is_some();
    let path = |id: &Ident| if associated { quote!(Self::#id) } else { quote!(#id) };
    let (sled_path, body_path) = (path(&sled), path(&body));
    let call = quote!(#sled_path::<#turbofish>(#(#args),*));
    // The generated call of an `unsafe` function's sled: the caller of the
    // user's function took on its contract, which the body needs and the
    // sled only forwards.
    // SAFETY: emitted tokens, not an unsafe operation here.
    let call = if unsafety { quote!(unsafe { #call }) } else { call };
    let allow = quote!(#[allow(improper_ctypes_definitions, clippy::too_many_arguments, non_snake_case)]);
    let sled_fn = quote! {
        #[doc(hidden)]
        #allow
        #[unsafe(naked)]
        #sled_sig {
            ::core::arch::naked_asm!(#SLED_ASM, body = sym #body_path::<#turbofish>, me = sym #sled_path::<#turbofish>)
        }
    };
    let body_fn = quote! {
        #[doc(hidden)]
        #allow
        #[inline(never)]
        #body_sig #block
    };
    Ok(if associated {
        quote! {
            #(#attrs)*
            #[inline(always)]
            #vis #outer_sig { #call }
            #sled_fn
            #body_fn
        }
    } else {
        quote! {
            #(#attrs)*
            #[inline(always)]
            #vis #outer_sig {
                #sled_fn
                #body_fn
                #call
            }
        }
    })
}

/// The forms a sled function cannot take, refused with the reason.
fn refuse(sig: &Signature) -> syn::Result<()> {
    let no = |tokens: &dyn quote::ToTokens, why: &str| {
        Err(syn::Error::new_spanned(
            tokens,
            format!("#[fastinst::instrument] cannot instrument {why}"),
        ))
    };
    if let Some(t) = &sig.asyncness {
        return no(t, "an async function (its body is a future; instrument what it calls)");
    }
    if let Some(t) = &sig.constness {
        return no(t, "a const function");
    }
    if let Some(t) = &sig.variadic {
        return no(t, "a C-variadic function");
    }
    if let Some(t) = &sig.abi {
        return no(t, "a function with an explicit ABI (the sled function needs its own)");
    }
    if let ReturnType::Type(_, ty) = &sig.output {
        if mentions_impl_trait(ty) {
            return no(
                ty,
                "a function returning `impl Trait` (the sled function must name its return type)",
            );
        }
    }
    Ok(())
}

fn mentions_impl_trait(ty: &Type) -> bool {
    struct Find(bool);
    impl syn::visit::Visit<'_> for Find {
        fn visit_type_impl_trait(&mut self, _: &syn::TypeImplTrait) {
            self.0 = true;
        }
    }
    let mut f = Find(false);
    syn::visit::visit_type(&mut f, ty);
    f.0
}

/// Turns each `impl Trait` argument type into a named type parameter, so
/// the sled and body functions can be named with every parameter given
/// (`sym body::<T>`, which `impl Trait` arguments forbid).
fn lift_impl_trait_args(sig: &mut Signature) {
    struct Lift {
        params: Vec<GenericParam>,
    }
    impl VisitMut for Lift {
        fn visit_type_mut(&mut self, ty: &mut Type) {
            syn::visit_mut::visit_type_mut(self, ty);
            if let Type::ImplTrait(it) = ty {
                let id = Ident::new(&format!("__FastinstImpl{}", self.params.len()), Span::call_site());
                let bounds = &it.bounds;
                self.params.push(syn::parse_quote!(#id: #bounds));
                *ty = syn::parse_quote!(#id);
            }
        }
    }
    let mut lift = Lift { params: Vec::new() };
    for input in sig.inputs.iter_mut() {
        if let FnArg::Typed(t) = input {
            lift.visit_type_mut(&mut t.ty);
        }
    }
    sig.generics.params.extend(lift.params);
}

/// The function's type and const parameters, for a turbofish.
fn turbofish(sig: &Signature) -> TokenStream {
    let ps = sig.generics.params.iter().filter_map(|p| match p {
        GenericParam::Type(t) => Some(t.ident.clone()),
        GenericParam::Const(c) => Some(c.ident.clone()),
        GenericParam::Lifetime(_) => None,
    });
    quote!(#(#ps),*)
}

/// Whether `Self` appears anywhere in the function: then it is in an
/// `impl` block, and nested functions could not use it.
fn names_self(f: &ItemFn) -> bool {
    fn walk(ts: TokenStream) -> bool {
        ts.into_iter().any(|t| match t {
            TokenTree::Ident(i) => i == "Self",
            TokenTree::Group(g) => walk(g.stream()),
            _ => false,
        })
    }
    walk(quote!(#f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expanded(item: TokenStream) -> String {
        expand(TokenStream::new(), item).unwrap().to_string()
    }

    #[test]
    fn a_free_function_nests_its_sled_and_body() {
        let s = expanded(quote!(
            pub fn add(a: u64, mut b: u64) -> u64 {
                b += a;
                b
            }
        ));
        assert!(s.contains("pub fn add (a : u64 , b : u64) -> u64"), "{s}");
        assert!(
            s.contains("extern \"C-unwind\" fn __fastinst_sled_add (a : u64 , b : u64)"),
            "{s}"
        );
        assert!(
            s.contains("extern \"C-unwind\" fn __fastinst_body_add (a : u64 , mut b : u64)"),
            "{s}"
        );
        assert!(s.contains("__fastinst_sled_add :: < > (a , b)"), "{s}");
        assert!(!s.contains("Self ::"), "{s}");
    }

    #[test]
    fn a_method_gets_associated_items_and_passes_self() {
        let s = expanded(quote!(
            fn get<T: Copy>(&self, i: usize) -> T {
                self.v[i]
            }
        ));
        assert!(s.contains("Self :: __fastinst_sled_get :: < T > (self , i)"), "{s}");
        assert!(
            s.contains("fn __fastinst_sled_get < T : Copy > (__fastinst_this : & Self , i : usize)"),
            "{s}"
        );
        assert!(
            s.contains("fn __fastinst_body_get < T : Copy > (& self , i : usize)"),
            "{s}"
        );
    }

    #[test]
    fn patterns_and_impl_trait_arguments_are_named() {
        let s = expanded(quote!(
            fn f((a, b): (u8, u8), x: impl Into<u64>) -> u64 {
                a as u64 + b as u64 + x.into()
            }
        ));
        assert!(
            s.contains("fn f < __FastinstImpl0 : Into < u64 > > (__fastinst_arg0 : (u8 , u8) , x : __FastinstImpl0)"),
            "{s}"
        );
        assert!(
            s.contains("__fastinst_sled_f :: < __FastinstImpl0 > (__fastinst_arg0 , x)"),
            "{s}"
        );
    }

    #[test]
    fn unsupported_forms_are_refused_with_the_reason() {
        for (item, why) in [
            (
                quote!(
                    async fn f() {}
                ),
                "async",
            ),
            (
                quote!(
                    const fn f() {}
                ),
                "const",
            ),
            (
                quote!(
                    extern "C" fn f() {}
                ),
                "explicit ABI",
            ),
            (
                quote!(
                    fn f() -> impl Iterator<Item = u8> {
                        None.into_iter()
                    }
                ),
                "impl Trait",
            ),
        ] {
            let e = expand(TokenStream::new(), item).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
        let e = expand(
            quote!(level = "debug"),
            quote!(
                fn f() {}
            ),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("no arguments"), "{e}");
    }
}
