//! `#[derive(Module)]` for nnx: the walk over a struct's tensors, with each field's path segment
//! and import rule recorded as static data, and a checked `#[nnx(...)]` attribute grammar.
//!
//! Use it through the `nnx` crate, which re-exports it: `use nnx::Module;` brings both the
//! trait and the derive.
//!
//! # What it generates
//!
//! For a struct (named fields, tuple or unit; with any generics), the derive implements
//! `Module`, whose two walks (shared and mutable) visit every field not marked `skip`, in
//! declaration order; the struct holds tensors when at least one field is walked. A field is
//! walked when its type is a `Module`: `Tensor`, another `#[derive(Module)]` type, an nnx layer,
//! or a `Vec`, array, `Option` or `Box` of those. Any other field needs `#[nnx(skip)]`; without
//! it the compiler points at the field with a message saying so. Type parameters used by walked
//! fields get a `Module` bound on the impl, so
//! `struct AdamState<M: Module> { mu: M, nu: M, step: Tensor }` works as written.
//!
//! A struct with a device parameter (`struct Mlp<D: Device = Host> { fc: Linear<D> }`) gets
//! `Module<D>` for every device instead, and `Place` with an inherent `place` that moves
//! `Mlp<Host>` onto a device (`mlp.place(&gpu)?`), cloning skipped fields.
//!
//! A tensor's name is its path: field names (or `rename`) joined by `.`; a tuple field is named
//! by its index.
//!
//! # Field attributes
//!
//! Several can be written in one `#[nnx(...)]` or spread over several.
//!
//! - `#[nnx(skip)]`: the field is not part of the state (configuration, caches) and is never
//!   walked. It cannot be combined with any other attribute.
//! - `#[nnx(rename = "seg")]`: the field's path segment everywhere, instead of its name. It must
//!   be non-empty and cannot contain `.`; two fields cannot end up with the same segment.
//! - `#[nnx(from = "a.b")]`: on import, the field's source name relative to its parent's source
//!   path (a dotted path, without empty segments).
//! - `#[nnx(gguf = "attn_q")]`: the field's source name when importing a GGUF file, which names
//!   tensors after llama.cpp (`blk.0.attn_q.weight`), not after transformers
//!   (`model.layers.0.self_attn.q_proj.weight`); `from` and `gguf` sit side by side, so one model
//!   reads both. It is a dotted path like `from`, or empty: with `gguf = ""` the field adds no
//!   segment and its tensors sit directly under the parent's GGUF path, as llama.cpp flattens
//!   `self_attn` and `mlp` into the layer.
//! - `#[nnx(transpose)]`: on import, the source stores the transpose (last two axes) of every
//!   rank-2+ tensor under this field.
//! - `#[nnx(split(axis = -1, parts = 3, index = 0))]`: on import, the field is piece `index` of
//!   `parts` equal pieces of the source along `axis` (negative counts from the end). It needs
//!   `from`; `parts` is at least 2 and `index` below it. Fields splitting the same source must
//!   agree on `parts` and `axis` and take different pieces.
//! - `#[nnx(rope_permute = "head_count")]`: on a GGUF import, the file stores the rows of every
//!   tensor under this field in llama.cpp's rotary order (its converter reorders the query and key
//!   projections of Llama-style models, head by head, from the rotate-half halves transformers
//!   uses into interleaved pairs), and the import undoes it. The value is the GGUF key
//!   `{arch}.attention.<key>` that counts the heads the rows are grouped by: `head_count` for the
//!   queries, `head_count_kv` for the keys (fewer, under grouped-query attention).
//! - `#[nnx(offset = 1.0)]`: on a transformers-named import, the source stores every value minus
//!   this constant and the import adds it back; Gemma stores its norm scales as `weight - 1`.
//!   The value is a number (integer or float, possibly negative) that fits in an `f32`, and not
//!   zero, which would change nothing. GGUF imports ignore it, since llama.cpp's converter has
//!   already added the constant. On a field whose dtype is not a float it is a problem in the
//!   import plan, not a compile error.
//! - `#[nnx(tie = "x.y")]`: on import, the field is the same tensor as the field at that model
//!   path (from the root of the import) and is not read from the file, so it cannot be combined
//!   with `from`, `gguf`, `split`, `transpose`, `rope_permute`, `offset` or `optional`.
//! - `#[nnx(optional)]`: on import, the source may lack the field; it then keeps its value.
//! - `#[nnx(dtype = "u32")]`: the dtype every tensor under the field must have, spelled as in
//!   SafeTensors, in any letter case: `bool`, `f4`, `f6_e2m3`, `f6_e3m2`, `u8`, `i8`, `f8_e5m2`,
//!   `f8_e4m3`, `f8_e8m0`, `f8_e4m3fnuz`, `f8_e5m2fnuz`, `i16`, `u16`, `f16`, `bf16`, `i32`, `u32`,
//!   `f32`, `c64`, `f64`, `i64`, `u64`.
//!
//! A field records both namings, and an import follows one (`Naming`, by default the file's):
//! a GGUF file takes `gguf` and `rope_permute`, any other file `from`, `transpose`, `split` and
//! `offset`; `tie`, `optional` and `dtype` hold in both. A field without `gguf` keeps its own
//! segment (or `rename`) in GGUF names, so only the fields whose names differ need one.
//!
//! The import attributes (`from`, `gguf`, `transpose`, `split`, `rope_permute`, `offset`, `tie`,
//! `optional`, `dtype`) need a field that can hold tensors (`Module::HOLDS_TENSORS`); on a
//! `usize`, or on a module whose fields are all skipped, the compiler says so at the field.
//!
//! # Container attributes
//!
//! - `#[nnx(crate = "path")]`: where the `nnx` crate is, when it is not reachable as `::nnx`
//!   (a renamed dependency, or a crate re-exporting it). The generated code names only
//!   `<path>::__private::...`.
//!
//! # Errors
//!
//! Every mistake in the attributes is reported in one compile, each on its own token: unknown
//! keys (with the likely intended one), duplicated keys, values of the wrong form, unknown
//! dtypes, malformed names, conflicting attributes, bad splits and name collisions. Enums and
//! unions are refused. Beside the errors the derive still implements the traits, so the mistake
//! is not followed by unrelated errors wherever the type is used.
//!
//! # Examples
//!
//! A GPT-2 style model, its attention fused in one source tensor:
//!
//! ```
//! use nnx::nn::{Embedding, Linear};
//! use nnx::{Module, Tensor};
//!
//! #[derive(Module)]
//! struct Attention {
//!     #[nnx(from = "c_attn", split(axis = -1, parts = 3, index = 0), transpose)]
//!     q: Linear,
//!     #[nnx(from = "c_attn", split(axis = -1, parts = 3, index = 1), transpose)]
//!     k: Linear,
//!     #[nnx(from = "c_attn", split(axis = -1, parts = 3, index = 2), transpose)]
//!     v: Linear,
//!     #[nnx(from = "c_proj", transpose)]
//!     out: Linear,
//!     #[nnx(skip)]
//!     heads: usize,
//! }
//!
//! #[derive(Module)]
//! struct Lm {
//!     wte: Embedding,
//!     #[nnx(rename = "h")]
//!     blocks: Vec<Attention>,
//!     #[nnx(tie = "wte")]
//!     head: Linear,
//!     #[nnx(optional, dtype = "bool")]
//!     mask: Option<Tensor>,
//! }
//! ```
//!
//! A Llama-style layer read from transformers checkpoints and from GGUF files alike: a
//! transformers import reads `self_attn.q_proj.weight`, a GGUF one `attn_q.weight` with its rows
//! put back in rotary order; Gemma-style norms add `offset` back on transformers imports only.
//!
//! ```
//! use nnx::nn::{Linear, RmsNorm};
//! use nnx::Module;
//!
//! #[derive(Module)]
//! struct Attention {
//!     #[nnx(from = "q_proj", gguf = "attn_q", rope_permute = "head_count")]
//!     q: Linear,
//!     #[nnx(from = "k_proj", gguf = "attn_k", rope_permute = "head_count_kv")]
//!     k: Linear,
//!     #[nnx(from = "v_proj", gguf = "attn_v")]
//!     v: Linear,
//!     #[nnx(from = "o_proj", gguf = "attn_output")]
//!     o: Linear,
//! }
//!
//! #[derive(Module)]
//! struct Layer {
//!     #[nnx(from = "input_layernorm", gguf = "attn_norm", offset = 1.0)]
//!     norm: RmsNorm,
//!     #[nnx(from = "self_attn", gguf = "")]
//!     attn: Attention,
//! }
//! ```

mod ast;
mod attr;
mod check;
mod ctxt;
mod expand;
mod fallback;
mod symbol;

use proc_macro::TokenStream;
use syn::parse_macro_input;

/// Derives `Module` for a struct (and `Place` when it has a device parameter); see the crate
/// documentation for the `#[nnx(...)]` attributes.
#[proc_macro_derive(Module, attributes(nnx))]
pub fn derive_module(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as syn::DeriveInput);
    expand::derive(&input).into()
}
