// The crate's documentation, the attribute reference, is also the derive's own page
// (`nnx::Module`), where users of `nnx` read it: one text, in `reference.md`.
#![doc = include_str!("reference.md")]

mod ast;
mod attr;
mod check;
mod ctxt;
mod expand;
mod fallback;
mod symbol;

use proc_macro::TokenStream;
use syn::parse_macro_input;

#[doc = include_str!("reference.md")]
#[proc_macro_derive(Module, attributes(nnx))]
pub fn derive_module(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as syn::DeriveInput);
    expand::derive(&input).into()
}
