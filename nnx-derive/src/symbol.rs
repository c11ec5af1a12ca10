//! The keywords of the `#[nnx(...)]` attribute grammar, as constants, and the spelling-distance
//! helper behind "did you mean" suggestions.

use std::fmt;

use syn::{Ident, Path};

/// One keyword of the attribute grammar.
#[derive(Copy, Clone, PartialEq, Eq)]
pub struct Symbol(pub &'static str);

/// The attribute's own name: `#[nnx(...)]`.
pub const NNX: Symbol = Symbol("nnx");
/// Field: not part of the state.
pub const SKIP: Symbol = Symbol("skip");
/// Field: the path segment.
pub const RENAME: Symbol = Symbol("rename");
/// Field: the import source name.
pub const FROM: Symbol = Symbol("from");
/// Field: the source stores the transpose.
pub const TRANSPOSE: Symbol = Symbol("transpose");
/// Field: one piece of a fused source.
pub const SPLIT: Symbol = Symbol("split");
/// Field: the same tensor as another field.
pub const TIE: Symbol = Symbol("tie");
/// Field: the source may lack it.
pub const OPTIONAL: Symbol = Symbol("optional");
/// Field: the required dtype.
pub const DTYPE: Symbol = Symbol("dtype");
/// Field: the source name in a GGUF file.
pub const GGUF: Symbol = Symbol("gguf");
/// Field: the GGUF file stores the rows in llama.cpp's rotary order.
pub const ROPE_PERMUTE: Symbol = Symbol("rope_permute");
/// Field: a transformers-named source stores the value minus this.
pub const OFFSET: Symbol = Symbol("offset");
/// Container: the path of the `nnx` crate.
pub const CRATE: Symbol = Symbol("crate");
/// `split(...)`: the axis cut.
pub const AXIS: Symbol = Symbol("axis");
/// `split(...)`: how many pieces.
pub const PARTS: Symbol = Symbol("parts");
/// `split(...)`: which piece.
pub const INDEX: Symbol = Symbol("index");

/// Every key a field accepts.
pub const FIELD_KEYS: &[Symbol] =
    &[SKIP, RENAME, FROM, GGUF, TRANSPOSE, SPLIT, ROPE_PERMUTE, OFFSET, TIE, OPTIONAL, DTYPE];
/// The GGUF keys (`{arch}.attention.<key>`) that `rope_permute` may name.
pub const HEAD_COUNT_KEYS: &[&str] = &["head_count", "head_count_kv"];
/// Every key the container accepts.
pub const CONTAINER_KEYS: &[Symbol] = &[CRATE];
/// Every parameter `split(...)` accepts, in the order they are usually written.
pub const SPLIT_KEYS: &[Symbol] = &[AXIS, PARTS, INDEX];

impl PartialEq<Symbol> for Ident {
    fn eq(&self, word: &Symbol) -> bool {
        self == word.0
    }
}

impl PartialEq<Symbol> for Path {
    fn eq(&self, word: &Symbol) -> bool {
        self.is_ident(word.0)
    }
}

impl fmt::Display for Symbol {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.0)
    }
}

/// The number of single-character insertions, deletions and substitutions between two words.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        current[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

/// The candidate closest to `word`, when it is close enough to be a likely typo.
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let word = word.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|candidate| (edit_distance(&word, candidate), candidate))
        .filter(|(distance, candidate)| *distance <= candidate.len().div_ceil(3))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// ` (did you mean `x`?)` for a likely typo, or nothing.
pub fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    match nearest(word, candidates) {
        Some(candidate) => format!(" (did you mean `{candidate}`?)"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(edit_distance("transpose", "transpose"), 0);
        assert_eq!(edit_distance("trasnpose", "transpose"), 2);
        assert_eq!(edit_distance("renam", "rename"), 1);
        assert_eq!(edit_distance("", "tie"), 3);
    }

    #[test]
    fn typos_find_their_key() {
        let keys = FIELD_KEYS.iter().map(|key| key.0);
        assert_eq!(nearest("tranpose", keys.clone()), Some("transpose"));
        assert_eq!(nearest("optinal", keys.clone()), Some("optional"));
        assert_eq!(nearest("Skip", keys.clone()), Some("skip"));
        assert_eq!(nearest("weights", keys), None);
    }
}
