//! The rules on what the attributes mean, alone and together: one function per rule, each
//! recording its mistakes in the context on the offending token.

use std::collections::HashMap;

use crate::ast::{self, Container, Conversion, Field};
use crate::ctxt::Ctxt;
use crate::symbol::{self, HEAD_COUNT_KEYS};

/// Runs every rule on a parsed input.
pub fn check(cx: &Ctxt, container: &Container<'_>) {
    for field in &container.fields {
        check_skip_alone(cx, field);
        check_rename_is_segment(cx, field);
        check_source_paths(cx, field);
        check_split_needs_from(cx, field);
        check_split_pieces(cx, field);
        check_tie_alone(cx, field);
        check_gguf_path(cx, field);
        check_rope_permute(cx, field);
        check_offset(cx, field);
    }
    check_split_siblings(cx, container);
    check_unique_segments(cx, container);
    check_tie_sibling(cx, container);
    check_weights_conversion(cx, container);
}

/// Why a dotted path is not valid, if it is not: it must be non-empty with non-empty segments.
pub fn path_problem(path: &str) -> Option<&'static str> {
    if path.is_empty() {
        Some("is empty")
    } else if path.starts_with('.') {
        Some("starts with `.`")
    } else if path.ends_with('.') {
        Some("ends with `.`")
    } else if path.contains("..") {
        Some("has an empty segment (`..`)")
    } else {
        None
    }
}

/// Why a single path segment is not valid, if it is not: non-empty, without `.`.
pub fn segment_problem(segment: &str) -> Option<&'static str> {
    if segment.is_empty() {
        Some("is empty")
    } else if segment.contains('.') {
        Some("contains `.`, which separates segments")
    } else {
        None
    }
}

/// A skipped field is not part of the state, so any other attribute on it would be ignored
/// silently; every such attribute is an error.
fn check_skip_alone(cx: &Ctxt, field: &Field<'_>) {
    if field.attrs.skip.is_none() {
        return;
    }
    for key in field.attrs.keys_besides_skip() {
        cx.error_spanned_by(
            key,
            format!("`{key}` has no effect on a skipped field: a `skip` field is not part of the state; remove `{key}` or `skip`"),
        );
    }
}

/// `rename` gives one path segment: it can be neither empty nor hold a `.`.
fn check_rename_is_segment(cx: &Ctxt, field: &Field<'_>) {
    let Some(rename) = &field.attrs.rename else { return };
    if let Some(problem) = segment_problem(&rename.value()) {
        cx.error_spanned_by(
            &rename.lit,
            format!("`rename` {problem}: it names one path segment, such as `rename = \"weight\"`"),
        );
    }
}

/// `from` and `tie` are dotted paths: non-empty, without empty segments.
fn check_source_paths(cx: &Ctxt, field: &Field<'_>) {
    for (attr, example) in [(&field.attrs.from, "from = \"attn.c_attn\""), (&field.attrs.tie, "tie = \"wte\"")] {
        let Some(attr) = attr else { continue };
        if let Some(problem) = path_problem(&attr.value()) {
            cx.error_spanned_by(
                &attr.lit,
                format!("`{}` path {problem}: write segments joined by single dots, such as `{example}`", attr.key),
            );
        }
    }
}

/// `split` cuts a fused source into pieces; without `from` the field's own name would be the
/// fused source, which is never what a checkpoint means. (On a tied field, `split` is reported by
/// [`check_tie_alone`] instead.)
fn check_split_needs_from(cx: &Ctxt, field: &Field<'_>) {
    let Some(split) = &field.attrs.split else { return };
    if field.attrs.from.is_none() && field.attrs.tie.is_none() {
        cx.error_spanned_by(
            &split.key,
            "`split` needs `from`: name the fused source, such as `#[nnx(from = \"c_attn\", split(...))]`",
        );
    }
}

/// `gguf` is a dotted path like `from`, or empty: the field adds no segment to GGUF names (its
/// fields sit directly under the parent's, as llama.cpp flattens `self_attn`).
fn check_gguf_path(cx: &Ctxt, field: &Field<'_>) {
    let Some(gguf) = &field.attrs.gguf else { return };
    let value = gguf.value();
    if value.is_empty() {
        return;
    }
    if let Some(problem) = path_problem(&value) {
        cx.error_spanned_by(
            &gguf.lit,
            format!(
                "`gguf` path {problem}: write segments joined by single dots, such as `gguf = \"attn_q\"`, \
                 or `gguf = \"\"` to add no segment"
            ),
        );
    }
}

/// `rope_permute` names the GGUF key that counts the row groups: the query heads or the
/// key/value heads.
fn check_rope_permute(cx: &Ctxt, field: &Field<'_>) {
    let Some(rope) = &field.attrs.rope_permute else { return };
    let value = rope.value();
    if !HEAD_COUNT_KEYS.contains(&value.as_str()) {
        cx.error_spanned_by(
            &rope.lit,
            format!(
                "`rope_permute` names the GGUF key that counts the heads the rows are grouped by: \
                 `head_count` (query heads) or `head_count_kv` (key/value heads), not `{value}`{}",
                symbol::did_you_mean(&value, HEAD_COUNT_KEYS.iter().copied()),
            ),
        );
    }
}

/// An offset of zero changes nothing: almost surely a mistake.
fn check_offset(cx: &Ctxt, field: &Field<'_>) {
    let Some(offset) = &field.attrs.offset else { return };
    if offset.value == 0.0 {
        cx.error_spanned_by(
            &offset.tokens,
            "`offset = 0` changes nothing: give the constant the source subtracted, such as `offset = 1.0`, or remove it",
        );
    }
}

/// A split has at least two parts and the index is one of them.
fn check_split_pieces(cx: &Ctxt, field: &Field<'_>) {
    let Some(split) = &field.attrs.split else { return };
    let parts = split.parts.value;
    if parts < 2 {
        cx.error_spanned_by(
            &split.parts.tokens,
            format!("`parts = {parts}` is not a split: a fused source holds at least 2 parts"),
        );
    } else if split.index.value >= parts {
        cx.error_spanned_by(
            &split.index.tokens,
            format!(
                "`index = {}` is out of range: with `parts = {parts}` it is one of 0..={}",
                split.index.value,
                parts - 1
            ),
        );
    }
}

/// A tied field is not read from the file (it shares another field's tensor), so attributes on
/// how to read it would be ignored silently.
fn check_tie_alone(cx: &Ctxt, field: &Field<'_>) {
    let Some(tie) = &field.attrs.tie else { return };
    let attrs = &field.attrs;
    let keys = [
        attrs.from.as_ref().map(|from| &from.key),
        attrs.gguf.as_ref().map(|gguf| &gguf.key),
        attrs.split.as_ref().map(|split| &split.key),
        attrs.transpose.as_ref(),
        attrs.rope_permute.as_ref().map(|rope| &rope.key),
        attrs.offset.as_ref().map(|offset| &offset.key),
        attrs.optional.as_ref(),
    ];
    for key in keys.into_iter().flatten() {
        cx.error_spanned_by(
            key,
            format!(
                "`{key}` has no effect on a tied field: it is not read from the file, it shares the tensor of `{}`; \
                 remove `{key}` or `tie`",
                tie.value()
            ),
        );
    }
}

/// Fields that split the same source must agree on how it is cut (`parts` and `axis`) and take
/// different pieces of it. The later field is reported, naming the earlier one.
fn check_split_siblings(cx: &Ctxt, container: &Container<'_>) {
    let mut first_by_source: HashMap<String, &Field<'_>> = HashMap::new();
    let mut index_by_source: HashMap<(String, usize), &Field<'_>> = HashMap::new();
    for field in container.fields.iter().filter(|field| field.is_walked()) {
        let (Some(split), Some(from)) = (&field.attrs.split, &field.attrs.from) else { continue };
        let source = from.value();
        let first = *first_by_source.entry(source.clone()).or_insert(field);
        if let Some(first_split) = first.attrs.split.as_ref().filter(|_| !std::ptr::eq(first, field)) {
            if first_split.parts.value != split.parts.value {
                cx.error_spanned_by(
                    &split.parts.tokens,
                    format!(
                        "`{source}` is split into {} parts by field `{}` but into {} here: siblings must use the same `parts`",
                        first_split.parts.value, first.name, split.parts.value
                    ),
                );
            }
            if first_split.axis.value != split.axis.value {
                cx.error_spanned_by(
                    &split.axis.tokens,
                    format!(
                        "`{source}` is split along axis {} by field `{}` but along axis {} here: siblings must use the same `axis`",
                        first_split.axis.value, first.name, split.axis.value
                    ),
                );
            }
        }
        match index_by_source.get(&(source.clone(), split.index.value)) {
            Some(earlier) => cx.error_spanned_by(
                &split.index.tokens,
                format!(
                    "piece {} of `{source}` is already taken by field `{}`: each sibling takes a different `index`",
                    split.index.value, earlier.name
                ),
            ),
            None => {
                index_by_source.insert((source, split.index.value), field);
            }
        }
    }
}

/// Names are distinct: two walked fields with the same path segment (through `rename`) would
/// give two tensors one name.
fn check_unique_segments(cx: &Ctxt, container: &Container<'_>) {
    let mut seen: HashMap<String, &Field<'_>> = HashMap::new();
    for field in container.fields.iter().filter(|field| field.is_walked()) {
        let segment = field.segment();
        match seen.get(&segment) {
            Some(earlier) => {
                let message = format!(
                    "path segment `{segment}` is already used by field `{}`: each field needs its own; rename one of them",
                    earlier.name
                );
                match &field.attrs.rename {
                    Some(rename) => cx.error_spanned_by(&rename.lit, message),
                    None => match &field.member {
                        syn::Member::Named(ident) => cx.error_spanned_by(ident, message),
                        syn::Member::Unnamed(_) => cx.error_spanned_by(field.ty, message),
                    },
                }
            }
            None => {
                seen.insert(segment, field);
            }
        }
    }
}

/// A `tie` path of one segment names a field of the import root: of this struct, which is that
/// root (a nested module ties to a root field of its own name, never to one of another type's
/// single segments). So the segment must be a walked sibling other than the field itself, and a
/// misspelt name fails here, with the closest sibling, instead of at import.
fn check_tie_sibling(cx: &Ctxt, container: &Container<'_>) {
    let walked: Vec<(String, &Field<'_>)> =
        container.fields.iter().filter(|field| field.is_walked()).map(|field| (field.segment(), field)).collect();
    for field in &container.fields {
        let Some(tie) = &field.attrs.tie else { continue };
        let path = tie.value();
        if path.contains('.') || path_problem(&path).is_some() {
            continue;
        }
        if path == field.segment() {
            cx.error_spanned_by(
                &tie.lit,
                format!("`tie = \"{path}\"` names this field itself: name the field whose tensor it shares"),
            );
            continue;
        }
        let siblings: Vec<&str> = walked
            .iter()
            .filter(|(segment, sibling)| {
                !std::ptr::eq(*sibling, field) && sibling.attrs.tie.is_none() && !segment.is_empty()
            })
            .map(|(segment, _)| segment.as_str())
            .collect();
        if walked.iter().any(|(segment, sibling)| *segment == path && !std::ptr::eq(*sibling, field)) {
            continue;
        }
        let closest = siblings
            .iter()
            .map(|segment| (strsim::levenshtein(segment, &path), *segment))
            // The closeness of nnx's own did-you-mean at import.
            .filter(|(distance, _)| *distance <= (path.chars().count() / 3).clamp(1, 4))
            .min();
        let hint = match closest {
            Some((_, segment)) => format!("did you mean `{segment}`?"),
            None if siblings.is_empty() => "it has no field to share a tensor with".to_string(),
            None => {
                format!("its fields are {}", siblings.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", "))
            }
        };
        cx.error_spanned_by(
            &tie.lit,
            format!(
                "`tie = \"{path}\"` names no field of this struct: {hint} (a tie names a field by its path from the \
                 import root; a path of several segments, such as `model.embed_tokens`, reaches into a nested one)"
            ),
        );
    }
}

/// In a struct with a weights parameter `W`, the generated `map_weights` converts every field
/// that names `W`: a projection `W::Layer<D>`, a module generic over `W`, or a container of
/// those with one type argument. A field naming `W` in any other way (a tuple, an array, a
/// reference) would have no converted value; it is an error on the field's type.
fn check_weights_conversion(cx: &Ctxt, container: &Container<'_>) {
    let Some(weights) = ast::weights_param(container.generics) else { return };
    for field in &container.fields {
        if unsupported(&ast::conversion(field.ty, weights)) {
            cx.error_spanned_by(
                field.ty,
                format!(
                    "`map_weights` cannot convert this field: a field naming the weights parameter `{weights}` must \
                     be `{weights}::Layer<D>`, a module generic over `{weights}`, or an `Option`, `Vec` or `Box` \
                     of those; use a `Vec` for several projections, or a struct deriving `Module`"
                ),
            );
        }
    }
}

/// Whether a conversion, or one of its items, cannot be carried out.
fn unsupported(conversion: &Conversion<'_>) -> bool {
    match conversion {
        Conversion::Unsupported => true,
        Conversion::Each(_, inner) => unsupported(inner),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::*;

    /// The messages of every mistake in a struct's attributes, parsed and checked.
    fn mistakes(input: proc_macro2::TokenStream) -> Vec<String> {
        let input: syn::DeriveInput = syn::parse2(input).unwrap();
        let cx = Ctxt::new();
        let container = Container::from_ast(&cx, &input);
        check(&cx, &container);
        match cx.check() {
            Ok(()) => Vec::new(),
            Err(errors) => errors.into_iter().map(|error| error.to_string()).collect(),
        }
    }

    #[test]
    fn a_one_segment_tie_names_a_walked_sibling() {
        let errors = mistakes(quote!(
            struct Mlp {
                fc1: Linear,
                fc2: Linear,
                #[nnx(tie = "fc3")]
                head: Linear,
            }
        ));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("`tie = \"fc3\"` names no field of this struct: did you mean `fc1`?"),
            "{errors:?}"
        );
        let accepted = [
            quote!(
                struct M {
                    wte: T,
                    #[nnx(tie = "wte")]
                    head: T,
                }
            ),
            quote!(
                struct M {
                    #[nnx(rename = "embed")]
                    wte: T,
                    #[nnx(tie = "embed")]
                    head: T,
                }
            ),
            quote!(
                struct M {
                    #[nnx(tie = "model.embed_tokens")]
                    head: T,
                }
            ),
        ];
        for input in accepted {
            assert!(mistakes(input.clone()).is_empty(), "{input}");
        }
        let skipped = mistakes(quote!(
            struct M {
                #[nnx(skip)]
                wte: T,
                #[nnx(tie = "wte")]
                head: T,
            }
        ));
        assert!(skipped[0].contains("it has no field to share a tensor with"), "{skipped:?}");
        let far = mistakes(quote!(
            struct M {
                first: T,
                second: T,
                #[nnx(tie = "lm_head")]
                head: T,
            }
        ));
        assert!(far[0].contains("its fields are `first`, `second`"), "{far:?}");
        let itself = mistakes(quote!(
            struct M {
                wte: T,
                #[nnx(tie = "head")]
                head: T,
            }
        ));
        assert!(itself[0].contains("names this field itself"), "{itself:?}");
    }

    #[test]
    fn empty_gguf_adds_no_segment_and_is_accepted() {
        let errors = mistakes(quote!(
            struct Layer {
                #[nnx(from = "self_attn", gguf = "")]
                attn: Attention,
                #[nnx(gguf = "")]
                mlp: Mlp,
            }
        ));
        assert!(errors.is_empty(), "{errors:?}");
    }

    #[test]
    fn gguf_paths_are_checked_like_from() {
        for (written, problem) in
            [(".x", "starts with `.`"), ("a..b", "has an empty segment (`..`)"), ("a.", "ends with `.`")]
        {
            let errors = mistakes(quote!(
                struct Layer {
                    #[nnx(gguf = #written)]
                    weight: Tensor,
                }
            ));
            assert_eq!(errors.len(), 1, "{written}: {errors:?}");
            assert!(errors[0].starts_with(&format!("`gguf` path {problem}: ")), "{written}: {errors:?}");
            assert!(errors[0].ends_with("or `gguf = \"\"` to add no segment"), "{written}: {errors:?}");
        }
        let errors = mistakes(quote!(
            struct Layer {
                #[nnx(gguf = "blk.attn_q")]
                weight: Tensor,
            }
        ));
        assert!(errors.is_empty(), "{errors:?}");
    }

    #[test]
    fn rope_permute_names_a_head_count() {
        for key in HEAD_COUNT_KEYS {
            let errors = mistakes(quote!(
                struct Attention {
                    #[nnx(gguf = "attn_q", rope_permute = #key)]
                    q: Tensor,
                }
            ));
            assert!(errors.is_empty(), "{key}: {errors:?}");
        }
        for (written, suggestion) in [
            ("heads", ""),
            ("head_cout", " (did you mean `head_count`?)"),
            ("head_count_k", " (did you mean `head_count_kv`?)"),
        ] {
            let errors = mistakes(quote!(
                struct Attention {
                    #[nnx(rope_permute = #written)]
                    q: Tensor,
                }
            ));
            assert_eq!(errors.len(), 1, "{written}: {errors:?}");
            assert!(errors[0].ends_with(&format!("not `{written}`{suggestion}")), "{written}: {errors:?}");
        }
    }

    #[test]
    fn offset_zero_is_refused_in_every_spelling() {
        for written in [quote!(0), quote!(0.0), quote!(-0.0)] {
            let errors = mistakes(quote!(
                struct Norm {
                    #[nnx(offset = #written)]
                    weight: Tensor,
                }
            ));
            assert_eq!(errors.len(), 1, "{written}: {errors:?}");
            assert!(errors[0].starts_with("`offset = 0` changes nothing"), "{written}: {errors:?}");
        }
    }

    #[test]
    fn gguf_attributes_have_no_effect_on_skipped_or_tied_fields() {
        let errors = mistakes(quote!(
            struct Model {
                wte: Tensor,
                #[nnx(skip, gguf = "x", rope_permute = "head_count", offset = 1.0)]
                cache: Tensor,
                #[nnx(tie = "wte", gguf = "output", rope_permute = "head_count", offset = 1.0)]
                head: Tensor,
            }
        ));
        let expected_skip = |key: &str| format!("`{key}` has no effect on a skipped field");
        let expected_tie = |key: &str| format!("`{key}` has no effect on a tied field");
        assert_eq!(errors.len(), 6, "{errors:?}");
        for (error, expected) in errors.iter().zip([
            expected_skip("gguf"),
            expected_skip("rope_permute"),
            expected_skip("offset"),
            expected_tie("gguf"),
            expected_tie("rope_permute"),
            expected_tie("offset"),
        ]) {
            assert!(error.starts_with(&expected), "{error}");
        }
    }

    #[test]
    fn paths() {
        assert_eq!(path_problem("a.b"), None);
        assert_eq!(path_problem("h.0.attn"), None);
        assert_eq!(path_problem("a"), None);
        assert_eq!(path_problem(""), Some("is empty"));
        assert_eq!(path_problem(".a"), Some("starts with `.`"));
        assert_eq!(path_problem("a."), Some("ends with `.`"));
        assert_eq!(path_problem("a..b"), Some("has an empty segment (`..`)"));
    }

    #[test]
    fn segments() {
        assert_eq!(segment_problem("weight"), None);
        assert_eq!(segment_problem("0"), None);
        assert_eq!(segment_problem(""), Some("is empty"));
        assert_eq!(segment_problem("a.b"), Some("contains `.`, which separates segments"));
    }
}
