//! Tokenizers built from GGUF metadata: byte-level BPE against the `tokenizer.json` it was
//! written from, SentencePiece against a small copy of llama.cpp's algorithm, and the errors.

use std::path::Path;

use nnx::generate::Tokenizer;
use nnx::gguf::{Array, GgufWriter, Metadata, Value};
use nnx::{Archive, Error, Tensor};
use serde_json::Value as Json;

use crate::util::{fixtures, run_nnx, scratch};

/// Whitespace runs, digits, text past ASCII, newlines, contractions and punctuation.
const TEXTS: &[&str] = &[
    "Hello world",
    "",
    " ",
    "  leading spaces,   inner runs   and trailing   ",
    "tabs\tand\nnewlines\n\n\nthen\r\nend\n",
    "digits 1234567890 and 3.14159, 42nd, 1000000",
    "caf\u{e9}, na\u{ef}ve, Gr\u{fc}\u{df}e, \u{65e5}\u{672c}\u{8a9e}, emoji \u{1f642}, \u{a0}non-breaking\u{2003}space",
    "don't I'll we've they're she's it'd I'm DON'T",
    "(x) [y] {z} x+=1; a->b <= c || d && !e ~f ^g `h` $i",
    "the quick brown fox jumps over the lazy dog. THE END!",
];

/// Texts with the special tokens of the fixture folders written in them.
const SPECIAL_TEXTS: &[&str] = &[
    "<|endoftext|>",
    "one<|endoftext|>two <|endoftext|> three<|endoftext|>",
    "<s>start</s> and <unk> in between<s>",
    " <s> spaced </s> ",
];

/// Writes `metadata` as a GGUF file of one small tensor and opens it again.
fn roundtrip(metadata: &Metadata, path: &Path) -> Tokenizer {
    let mut writer = GgufWriter::new();
    for (key, value) in metadata.iter() {
        writer.metadata_mut().set(key, value.clone());
    }
    writer.add_tensor("token_embd.weight", &Tensor::from_vec(vec![0f32; 4], &[1, 4]).unwrap()).unwrap();
    writer.write(path).unwrap();
    let archive = Archive::open(path).unwrap();
    Tokenizer::from_gguf(archive.gguf_metadata().expect("GGUF metadata"), path).unwrap()
}

fn strings(items: impl IntoIterator<Item = impl Into<String>>) -> Value {
    Value::Array(Array::String(items.into_iter().map(Into::into).collect()))
}

/// The tokenizer metadata llama.cpp's converter writes for a byte-level BPE `tokenizer.json`.
fn gpt2_metadata(folder: &Path, pre: &str) -> Metadata {
    let json: Json = serde_json::from_str(&std::fs::read_to_string(folder.join("tokenizer.json")).unwrap()).unwrap();
    let vocab = json["model"]["vocab"].as_object().unwrap();
    let mut tokens = vec![String::new(); vocab.len()];
    for (token, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = token.clone();
    }
    let mut types = vec![1i32; tokens.len()];
    for added in json["added_tokens"].as_array().unwrap() {
        types[added["id"].as_u64().unwrap() as usize] = if added["special"] == true { 3 } else { 4 };
    }
    let merges: Vec<String> = json["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| format!("{} {}", pair[0].as_str().unwrap(), pair[1].as_str().unwrap()))
        .collect();
    let mut metadata = Metadata::new();
    metadata.set("general.architecture", Value::String("gpt2".into()));
    metadata.set("tokenizer.ggml.model", Value::String("gpt2".into()));
    metadata.set("tokenizer.ggml.pre", Value::String(pre.into()));
    metadata.set("tokenizer.ggml.tokens", strings(tokens));
    metadata.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    metadata.set("tokenizer.ggml.merges", strings(merges));
    metadata.set("tokenizer.ggml.bos_token_id", Value::U32(0));
    metadata.set("tokenizer.ggml.eos_token_id", Value::U32(0));
    metadata
}

fn encode_all(tokenizer: &Tokenizer, texts: &[&str]) -> Vec<Vec<u32>> {
    texts.iter().map(|text| tokenizer.encode(text).unwrap()).collect()
}

#[test]
fn gpt2_vocabulary_gives_the_ids_of_its_tokenizer_json() {
    let folder = fixtures().join("gpt2-tiny");
    let dir = scratch();
    let reference = Tokenizer::from_folder(&folder).unwrap();
    let gguf = roundtrip(&gpt2_metadata(&folder, "gpt-2"), &dir.path().join("gpt2.gguf"));
    assert_eq!(gguf.vocab_size(), reference.vocab_size());
    let texts: Vec<&str> = TEXTS.iter().chain(SPECIAL_TEXTS).copied().collect();
    for (text, (ours, expected)) in
        texts.iter().zip(encode_all(&gguf, &texts).iter().zip(encode_all(&reference, &texts)))
    {
        assert_eq!(ours, &expected, "ids of {text:?}");
    }
    for text in TEXTS {
        let ids = gguf.encode(text).unwrap();
        assert_eq!(gguf.decode(&ids).unwrap(), *text, "decoded ids of {text:?}");
    }
    let ids = gguf.encode("one<|endoftext|>two").unwrap();
    assert!(ids.contains(&0), "the control token written in the text is matched: {ids:?}");
    assert_eq!(gguf.decode(&ids).unwrap(), "onetwo", "control tokens are left out of decoded text");
}

/// llama.cpp's `default` pre-tokenizer is not GPT-2's: punctuation runs are split off first,
/// then GPT-2's expression, then digit runs, then runs of three ASCII digits.
#[test]
fn default_pre_tokenizer_splits_as_llama_cpp() {
    let folder = fixtures().join("gpt2-tiny");
    let dir = scratch();
    let reference = Tokenizer::from_folder(&folder).unwrap();
    let gguf = roundtrip(&gpt2_metadata(&folder, "default"), &dir.path().join("default.gguf"));
    let pieces =
        |pieces: &[&str]| -> Vec<u32> { pieces.iter().flat_map(|piece| reference.encode(piece).unwrap()).collect() };
    for (text, split) in [
        ("don't", &["don", "'", "t"][..]),
        (" (x) y", &[" ", "(", "x", ")", " y"]),
        ("x+=1000", &["x", "+=", "100", "0"]),
        (" 12345 and", &[" ", "123", "45", " and"]),
        ("a, b", &["a", ",", " b"]),
    ] {
        assert_eq!(gguf.encode(text).unwrap(), pieces(split), "ids of {text:?}");
    }
    assert_ne!(
        gguf.encode(" 12345").unwrap(),
        reference.encode(" 12345").unwrap(),
        "GPT-2's expression keeps ` 12345` whole"
    );
}

/// `llama-bpe` (Llama 3's expression): digits in runs of at most three, one character that is
/// not a letter or digit in front of a word, a BOS token by default.
#[test]
fn llama3_pre_tokenizer_splits_digits_by_three_and_adds_bos() {
    let folder = fixtures().join("gpt2-tiny");
    let dir = scratch();
    let reference = Tokenizer::from_folder(&folder).unwrap();
    let gguf = roundtrip(&gpt2_metadata(&folder, "llama-bpe"), &dir.path().join("llama3.gguf"));
    let pieces = |pieces: &[&str]| -> Vec<u32> {
        std::iter::once(0).chain(pieces.iter().flat_map(|piece| reference.encode(piece).unwrap())).collect()
    };
    for (text, split) in [
        ("1234567", &["123", "456", "7"][..]),
        ("x 1000", &["x", " ", "100", "0"]),
        ("a  b\n\nc", &["a", " ", " b", "\n\n", "c"]),
        ("hello world", &["hello", " world"]),
    ] {
        assert_eq!(gguf.encode(text).unwrap(), pieces(split), "ids of {text:?}");
    }
}

#[test]
fn converted_llama_folder_gives_the_ids_of_its_tokenizer_json() {
    let folder = fixtures().join("llama-tiny");
    let dir = scratch();
    let output = dir.path().join("llama.gguf");
    let (code, _, err) = run_nnx(&["convert", folder.to_str().unwrap(), output.to_str().unwrap(), "--type", "f32"]);
    assert_eq!(code, 0, "nnx convert failed:\n{err}");
    let reference = Tokenizer::from_folder(&folder).unwrap();
    let archive = Archive::open(&output).unwrap();
    let metadata = archive.gguf_metadata().expect("GGUF metadata");
    let texts: Vec<&str> = TEXTS.iter().chain(SPECIAL_TEXTS).copied().collect();
    let expected = encode_all(&reference, &texts);

    // The folder's tokenizer adds <s>, and so does the file (`add_bos_token`).
    let gguf = Tokenizer::from_gguf(metadata, &output).unwrap();
    for (text, (ours, expected)) in texts.iter().zip(encode_all(&gguf, &texts).iter().zip(&expected)) {
        assert_eq!(expected.first(), Some(&1), "the folder's tokenizer adds <s> to {text:?}");
        assert_eq!(ours, expected, "ids of {text:?}");
    }
    // Without the key, llama.cpp adds no <s> to a `default` byte-level vocabulary.
    let mut without = metadata.clone();
    without.remove("tokenizer.ggml.add_bos_token");
    let gguf = Tokenizer::from_gguf(&without, &output).unwrap();
    for (text, (ours, expected)) in texts.iter().zip(encode_all(&gguf, &texts).iter().zip(&expected)) {
        assert_eq!(ours[..], expected[1..], "ids of {text:?} without `add_bos_token`");
    }
}

/// llama.cpp's SentencePiece encoding, written plainly: the text is cut around the control,
/// unknown and user-defined tokens (longest first), each other piece gets a leading space
/// when `space_prefix`, its spaces become `▁`, and then the neighbouring pair whose
/// concatenation is the token of highest score (the leftmost of equal ones) is merged until no
/// pair is a token; what is left and not a token is spelled as `<0xNN>` tokens.
struct Reference {
    tokens: Vec<String>,
    scores: Vec<f32>,
    types: Vec<i32>,
    space_prefix: bool,
    bos: bool,
    eos: bool,
}

impl Reference {
    fn id(&self, text: &str) -> Option<u32> {
        self.tokens.iter().position(|token| token == text).map(|id| id as u32)
    }

    fn encode(&self, text: &str) -> Vec<u32> {
        let mut special: Vec<usize> = (0..self.tokens.len()).filter(|&id| matches!(self.types[id], 2..=4)).collect();
        special.sort_by_key(|&id| std::cmp::Reverse(self.tokens[id].len()));
        // Fragments: Ok(text) or Err(token id).
        let mut fragments: Vec<Result<String, u32>> = vec![Ok(text.to_string())];
        for id in special {
            let token = &self.tokens[id];
            fragments = fragments
                .into_iter()
                .flat_map(|fragment| match fragment {
                    Ok(text) => {
                        let mut out = Vec::new();
                        let mut rest = text.as_str();
                        while let Some(at) = rest.find(token.as_str()) {
                            if at > 0 {
                                out.push(Ok(rest[..at].to_string()));
                            }
                            out.push(Err(id as u32));
                            rest = &rest[at + token.len()..];
                        }
                        if !rest.is_empty() {
                            out.push(Ok(rest.to_string()));
                        }
                        out
                    }
                    token => vec![token],
                })
                .collect();
        }
        let mut ids = Vec::new();
        if self.bos {
            ids.push(1);
        }
        for fragment in fragments {
            match fragment {
                Err(id) => ids.push(id),
                Ok(text) => {
                    let text = if self.space_prefix { format!(" {text}") } else { text };
                    ids.extend(self.pieces(&text.replace(' ', "\u{2581}")));
                }
            }
        }
        if self.eos {
            ids.push(2);
        }
        ids
    }

    fn pieces(&self, text: &str) -> Vec<u32> {
        let mut symbols: Vec<String> = text.chars().map(String::from).collect();
        loop {
            let mut best: Option<(usize, f32)> = None;
            for at in 0..symbols.len().saturating_sub(1) {
                if let Some(id) = self.id(&format!("{}{}", symbols[at], symbols[at + 1])) {
                    let score = self.scores[id as usize];
                    if best.is_none_or(|(_, best)| score > best) {
                        best = Some((at, score));
                    }
                }
            }
            let Some((at, _)) = best else { break };
            let right = symbols.remove(at + 1);
            symbols[at].push_str(&right);
        }
        symbols
            .iter()
            .flat_map(|symbol| match self.id(symbol) {
                Some(id) => vec![id],
                None => symbol.bytes().map(|byte| self.id(&format!("<0x{byte:02X}>")).expect("byte token")).collect(),
            })
            .collect()
    }

    fn metadata(&self) -> Metadata {
        let mut metadata = Metadata::new();
        metadata.set("general.architecture", Value::String("llama".into()));
        metadata.set("tokenizer.ggml.model", Value::String("llama".into()));
        metadata.set("tokenizer.ggml.tokens", strings(self.tokens.clone()));
        metadata.set("tokenizer.ggml.scores", Value::Array(Array::F32(self.scores.clone())));
        metadata.set("tokenizer.ggml.token_type", Value::Array(Array::I32(self.types.clone())));
        metadata.set("tokenizer.ggml.bos_token_id", Value::U32(1));
        metadata.set("tokenizer.ggml.eos_token_id", Value::U32(2));
        metadata.set("tokenizer.ggml.unknown_token_id", Value::U32(0));
        metadata.set("tokenizer.ggml.add_bos_token", Value::Bool(self.bos));
        metadata.set("tokenizer.ggml.add_eos_token", Value::Bool(self.eos));
        metadata.set("tokenizer.ggml.add_space_prefix", Value::Bool(self.space_prefix));
        metadata
    }
}

/// A small SentencePiece vocabulary: `<unk>`, `<s>`, `</s>`, the 256 byte tokens, pieces whose
/// scores do not follow their ids (so that merging by score, by id or longest-first differ),
/// a user-defined and a control token.
fn sentence_piece() -> Reference {
    let mut vocab: Vec<(String, f32, i32)> =
        vec![("<unk>".into(), 0.0, 2), ("<s>".into(), 0.0, 3), ("</s>".into(), 0.0, 3)];
    vocab.extend((0..=255u8).map(|byte| (format!("<0x{byte:02X}>"), 0.0, 6)));
    let pieces: &[(&str, f32)] = &[
        ("\u{2581}", -1.0),
        ("e", -2.0),
        ("t", -3.0),
        ("h", -4.0),
        ("a", -5.0),
        ("o", -6.0),
        ("l", -7.0),
        ("w", -8.0),
        ("r", -9.0),
        ("d", -10.0),
        ("n", -11.0),
        ("c", -12.0),
        ("f", -13.0),
        ("\u{e9}", -14.0),
        ("s", -15.0),
        ("he", -20.0),
        ("\u{2581}t", -60.0),
        ("th", -30.0),
        ("\u{2581}the", -25.0),
        ("ll", -21.0),
        ("lo", -22.0),
        ("llo", -40.0),
        ("\u{2581}he", -45.0),
        ("\u{2581}h", -70.0),
        ("\u{2581}hello", -35.0),
        ("or", -23.0),
        ("\u{2581}w", -50.0),
        ("\u{2581}wor", -55.0),
        ("ld", -24.0),
        ("\u{2581}world", -36.0),
        ("an", -26.0),
        ("\u{2581}a", -27.0),
        ("nd", -28.0),
        ("\u{2581}and", -29.0),
        ("\u{2581}an", -31.0),
        ("ca", -32.0),
        ("af", -33.0),
        ("\u{2581}caf", -65.0),
        ("f\u{e9}", -34.0),
        ("\u{2581}\u{2581}", -37.0),
        ("\u{2581}\u{2581}\u{2581}\u{2581}", -38.0),
        ("es", -39.0),
        ("\u{2581}s", -41.0),
        ("ee", -42.0),
    ];
    // Listed in reverse, so that the ids run against the scores.
    vocab.extend(pieces.iter().rev().map(|&(piece, score)| (piece.to_string(), score, 1)));
    vocab.push(("<|user|>".into(), 0.0, 4));
    vocab.push(("<|end|>".into(), 0.0, 3));
    Reference {
        tokens: vocab.iter().map(|(token, ..)| token.clone()).collect(),
        scores: vocab.iter().map(|&(_, score, _)| score).collect(),
        types: vocab.iter().map(|&(.., kind)| kind).collect(),
        space_prefix: true,
        bos: true,
        eos: false,
    }
}

const SPM_TEXTS: &[&str] = &[
    "the",
    "hello world",
    "the hello and the world",
    "Hello World",
    "  two    spaces  ",
    "tab\tand\nnewline\n",
    "caf\u{e9} \u{2615} \u{65e5}\u{672c}",
    "theee seeds",
    "12345",
    "<s>the</s>",
    "hello<|user|>world <|end|> and",
    "<|end|>",
    "",
];

#[test]
fn sentence_piece_vocabulary_merges_by_score_as_llama_cpp() {
    let dir = scratch();
    let reference = sentence_piece();
    // The pieces merge by score: "the" is ▁ t h e -> ▁ t he -> ▁t he -> ▁the, not ▁ th e.
    assert_eq!(reference.pieces("\u{2581}the"), [reference.id("\u{2581}the").unwrap()]);
    let gguf = roundtrip(&reference.metadata(), &dir.path().join("spm.gguf"));
    for text in SPM_TEXTS {
        assert_eq!(gguf.encode(text).unwrap(), reference.encode(text), "ids of {text:?}");
    }
    for text in
        ["the hello and the world", "  two    spaces  ", "caf\u{e9} \u{2615} \u{65e5}\u{672c}", "tab\tand\nnewline\n"]
    {
        let ids = gguf.encode(text).unwrap();
        assert_eq!(gguf.decode(&ids).unwrap(), text, "decoded ids of {text:?}");
    }
}

#[test]
fn sentence_piece_settings_are_read() {
    let dir = scratch();
    for (space_prefix, bos, eos) in [(false, true, false), (true, false, true), (false, false, false)] {
        let reference = Reference { space_prefix, bos, eos, ..sentence_piece() };
        let gguf = roundtrip(&reference.metadata(), &dir.path().join("spm.gguf"));
        for text in SPM_TEXTS {
            assert_eq!(
                gguf.encode(text).unwrap(),
                reference.encode(text),
                "ids of {text:?} ({space_prefix}, {bos}, {eos})"
            );
        }
    }
    // Without the keys: a space prefix and <s>, no </s>.
    let reference = sentence_piece();
    let mut metadata = reference.metadata();
    for key in ["add_bos_token", "add_eos_token", "add_space_prefix"] {
        metadata.remove(&format!("tokenizer.ggml.{key}"));
    }
    let gguf = Tokenizer::from_gguf(&metadata, Path::new("spm.gguf")).unwrap();
    assert_eq!(gguf.encode("hello world").unwrap(), reference.encode("hello world"));
}

fn refused(metadata: &Metadata) -> String {
    match Tokenizer::from_gguf(metadata, Path::new("model.gguf")) {
        Err(error @ Error::Tokenizer { .. }) => error.to_string(),
        Err(other) => panic!("another error: {other}"),
        Ok(_) => panic!("a tokenizer was built"),
    }
}

#[test]
fn unknown_models_and_pre_tokenizers_are_named() {
    let folder = fixtures().join("gpt2-tiny");
    let mut metadata = gpt2_metadata(&folder, "gpt-2");

    metadata.set("tokenizer.ggml.pre", Value::String("no-such-pre".into()));
    let message = refused(&metadata);
    assert!(message.contains("model.gguf"), "{message}");
    assert!(message.contains("`no-such-pre`"), "{message}");
    assert!(message.contains("llama-bpe") && message.contains("qwen2") && message.contains("default"), "{message}");

    metadata.set("tokenizer.ggml.pre", Value::String("gpt-2".into()));
    metadata.set("tokenizer.ggml.model", Value::String("t5".into()));
    let message = refused(&metadata);
    assert!(message.contains("`t5`") && message.contains("tokenizer.ggml.model"), "{message}");

    metadata.remove("tokenizer.ggml.model");
    assert!(refused(&metadata).contains("tokenizer.ggml.model"));

    metadata.set("tokenizer.ggml.model", Value::String("gpt2".into()));
    metadata.set("tokenizer.ggml.token_type", Value::Array(Array::I32(vec![1; 3])));
    let message = refused(&metadata);
    assert!(message.contains("tokenizer.ggml.token_type"), "{message}");

    let mut metadata = gpt2_metadata(&folder, "gpt-2");
    metadata.remove("tokenizer.ggml.bos_token_id");
    metadata.set("tokenizer.ggml.tokens", strings(["a", "b", "ab"]));
    metadata.set("tokenizer.ggml.token_type", Value::Array(Array::I32(vec![1; 3])));
    metadata.set("tokenizer.ggml.merges", strings(["a b"]));
    metadata.set("tokenizer.ggml.add_bos_token", Value::Bool(true));
    let message = refused(&metadata);
    assert!(message.contains("bos_token_id"), "{message}");

    metadata.set("tokenizer.ggml.tokens", strings(["a", "b", "a"]));
    let message = refused(&metadata);
    assert!(message.contains("`a` twice"), "{message}");
}

#[test]
fn missing_merges_are_no_merges_and_unknown_characters_are_dropped() {
    let mut metadata = Metadata::new();
    metadata.set("tokenizer.ggml.model", Value::String("gpt2".into()));
    metadata.set("tokenizer.ggml.pre", Value::String("gpt-2".into()));
    metadata.set("tokenizer.ggml.tokens", strings(["a", "b", "ab", "\u{120}"]));
    let gguf = Tokenizer::from_gguf(&metadata, Path::new("bpe.gguf")).unwrap();
    assert_eq!(gguf.encode("ab ba c").unwrap(), [0, 1, 3, 1, 0, 3]);
    metadata.set("tokenizer.ggml.merges", strings(["a b", "x y"]));
    let gguf = Tokenizer::from_gguf(&metadata, Path::new("bpe.gguf")).unwrap();
    assert_eq!(gguf.encode("ab ba").unwrap(), [2, 3, 1, 0]);
}

/// Every pre-tokenizer the error message lists builds (its regular expressions compile) and
/// encodes text.
#[test]
fn every_known_pre_tokenizer_builds() {
    let folder = fixtures().join("gpt2-tiny");
    let mut metadata = gpt2_metadata(&folder, "no-such-pre");
    let message = refused(&metadata);
    let known = message.split("it knows ").nth(1).expect("a list of names");
    let names: Vec<&str> = known.split(", ").map(str::trim).collect();
    assert!(names.len() > 50, "{names:?}");
    for name in names {
        metadata.set("tokenizer.ggml.pre", Value::String(name.into()));
        let tokenizer = Tokenizer::from_gguf(&metadata, Path::new("model.gguf"))
            .unwrap_or_else(|error| panic!("pre-tokenizer `{name}`: {error}"));
        for text in TEXTS {
            let ids = tokenizer.encode(text).unwrap();
            assert_eq!(tokenizer.decode(&ids).unwrap(), *text, "`{name}` on {text:?}");
        }
    }
}

/// The ids of llama.cpp's own tokenizer (`llama-tokenize`), committed as goldens by
/// `scripts/llamacpp/tokenizer_goldens.py`: the gpt2-tiny vocabulary under four
/// `tokenizer.ggml.pre` values, on texts with whitespace runs, digits, contractions, non-ASCII
/// and special tokens written in the text.
#[test]
fn ids_equal_llama_cpps_tokenizer_on_its_goldens() {
    let goldens: Json =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("gguf/llamacpp/tokenizer.json")).unwrap())
            .unwrap();
    let tokenizer: Json =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("gpt2-tiny/tokenizer.json")).unwrap()).unwrap();
    let vocab = tokenizer["model"]["vocab"].as_object().unwrap();
    let mut tokens = vec![String::new(); vocab.len()];
    for (token, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = token.clone();
    }
    let mut types = vec![1i32; tokens.len()];
    for added in tokenizer["added_tokens"].as_array().unwrap() {
        types[added["id"].as_u64().unwrap() as usize] = 3;
    }
    let merges: Vec<String> = tokenizer["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|merge| match merge {
            Json::String(text) => text.clone(),
            pair => format!("{} {}", pair[0].as_str().unwrap(), pair[1].as_str().unwrap()),
        })
        .collect();
    let mut checked = 0;
    for (pre, cases) in goldens["cases"].as_object().unwrap() {
        let mut metadata = Metadata::new();
        metadata.set("general.architecture", Value::String("llama".into()));
        metadata.set("tokenizer.ggml.model", Value::String("gpt2".into()));
        metadata.set("tokenizer.ggml.pre", Value::String(pre.clone()));
        metadata.set("tokenizer.ggml.tokens", Value::Array(Array::String(tokens.clone())));
        metadata.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types.clone())));
        metadata.set("tokenizer.ggml.merges", Value::Array(Array::String(merges.clone())));
        metadata.set("tokenizer.ggml.bos_token_id", Value::U32(0));
        metadata.set("tokenizer.ggml.eos_token_id", Value::U32(0));
        let tokenizer = Tokenizer::from_gguf(&metadata, Path::new("goldens.gguf")).unwrap();
        for case in cases.as_array().unwrap() {
            let text = case[0].as_str().unwrap();
            let expected: Vec<u32> = serde_json::from_value(case[1].clone()).unwrap();
            assert_eq!(tokenizer.encode(text).unwrap(), expected, "pre `{pre}`, text {text:?}");
            checked += 1;
        }
    }
    assert_eq!(checked, 48);
}

#[test]
fn the_command_line_tokenizes_with_a_gguf_files_tokenizer_as_with_the_folders() {
    let dir = scratch();
    let folder = fixtures().join("llama-tiny");
    let gguf = dir.path().join("llama-tiny.gguf");
    let (code, _, stderr) = run_nnx(&["convert".as_ref(), folder.as_os_str(), gguf.as_os_str()]);
    assert_eq!(code, 0, "{stderr}");
    let generation: Json =
        serde_json::from_str(&std::fs::read_to_string(folder.join("generation.json")).unwrap()).unwrap();
    let prompt = generation["prompt"].as_str().unwrap();
    for model in [gguf.as_os_str(), folder.as_os_str()] {
        let (code, stdout, stderr) = run_nnx(&["tokenize".as_ref(), model, prompt.as_ref()]);
        assert_eq!(code, 0, "{stderr}");
        let ids: Json = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(ids, generation["prompt_ids"], "the ids transformers gives, with its BOS");
    }
    let (code, _, stderr) = run_nnx(&["tokenize".as_ref(), folder.join("model.safetensors").as_os_str(), "x".as_ref()]);
    assert_ne!(code, 0);
    assert!(stderr.contains("not a GGUF file or a model folder"), "{stderr}");
}
