//! Parsing of `#[nnx(...)]` attributes into plain data. This file checks the syntax of each key
//! and the form of its value; what the values mean together is checked in `check.rs`.

use proc_macro2::{TokenStream, TokenTree};
use quote::quote;
use syn::meta::ParseNestedMeta;
use syn::parse::{Parse, ParseStream};
use syn::{Ident, LitInt, LitStr, Token};

use crate::ctxt::Ctxt;
use crate::symbol::{
    self, AXIS, CONTAINER_KEYS, CRATE, DTYPE, FIELD_KEYS, FROM, INDEX, NNX, OPTIONAL, PARTS, RENAME, SKIP, SPLIT_KEYS,
    Symbol, TIE, TRANSPOSE,
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
    /// Every key written on the field, valid or not, in order: duplicate detection and
    /// "anything besides `skip`".
    pub written: Vec<Ident>,
}

impl Field {
    /// Parses every `#[nnx(...)]` attribute of a field, recording mistakes in `cx`.
    pub fn from_ast(cx: &mut Ctxt, attrs: &[syn::Attribute]) -> Field {
        let mut field = Field::default();
        for attr in nnx_lists(cx, attrs) {
            let result = attr.parse_nested_meta(|meta| {
                if let Err(error) = field.parse_key(cx, &meta) {
                    cx.syn_error(error);
                    skip_item(meta.input);
                }
                Ok(())
            });
            if let Err(error) = result {
                cx.syn_error(error);
            }
        }
        field
    }

    /// Whether the field carries an import attribute, so that it must hold tensors.
    pub fn has_import_rule(&self) -> bool {
        self.from.is_some()
            || self.transpose.is_some()
            || self.split.is_some()
            || self.tie.is_some()
            || self.optional.is_some()
            || self.dtype.is_some()
    }

    fn parse_key(&mut self, cx: &mut Ctxt, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
        let Some(key) = meta.path.get_ident().cloned() else {
            let rest = skip_item(meta.input);
            let path = &meta.path;
            return Err(syn::Error::new_spanned(
                quote!(#path #rest),
                format!("expected one of the field attributes: {}", list(FIELD_KEYS)),
            ));
        };
        if key == CRATE {
            let rest = skip_item(meta.input);
            return Err(syn::Error::new_spanned(
                quote!(#key #rest),
                "`crate` is a container attribute: put `#[nnx(crate = \"...\")]` on the struct, not on a field",
            ));
        }
        let Some(symbol) = FIELD_KEYS.iter().copied().find(|symbol| key == *symbol) else {
            let rest = skip_item(meta.input);
            let name = key.to_string();
            return Err(syn::Error::new_spanned(
                quote!(#key #rest),
                format!(
                    "unknown attribute `{name}`{}; the field attributes are: {}",
                    symbol::did_you_mean(&name, FIELD_KEYS.iter().map(|symbol| symbol.0)),
                    list(FIELD_KEYS),
                ),
            ));
        };
        if self.written.iter().any(|written| *written == symbol) {
            let rest = skip_item(meta.input);
            return Err(syn::Error::new_spanned(
                quote!(#key #rest),
                format!("duplicate `{symbol}` on this field: write each attribute once"),
            ));
        }
        self.written.push(key.clone());
        match symbol {
            SKIP => self.skip = Some(flag(meta, &key)?),
            TRANSPOSE => self.transpose = Some(flag(meta, &key)?),
            OPTIONAL => self.optional = Some(flag(meta, &key)?),
            RENAME => self.rename = Some(string(meta, &key, "rename = \"segment\"")?),
            FROM => self.from = Some(string(meta, &key, "from = \"source.name\"")?),
            TIE => self.tie = Some(string(meta, &key, "tie = \"model.path\"")?),
            DTYPE => {
                let lit = string(meta, &key, "dtype = \"f32\"")?;
                let text = lit.value();
                match parse_dtype(&text) {
                    Some(variant) => self.dtype = Some(DTypeAttr { variant }),
                    None => cx.error_spanned_by(
                        &lit.lit,
                        format!(
                            "unknown dtype `{text}`{}; expected one of: {}",
                            symbol::did_you_mean(&text, DTYPES.iter().map(|(spelling, _)| *spelling)),
                            DTYPES.iter().map(|(spelling, _)| *spelling).collect::<Vec<_>>().join(", "),
                        ),
                    ),
                }
            }
            _ => self.split = split(cx, meta, &key)?,
        }
        Ok(())
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
    pub fn from_ast(cx: &mut Ctxt, attrs: &[syn::Attribute]) -> Container {
        let mut container = Container::default();
        let mut seen_crate = false;
        for attr in nnx_lists(cx, attrs) {
            let result = attr.parse_nested_meta(|meta| {
                if let Err(error) = container.parse_key(&meta, &mut seen_crate) {
                    cx.syn_error(error);
                    skip_item(meta.input);
                }
                Ok(())
            });
            if let Err(error) = result {
                cx.syn_error(error);
            }
        }
        container
    }

    fn parse_key(&mut self, meta: &ParseNestedMeta<'_>, seen_crate: &mut bool) -> syn::Result<()> {
        let path = &meta.path;
        if *path == CRATE {
            let key = path.get_ident().cloned().unwrap_or_else(|| Ident::new("crate", proc_macro2::Span::call_site()));
            if *seen_crate {
                let rest = skip_item(meta.input);
                return Err(syn::Error::new_spanned(quote!(#key #rest), "duplicate `crate`: write it once"));
            }
            *seen_crate = true;
            let lit = string(meta, &key, "crate = \"::nnx\"")?;
            let parsed = lit.lit.parse::<syn::Path>().map_err(|_| {
                syn::Error::new_spanned(
                    &lit.lit,
                    "`crate` must be a path to the `nnx` crate, such as `::nnx` or `my::nnx`",
                )
            })?;
            self.crate_path = Some(parsed);
            return Ok(());
        }
        let rest = skip_item(meta.input);
        let name = path.get_ident().map(ToString::to_string).unwrap_or_default();
        if FIELD_KEYS.iter().any(|symbol| *path == *symbol) {
            return Err(syn::Error::new_spanned(
                quote!(#path #rest),
                format!("`{name}` is a field attribute: put it on a field, not on the struct"),
            ));
        }
        Err(syn::Error::new_spanned(
            quote!(#path #rest),
            format!(
                "unknown attribute `{}`{}; the struct accepts only `crate = \"...\"`",
                quote!(#path).to_string().replace(' ', ""),
                symbol::did_you_mean(&name, CONTAINER_KEYS.iter().map(|symbol| symbol.0)),
            ),
        ))
    }
}

/// The `#[nnx(...)]` attributes among `attrs`; an `#[nnx]` or `#[nnx = ...]` is recorded as a
/// mistake and left out.
fn nnx_lists<'a>(cx: &mut Ctxt, attrs: &'a [syn::Attribute]) -> Vec<&'a syn::Attribute> {
    let mut lists = Vec::new();
    for attr in attrs.iter().filter(|attr| attr.path() == &NNX) {
        match &attr.meta {
            syn::Meta::List(_) => lists.push(attr),
            meta => cx.error_spanned_by(meta, "`nnx` takes its attributes in parentheses, such as `#[nnx(skip)]`"),
        }
    }
    lists
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
    let rest = skip_item(meta.input);
    Err(syn::Error::new_spanned(quote!(#key #rest), format!("`{key}` takes no value: write `#[nnx({key})]`")))
}

/// A key that takes a string: `key = "..."`.
fn string(meta: &ParseNestedMeta<'_>, key: &Ident, example: &str) -> syn::Result<StrAttr> {
    let expected = || format!("`{key}` takes a string: write `{example}`");
    if !meta.input.peek(Token![=]) {
        let rest = skip_item(meta.input);
        return Err(syn::Error::new_spanned(quote!(#key #rest), expected()));
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

/// An integer literal, possibly negative.
struct Integer {
    negative: bool,
    lit: LitInt,
}

impl Parse for Integer {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let negative = input.parse::<Option<Token![-]>>()?.is_some();
        let lit = input.parse()?;
        Ok(Integer { negative, lit })
    }
}

/// The value of one `split` parameter: `= <integer>`.
fn integer(meta: &ParseNestedMeta<'_>, key: &Ident) -> syn::Result<(Integer, TokenStream)> {
    let expected = || {
        if *key == AXIS {
            format!("`{key}` takes an integer, negative to count from the end: write `{key} = -1`")
        } else {
            format!("`{key}` takes an unsigned integer: write `{key} = 3`")
        }
    };
    if !meta.input.peek(Token![=]) {
        let rest = skip_item(meta.input);
        return Err(syn::Error::new_spanned(quote!(#key #rest), expected()));
    }
    let equals: Token![=] = meta.input.parse()?;
    let value = skip_item(meta.input);
    if value.is_empty() {
        return Err(syn::Error::new_spanned(quote!(#key #equals), expected()));
    }
    match syn::parse2::<Integer>(value.clone()) {
        Ok(integer) if integer.lit.suffix().is_empty() => Ok((integer, value)),
        _ => Err(syn::Error::new_spanned(value, expected())),
    }
}

/// `split(axis = .., parts = .., index = ..)`: `None` when malformed (the mistakes are recorded).
fn split(cx: &mut Ctxt, meta: &ParseNestedMeta<'_>, key: &Ident) -> syn::Result<Option<SplitAttr>> {
    const EXAMPLE: &str = "split(axis = -1, parts = 3, index = 0)";
    let written = skip_item(&meta.input.fork());
    if !meta.input.peek(syn::token::Paren) {
        let rest = skip_item(meta.input);
        return Err(syn::Error::new_spanned(
            quote!(#key #rest),
            format!("`split` takes three parameters: write `{EXAMPLE}`"),
        ));
    }
    let tokens = quote!(#key #written);
    let mut axis: Option<Param<isize>> = None;
    let mut parts: Option<Param<usize>> = None;
    let mut index: Option<Param<usize>> = None;
    let mut complete = true;
    let result = meta.parse_nested_meta(|inner| {
        let outcome = (|| {
            let Some(name) = inner.path.get_ident().cloned() else {
                let path = &inner.path;
                let rest = skip_item(inner.input);
                return Err(syn::Error::new_spanned(
                    quote!(#path #rest),
                    format!("expected `axis`, `parts` or `index`: write `{EXAMPLE}`"),
                ));
            };
            let Some(symbol) = SPLIT_KEYS.iter().copied().find(|symbol| name == *symbol) else {
                let rest = skip_item(inner.input);
                let text = name.to_string();
                return Err(syn::Error::new_spanned(
                    quote!(#name #rest),
                    format!(
                        "unknown `split` parameter `{text}`{}; `split` takes `axis`, `parts` and `index`",
                        symbol::did_you_mean(&text, SPLIT_KEYS.iter().map(|symbol| symbol.0)),
                    ),
                ));
            };
            let seen = match symbol {
                AXIS => axis.is_some(),
                PARTS => parts.is_some(),
                _ => index.is_some(),
            };
            if seen {
                let rest = skip_item(inner.input);
                return Err(syn::Error::new_spanned(
                    quote!(#name #rest),
                    format!("duplicate `{symbol}` in `split`: write each parameter once"),
                ));
            }
            let (value, tokens) = integer(&inner, &name)?;
            let out_of_range = || syn::Error::new_spanned(&tokens, format!("`{symbol}` is out of range"));
            if symbol == AXIS {
                let magnitude: isize = value.lit.base10_parse().map_err(|_| out_of_range())?;
                let value = if value.negative { -magnitude } else { magnitude };
                axis = Some(Param { value, tokens });
            } else {
                if value.negative {
                    return Err(syn::Error::new_spanned(
                        &tokens,
                        format!("`{symbol}` takes an unsigned integer: write `{symbol} = 3`"),
                    ));
                }
                let value: usize = value.lit.base10_parse().map_err(|_| out_of_range())?;
                let param = Param { value, tokens };
                if symbol == PARTS {
                    parts = Some(param);
                } else {
                    index = Some(param);
                }
            }
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
    let missing: Vec<&str> = [(AXIS, axis.is_none()), (PARTS, parts.is_none()), (INDEX, index.is_none())]
        .into_iter()
        .filter(|(_, missing)| *missing)
        .map(|(symbol, _)| symbol.0)
        .collect();
    if !missing.is_empty() && complete {
        let names = missing.iter().map(|name| format!("`{name}`")).collect::<Vec<_>>().join(" and ");
        cx.error_spanned_by(&tokens, format!("`split` is missing {names}: write `{EXAMPLE}`"));
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
        let mut cx = Ctxt::new();
        let field = Field::from_ast(&mut cx, &data.fields.iter().next().unwrap().attrs);
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
            let mut cx = Ctxt::new();
            let container = Container::from_ast(&mut cx, &input.attrs);
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
    fn every_mistake_is_reported() {
        let (_, errors) = field(quote!(
            #[nnx(trnaspose, rename = 3, skip = true, split(axis = 1), dtype = "u33")]
            #[nnx(skip)]
        ));
        assert_eq!(errors.len(), 6, "{errors:?}");
        assert!(errors[0].contains("did you mean `transpose`"));
        assert!(errors[1].contains("`rename` takes a string"));
        assert!(errors[2].contains("`skip` takes no value"));
        assert!(errors[3].contains("missing `parts` and `index`"));
        assert!(errors[4].contains("unknown dtype `u33`"));
        assert!(errors[5].contains("duplicate `skip`"));
    }
}
