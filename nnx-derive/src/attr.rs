//! Parsing of `#[nnx(...)]` attributes into plain data. This file checks the syntax of each key
//! and the form of its value; what the values mean together is checked in `check.rs`.

use std::fmt::Display;

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, quote};
use syn::meta::ParseNestedMeta;
use syn::parse::{Parse, ParseStream};
use syn::{Ident, LitInt, LitStr, Token};

use crate::ctxt::Ctxt;
use crate::symbol::{
    self, AXIS, CONTAINER_KEYS, CRATE, DTYPE, FIELD_KEYS, FROM, GGUF, INDEX, NNX, OFFSET, OPTIONAL, PARTS, RENAME,
    ROPE_PERMUTE, SKIP, SPLIT, SPLIT_KEYS, Symbol, TIE, TRANSPOSE,
};

/// The SafeTensors dtype spellings (matched case-insensitively) and the `DType` variant each one
/// names.
pub const DTYPES: &[(&str, &str)] = &[
    ("bool", "Bool"),
    ("f4", "F4"),
    ("f6_e2m3", "F6E2M3"),
    ("f6_e3m2", "F6E3M2"),
    ("u8", "U8"),
    ("i8", "I8"),
    ("f8_e5m2", "F8E5M2"),
    ("f8_e4m3", "F8E4M3"),
    ("f8_e8m0", "F8E8M0"),
    ("f8_e4m3fnuz", "F8E4M3Fnuz"),
    ("f8_e5m2fnuz", "F8E5M2Fnuz"),
    ("i16", "I16"),
    ("u16", "U16"),
    ("f16", "F16"),
    ("bf16", "BF16"),
    ("i32", "I32"),
    ("u32", "U32"),
    ("f32", "F32"),
    ("c64", "C64"),
    ("f64", "F64"),
    ("i64", "I64"),
    ("u64", "U64"),
];

/// The `DType` variant named by a SafeTensors dtype spelling, in any letter case.
pub fn parse_dtype(text: &str) -> Option<&'static str> {
    DTYPES.iter().find(|(spelling, _)| spelling.eq_ignore_ascii_case(text)).map(|(_, variant)| *variant)
}

/// One attribute's slot while parsing: empty until the attribute is read, and reporting a
/// second occurrence by itself, on that occurrence's tokens.
pub struct Attr<'c, T> {
    cx: &'c Ctxt,
    name: Symbol,
    /// What follows the name in a duplicate's message: where it is written and what to do.
    place: &'static str,
    value: Option<T>,
}

impl<'c, T> Attr<'c, T> {
    /// An empty slot for the attribute `name`; `place` completes a duplicate's message.
    pub fn none(cx: &'c Ctxt, name: Symbol, place: &'static str) -> Self {
        Attr { cx, name, place, value: None }
    }

    /// Fills the slot, or reports a duplicate on `tokens` when it is already filled.
    pub fn set<A: ToTokens>(&mut self, tokens: A, value: T) {
        if self.value.is_some() {
            let name = self.name;
            self.cx.error_spanned_by(tokens, format!("duplicate `{name}`{}", self.place));
        } else {
            self.value = Some(value);
        }
    }

    /// Fills the slot when there is a value.
    pub fn set_opt<A: ToTokens>(&mut self, tokens: A, value: Option<T>) {
        if let Some(value) = value {
            self.set(tokens, value);
        }
    }

    /// The value read, if any.
    pub fn get(self) -> Option<T> {
        self.value
    }
}

/// The slot of a key that takes no value, like `transpose`: it keeps the key for error spans.
pub struct BoolAttr<'c>(Attr<'c, Ident>);

impl<'c> BoolAttr<'c> {
    /// An empty slot for the flag `name`; `place` completes a duplicate's message.
    pub fn none(cx: &'c Ctxt, name: Symbol, place: &'static str) -> Self {
        BoolAttr(Attr::none(cx, name, place))
    }

    /// Records the flag as written by `key`, or reports a duplicate on `tokens`.
    pub fn set_true<A: ToTokens>(&mut self, tokens: A, key: Ident) {
        self.0.set(tokens, key);
    }

    /// The key, when the flag was written.
    pub fn get(self) -> Option<Ident> {
        self.0.get()
    }
}

/// A string-valued key as written: `rename = "seg"`.
#[derive(Clone)]
pub struct StrAttr {
    /// The key.
    pub key: Ident,
    /// The string literal.
    pub lit: LitStr,
}

impl StrAttr {
    /// The string's value.
    pub fn value(&self) -> String {
        self.lit.value()
    }
}

/// `dtype = "u32"` with the variant it names.
#[derive(Clone)]
pub struct DTypeAttr {
    /// The `dtype` key.
    pub key: Ident,
    /// The `DType` variant, e.g. `U32`.
    pub variant: &'static str,
}

/// One integer parameter of `split(...)` and the tokens it was written with.
#[derive(Clone)]
pub struct Param<T> {
    /// The value.
    pub value: T,
    /// The value's tokens (`-1` is two), for error spans.
    pub tokens: TokenStream,
}

/// `split(axis = -1, parts = 3, index = 0)`, complete and well-formed.
#[derive(Clone)]
pub struct SplitAttr {
    /// The `split` key.
    pub key: Ident,
    /// The axis cut; negative counts from the end.
    pub axis: Param<isize>,
    /// How many equal pieces the source holds.
    pub parts: Param<usize>,
    /// Which piece this field is.
    pub index: Param<usize>,
}

const ON_FIELD: &str = " on this field: write each attribute once";

/// Everything the `#[nnx(...)]` attributes of one field say. Each key holds its tokens so that
/// later checks can point at them.
#[derive(Default)]
pub struct Field {
    /// `skip`.
    pub skip: Option<Ident>,
    /// `rename = "seg"`.
    pub rename: Option<StrAttr>,
    /// `from = "a.b"`.
    pub from: Option<StrAttr>,
    /// `gguf = "attn_q"` (may be empty).
    pub gguf: Option<StrAttr>,
    /// `rope_permute = "head_count"`.
    pub rope_permute: Option<StrAttr>,
    /// `offset = 1.0`.
    pub offset: Option<FloatAttr>,
    /// `transpose`.
    pub transpose: Option<Ident>,
    /// `split(...)`; `None` also when it was written but malformed (already reported).
    pub split: Option<SplitAttr>,
    /// `tie = "x.y"`.
    pub tie: Option<StrAttr>,
    /// `optional`.
    pub optional: Option<Ident>,
    /// `dtype = "..."`; `None` also when the dtype was unknown (already reported).
    pub dtype: Option<DTypeAttr>,
}

impl Field {
    /// Parses every `#[nnx(...)]` attribute of a field, recording mistakes in `cx`.
    pub fn from_ast(cx: &Ctxt, attrs: &[syn::Attribute]) -> Field {
        let mut skip = BoolAttr::none(cx, SKIP, ON_FIELD);
        let mut rename = Attr::none(cx, RENAME, ON_FIELD);
        let mut from = Attr::none(cx, FROM, ON_FIELD);
        let mut gguf = Attr::none(cx, GGUF, ON_FIELD);
        let mut rope_permute = Attr::none(cx, ROPE_PERMUTE, ON_FIELD);
        let mut offset = Attr::none(cx, OFFSET, ON_FIELD);
        let mut transpose = BoolAttr::none(cx, TRANSPOSE, ON_FIELD);
        let mut split = Attr::none(cx, SPLIT, ON_FIELD);
        let mut tie = Attr::none(cx, TIE, ON_FIELD);
        let mut optional = BoolAttr::none(cx, OPTIONAL, ON_FIELD);
        let mut dtype = Attr::none(cx, DTYPE, ON_FIELD);
        for_each_key(cx, attrs, |meta| {
            let Some(key) = meta.path.get_ident().cloned() else {
                let path = &meta.path;
                return Err(reject(
                    meta.input,
                    path,
                    format!("expected one of the field attributes: {}", list(FIELD_KEYS)),
                ));
            };
            if key == CRATE {
                return Err(reject(
                    meta.input,
                    &key,
                    "`crate` is a container attribute: put `#[nnx(crate = \"...\")]` on the struct, not on a field",
                ));
            }
            let Some(symbol) = FIELD_KEYS.iter().copied().find(|symbol| key == *symbol) else {
                let name = key.to_string();
                return Err(reject(
                    meta.input,
                    &key,
                    format!(
                        "unknown attribute `{name}`{}; the field attributes are: {}",
                        symbol::did_you_mean(&name, FIELD_KEYS.iter().map(|symbol| symbol.0)),
                        list(FIELD_KEYS),
                    ),
                ));
            };
            let item = item_tokens(meta, &key);
            match symbol {
                SKIP => skip.set_true(item, flag(meta, &key)?),
                TRANSPOSE => transpose.set_true(item, flag(meta, &key)?),
                OPTIONAL => optional.set_true(item, flag(meta, &key)?),
                RENAME => rename.set(item, string(meta, &key, "rename = \"segment\"")?),
                FROM => from.set(item, string(meta, &key, "from = \"source.name\"")?),
                GGUF => gguf.set(item, string(meta, &key, "gguf = \"attn_q\"")?),
                ROPE_PERMUTE => rope_permute.set(item, string(meta, &key, "rope_permute = \"head_count\"")?),
                OFFSET => offset.set(item, float(meta, &key)?),
                TIE => tie.set(item, string(meta, &key, "tie = \"model.path\"")?),
                DTYPE => dtype.set_opt(item, parse_dtype_attr(cx, meta, &key)?),
                _ => split.set_opt(item, parse_split(cx, meta, &key)?),
            }
            Ok(())
        });
        Field {
            skip: skip.get(),
            rename: rename.get(),
            from: from.get(),
            gguf: gguf.get(),
            rope_permute: rope_permute.get(),
            offset: offset.get(),
            transpose: transpose.get(),
            split: split.get(),
            tie: tie.get(),
            optional: optional.get(),
            dtype: dtype.get(),
        }
    }

    /// Whether the field carries an import attribute, so that it must hold tensors.
    pub fn has_import_rule(&self) -> bool {
        self.from.is_some()
            || self.gguf.is_some()
            || self.rope_permute.is_some()
            || self.offset.is_some()
            || self.transpose.is_some()
            || self.split.is_some()
            || self.tie.is_some()
            || self.optional.is_some()
            || self.dtype.is_some()
    }

    /// The keys of every attribute read on the field besides `skip`, in grammar order.
    pub fn keys_besides_skip(&self) -> Vec<&Ident> {
        [
            self.rename.as_ref().map(|rename| &rename.key),
            self.from.as_ref().map(|from| &from.key),
            self.gguf.as_ref().map(|gguf| &gguf.key),
            self.transpose.as_ref(),
            self.split.as_ref().map(|split| &split.key),
            self.rope_permute.as_ref().map(|rope| &rope.key),
            self.offset.as_ref().map(|offset| &offset.key),
            self.tie.as_ref().map(|tie| &tie.key),
            self.optional.as_ref(),
            self.dtype.as_ref().map(|dtype| &dtype.key),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// What the `#[nnx(...)]` attributes on the struct itself say.
#[derive(Default)]
pub struct Container {
    /// `crate = "path"`: where the `nnx` crate is, when not at `::nnx`.
    pub crate_path: Option<syn::Path>,
}

impl Container {
    /// Parses the struct's `#[nnx(...)]` attributes, recording mistakes in `cx`.
    pub fn from_ast(cx: &Ctxt, attrs: &[syn::Attribute]) -> Container {
        let mut crate_path = Attr::none(cx, CRATE, ": write it once");
        for_each_key(cx, attrs, |meta| {
            let path = &meta.path;
            if *path == CRATE {
                let key = path.get_ident().cloned().unwrap_or_else(|| Ident::new("crate", Span::call_site()));
                let item = item_tokens(meta, &key);
                let lit = string(meta, &key, "crate = \"::nnx\"")?;
                let parsed = lit.lit.parse::<syn::Path>().map_err(|_| {
                    syn::Error::new_spanned(
                        &lit.lit,
                        "`crate` must be a path to the `nnx` crate, such as `::nnx` or `my::nnx`",
                    )
                })?;
                crate_path.set(item, parsed);
                return Ok(());
            }
            let name = path.get_ident().map(ToString::to_string).unwrap_or_default();
            if FIELD_KEYS.iter().any(|symbol| *path == *symbol) {
                return Err(reject(
                    meta.input,
                    path,
                    format!("`{name}` is a field attribute: put it on a field, not on the struct"),
                ));
            }
            let written = quote!(#path).to_string().replace(' ', "");
            Err(reject(
                meta.input,
                path,
                format!(
                    "unknown attribute `{written}`{}; the struct accepts only `crate = \"...\"`",
                    symbol::did_you_mean(&name, CONTAINER_KEYS.iter().map(|symbol| symbol.0)),
                ),
            ))
        });
        Container { crate_path: crate_path.get() }
    }
}

/// Calls `parse_key` on every key of every `#[nnx(...)]` attribute among `attrs`. A key it
/// rejects is recorded in `cx` and the rest of its item skipped, so that the next key is still
/// read; an `#[nnx]` or `#[nnx = ...]` is recorded as a mistake and left out.
fn for_each_key(
    cx: &Ctxt,
    attrs: &[syn::Attribute],
    mut parse_key: impl FnMut(&ParseNestedMeta<'_>) -> syn::Result<()>,
) {
    for attr in attrs.iter().filter(|attr| attr.path() == &NNX) {
        if !matches!(attr.meta, syn::Meta::List(_)) {
            cx.error_spanned_by(&attr.meta, "`nnx` takes its attributes in parentheses, such as `#[nnx(skip)]`");
            continue;
        }
        let result = attr.parse_nested_meta(|meta| {
            if let Err(error) = parse_key(&meta) {
                cx.syn_error(error);
                skip_item(meta.input);
            }
            Ok(())
        });
        if let Err(error) = result {
            cx.syn_error(error);
        }
    }
}

/// An error spanning `head` and the rest of its item, which is consumed so that parsing goes
/// on with the next item.
fn reject<H: ToTokens, M: Display>(input: ParseStream<'_>, head: H, message: M) -> syn::Error {
    let rest = skip_item(input);
    syn::Error::new_spanned(quote!(#head #rest), message)
}

/// The tokens of the item that starts with `key`, without consuming them: the span of a
/// duplicate.
fn item_tokens(meta: &ParseNestedMeta<'_>, key: &Ident) -> TokenStream {
    let rest = skip_item(&meta.input.fork());
    quote!(#key #rest)
}

/// `a`, `b` and `c` from a list of keys.
fn list(symbols: &[Symbol]) -> String {
    symbols.iter().map(|symbol| format!("`{symbol}`")).collect::<Vec<_>>().join(", ")
}

/// Consumes the rest of one item of an attribute list (up to, not including, the next top-level
/// comma) and returns its tokens.
fn skip_item(input: ParseStream<'_>) -> TokenStream {
    input
        .step(|cursor| {
            let mut rest = *cursor;
            let mut skipped = TokenStream::new();
            while let Some((tree, next)) = rest.token_tree() {
                if matches!(&tree, TokenTree::Punct(punct) if punct.as_char() == ',') {
                    break;
                }
                skipped.extend([tree]);
                rest = next;
            }
            Ok((skipped, rest))
        })
        .unwrap_or_default()
}

/// A key that takes no value, like `transpose`.
fn flag(meta: &ParseNestedMeta<'_>, key: &Ident) -> syn::Result<Ident> {
    if meta.input.is_empty() || meta.input.peek(Token![,]) {
        return Ok(key.clone());
    }
    Err(reject(meta.input, key, format!("`{key}` takes no value: write `#[nnx({key})]`")))
}

/// A key that takes a string: `key = "..."`.
fn string(meta: &ParseNestedMeta<'_>, key: &Ident, example: &str) -> syn::Result<StrAttr> {
    let expected = || format!("`{key}` takes a string: write `{example}`");
    if !meta.input.peek(Token![=]) {
        return Err(reject(meta.input, key, expected()));
    }
    let equals: Token![=] = meta.input.parse()?;
    let value = skip_item(meta.input);
    if value.is_empty() {
        return Err(syn::Error::new_spanned(quote!(#key #equals), expected()));
    }
    match syn::parse2::<LitStr>(value.clone()) {
        Ok(lit) => Ok(StrAttr { key: key.clone(), lit }),
        Err(_) => Err(syn::Error::new_spanned(value, expected())),
    }
}

/// A key that takes a finite number: `offset = 1.0` (an integer or a float, possibly negative).
fn float(meta: &ParseNestedMeta<'_>, key: &Ident) -> syn::Result<FloatAttr> {
    let expected = || format!("`{key}` takes a finite number: write `{key} = 1.0`");
    if !meta.input.peek(Token![=]) {
        return Err(reject(meta.input, key, expected()));
    }
    let equals: Token![=] = meta.input.parse()?;
    let tokens = skip_item(meta.input);
    if tokens.is_empty() {
        return Err(syn::Error::new_spanned(quote!(#key #equals), expected()));
    }
    let parse = |input: ParseStream<'_>| -> syn::Result<f32> {
        let negative = input.parse::<Option<Token![-]>>()?.is_some();
        let magnitude: f32 = if input.peek(syn::LitFloat) {
            input.parse::<syn::LitFloat>()?.base10_parse()?
        } else {
            input.parse::<LitInt>()?.base10_parse()?
        };
        Ok(if negative { -magnitude } else { magnitude })
    };
    match syn::parse::Parser::parse2(parse, tokens.clone()) {
        Ok(value) if value.is_finite() => Ok(FloatAttr { key: key.clone(), value, tokens }),
        Ok(_) => {
            let written = tokens.to_string().replace(' ', "");
            Err(syn::Error::new_spanned(
                tokens,
                format!("`{key} = {written}` does not fit in an `f32`: write a smaller number, such as `{key} = 1.0`"),
            ))
        }
        Err(_) if syn::parse2::<LitStr>(tokens.clone()).is_ok() => {
            Err(syn::Error::new_spanned(tokens, format!("`{key}` takes a number, not a string: write `{key} = 1.0`")))
        }
        Err(_) => Err(syn::Error::new_spanned(tokens, expected())),
    }
}

/// `dtype = "..."`: `None` when the dtype is unknown (recorded in `cx`).
fn parse_dtype_attr(cx: &Ctxt, meta: &ParseNestedMeta<'_>, key: &Ident) -> syn::Result<Option<DTypeAttr>> {
    let lit = string(meta, key, "dtype = \"f32\"")?;
    let text = lit.value();
    let variant = parse_dtype(&text);
    if variant.is_none() {
        cx.error_spanned_by(
            &lit.lit,
            format!(
                "unknown dtype `{text}`{}; expected one of: {}",
                symbol::did_you_mean(&text, DTYPES.iter().map(|(spelling, _)| *spelling)),
                DTYPES.iter().map(|(spelling, _)| *spelling).collect::<Vec<_>>().join(", "),
            ),
        );
    }
    Ok(variant.map(|variant| DTypeAttr { key: key.clone(), variant }))
}

/// `key = <number>` as written, with its value.
pub struct FloatAttr {
    /// The key.
    pub key: Ident,
    /// The value.
    pub value: f32,
    /// The value's tokens, for error spans.
    pub tokens: TokenStream,
}

/// One parameter of `split(...)` as written: `= <integer>`, possibly negative.
struct SplitParam {
    /// A leading `-`.
    negative: bool,
    /// The integer's magnitude.
    magnitude: LitInt,
    /// The value's tokens, for error spans.
    tokens: TokenStream,
}

impl Parse for SplitParam {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let tokens = input.fork().parse::<TokenStream>()?;
        let negative = input.parse::<Option<Token![-]>>()?.is_some();
        let magnitude = input.parse()?;
        Ok(SplitParam { negative, magnitude, tokens })
    }
}

/// Reads the value of the `split` parameter `key`: `= <integer>`.
fn split_param(meta: &ParseNestedMeta<'_>, key: &Ident) -> syn::Result<SplitParam> {
    let expected = || {
        if *key == AXIS {
            format!("`{key}` takes an integer, negative to count from the end: write `{key} = -1`")
        } else {
            format!("`{key}` takes an unsigned integer: write `{key} = 3`")
        }
    };
    if !meta.input.peek(Token![=]) {
        return Err(reject(meta.input, key, expected()));
    }
    let equals: Token![=] = meta.input.parse()?;
    let value = skip_item(meta.input);
    if value.is_empty() {
        return Err(syn::Error::new_spanned(quote!(#key #equals), expected()));
    }
    match syn::parse2::<SplitParam>(value.clone()) {
        Ok(param) if param.magnitude.suffix().is_empty() => Ok(param),
        _ => Err(syn::Error::new_spanned(value, expected())),
    }
}

/// `split(axis = .., parts = .., index = ..)`: `None` when malformed (the mistakes are recorded).
fn parse_split(cx: &Ctxt, meta: &ParseNestedMeta<'_>, key: &Ident) -> syn::Result<Option<SplitAttr>> {
    const EXAMPLE: &str = "split(axis = -1, parts = 3, index = 0)";
    const IN_SPLIT: &str = " in `split`: write each parameter once";
    if !meta.input.peek(syn::token::Paren) {
        return Err(reject(meta.input, key, format!("`split` takes three parameters: write `{EXAMPLE}`")));
    }
    let tokens = item_tokens(meta, key);
    let mut axis: Attr<'_, Param<isize>> = Attr::none(cx, AXIS, IN_SPLIT);
    let mut parts: Attr<'_, Param<usize>> = Attr::none(cx, PARTS, IN_SPLIT);
    let mut index: Attr<'_, Param<usize>> = Attr::none(cx, INDEX, IN_SPLIT);
    let mut complete = true;
    let result = meta.parse_nested_meta(|inner| {
        let outcome = (|| {
            let Some(name) = inner.path.get_ident().cloned() else {
                return Err(reject(
                    inner.input,
                    &inner.path,
                    format!("expected `axis`, `parts` or `index`: write `{EXAMPLE}`"),
                ));
            };
            let Some(symbol) = SPLIT_KEYS.iter().copied().find(|symbol| name == *symbol) else {
                let text = name.to_string();
                return Err(reject(
                    inner.input,
                    &name,
                    format!(
                        "unknown `split` parameter `{text}`{}; `split` takes `axis`, `parts` and `index`",
                        symbol::did_you_mean(&text, SPLIT_KEYS.iter().map(|symbol| symbol.0)),
                    ),
                ));
            };
            let item = item_tokens(&inner, &name);
            let param = split_param(&inner, &name)?;
            let out_of_range = || syn::Error::new_spanned(&param.tokens, format!("`{symbol}` is out of range"));
            if symbol == AXIS {
                let magnitude: isize = param.magnitude.base10_parse().map_err(|_| out_of_range())?;
                let value = if param.negative { -magnitude } else { magnitude };
                axis.set(item, Param { value, tokens: param.tokens });
                return Ok(());
            }
            if param.negative {
                return Err(syn::Error::new_spanned(
                    &param.tokens,
                    format!("`{symbol}` takes an unsigned integer: write `{symbol} = 3`"),
                ));
            }
            let value: usize = param.magnitude.base10_parse().map_err(|_| out_of_range())?;
            let slot = if symbol == PARTS { &mut parts } else { &mut index };
            slot.set(item, Param { value, tokens: param.tokens });
            Ok(())
        })();
        if let Err(error) = outcome {
            cx.syn_error(error);
            complete = false;
            skip_item(inner.input);
        }
        Ok(())
    });
    if let Err(error) = result {
        cx.syn_error(error);
        return Ok(None);
    }
    let (axis, parts, index) = (axis.get(), parts.get(), index.get());
    let missing: Vec<String> = [(AXIS, axis.is_none()), (PARTS, parts.is_none()), (INDEX, index.is_none())]
        .into_iter()
        .filter(|(_, missing)| *missing)
        .map(|(symbol, _)| format!("`{symbol}`"))
        .collect();
    if !missing.is_empty() && complete {
        cx.error_spanned_by(&tokens, format!("`split` is missing {}: write `{EXAMPLE}`", missing.join(" and ")));
    }
    match (axis, parts, index) {
        (Some(axis), Some(parts), Some(index)) => Ok(Some(SplitAttr { key: key.clone(), axis, parts, index })),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes_parse_in_any_case() {
        assert_eq!(parse_dtype("u32"), Some("U32"));
        assert_eq!(parse_dtype("BF16"), Some("BF16"));
        assert_eq!(parse_dtype("F8_E4M3"), Some("F8E4M3"));
        assert_eq!(parse_dtype("f8_e5m2fnuz"), Some("F8E5M2Fnuz"));
        assert_eq!(parse_dtype("Bool"), Some("Bool"));
        assert_eq!(parse_dtype("u33"), None);
        assert_eq!(parse_dtype("f8e4m3"), None);
        assert_eq!(parse_dtype(""), None);
    }

    #[test]
    fn every_dtype_is_listed_once() {
        for (at, (spelling, _)) in DTYPES.iter().enumerate() {
            assert!(DTYPES[at + 1..].iter().all(|(other, _)| other != spelling));
        }
        assert_eq!(DTYPES.len(), 22);
    }

    fn field(attrs: TokenStream) -> (Field, Vec<String>) {
        let input: syn::DeriveInput = syn::parse2(quote!(struct S { #attrs x: T })).unwrap();
        let syn::Data::Struct(data) = input.data else { unreachable!() };
        let cx = Ctxt::new();
        let field = Field::from_ast(&cx, &data.fields.iter().next().unwrap().attrs);
        let errors = match cx.check() {
            Ok(()) => Vec::new(),
            Err(error) => error.into_iter().map(|error| error.to_string()).collect(),
        };
        (field, errors)
    }

    #[test]
    fn crate_paths_parse() {
        for (written, expected) in [("crate", "crate"), ("::nnx", ":: nnx"), ("my::weights", "my :: weights")] {
            let input: syn::DeriveInput = syn::parse2(quote!(
                #[nnx(crate = #written)]
                struct S;
            ))
            .unwrap();
            let cx = Ctxt::new();
            let container = Container::from_ast(&cx, &input.attrs);
            assert!(cx.check().is_ok());
            let path = container.crate_path.unwrap();
            assert_eq!(quote!(#path).to_string(), expected);
        }
    }

    #[test]
    fn full_field_parses() {
        let (field, errors) = field(quote!(
            #[nnx(from = "c_attn", split(axis = -1, parts = 3, index = 2), transpose)]
            #[nnx(optional, dtype = "bf16", rename = "q")]
        ));
        assert!(errors.is_empty(), "{errors:?}");
        let split = field.split.unwrap();
        assert_eq!((split.axis.value, split.parts.value, split.index.value), (-1, 3, 2));
        assert_eq!(field.from.unwrap().value(), "c_attn");
        assert_eq!(field.rename.unwrap().value(), "q");
        assert_eq!(field.dtype.unwrap().variant, "BF16");
        assert!(field.transpose.is_some() && field.optional.is_some());
    }

    #[test]
    fn offsets_parse_as_integers_floats_and_negatives() {
        let cases = [
            (quote!(1), 1.0, "1"),
            (quote!(1.0), 1.0, "1.0"),
            (quote!(0.25), 0.25, "0.25"),
            (quote!(-0.5), -0.5, "- 0.5"),
            (quote!(-2), -2.0, "- 2"),
            (quote!(1e-3), 1e-3, "1e-3"),
        ];
        for (written, expected, tokens) in cases {
            let (field, errors) = field(quote!(#[nnx(offset = #written)]));
            assert!(errors.is_empty(), "{written}: {errors:?}");
            let offset = field.offset.unwrap();
            assert_eq!(offset.key, "offset");
            assert_eq!(offset.value.to_bits(), f32::to_bits(expected), "{written}");
            assert_eq!(offset.tokens.to_string(), tokens);
        }
    }

    #[test]
    fn offsets_that_are_not_finite_numbers_are_refused() {
        let expected = "`offset` takes a finite number: write `offset = 1.0`";
        let cases = [
            (quote!(offset), expected),
            (quote!(offset =), expected),
            (quote!(offset = x), expected),
            (quote!(offset = true), expected),
            (quote!(offset = "1"), "`offset` takes a number, not a string: write `offset = 1.0`"),
            (
                quote!(offset = -1e40),
                "`offset = -1e40` does not fit in an `f32`: write a smaller number, such as `offset = 1.0`",
            ),
        ];
        for (written, message) in cases {
            let (field, errors) = field(quote!(#[nnx(#written)]));
            assert!(field.offset.is_none(), "{written}");
            assert_eq!(errors, [message], "{written}");
        }
    }

    #[test]
    fn empty_gguf_parses() {
        let (field, errors) = field(quote!(#[nnx(from = "self_attn", gguf = "")]));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(field.gguf.unwrap().value(), "");
        assert_eq!(field.from.unwrap().value(), "self_attn");
    }

    #[test]
    fn gguf_attributes_parse_beside_the_others() {
        let (field, errors) = field(quote!(
            #[nnx(from = "q_proj", gguf = "attn_q", rope_permute = "head_count", offset = 1.0)]
        ));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(field.gguf.unwrap().value(), "attn_q");
        assert_eq!(field.rope_permute.unwrap().value(), "head_count");
        assert_eq!(field.offset.unwrap().value.to_bits(), 1.0f32.to_bits());
    }

    #[test]
    fn every_mistake_is_reported() {
        let (_, errors) = field(quote!(
            #[nnx(trnaspose, rename = 3, skip = true, split(axis = 1), dtype = "u33")]
            #[nnx(transpose, transpose)]
        ));
        assert_eq!(errors.len(), 6, "{errors:?}");
        assert!(errors[0].contains("did you mean `transpose`"));
        assert!(errors[1].contains("`rename` takes a string"));
        assert!(errors[2].contains("`skip` takes no value"));
        assert!(errors[3].contains("missing `parts` and `index`"));
        assert!(errors[4].contains("unknown dtype `u33`"));
        assert!(errors[5].contains("duplicate `transpose` on this field"));
    }
}
