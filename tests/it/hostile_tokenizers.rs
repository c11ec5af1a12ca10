//! Hostile tokenizers: GGUF vocabularies and tokenizer files whose merges, tokens or control
//! tokens would take memory or time far beyond their size. Each runs `nnx tokenize` in a child
//! process under an address-space limit and a timeout and prints its peak memory and time;
//! valid but large vocabularies must load and tokenize as a small one does.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nnx::generate::Tokenizer;
use nnx::gguf::{Array, GgufWriter, Metadata, Value};
use nnx::{Error, Tensor};

use crate::util::{Bounded, run_nnx_bounded, scratch, text};

/// The address space each run may use.
const MEMORY: u64 = 3 << 30;

/// How long a run may take.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `nnx` with `args` under [`MEMORY`] and [`TIMEOUT`], printing its peak memory, time and
/// the size of `input` as `case`.
fn run(case: &str, input: &Path, args: &[&str]) -> Bounded {
    let started = Instant::now();
    let bounded = run_nnx_bounded(args, &[], MEMORY, TIMEOUT);
    let size = std::fs::metadata(input).map_or(0, |metadata| metadata.len());
    eprintln!(
        "{case}: input {} KiB, peak_memory {} MiB, {:.1} s",
        size >> 10,
        bounded.peak_memory >> 20,
        started.elapsed().as_secs_f64()
    );
    bounded
}

/// `nnx tokenize input text`.
fn tokenize(case: &str, input: &Path, text_to_tokenize: &str) -> Bounded {
    run(case, input, &["tokenize", text(input), text_to_tokenize])
}

/// Asserts that `bounded` succeeded and returns the ids it printed.
fn ids(bounded: &Bounded) -> Vec<u32> {
    assert!(!bounded.timed_out, "nnx ran past its timeout:\n{}", bounded.stderr);
    assert_eq!(bounded.code, Some(0), "nnx failed:\n{}", bounded.stderr);
    serde_json::from_str(bounded.stdout.trim()).expect("a JSON array of ids")
}

/// Asserts a refusal naming `entry` and the file.
fn refused(bounded: &Bounded, entry: &str, file: &Path) {
    bounded.assert_refused(entry);
    assert!(bounded.stderr.contains(text(file)), "the error names the file:\n{}", bounded.stderr);
}

fn strings(items: impl IntoIterator<Item = impl Into<String>>) -> Value {
    Value::Array(Array::String(items.into_iter().map(Into::into).collect()))
}

/// Writes `metadata` as a GGUF file of one small tensor, as a model file has.
fn write_gguf(metadata: &Metadata, path: &Path) -> PathBuf {
    let mut writer = GgufWriter::new();
    for (key, value) in metadata.iter() {
        writer.metadata_mut().set(key, value.clone());
    }
    writer.add_tensor("token_embd.weight", &Tensor::from_vec(vec![0f32; 4], &[1, 4]).unwrap()).unwrap();
    writer.write(path).unwrap();
    path.to_path_buf()
}

/// A SentencePiece vocabulary: `<unk>`, `<s>`, `</s>`, the 256 byte tokens, then `pieces` with
/// their scores, all of them normal tokens.
fn sentence_piece(pieces: impl IntoIterator<Item = (String, f32)>) -> Metadata {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    tokens.extend((0..=255u8).map(|byte| format!("<0x{byte:02X}>")));
    types.extend([6; 256]);
    let mut scores = vec![0.0f32; tokens.len()];
    for (piece, score) in pieces {
        tokens.push(piece);
        scores.push(score);
        types.push(1);
    }
    let mut metadata = Metadata::new();
    metadata.set("general.architecture", Value::String("llama".into()));
    metadata.set("tokenizer.ggml.model", Value::String("llama".into()));
    metadata.set("tokenizer.ggml.tokens", strings(tokens));
    metadata.set("tokenizer.ggml.scores", Value::Array(Array::F32(scores)));
    metadata.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    metadata.set("tokenizer.ggml.bos_token_id", Value::U32(1));
    metadata.set("tokenizer.ggml.eos_token_id", Value::U32(2));
    metadata.set("tokenizer.ggml.unknown_token_id", Value::U32(0));
    metadata
}

/// A byte-level BPE vocabulary of `tokens` (all normal) and `merges`.
fn byte_pairs(tokens: Vec<String>, merges: Vec<String>) -> Metadata {
    let mut metadata = Metadata::new();
    metadata.set("general.architecture", Value::String("gpt2".into()));
    metadata.set("tokenizer.ggml.model", Value::String("gpt2".into()));
    metadata.set("tokenizer.ggml.pre", Value::String("gpt-2".into()));
    metadata.set("tokenizer.ggml.token_type", Value::Array(Array::I32(vec![1; tokens.len()])));
    metadata.set("tokenizer.ggml.tokens", strings(tokens));
    metadata.set("tokenizer.ggml.merges", strings(merges));
    metadata
}

/// `a`, `aa`, `aaa`, ... up to 2,450 bytes: 3 MB in which every split of every token is two
/// tokens, so the merges derived from it would hold about 5 GB of text.
#[test]
fn sentence_piece_vocabulary_of_nested_runs_is_refused() {
    let dir = scratch();
    let pieces = (1..=2450).map(|length| ("a".repeat(length), length as f32));
    let path = write_gguf(&sentence_piece(pieces), &dir.path().join("runs.gguf"));
    let bounded = tokenize("nested runs", &path, "aaaa");
    refused(&bounded, "tokenizer.ggml.tokens", &path);
    assert!(bounded.stderr.contains("MiB of text"), "{}", bounded.stderr);
}

/// One token of 1 MiB used to take minutes to split; it is refused by name.
#[test]
fn megabyte_token_is_refused() {
    let dir = scratch();
    let pieces = [("a".to_string(), -1.0), ("b".repeat(1 << 20), -2.0)];
    let path = write_gguf(&sentence_piece(pieces), &dir.path().join("long.gguf"));
    let bounded = tokenize("1 MiB token", &path, "ab");
    refused(&bounded, "token 260 of `tokenizer.ggml.tokens` is 1048576 bytes long", &path);
}

/// A control token of 2 MiB (a 64 MiB one used to take 5.8 GB in the matching automaton).
#[test]
fn huge_control_token_in_a_gguf_is_refused() {
    let dir = scratch();
    let mut tokens: Vec<String> = vec!["a".into(), "b".into()];
    tokens.push(format!("<|{}|>", "x".repeat(2 << 20)));
    let mut metadata = byte_pairs(tokens, vec![]);
    metadata.set("tokenizer.ggml.token_type", Value::Array(Array::I32(vec![1, 1, 3])));
    let path = write_gguf(&metadata, &dir.path().join("control.gguf"));
    let bounded = tokenize("2 MiB control token", &path, "ab");
    refused(&bounded, "token 2 of `tokenizer.ggml.tokens`", &path);
}

/// Many control tokens of a few KiB each: each is allowed, their sum is not.
#[test]
fn too_much_control_token_text_is_refused() {
    let dir = scratch();
    let mut tokens: Vec<String> = vec!["a".into()];
    tokens.extend((0..400).map(|index| format!("<|{index}{}|>", "x".repeat(4000))));
    let mut types = vec![3i32; tokens.len()];
    types[0] = 1;
    let mut metadata = byte_pairs(tokens, vec![]);
    metadata.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    let path = write_gguf(&metadata, &dir.path().join("controls.gguf"));
    let bounded = tokenize("400 control tokens of 4 KB", &path, "a");
    refused(&bounded, "`tokenizer.ggml.token_type` marks too many tokens", &path);
}

/// A legitimate SentencePiece vocabulary of 3.3 MB (168,420 tokens, as many as large real ones
/// have): every word of up to four letters of a 20-letter alphabet, longer ones scored higher.
#[test]
fn large_sentence_piece_vocabulary_loads_and_tokenizes() {
    let dir = scratch();
    let letters: Vec<char> = "abcdefghijklmnoprstu".chars().collect();
    let mut words: Vec<String> = vec!["\u{2581}".into()];
    let mut previous: Vec<String> = vec![String::new()];
    for _ in 0..4 {
        previous =
            previous.iter().flat_map(|word| letters.iter().map(move |letter| format!("{word}{letter}"))).collect();
        words.extend(previous.iter().cloned());
    }
    let id = |word: &str| 259 + words.iter().position(|candidate| candidate == word).unwrap() as u32;
    let space = id("\u{2581}");
    let expected = vec![1, space, id("abcd"), space, id("tusr"), space, id("ab")];
    let pieces = words.iter().map(|word| (word.clone(), word.chars().count() as f32));
    let path = write_gguf(&sentence_piece(pieces), &dir.path().join("large.gguf"));
    assert!(std::fs::metadata(&path).unwrap().len() > 3_000_000);
    let bounded = tokenize("large SentencePiece vocabulary", &path, "abcd tusr ab");
    assert_eq!(ids(&bounded), expected);
    assert!(bounded.peak_memory < 1 << 30, "peak memory {} MiB", bounded.peak_memory >> 20);
}

/// 400,000 tokens of one to three bytes (5 MB): memory stays a small multiple of the file.
#[test]
fn many_tiny_tokens_load_in_bounded_memory() {
    let dir = scratch();
    let mut tokens: Vec<String> = ('a'..='z').map(String::from).collect();
    let mut index = 0u32;
    while tokens.len() < 400_000 {
        let token: String = char::from_u32(0x4e00 + index % 0x5000).into_iter().collect();
        let token =
            if index < 0x5000 { token } else { format!("{token}{}", (b'a' + (index / 0x5000 % 26) as u8) as char) };
        tokens.push(token);
        index += 1;
    }
    let path = write_gguf(&byte_pairs(tokens, vec![]), &dir.path().join("tiny.gguf"));
    let size = std::fs::metadata(&path).unwrap().len();
    let bounded = tokenize("400,000 tiny tokens", &path, "abc");
    assert_eq!(ids(&bounded), [0, 1, 2]);
    assert!(bounded.peak_memory < 60 * size + (256 << 20), "peak memory {} MiB", bounded.peak_memory >> 20);
}

/// Past two million tokens a vocabulary is refused before anything is built from it.
#[test]
fn millions_of_tokens_are_refused() {
    let tokens: Vec<String> = (0..(1u32 << 21) + 1).map(|index| format!("{index:x}")).collect();
    let metadata = byte_pairs(tokens, vec![]);
    let error = Tokenizer::from_gguf(&metadata, Path::new("many.gguf")).err().expect("refused");
    let message = error.to_string();
    assert!(matches!(error, Error::Tokenizer { .. }), "{message}");
    assert!(
        message.contains("many.gguf") && message.contains("`tokenizer.ggml.tokens` has 2097153 tokens"),
        "{message}"
    );
}

/// 300,000 merges of tokens the vocabulary does not have, and merges without a space, are left
/// out as llama.cpp leaves them out.
#[test]
fn merges_of_unknown_tokens_and_without_spaces_are_left_out() {
    let dir = scratch();
    let tokens: Vec<String> = ["a", "b", "ab"].map(String::from).to_vec();
    let mut merges: Vec<String> = (0..300_000).map(|index| format!("x{index} y{index}")).collect();
    merges.extend(["ab".into(), "a".into(), String::new(), " ".into(), "a b".into()]);
    let path = write_gguf(&byte_pairs(tokens, merges), &dir.path().join("merges.gguf"));
    let bounded = tokenize("300,000 unknown merges", &path, "ab ba");
    // `ab` is merged; the space is no token and is dropped.
    assert_eq!(ids(&bounded), [2, 1, 0]);
}

#[test]
fn duplicate_tokens_are_refused_by_index() {
    let dir = scratch();
    let tokens: Vec<String> = ["a", "b", "c", "b"].map(String::from).to_vec();
    let path = write_gguf(&byte_pairs(tokens, vec![]), &dir.path().join("twice.gguf"));
    let bounded = tokenize("duplicate tokens", &path, "ab");
    refused(&bounded, "`tokenizer.ggml.tokens` holds `b` twice (tokens 1 and 3)", &path);
}

/// `scores` and `token_type` must have one value per token.
#[test]
fn per_token_arrays_of_another_length_are_refused() {
    let dir = scratch();
    for (field, value) in [
        ("tokenizer.ggml.scores", Value::Array(Array::F32(vec![0.0; 5]))),
        ("tokenizer.ggml.token_type", Value::Array(Array::I32(vec![1; 100_000]))),
    ] {
        let mut metadata = sentence_piece([("a".to_string(), -1.0)]);
        metadata.set(field, value);
        let path = write_gguf(&metadata, &dir.path().join("arrays.gguf"));
        let bounded = tokenize(field, &path, "a");
        refused(&bounded, &format!("`{field}` has"), &path);
    }
}

/// Special ids past the vocabulary are ignored, as llama.cpp ignores them, unless a token that
/// must be added has no id left.
#[test]
fn special_ids_out_of_range_are_ignored_or_refused() {
    let dir = scratch();
    let tokens: Vec<String> = ["a", "b"].map(String::from).to_vec();
    let mut metadata = byte_pairs(tokens, vec![]);
    metadata.set("tokenizer.ggml.bos_token_id", Value::U32(u32::MAX));
    metadata.set("tokenizer.ggml.eos_token_id", Value::U64(u64::MAX));
    metadata.set("tokenizer.ggml.padding_token_id", Value::U32(7));
    metadata.set("tokenizer.ggml.unknown_token_id", Value::U32(1 << 30));
    let path = write_gguf(&metadata, &dir.path().join("ids.gguf"));
    assert_eq!(ids(&tokenize("special ids out of range", &path, "ab")), [0, 1]);
    metadata.set("tokenizer.ggml.add_bos_token", Value::Bool(true));
    let path = write_gguf(&metadata, &dir.path().join("bos.gguf"));
    refused(&tokenize("BOS id out of range", &path, "ab"), "tokenizer.ggml.bos_token_id", &path);
}

/// Unknown models and pre-tokenizers are refused; a name of a megabyte is shown cut short.
#[test]
fn unknown_models_and_pre_tokenizers_are_refused_briefly() {
    let dir = scratch();
    let tokens: Vec<String> = ["a", "b"].map(String::from).to_vec();
    let mut metadata = byte_pairs(tokens, vec![]);
    metadata.set("tokenizer.ggml.pre", Value::String(format!("\u{1b}[2J{}", "p".repeat(1 << 20))));
    let path = write_gguf(&metadata, &dir.path().join("pre.gguf"));
    let bounded = tokenize("unknown pre-tokenizer", &path, "ab");
    refused(&bounded, "(`tokenizer.ggml.pre`) is not one nnx knows", &path);
    assert!(bounded.stderr.len() < 8192 && !bounded.stderr.contains('\u{1b}'), "{}", bounded.stderr);
    metadata.set("tokenizer.ggml.pre", Value::String("gpt-2".into()));
    metadata.set("tokenizer.ggml.model", Value::String("t5".repeat(1 << 19)));
    let path = write_gguf(&metadata, &dir.path().join("model.gguf"));
    let bounded = tokenize("unknown model", &path, "ab");
    refused(&bounded, "(`tokenizer.ggml.model`) is not supported", &path);
    assert!(bounded.stderr.len() < 8192, "{}", bounded.stderr);
}

/// Byte tokens that are not `<0xNN>` are plain tokens: bytes no token covers are unknown.
#[test]
fn malformed_byte_fallback_tokens_are_plain_tokens() {
    let dir = scratch();
    let mut metadata = sentence_piece([("\u{2581}".to_string(), -1.0), ("a".to_string(), -2.0)]);
    let Some(Value::Array(Array::String(tokens))) = metadata.get("tokenizer.ggml.tokens").cloned() else {
        unreachable!()
    };
    let mut tokens = tokens;
    for (index, malformed) in ["<0xZZ>", "<0x>", "<0x\u{e9}>", "<0x4", "<0x123>"].iter().enumerate() {
        tokens[3 + index] = (*malformed).to_string();
    }
    metadata.set("tokenizer.ggml.tokens", strings(tokens));
    let path = write_gguf(&metadata, &dir.path().join("bytes.gguf"));
    // `<0x00>` to `<0x04>` are gone, so `\u{1}` has no byte token and is the unknown token.
    assert_eq!(ids(&tokenize("malformed byte tokens", &path, "a\u{1}a")), [1, 259, 260, 0, 260]);
}

/// A folder of `tokenizer.json` with `json` as its text.
fn tokenizer_json(dir: &Path, name: &str, json: &str) -> PathBuf {
    let folder = dir.join(name);
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("tokenizer.json"), json).unwrap();
    folder
}

/// A small WordLevel `tokenizer.json` with `added` (a JSON array) as its added tokens and
/// `pre_tokenizer` (JSON) as its pre-tokenizer.
fn word_level(added: &str, pre_tokenizer: &str) -> String {
    format!(
        r#"{{"version":"1.0","truncation":null,"padding":null,"added_tokens":{added},"normalizer":null,"pre_tokenizer":{pre_tokenizer},"post_processor":null,"decoder":null,"model":{{"type":"WordLevel","vocab":{{"[UNK]":0,"a":1,"b":2}},"unk_token":"[UNK]"}}}}"#
    )
}

fn added(id: usize, content: &str) -> String {
    format!(
        r#"{{"id":{id},"content":"{content}","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}}"#
    )
}

#[test]
fn small_tokenizer_json_tokenizes() {
    let dir = scratch();
    let folder = tokenizer_json(dir.path(), "small", &word_level(&format!("[{}]", added(3, "<s>")), "null"));
    let bounded = run("small tokenizer.json", &folder.join("tokenizer.json"), &["tokenize", text(&folder), "a<s>b"]);
    assert_eq!(ids(&bounded), [1, 3, 2]);
}

/// An added token of 2 MiB in a `tokenizer.json` (a 64 MiB one took 5.8 GB).
#[test]
fn huge_added_token_in_a_tokenizer_json_is_refused() {
    let dir = scratch();
    let json = word_level(&format!("[{}]", added(3, &"x".repeat(2 << 20))), "null");
    let folder = tokenizer_json(dir.path(), "added", &json);
    let file = folder.join("tokenizer.json");
    let bounded = run("2 MiB added token", &file, &["tokenize", text(&folder), "ab"]);
    refused(&bounded, "`added_tokens` entry 0 has a `content` of 2097152 bytes", &file);
}

/// A model vocabulary token of 1 MiB in a `tokenizer.json`.
#[test]
fn huge_vocabulary_token_in_a_tokenizer_json_is_refused() {
    let dir = scratch();
    let json = word_level("[]", "null").replace(r#""b":2"#, &format!(r#""b":2,"{}":3"#, "y".repeat(1 << 20)));
    let folder = tokenizer_json(dir.path(), "vocab", &json);
    let file = folder.join("tokenizer.json");
    let bounded = run("1 MiB vocabulary token", &file, &["tokenize", text(&folder), "ab"]);
    refused(&bounded, "token 3 of `model.vocab` is 1048576 bytes long", &file);
}

/// A `Split` pre-tokenizer whose regular expression is 1 MiB, and one nested past what the
/// regular expression parser allows.
#[test]
fn enormous_and_deep_regular_expressions_are_refused() {
    let dir = scratch();
    let split = |pattern: &str| {
        format!(
            r#"{{"type":"Sequence","pretokenizers":[{{"type":"Split","pattern":{{"Regex":"{pattern}"}},"behavior":"Isolated","invert":false}}]}}"#
        )
    };
    let huge = vec!["a"; 1 << 19].join("|");
    let folder = tokenizer_json(dir.path(), "huge", &word_level("[]", &split(&huge)));
    let file = folder.join("tokenizer.json");
    let bounded = run("1 MiB regular expression", &file, &["tokenize", text(&folder), "ab"]);
    refused(&bounded, "a regular expression of `pre_tokenizer` is 1048575 bytes long", &file);

    let deep = format!("{}a{}", "(".repeat(5000), ")".repeat(5000));
    let folder = tokenizer_json(dir.path(), "deep", &word_level("[]", &split(&deep)));
    let file = folder.join("tokenizer.json");
    let bounded = run("regular expression nested 5,000 deep", &file, &["tokenize", text(&folder), "ab"]);
    bounded.assert_refused(text(&file));
}

/// 3 MB of nested arrays: `serde_json`'s recursion limit refuses it before anything overflows.
#[test]
fn deeply_nested_tokenizer_json_is_refused() {
    let dir = scratch();
    for (name, json) in [
        ("arrays", format!(r#"{{"version":"1.0","normalizer":{}"#, "[".repeat(3 << 20))),
        ("normalizers", {
            let mut json = String::new();
            for _ in 0..100_000 {
                json.push_str(r#"{"type":"Sequence","normalizers":["#);
            }
            word_level("[]", "null").replace(r#""normalizer":null"#, &format!(r#""normalizer":{json}"#))
        }),
    ] {
        let folder = tokenizer_json(dir.path(), name, &json);
        let file = folder.join("tokenizer.json");
        let bounded = run(&format!("nested {name}"), &file, &["tokenize", text(&folder), "ab"]);
        refused(&bounded, "recursion limit exceeded", &file);
    }
}
