//! A tokenizer built from a GGUF file's `tokenizer.ggml.*` metadata out of the `tokenizers`
//! crate's own parts, put together so that text becomes the ids llama.cpp's `llama_tokenize`
//! gives with `parse_special` (control tokens written in the text are matched).
//!
//! - `gpt2` vocabularies are byte-level BPE. llama.cpp splits the text with the list of regular
//!   expressions that `tokenizer.ggml.pre` names, each one splitting the pieces of the one
//!   before and keeping the text between its matches as pieces too: that is a sequence of
//!   `Split` pre-tokenizers with isolated matches, then the byte-to-character mapping.
//! - `llama` vocabularies are SentencePiece, which llama.cpp encodes by merging, again and
//!   again, the neighbouring pair whose concatenation is the token of highest score, then
//!   spelling out as `<0xNN>` byte tokens what no token covers. That is BPE whose merges are
//!   every pair of tokens that concatenates into a token, ranked by that token's score (as
//!   transformers' converter derives them), with byte fallback; a space is written in front of
//!   every piece of text (`tokenizer.ggml.add_space_prefix`) and spaces become `▁`.
//!
//! Control, unknown and user-defined tokens are added tokens matched in the raw text, as
//! llama.cpp partitions the text around them before anything else; `<s>`/`</s>` come from a
//! template post-processor as `tokenizer.ggml.add_bos_token`/`add_eos_token` say.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use nnx_io::gguf::{Metadata, Value};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::{SpecialToken, TemplateProcessing};
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper, PaddingParams, PreTokenizerWrapper};
use tokenizers::{SplitDelimiterBehavior, Tokenizer};

use super::text::{MAX_ADDED_BYTES, MAX_ADDED_TOKENS, MAX_TOKEN_BYTES};
use crate::{Error, Result};

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
const UNKNOWN: i64 = 2;
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// SentencePiece's whitespace mark, which stands for a space inside pieces.
const SPACE_MARK: &str = "\u{2581}";

// The regular expressions of llama.cpp's BPE pre-tokenizers (`llm_tokenizer_bpe` in
// `llama-vocab.cpp`), in the forms it runs them: the `(?i:...)` contractions spelled out and the
// case classes of tekken and gpt-4o written with look-aheads, which keep llama.cpp's own
// reading of them (any letter outside A-Z counts as lower case, any outside a-z as upper case).

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const JAIS2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}";
/// Written with escapes: several of its characters have canonical equivalents.
const DEEPSEEK_LETTERS: &str = r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+";
const DEEPSEEK3_WORDS: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;
const SPARK_WORDS: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"##;
const CJK_KANA: &str = r"[一-龥぀-ゟ゠-ヿ]+";
const CJK_HANGUL: &str = r"[一-龥ࠀ-一가-퟿]+";
const YOUTU_CJK: &str = r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+";
const YOUTU_WORDS: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GRANITE_MULTI: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const BAILING: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
const SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
const UFAKZEKA: &str = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const EXAONE_MOE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+";
const MINICPM5: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// One of llama.cpp's BPE pre-tokenizer types: the `tokenizer.ggml.pre` names that choose it,
/// its regular expressions in the order they split, and what else the name sets.
struct PreTokenizer {
    names: &'static [&'static str],
    regexes: &'static [&'static str],
    /// A piece that is a token as a whole is that token, whatever the merges would make.
    ignore_merges: bool,
    /// `<s>` is added unless `tokenizer.ggml.add_bos_token` says otherwise.
    add_bos: bool,
    /// There is no `<s>` unless `tokenizer.ggml.bos_token_id` names one.
    no_bos: bool,
}

const fn pre(names: &'static [&'static str], regexes: &'static [&'static str]) -> PreTokenizer {
    PreTokenizer { names, regexes, ignore_merges: false, add_bos: false, no_bos: false }
}

impl PreTokenizer {
    const fn ignore_merges(mut self) -> PreTokenizer {
        self.ignore_merges = true;
        self
    }

    const fn add_bos(mut self) -> PreTokenizer {
        self.add_bos = true;
        self
    }

    const fn no_bos(mut self) -> PreTokenizer {
        self.no_bos = true;
        self
    }
}

/// The pre-tokenizers of `llama_vocab::impl::load`, name by name. Left out: those llama.cpp
/// runs with code of its own rather than its regular expressions (kimi-k2, afmoe, tiny_aya,
/// superbpe), those that escape spaces or do not map bytes (gemma4, sarvam-moe, whitespace),
/// and those that add a separator token (roberta-bpe, jina-v1-en, jina-v2-code) or image
/// tokens (chameleon).
const PRE_TOKENIZERS: &[PreTokenizer] = &[
    pre(&["default"], &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]),
    pre(
        &["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"],
        &[LLAMA3],
    )
    .ignore_merges()
    .add_bos(),
    pre(&["dbrx", "smaug-bpe"], &[LLAMA3]),
    pre(&["chatglm-bpe"], &[LLAMA3]).no_bos(),
    pre(&["glm4", "glm5"], &[LLAMA3]).no_bos().ignore_merges(),
    pre(&["jais-2"], &[JAIS2]),
    pre(&["minicpm5"], &[r"\p{N}{1,3}", MINICPM5]).ignore_merges(),
    pre(
        &["deepseek-llm"],
        &[r"[\r\n]", DEEPSEEK_LETTERS, r"\s?[!-/:-~！-／：-～‘-‟　-。]+", r"\s+$", CJK_HANGUL, r"\p{N}+"],
    ),
    pre(&["deepseek-coder"], &[r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK_HANGUL, r"\p{N}"]),
    pre(&["deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"], &[r"\p{N}{1,3}", CJK_KANA, DEEPSEEK3_WORDS]),
    pre(&["spark2_5"], &[r"\p{N}{1,3}", CJK_KANA, SPARK_WORDS, r"\p{N}"]),
    pre(&["youtu"], &[YOUTU_CJK, YOUTU_WORDS]).ignore_merges(),
    pre(&["falcon"], &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"]),
    pre(
        &["starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"],
        &[r"\p{N}", GPT2],
    ),
    pre(
        &[
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "exaone4",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
        ],
        &[GPT2],
    ),
    pre(
        &["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open", "grok-2"],
        &[QWEN2],
    ),
    pre(&["qwen35"], &[QWEN35]),
    pre(&["poro-chat", "bloom", "gpt3-finnish"], &[BLOOM]),
    pre(&["viking"], &[BLOOM, r"\p{N}"]),
    pre(&["tekken"], &[TEKKEN]).ignore_merges().add_bos(),
    pre(&["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], &[GPT4O]),
    pre(&["granite-embed-multi-97m"], &[GRANITE_MULTI]).ignore_merges(),
    pre(&["bailingmoe", "bailingmoe2", "llada-moe"], &[BAILING]),
    pre(&["seed-coder"], &[SEED_CODER]),
    pre(&["ufakzeka"], &[UFAKZEKA]),
    pre(&["laguna"], &[r"[^\n]+|[\n]+", QWEN2]),
    pre(&["exaone-moe"], &[EXAONE_MOE]),
];

/// Every `tokenizer.ggml.pre` name nnx knows, for error messages.
fn known_pre_tokenizers() -> String {
    PRE_TOKENIZERS.iter().flat_map(|pre| pre.names.iter().copied()).collect::<Vec<_>>().join(", ")
}

/// The most tokens a GGUF vocabulary may have: eight times the largest in use (Gemma 3's
/// 262,144), far below what ids can number. Each token costs a few hundred bytes of maps, so
/// millions of tiny tokens would cost many times the file's size.
const MAX_TOKENS: usize = 1 << 21;

/// The most text the merges derived from a SentencePiece vocabulary may hold (the two halves of
/// every split of a token into two tokens). A trained vocabulary of 262,144 tokens needs about
/// 10 MiB; a vocabulary made so that every part of every token is a token needs the cube of
/// its size.
const MAX_MERGE_BYTES: usize = 64 << 20;

/// `text` as an error message shows it: escaped, and cut after 64 characters, so that a
/// hostile token neither floods the terminal nor moves its cursor.
fn shown(text: &str) -> String {
    let mut shown: String = text.chars().take(64).flat_map(char::escape_debug).collect();
    if text.chars().nth(64).is_some() {
        shown.push_str("...");
    }
    shown
}

/// Refuses vocabularies that would cost far more to build than their size: too many tokens for
/// a language model, or a token longer than [`MAX_TOKEN_BYTES`].
fn check_vocabulary(origin: &Path, tokens: &[String]) -> Result<()> {
    let count = tokens.len();
    if count > MAX_TOKENS {
        return Err(fail(
            origin,
            format!(
                "`tokenizer.ggml.tokens` has {count} tokens, more than the {MAX_TOKENS} nnx reads (the largest vocabularies in use have 262,144): the file is damaged or not a language model's vocabulary"
            ),
        ));
    }
    if let Some((id, token)) = tokens.iter().enumerate().find(|(_, token)| token.len() > MAX_TOKEN_BYTES) {
        return Err(fail(
            origin,
            format!(
                "token {id} of `tokenizer.ggml.tokens` is {} bytes long, more than the {MAX_TOKEN_BYTES} nnx accepts (trained tokens have at most a few hundred): the file is damaged or hostile; use one from a trusted converter",
                token.len()
            ),
        ));
    }
    Ok(())
}

/// Refuses more control, unknown and user-defined tokens than [`MAX_ADDED_TOKENS`], or more
/// text in them than [`MAX_ADDED_BYTES`]: they are matched in the text by an automaton that
/// takes tens of bytes per byte of theirs.
fn check_added_tokens(origin: &Path, tokens: &[String], types: &[i64]) -> Result<()> {
    let (mut count, mut bytes) = (0usize, 0usize);
    for (id, (token, kind)) in tokens.iter().zip(types).enumerate() {
        if ![UNKNOWN, CONTROL, USER_DEFINED].contains(kind) {
            continue;
        }
        count += 1;
        bytes += token.len();
        if count > MAX_ADDED_TOKENS || bytes > MAX_ADDED_BYTES {
            return Err(fail(
                origin,
                format!(
                    "`tokenizer.ggml.token_type` marks too many tokens as control, unknown or user-defined: by token {id} there are {count}, of {bytes} bytes, past the {MAX_ADDED_TOKENS} tokens or {} KiB nnx matches in the text (vocabularies in use have at most a few thousand); the file is damaged or hostile",
                    MAX_ADDED_BYTES >> 10
                ),
            ));
        }
    }
    Ok(())
}

/// The error of a GGUF file whose tokenizer metadata cannot make a tokenizer.
fn fail(origin: &Path, message: impl Into<String>) -> Error {
    Error::Tokenizer { path: origin.to_path_buf(), source: message.into().into() }
}

/// The tokenizer keys that are read, typed.
struct Keys<'a> {
    metadata: &'a Metadata,
    origin: &'a Path,
}

impl Keys<'_> {
    fn get(&self, field: &str) -> Option<&Value> {
        self.metadata.get(&format!("tokenizer.ggml.{field}"))
    }

    fn wrong(&self, field: &str, expected: &str) -> Error {
        fail(self.origin, format!("`tokenizer.ggml.{field}` must be {expected}"))
    }

    fn string(&self, field: &str) -> Result<Option<&str>> {
        self.get(field).map(|value| value.as_str().ok_or_else(|| self.wrong(field, "a string"))).transpose()
    }

    fn boolean(&self, field: &str) -> Result<Option<bool>> {
        self.get(field).map(|value| value.as_bool().ok_or_else(|| self.wrong(field, "true or false"))).transpose()
    }

    fn id(&self, field: &str) -> Result<Option<u64>> {
        self.get(field)
            .map(|value| value.as_u64().ok_or_else(|| self.wrong(field, "a non-negative integer")))
            .transpose()
    }

    fn strings(&self, field: &str) -> Result<Option<&[String]>> {
        self.get(field)
            .map(|value| {
                value
                    .as_array()
                    .and_then(|array| array.as_strings())
                    .ok_or_else(|| self.wrong(field, "an array of strings"))
            })
            .transpose()
    }

    /// An array of numbers with one per token: llama.cpp reads the `i`th value for token `i`, so
    /// any other length means the arrays do not describe the same vocabulary.
    fn per_token<T>(
        &self,
        field: &str,
        tokens: usize,
        read: impl Fn(&Value) -> Option<Vec<T>>,
    ) -> Result<Option<Vec<T>>> {
        let Some(value) = self.get(field) else { return Ok(None) };
        let values = read(value).ok_or_else(|| self.wrong(field, "an array of numbers"))?;
        if values.len() != tokens {
            return Err(fail(
                self.origin,
                format!(
                    "`tokenizer.ggml.{field}` has {} values for {tokens} tokens: it needs one per token of `tokenizer.ggml.tokens`; the file is damaged or was written by a broken converter",
                    values.len()
                ),
            ));
        }
        Ok(Some(values))
    }
}

/// The kind of vocabulary `tokenizer.ggml.model` names.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `gpt2`: byte-level BPE.
    BytePairs,
    /// `llama`: SentencePiece.
    SentencePiece,
    /// `gemma4`: BPE by the file's merges over text whose spaces are `▁` (SentencePiece's
    /// alphabet, no prefix), with byte fallback, split only at newlines.
    SpacedPairs,
}

/// The tokenizer that `metadata` describes, as llama.cpp builds it; errors name `origin`.
pub(crate) fn tokenizer_from_gguf(metadata: &Metadata, origin: &Path) -> Result<Tokenizer> {
    let keys = Keys { metadata, origin };
    let kind = match keys.string("model")? {
        Some("gpt2") => Kind::BytePairs,
        Some("llama") => Kind::SentencePiece,
        Some("gemma4") => Kind::SpacedPairs,
        Some(other) => {
            return Err(fail(
                origin,
                format!(
                    "tokenizer model `{}` (`tokenizer.ggml.model`) is not supported: nnx builds `gpt2` (byte-level BPE), `llama` (SentencePiece) and `gemma4` (BPE over SentencePiece's alphabet) tokenizers",
                    shown(other)
                ),
            ));
        }
        None => return Err(fail(origin, "the file has no tokenizer: `tokenizer.ggml.model` is missing")),
    };
    let tokens = keys.strings("tokens")?.ok_or_else(|| fail(origin, "`tokenizer.ggml.tokens` is missing"))?;
    let count = tokens.len();
    check_vocabulary(origin, tokens)?;
    // llama.cpp names an empty token by its id so that every token has a text of its own.
    let tokens: Vec<String> = tokens
        .iter()
        .enumerate()
        .map(|(id, token)| if token.is_empty() { format!("[EMPTY_{id}]") } else { token.clone() })
        .collect();
    let types =
        keys.per_token("token_type", count, |value| value.as_array()?.to_i64s())?.unwrap_or_else(|| vec![1; count]);
    let vocab: Vocab = tokens.iter().enumerate().map(|(id, token)| (token.clone(), id as u32)).collect();
    if vocab.len() != count {
        // Found again only now, on the error path, to keep the common path to one map.
        let mut first = HashMap::new();
        for (id, token) in tokens.iter().enumerate() {
            if let Some(before) = first.insert(token.as_str(), id) {
                return Err(fail(
                    origin,
                    format!(
                        "`tokenizer.ggml.tokens` holds `{}` twice (tokens {before} and {id}): every token must be distinct; the file is damaged",
                        shown(token)
                    ),
                ));
            }
        }
    }
    check_added_tokens(origin, &tokens, &types)?;

    let pre = match kind {
        Kind::BytePairs => {
            let name = keys.string("pre")?.unwrap_or("default");
            Some(PRE_TOKENIZERS.iter().find(|pre| pre.names.contains(&name)).ok_or_else(|| {
                fail(
                    origin,
                    format!(
                        "pre-tokenizer `{}` (`tokenizer.ggml.pre`) is not one nnx knows; it knows {}",
                        shown(name),
                        known_pre_tokenizers()
                    ),
                )
            })?)
        }
        Kind::SentencePiece | Kind::SpacedPairs => None,
    };

    // The special ids llama.cpp assumes before reading the keys, and whether it adds them.
    let in_range = |id: u64| usize::try_from(id).ok().filter(|&id| id < count).map(|id| id as u32);
    let (mut bos, mut eos, mut unknown) = match kind {
        Kind::BytePairs => (in_range(11), in_range(11), None),
        Kind::SentencePiece | Kind::SpacedPairs => (in_range(1), in_range(2), in_range(0)),
    };
    if pre.is_some_and(|pre| pre.no_bos) {
        bos = None;
    }
    let mut padding = None;
    for (field, slot) in [
        ("bos_token_id", &mut bos),
        ("eos_token_id", &mut eos),
        ("unknown_token_id", &mut unknown),
        ("padding_token_id", &mut padding),
    ] {
        // An id past the vocabulary is ignored, as llama.cpp ignores it.
        if let Some(id) = keys.id(field)?.and_then(in_range) {
            *slot = Some(id);
        }
    }
    let add_bos = keys.boolean("add_bos_token")?.unwrap_or(match kind {
        Kind::BytePairs => pre.is_some_and(|pre| pre.add_bos),
        Kind::SentencePiece | Kind::SpacedPairs => true,
    });
    let add_eos = keys.boolean("add_eos_token")?.unwrap_or(false);

    let mut tokenizer = match kind {
        Kind::BytePairs => {
            let pre = pre.expect("a byte-level vocabulary has a pre-tokenizer");
            byte_level(&keys, vocab, pre)?
        }
        Kind::SpacedPairs => spaced_pairs(&keys, vocab)?,
        Kind::SentencePiece => {
            let scores = keys.per_token("scores", count, |value| {
                let array = value.as_array()?;
                array
                    .as_f32s()
                    .map(<[f32]>::to_vec)
                    .or_else(|| Some(array.to_i64s()?.into_iter().map(|score| score as f32).collect()))
            })?;
            let add_space_prefix = keys.boolean("add_space_prefix")?.unwrap_or(true);
            sentence_piece(
                origin,
                &tokens,
                vocab,
                scores.as_deref(),
                unknown.map(|id| tokens[id as usize].clone()),
                add_space_prefix,
            )?
        }
    };

    // Control and unknown tokens are special: matched in the text and left out of decoded text;
    // user-defined ones are matched in the text too. All are matched in the text as written.
    let added = |wanted: &[i64], special: bool| -> Vec<AddedToken> {
        tokens
            .iter()
            .zip(&types)
            .filter(|(_, kind)| wanted.contains(kind))
            .map(|(token, _)| AddedToken::from(token.clone(), special).normalized(false))
            .collect()
    };
    let error = |source: tokenizers::Error| Error::Tokenizer { path: origin.to_path_buf(), source };
    tokenizer.add_special_tokens(added(&[UNKNOWN, CONTROL], true)).map_err(error)?;
    tokenizer.add_tokens(added(&[USER_DEFINED], false)).map_err(error)?;

    let special = |name: &str, id: Option<u32>, field: &str| -> Result<SpecialToken> {
        let id = id.ok_or_else(|| {
            fail(
                origin,
                format!(
                    "`tokenizer.ggml.add_{name}_token` asks for a token that `tokenizer.ggml.{field}` does not name"
                ),
            )
        })?;
        SpecialToken::new(name.to_uppercase(), vec![id], vec![tokens[id as usize].clone()]).map_err(error)
    };
    if add_bos || add_eos {
        let mut single = Vec::new();
        let mut specials = Vec::new();
        if add_bos {
            single.push("BOS");
            specials.push(special("bos", bos, "bos_token_id")?);
        }
        single.push("$A");
        if add_eos {
            single.push("EOS");
            specials.push(special("eos", eos, "eos_token_id")?);
        }
        let pair: Vec<String> = single
            .iter()
            .map(|piece| piece.to_string())
            .chain(single.iter().map(|piece| if *piece == "$A" { "$B:1".to_string() } else { format!("{piece}:1") }))
            .collect();
        let processor = TemplateProcessing::builder()
            .try_single(single)
            .and_then(|builder| builder.try_pair(pair))
            .map_err(|message| fail(origin, message))?
            .special_tokens(specials)
            .build()
            .map_err(|source| fail(origin, source.to_string()))?;
        tokenizer.with_post_processor(Some(processor));
    }
    if let Some(id) = padding {
        // Pads batches to their longest member; a single text is never padded.
        tokenizer.with_padding(Some(PaddingParams {
            pad_id: id,
            pad_token: tokens[id as usize].clone(),
            ..PaddingParams::default()
        }));
    }
    Ok(tokenizer)
}

/// Gemma 4's tokenizer as llama.cpp runs it: BPE by `tokenizer.ggml.merges` over the text
/// with every space a `▁` (no prefix), split only into runs of newlines and runs of the rest,
/// bytes no token covers as their `<0xNN>` tokens.
fn spaced_pairs(keys: &Keys<'_>, vocab: Vocab) -> Result<Tokenizer> {
    let error = |source: tokenizers::Error| Error::Tokenizer { path: keys.origin.to_path_buf(), source };
    let merges = file_merges(keys, &vocab)?;
    let model = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true).fuse_unk(true);
    let mut tokenizer = Tokenizer::new(model.build().map_err(error)?);
    tokenizer
        .with_normalizer(Some(NormalizerSequence::new(vec![Replace::new(" ", SPACE_MARK).map_err(error)?.into()])))
        .map_err(error)?;
    let lines = Split::new(SplitPattern::Regex("[^\\n]+|[\\n]+".to_string()), SplitDelimiterBehavior::Isolated, false)
        .map_err(error)?;
    tokenizer.with_pre_tokenizer(Some(PreTokenizerSequence::new(vec![PreTokenizerWrapper::Split(lines)])));
    let decoders: Vec<DecoderWrapper> =
        vec![Replace::new(SPACE_MARK, " ").map_err(error)?.into(), ByteFallback::new().into(), Fuse::new().into()];
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

/// The merges of `tokenizer.ggml.merges` BPE can take: llama.cpp splits a merge at its first
/// space after the first byte and keeps the first rank of a pair given twice. A merge whose
/// parts or result are not tokens cannot make a token, and BPE refuses it: it is left out. A
/// missing list is read as no merges.
fn file_merges(keys: &Keys<'_>, vocab: &Vocab) -> Result<Vec<(String, String)>> {
    let mut seen = HashSet::new();
    Ok(keys
        .strings("merges")?
        .unwrap_or_default()
        .iter()
        .filter_map(|merge| {
            let at = merge.as_bytes().iter().skip(1).position(|&byte| byte == b' ')? + 1;
            let (left, right) = (&merge[..at], &merge[at + 1..]);
            let known =
                vocab.contains_key(left) && vocab.contains_key(right) && vocab.contains_key(&format!("{left}{right}"));
            (known && seen.insert((left, right))).then(|| (left.to_string(), right.to_string()))
        })
        .collect())
}

/// Byte-level BPE over `tokens` and `tokenizer.ggml.merges`, split first as `pre` says.
fn byte_level(keys: &Keys<'_>, vocab: Vocab, pre: &PreTokenizer) -> Result<Tokenizer> {
    let merges = file_merges(keys, &vocab)?;
    let error = |source: tokenizers::Error| Error::Tokenizer { path: keys.origin.to_path_buf(), source };
    // No unknown token: llama.cpp drops the characters no token covers.
    let model =
        BPE::builder().vocab_and_merges(vocab, merges).ignore_merges(pre.ignore_merges).build().map_err(error)?;
    let mut splits = Vec::with_capacity(pre.regexes.len() + 1);
    for regex in pre.regexes {
        let split = Split::new(SplitPattern::Regex((*regex).to_string()), SplitDelimiterBehavior::Isolated, false)
            .map_err(error)?;
        splits.push(PreTokenizerWrapper::Split(split));
    }
    splits.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)));
    let mut tokenizer = Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(PreTokenizerSequence::new(splits)));
    tokenizer.with_decoder(Some(ByteLevel::new(false, false, false)));
    Ok(tokenizer)
}

/// SentencePiece as llama.cpp encodes it: BPE by score with byte fallback, spaces as `▁`.
fn sentence_piece(
    origin: &Path,
    tokens: &[String],
    vocab: Vocab,
    scores: Option<&[f32]>,
    unknown: Option<String>,
    add_space_prefix: bool,
) -> Result<Tokenizer> {
    let error = |source: tokenizers::Error| Error::Tokenizer { path: origin.to_path_buf(), source };
    let merges = merges_by_score(origin, tokens, scores)?;
    let mut model = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true).fuse_unk(true);
    if let Some(unknown) = unknown {
        model = model.unk_token(unknown);
    }
    let mut tokenizer = Tokenizer::new(model.build().map_err(error)?);
    // A space goes in front of every piece of text, the first and each one after an added
    // token, as llama.cpp does; then every space is a `▁`.
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if add_space_prefix {
        normalizers.push(Prepend::new(SPACE_MARK.to_string()).into());
    }
    normalizers.push(Replace::new(" ", SPACE_MARK).map_err(error)?.into());
    tokenizer.with_normalizer(Some(NormalizerSequence::new(normalizers))).map_err(error)?;
    let mut decoders: Vec<DecoderWrapper> =
        vec![Replace::new(SPACE_MARK, " ").map_err(error)?.into(), ByteFallback::new().into(), Fuse::new().into()];
    if add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

/// The merges that make BPE choose as SentencePiece does: every split of a token into two
/// tokens, ranked by the score of the token they make, highest first (ties by that token's id,
/// then by the ids of its parts). llama.cpp breaks a tie of scores by the leftmost pair in the
/// text instead, which no ranking can express; vocabularies give their tokens distinct scores.
///
/// The splits are found in time linear in the vocabulary's bytes (after sorting it): a token's
/// prefixes that are tokens are a chain of "longest proper prefix that is a token" links, its
/// suffixes likewise, and a split is a length on both chains. Trying every cut of every token
/// instead hashes each token once per character, quadratic in its length.
///
/// # Errors
/// When the merges' text would pass [`MAX_MERGE_BYTES`]: the tokens' halves are tokens far more
/// often than in any trained vocabulary (a vocabulary of `a`, `aa`, `aaa`, ... has merges whose
/// text grows with the cube of its size).
fn merges_by_score(origin: &Path, tokens: &[String], scores: Option<&[f32]>) -> Result<Vec<(String, String)>> {
    let prefixes = longest_proper_parts(tokens, |a, b| a.cmp(b), |token, part| token.starts_with(part));
    let suffixes =
        longest_proper_parts(tokens, |a, b| a.iter().rev().cmp(b.iter().rev()), |token, part| token.ends_with(part));
    let score = |id: usize| scores.and_then(|scores| scores.get(id)).copied().unwrap_or(0.0);
    let mut merges: Vec<(u32, u32, u32)> = Vec::new();
    let mut text = 0usize;
    // The ids of a token's proper prefixes that are tokens (longest first), and of its suffixes.
    let (mut left_parts, mut right_parts) = (Vec::new(), Vec::new());
    for (id, token) in tokens.iter().enumerate() {
        let chain = |links: &[Option<u32>], into: &mut Vec<u32>| {
            into.clear();
            let mut link = links[id];
            while let Some(part) = link {
                into.push(part);
                link = links[part as usize];
            }
        };
        chain(&prefixes, &mut left_parts);
        chain(&suffixes, &mut right_parts);
        // Prefixes by decreasing length meet suffixes by increasing length where they split the
        // token in two; both lists are sorted, so one pass finds every split.
        let mut rights = right_parts.iter().rev().peekable();
        for &left in &left_parts {
            let wanted = token.len() - tokens[left as usize].len();
            while rights.next_if(|&&right| tokens[right as usize].len() < wanted).is_some() {}
            if let Some(&&right) = rights.peek().filter(|&&&right| tokens[right as usize].len() == wanted) {
                text += token.len();
                if text > MAX_MERGE_BYTES {
                    return Err(fail(
                        origin,
                        format!(
                            "the SentencePiece vocabulary `tokenizer.ggml.tokens` splits into pairs of its own tokens more often than a trained vocabulary does: by token {id} ({} bytes) the merges nnx derives from it hold more than {} MiB of text; the file is damaged or hostile, use one from a trusted converter",
                            token.len(),
                            MAX_MERGE_BYTES >> 20
                        ),
                    ));
                }
                merges.push((id as u32, left, right));
            }
        }
    }
    merges.sort_by(|a, b| score(b.0 as usize).total_cmp(&score(a.0 as usize)).then(a.cmp(b)));
    Ok(merges
        .into_iter()
        .map(|(_, left, right)| (tokens[left as usize].clone(), tokens[right as usize].clone()))
        .collect())
}

/// For each token, the id of its longest proper part that is a token, where `contains` says
/// which parts count (prefixes, or suffixes) and `order` sorts every token right after its parts
/// (byte order for prefixes, reversed byte order for suffixes).
///
/// In that order the tokens that are parts of a token form a stack: each one's parts are still
/// on it when it comes, and the others are popped. Every token is pushed and popped once, and
/// each test reads at most the part's bytes, so the pass is linear in the vocabulary's bytes.
/// Tokens are distinct.
fn longest_proper_parts(
    tokens: &[String],
    order: impl Fn(&[u8], &[u8]) -> std::cmp::Ordering,
    contains: impl Fn(&[u8], &[u8]) -> bool,
) -> Vec<Option<u32>> {
    let mut sorted: Vec<u32> = (0..tokens.len() as u32).collect();
    sorted.sort_unstable_by(|&a, &b| order(tokens[a as usize].as_bytes(), tokens[b as usize].as_bytes()));
    let mut links = vec![None; tokens.len()];
    let mut stack: Vec<u32> = Vec::new();
    for &id in &sorted {
        let token = tokens[id as usize].as_bytes();
        while let Some(&top) = stack.last() {
            let part = tokens[top as usize].as_bytes();
            if part.len() < token.len() && contains(token, part) {
                break;
            }
            stack.pop();
        }
        links[id as usize] = stack.last().copied();
        stack.push(id);
    }
    links
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The merges as first written: every cut of every token looked up in a map.
    fn every_cut(tokens: &[String], scores: &[f32]) -> Vec<(String, String)> {
        let ids: HashMap<&str, usize> = tokens.iter().enumerate().map(|(id, token)| (token.as_str(), id)).collect();
        let mut merges: Vec<(usize, usize, usize)> = Vec::new();
        for (id, token) in tokens.iter().enumerate() {
            for (at, _) in token.char_indices().skip(1) {
                if let (Some(&left), Some(&right)) = (ids.get(&token[..at]), ids.get(&token[at..])) {
                    merges.push((id, left, right));
                }
            }
        }
        merges.sort_by(|a, b| scores[b.0].total_cmp(&scores[a.0]).then(a.cmp(b)));
        merges.into_iter().map(|(_, left, right)| (tokens[left].clone(), tokens[right].clone())).collect()
    }

    /// Vocabularies of short words over a small alphabet (with a character of two bytes), so
    /// that most halves are tokens, give the same merges in the same order.
    #[test]
    fn chains_of_parts_find_every_cut() {
        let alphabet = ['a', 'b', '\u{e9}', '\u{2581}'];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..50 {
            let mut tokens: Vec<String> = Vec::new();
            let mut seen = HashSet::new();
            for _ in 0..(next() % 200) {
                let length = 1 + next() % 6;
                let token: String = (0..length).map(|_| alphabet[(next() % 4) as usize]).collect();
                if seen.insert(token.clone()) {
                    tokens.push(token);
                }
            }
            let scores: Vec<f32> = tokens.iter().map(|_| (next() % 16) as f32).collect();
            let ours = merges_by_score(Path::new("test.gguf"), &tokens, Some(&scores)).unwrap();
            assert_eq!(ours, every_cut(&tokens, &scores), "{tokens:?}");
        }
    }

    #[test]
    fn shown_text_is_escaped_and_cut() {
        assert_eq!(shown("a\u{1b}[2J"), "a\\u{1b}[2J");
        assert_eq!(shown(&"x".repeat(100)), format!("{}...", "x".repeat(64)));
    }
}
