//! Hostile input for every reader a user can point at a file, beyond the SafeTensors header:
//! archive readers, quantized folders, model configurations and the `nnx` commands. Each case
//! asserts the exact error (or the exact result, where an empty weight is valid) and that
//! nothing panics: the test binary is built with overflow checks, so an unchecked size would
//! panic here.

use std::path::{Path, PathBuf};

use nnx::error::ConfigRule;
use nnx::models::bert::BertConfig;
use nnx::models::gpt2::Gpt2Config;
use nnx::models::llama::LlamaConfig;
use nnx::nn::{Init, Linear};
use nnx::quantized::{EncodedWeight, QuantizedFolder, WeightEncoding};
use nnx::{Archive, DType, Error, Tensor};
use serde_json::{Value, json};

use crate::hostile::{ALLOCATION_LIMIT, Expect, corpus, entry, file, largest_allocation};
use crate::util::{fixtures, run_nnx, scratch, text};

/// 2^62: an axis no memory could hold, beside a zero-size one.
const HUGE: u64 = 1 << 62;

/// A SafeTensors file of `entries` (name, dtype, shape, bytes) laid out in order, with
/// `__metadata__` when given.
fn safetensors(entries: &[(&str, &str, String, Vec<u8>)], metadata: Option<Value>) -> Vec<u8> {
    let mut fields = Vec::new();
    if let Some(metadata) = metadata {
        fields.push(format!(r#""__metadata__":{metadata}"#));
    }
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in entries {
        let begin = data.len() as u64;
        data.extend_from_slice(bytes);
        fields.push(format!(r#""{name}":{}"#, entry(dtype, shape, begin, data.len() as u64)));
    }
    file(&format!("{{{}}}", fields.join(",")), &data)
}

/// Writes `bytes` as `name` in `dir` and returns its path.
fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// The message of `error`, which must name `path` and hold every one of `words`.
fn says(error: &Error, path: &Path, words: &[&str]) {
    let message = error.to_string();
    assert!(message.contains(&path.display().to_string()), "the message does not name the file: {message}");
    for words in words {
        assert!(message.contains(words), "the message lacks {words:?}: {message}");
    }
}

/// Runs `nnx` and checks a refusal: status 1, one line on stderr starting `error: ` that names
/// `path` and holds `words`, nothing on stdout, and no panic.
fn refused(args: &[&str], path: &Path, words: &[&str]) {
    let (code, stdout, stderr) = run_nnx(args);
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    assert_eq!(code, 1, "{args:?}: {stderr}");
    assert!(stdout.is_empty(), "{args:?}: {stdout}");
    assert!(stderr.starts_with("error: ") && stderr.trim_end().lines().count() == 1, "{args:?}: {stderr}");
    assert!(stderr.contains(&path.display().to_string()), "{args:?} does not name the file: {stderr}");
    for words in words {
        assert!(stderr.contains(words), "{args:?}: stderr lacks {words:?}: {stderr}");
    }
}

/// Runs `nnx` and checks that it succeeds without a panic.
fn succeeds(args: &[&str]) -> String {
    let (code, stdout, stderr) = run_nnx(args);
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    assert_eq!(code, 0, "{args:?}: {stderr}");
    stdout
}

// ---------------------------------------------------------------------------------------------
// Archives.

#[test]
fn empty_entries_with_huge_axes_read_through_every_archive_reader() {
    let dir = scratch();
    let entries = [
        ("a", "F32", format!("[0,{HUGE}]"), Vec::new()),
        ("b", "U8", format!("[{},0,{}]", 1u64 << 40, 1u64 << 40), Vec::new()),
        ("c", "BF16", format!("[0,{HUGE},{HUGE}]"), Vec::new()),
    ];
    let path = write(dir.path(), "empty.safetensors", &safetensors(&entries, None));
    let archive = Archive::open(&path).unwrap();
    let shapes: [(&str, DType, Vec<usize>); 3] = [
        ("a", DType::F32, vec![0, 1 << 62]),
        ("b", DType::U8, vec![1 << 40, 0, 1 << 40]),
        ("c", DType::BF16, vec![0, 1 << 62, 1 << 62]),
    ];
    for (name, dtype, shape) in &shapes {
        let tensor = archive.try_get(name).unwrap();
        assert_eq!(tensor.shape(), shape.as_slice(), "{name}");
        assert!(tensor.is_empty(), "{name}");
        assert_eq!((tensor.len(), tensor.byte_len()), (0, 0), "{name}");
        assert!(tensor.is_contiguous(), "{name}");
        assert!(tensor.to_bytes().unwrap().is_empty(), "{name}");
        assert_eq!(tensor.contiguous().shape(), shape.as_slice(), "{name}");
        assert_eq!(tensor.copy().shape(), shape.as_slice(), "{name}");
        assert_eq!(tensor.reshape(&[0]).unwrap().shape(), [0], "{name}");
        assert_eq!(tensor.transpose(0, 1).unwrap().contiguous().len(), 0, "{name}");
        assert!(archive.get(name).is_some(), "{name}");
        assert_eq!(archive.tensor(name, *dtype, shape).unwrap().len(), 0, "{name}");
        let info = archive.info(name).unwrap();
        assert_eq!((info.dtype, info.shape.as_slice(), info.bytes), (*dtype, shape.as_slice(), 0), "{name}");
    }
    assert_eq!(archive.float("a", DType::F16, &[0, 1 << 62]).unwrap().shape(), [0, 1 << 62]);
    assert!(archive.try_get("a").unwrap().to_vec::<f32>().unwrap().is_empty());
    assert_eq!(archive.float("c", DType::F32, &[0, 1 << 62, 1 << 62]).unwrap().dtype(), DType::F32);
    let stdout = succeeds(&["inspect", text(&path)]);
    assert!(stdout.contains(&format!("[0, {HUGE}, {HUGE}]")), "{stdout}");
}

#[test]
fn tensors_of_zero_elements_never_multiply_their_other_axes() {
    let meta = Tensor::meta(DType::F32, &[0, 1 << 62, 1 << 62]);
    assert!(meta.is_contiguous() && meta.is_empty());
    let empty = Tensor::from_vec(Vec::<f32>::new(), &[1 << 40, 1 << 40, 0]).unwrap();
    assert_eq!(empty.len(), 0);
    assert!(empty.is_contiguous());
    assert_eq!(Tensor::zeros(DType::F64, &[1 << 40, 1 << 40, 0]).byte_len(), 0);
    assert!(matches!(
        Tensor::from_vec(Vec::<f32>::new(), &[1 << 40, 1 << 40, 1]),
        Err(Error::TooLarge { dtype: DType::F32, .. })
    ));
    // 2^62 F4 elements take 2^64 bits: too many to count, though each is under a byte.
    assert!(matches!(Tensor::from_bytes(DType::F4, &[1 << 62], &[]), Err(Error::TooLarge { .. })));
}

#[test]
fn every_archive_reader_names_the_file_and_the_entry() {
    let dir = scratch();
    let floats = |values: &[f32]| values.iter().flat_map(|value| value.to_le_bytes()).collect::<Vec<u8>>();
    let entries = [
        ("layer.weight", "F32", "[2,3]".to_string(), floats(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])),
        ("layer.bias", "F32", "[2]".to_string(), floats(&[0.5, -0.5])),
        ("flags", "BOOL", "[4]".to_string(), vec![0, 1, 2, 0]),
        ("ids", "I32", "[2]".to_string(), vec![1, 0, 0, 0, 2, 0, 0, 0]),
    ];
    let path = write(dir.path(), "readers.safetensors", &safetensors(&entries, None));
    let archive = Archive::open(&path).unwrap();

    assert!(archive.get("layer.wieght").is_none());
    let error = archive.try_get("layer.wieght").unwrap_err();
    assert!(
        matches!(&error, Error::NoEntry { name, suggestion: Some(near), .. } if name == "layer.wieght" && near == "layer.weight"),
        "{error:?}"
    );
    says(&error, &path, &["`layer.wieght`", "did you mean `layer.weight`"]);
    let error = archive.info("absent").unwrap_err();
    assert!(matches!(&error, Error::NoEntry { name, .. } if name == "absent"), "{error:?}");
    says(&error, &path, &["`absent`"]);

    let error = archive.tensor("layer.weight", DType::F32, &[3, 2]).unwrap_err();
    assert!(
        matches!(&error, Error::EntryMismatch { name, expected_shape, found_shape, .. }
            if name == "layer.weight" && expected_shape == &[3, 2] && found_shape == &[2, 3]),
        "{error:?}"
    );
    says(&error, &path, &["`layer.weight`", "[3, 2]", "[2, 3]"]);
    let error = archive.float("ids", DType::F32, &[2]).unwrap_err();
    assert!(matches!(&error, Error::EntryNotFloat { name, dtype: DType::I32, .. } if name == "ids"), "{error:?}");
    says(&error, &path, &["`ids`", "I32"]);

    for error in [archive.try_get("flags").unwrap_err(), archive.tensor("flags", DType::Bool, &[4]).unwrap_err()] {
        assert!(
            matches!(&error, Error::Data { name, source, .. }
                if name == "flags" && matches!(**source, Error::InvalidBool { index: 2, value: 2 })),
            "{error:?}"
        );
        says(&error, &path, &["`flags`", "invalid data"]);
    }

    let mut layer = Linear::builder(2, 3).init(Init::Meta).build();
    let error = archive.load_into(&mut layer, "layer").unwrap_err();
    assert!(matches!(&error, Error::Load(_)), "{error:?}");
    says(&error, &path, &["`layer.weight`", "[3, 2]", "[2, 3]"]);
    let error = archive.import_into(&mut layer, "layer").unwrap_err();
    assert!(matches!(&error, Error::Load(_)), "{error:?}");
    says(&error, &path, &["layer.weight"]);
    assert!(layer.weight.is_meta(), "a refused load leaves the module unchanged");

    let mut fitting = Linear::builder(3, 2).init(Init::Meta).build();
    archive.load_into(&mut fitting, "layer").unwrap();
    assert_eq!(fitting.weight.to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
}

// ---------------------------------------------------------------------------------------------
// Quantized folders.

/// The error of reading the weight `w` of `path` through every quantized reader, which must all
/// agree.
fn weight_error(path: &Path) -> Error {
    let folder = QuantizedFolder::open(path).unwrap();
    let error = folder.weight("w").unwrap_err();
    let others =
        [folder.encoding("w").map(drop), folder.quantized_linear("w").map(drop), folder.seed_linear("w").map(drop)];
    for other in others {
        assert_eq!(other.unwrap_err().to_string(), error.to_string());
    }
    error
}

#[test]
fn affine_weights_without_rows_decode_to_their_empty_shape() {
    let dir = scratch();
    let entries = [
        ("w.weight", "U32", format!("[0,{}]", 1u64 << 59), Vec::new()),
        ("w.scales", "BF16", format!("[0,{}]", 1u64 << 56), Vec::new()),
        ("w.biases", "BF16", format!("[0,{}]", 1u64 << 56), Vec::new()),
    ];
    let metadata = json!({ "quantization": json!({ "bits": 4, "group_size": 64 }).to_string() });
    for (name, metadata) in [("told.safetensors", Some(metadata)), ("inferred.safetensors", None)] {
        let path = write(dir.path(), name, &safetensors(&entries, metadata));
        let folder = QuantizedFolder::open(&path).unwrap();
        let weight = folder.weight("w").unwrap();
        assert!(matches!(weight.encoding(), WeightEncoding::Affine(spec) if spec.bits == 4 && spec.group_size == 64));
        let float = weight.to_float(DType::F32).unwrap();
        assert_eq!(float.shape(), [0, 1 << 62], "{name}");
        assert_eq!(folder.quantized_linear("w").unwrap().in_features(), 1 << 62, "{name}");
    }
}

#[test]
fn affine_scales_whose_values_overflow_are_refused() {
    let dir = scratch();
    let entries = [
        ("w.weight", "U32", format!("[0,{HUGE}]"), Vec::new()),
        ("w.scales", "BF16", format!("[0,{}]", 1u64 << 60), Vec::new()),
        ("w.biases", "BF16", format!("[0,{}]", 1u64 << 60), Vec::new()),
    ];
    let path = write(dir.path(), "overflow.safetensors", &safetensors(&entries, None));
    let error = weight_error(&path);
    assert!(
        matches!(&error, Error::QuantizedWeight { name, source, .. } if name == "w"
            && matches!(&**source, Error::QuantTooLarge { stream: "scales", shape, values: 64 } if shape == &[0, 1 << 60])),
        "{error:?}"
    );
    says(&error, &path, &["weight `w`", "`scales`", "too large to address", "write the weight again"]);
    refused(&["dequantize", text(&path), text(&dir.path().join("out.safetensors"))], &path, &["`w`", "`scales`"]);
}

#[test]
fn seed_weights_without_rows_or_columns_decode_to_their_empty_shape() {
    let dir = scratch();
    let bias = vec![0xe2, 0xff, 0xff, 0xff];
    for (name, blocks_shape, logical) in [
        ("no-rows.safetensors", format!("[1,0,{}]", 1u64 << 59), vec![0, 1 << 62]),
        ("no-columns.safetensors", "[1,4,0]".to_string(), vec![4, 0]),
        ("no-slices.safetensors", "[0,4,8]".to_string(), vec![0, 4, 64]),
    ] {
        let slices = if logical.len() == 3 { "[0]" } else { "[1]" };
        let entries = [
            ("w.seeds", "U16", blocks_shape.clone(), Vec::new()),
            ("w.nibbles", "U16", blocks_shape.clone(), Vec::new()),
            ("w.exp_bias", "I32", slices.to_string(), if logical.len() == 3 { Vec::new() } else { bias.clone() }),
        ];
        let path = write(dir.path(), name, &safetensors(&entries, None));
        let folder = QuantizedFolder::open(&path).unwrap();
        let weight = folder.weight("w").unwrap();
        assert_eq!(weight.to_float(DType::BF16).unwrap().shape(), logical.as_slice(), "{name}");
        folder.seed_linear("w").unwrap();
        let out = dir.path().join(format!("decoded-{name}"));
        succeeds(&["dequantize", text(&path), text(&out)]);
        assert_eq!(Archive::open(&out).unwrap().info("w.weight").unwrap().shape, logical, "{name}");
    }
}

#[test]
fn seed_blocks_whose_values_overflow_are_refused() {
    let dir = scratch();
    let blocks = format!("[1,0,{}]", 1u64 << 61);
    let entries = [
        ("w.seeds", "U16", blocks.clone(), Vec::new()),
        ("w.nibbles", "U16", blocks, Vec::new()),
        ("w.exp_bias", "I32", "[1]".to_string(), vec![0; 4]),
    ];
    let path = write(dir.path(), "overflow.safetensors", &safetensors(&entries, None));
    let error = weight_error(&path);
    assert!(
        matches!(&error, Error::QuantizedWeight { name, source, .. } if name == "w"
            && matches!(&**source, Error::QuantTooLarge { stream: "seeds", values: 8, .. })),
        "{error:?}"
    );
    says(&error, &path, &["weight `w`", "`seeds`", "too large to address"]);
    refused(&["dequantize", text(&path), text(&dir.path().join("out.safetensors"))], &path, &["`w`", "`seeds`"]);
}

#[test]
fn seed_streams_that_do_not_fit_name_the_file_and_the_weight() {
    let dir = scratch();
    let entries = [
        ("w.seeds", "U16", "[1,4,8]".to_string(), vec![1; 64]),
        ("w.nibbles", "U16", "[1,4,4]".to_string(), vec![0; 32]),
        ("w.exp_bias", "I32", "[1]".to_string(), vec![0; 4]),
    ];
    let path = write(dir.path(), "mismatch.safetensors", &safetensors(&entries, None));
    let error = weight_error(&path);
    assert!(
        matches!(&error, Error::QuantizedWeight { name, source, .. } if name == "w"
            && matches!(&**source, Error::QuantStream { stream: "nibbles", .. })),
        "{error:?}"
    );
    says(&error, &path, &["weight `w`", "`nibbles`", "[1, 4, 4]", "[1, 4, 8]"]);
    refused(&["dequantize", text(&path), text(&dir.path().join("out.safetensors"))], &path, &["`w`", "`nibbles`"]);
}

#[test]
fn seed_exp_bias_at_the_ends_of_i32_decodes_without_overflow() {
    let dir = scratch();
    for fixture in ["seed4_1x4x64.safetensors", "seed4p4_1x4x64.safetensors"] {
        let source = Archive::open(fixtures().join("seedlm").join(fixture)).unwrap();
        for (bias, label) in [(i32::MAX, "max"), (i32::MIN, "min")] {
            let mut archive = Archive::new();
            for name in source.names() {
                archive.insert(name, source.try_get(name).unwrap());
            }
            archive.insert("w.exp_bias", Tensor::from_vec(vec![bias], &[1]).unwrap());
            let path = dir.path().join(format!("{label}-{fixture}"));
            archive.save(&path).unwrap();
            let folder = QuantizedFolder::open(&path).unwrap();
            let values = folder.weight("w").unwrap().to_float(DType::F32).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(values.len(), 4 * 64);
            if bias == i32::MAX {
                assert!(values.iter().all(|value| !value.is_finite()), "{fixture}: scales of 2^(2^31) are infinite");
            } else {
                assert!(values.iter().all(|&value| value == 0.0), "{fixture}: scales of 2^(-2^31) are zero");
            }
            let x = Tensor::from_vec(vec![1.0f32; 64], &[1, 64]).unwrap();
            assert_eq!(folder.seed_linear("w").unwrap().forward(&x).unwrap().shape(), [1, 4]);
        }
    }
}

#[test]
fn quantization_values_too_wide_for_their_fields_are_refused() {
    let dir = scratch();
    let model = safetensors(&[("w.weight", "F32", "[1]".to_string(), vec![0; 4])], None);
    let bits_allowed = vec![2, 3, 4, 5, 6, 8];
    let cases: [(Value, &str, u64, Vec<u64>); 5] = [
        (
            json!({ "bits": (1u64 << 32) + 4, "group_size": 64 }),
            "quantization.bits",
            (1 << 32) + 4,
            bits_allowed.clone(),
        ),
        (
            json!({ "bits": 4, "group_size": (1u64 << 32) + 64 }),
            "quantization.group_size",
            (1 << 32) + 64,
            vec![32, 64, 128],
        ),
        (json!({ "bits": 4, "group_size": u64::MAX }), "quantization.group_size", u64::MAX, vec![32, 64, 128]),
        (json!({ "bits": 7, "group_size": 64 }), "quantization.bits", 7, bits_allowed.clone()),
        (
            json!({ "bits": 4, "group_size": 64, "layers.0.q": { "bits": (1u64 << 32) + 8, "group_size": 64 } }),
            "quantization.layers.0.q.bits",
            (1 << 32) + 8,
            bits_allowed,
        ),
    ];
    for (at, (quantization, field, found, allowed)) in cases.into_iter().enumerate() {
        // In a folder's `config.json`, and in the metadata of a single file.
        let folder = dir.path().join(format!("folder-{at}"));
        std::fs::create_dir_all(&folder).unwrap();
        write(&folder, "model.safetensors", &model);
        let config = write(&folder, "config.json", json!({ "quantization": quantization }).to_string().as_bytes());
        let metadata = json!({ "quantization": quantization.to_string() });
        let single = write(
            dir.path(),
            &format!("single-{at}.safetensors"),
            &safetensors(&[("w.weight", "F32", "[1]".into(), vec![0; 4])], Some(metadata)),
        );
        for (opened, named) in [(&folder, &config), (&single, &single)] {
            let error = QuantizedFolder::open(opened).unwrap_err();
            let expected = ConfigRule::OneOf { allowed: allowed.clone() };
            assert!(
                matches!(&error, Error::ConfigField { path, field: f, found: n, rule }
                    if path == named && f == field && *n == found && *rule == expected),
                "{field}: {error:?}"
            );
            says(&error, named, &[&format!("`{field}` is {found}"), "it must be one of"]);
            refused(&["dequantize", text(opened), text(&dir.path().join("out"))], named, &[&format!("`{field}`")]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Model configurations.

/// Writes `base` with `edits` applied as `config.json` and reads it with `read`.
fn read_edited<T: std::fmt::Debug>(
    dir: &Path,
    base: &Value,
    edits: &Value,
    read: impl Fn(&Path) -> nnx::Result<T>,
) -> (PathBuf, nnx::Result<T>) {
    let mut config = base.clone();
    for (key, value) in edits.as_object().unwrap() {
        config[key] = value.clone();
    }
    let path = write(dir, "config.json", config.to_string().as_bytes());
    let result = read(&path);
    (path, result)
}

/// Each edit of `base` must give `Error::ConfigField` for its field, value and rule.
fn refuses_fields<T: std::fmt::Debug>(
    base: &Value,
    read: impl Fn(&Path) -> nnx::Result<T>,
    cases: &[(Value, &str, u64, ConfigRule)],
) {
    let dir = scratch();
    read_edited(dir.path(), base, &json!({}), &read).1.expect("the base configuration is valid");
    for (edits, field, found, rule) in cases {
        let (path, result) = read_edited(dir.path(), base, edits, &read);
        let error = result.expect_err(&format!("{edits} must be refused"));
        assert!(
            matches!(&error, Error::ConfigField { path: at, field: f, found: n, rule: r }
                if at == &path && f == field && n == found && r == rule),
            "{edits}: {error:?}"
        );
        says(&error, &path, &[&format!("`{field}` is {found}"), &rule.to_string(), "correct that field"]);
        assert_eq!(error.to_string().lines().count(), 1, "{error}");
    }
    let (path, result) = read_edited(dir.path(), base, &json!({ "vocab_size": "many" }), &read);
    let error = result.unwrap_err();
    assert!(matches!(&error, Error::Config { path: at, .. } if at == &path), "{error:?}");
    says(&error, &path, &["invalid type: string \"many\"", "the model's own `config.json`"]);
}

fn fixture_config(model: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join(model).join("config.json")).unwrap()).unwrap()
}

#[test]
fn gpt2_configs_with_unusable_fields_name_the_file_and_the_field() {
    use ConfigRule::{Addressable, AtMost, Divides, Positive};
    let layers = AtMost { limit: nnx::models::MAX_LAYERS as u64 };
    refuses_fields(
        &fixture_config("gpt2-tiny"),
        |path| Gpt2Config::from_file(path),
        &[
            (json!({ "n_head": 0 }), "n_head", 0, Positive),
            (json!({ "n_head": 5 }), "n_head", 5, Divides { field: "n_embd", value: 64 }),
            (json!({ "n_embd": 0 }), "n_embd", 0, Positive),
            (json!({ "vocab_size": 0 }), "vocab_size", 0, Positive),
            (json!({ "n_positions": 0 }), "n_positions", 0, Positive),
            (json!({ "n_inner": 0 }), "n_inner", 0, Positive),
            (json!({ "n_layer": 1u64 << 40 }), "n_layer", 1 << 40, layers.clone()),
            (json!({ "n_layer": u64::MAX }), "n_layer", u64::MAX, layers),
            (json!({ "vocab_size": HUGE }), "vocab_size", HUGE, Addressable),
            (json!({ "n_embd": 1u64 << 40, "n_head": 1 }), "n_embd", 1 << 40, Addressable),
        ],
    );
}

#[test]
fn llama_configs_with_unusable_fields_name_the_file_and_the_field() {
    use ConfigRule::{Addressable, AtMost, Divides, Even, Positive};
    let rotary = Even { reason: "rotary position embeddings turn pairs of values" };
    refuses_fields(
        &fixture_config("llama-tiny"),
        |path| LlamaConfig::from_file(path),
        &[
            (json!({ "num_attention_heads": 0 }), "num_attention_heads", 0, Positive),
            (json!({ "num_key_value_heads": 0 }), "num_key_value_heads", 0, Positive),
            (
                json!({ "num_key_value_heads": 3 }),
                "num_key_value_heads",
                3,
                Divides { field: "num_attention_heads", value: 4 },
            ),
            (json!({ "head_dim": 0 }), "head_dim", 0, Positive),
            (json!({ "head_dim": 15 }), "head_dim", 15, rotary.clone()),
            (
                json!({ "head_dim": null, "num_attention_heads": 3, "num_key_value_heads": 1 }),
                "num_attention_heads",
                3,
                Divides { field: "hidden_size", value: 64 },
            ),
            (
                json!({ "head_dim": null, "hidden_size": 72, "num_attention_heads": 8 }),
                "hidden_size / num_attention_heads",
                9,
                rotary,
            ),
            (json!({ "vocab_size": 0 }), "vocab_size", 0, Positive),
            (json!({ "hidden_size": 0 }), "hidden_size", 0, Positive),
            (json!({ "intermediate_size": 0 }), "intermediate_size", 0, Positive),
            (
                json!({ "num_hidden_layers": 1u64 << 40 }),
                "num_hidden_layers",
                1 << 40,
                AtMost { limit: nnx::models::MAX_LAYERS as u64 },
            ),
            (json!({ "intermediate_size": HUGE }), "intermediate_size", HUGE, Addressable),
            // Found by the `config` fuzz target: without layers the per-layer sizes are never
            // multiplied, but the attention widths still are.
            (
                json!({ "num_hidden_layers": 0, "num_attention_heads": 1u64 << 62, "num_key_value_heads": null, "head_dim": 8 }),
                "num_attention_heads",
                1 << 62,
                Addressable,
            ),
        ],
    );
}

#[test]
fn bert_configs_with_unusable_fields_name_the_file_and_the_field() {
    use ConfigRule::{Addressable, AtMost, Divides, Positive};
    let base = json!({
        "vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 64, "max_position_embeddings": 16, "type_vocab_size": 2,
    });
    refuses_fields(
        &base,
        |path| BertConfig::from_file(path),
        &[
            (json!({ "num_attention_heads": 0 }), "num_attention_heads", 0, Positive),
            (
                json!({ "num_attention_heads": 5 }),
                "num_attention_heads",
                5,
                Divides { field: "hidden_size", value: 32 },
            ),
            (json!({ "hidden_size": 0 }), "hidden_size", 0, Positive),
            (json!({ "vocab_size": 0 }), "vocab_size", 0, Positive),
            (json!({ "intermediate_size": 0 }), "intermediate_size", 0, Positive),
            (json!({ "max_position_embeddings": 0 }), "max_position_embeddings", 0, Positive),
            (json!({ "type_vocab_size": 0 }), "type_vocab_size", 0, Positive),
            (
                json!({ "num_hidden_layers": 100_000 }),
                "num_hidden_layers",
                100_000,
                AtMost { limit: nnx::models::MAX_LAYERS as u64 },
            ),
            (json!({ "hidden_size": 1u64 << 40, "num_attention_heads": 1 }), "hidden_size", 1 << 40, Addressable),
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// The `nnx` commands.

#[test]
fn every_command_refuses_every_hostile_file_in_one_line() {
    let dir = scratch();
    let out = dir.path().join("out.safetensors");
    for (at, case) in corpus().into_iter().enumerate() {
        let path = write(dir.path(), &format!("case-{at:02}.safetensors"), &case.bytes);
        let bad_data = matches!(case.expect, Expect::BadData(_));
        if bad_data {
            // Headers are fine: listing them reads no data.
            succeeds(&["inspect", text(&path)]);
        } else {
            refused(&["inspect", text(&path)], &path, case.says);
            refused(&["inspect", "--json", text(&path)], &path, case.says);
        }
        for encoding in ["q4", "seed4"] {
            let words: &[&str] = if bad_data { &["no weight to quantize"] } else { case.says };
            refused(&["quantize", text(&path), text(&out), "--encoding", encoding], &path, words);
        }
        let words: &[&str] = match case.expect {
            Expect::BadData(entry) => &[entry, "invalid data"],
            _ => case.says,
        };
        refused(&["dequantize", text(&path), text(&out)], &path, words);
        assert!(!out.exists(), "{}: a refused command wrote its output", case.name);
    }
}

#[test]
fn quantize_and_dequantize_round_trip_weights_without_rows() {
    let dir = scratch();
    for columns in [128, HUGE] {
        let input = write(
            dir.path(),
            &format!("empty-{columns}.safetensors"),
            &safetensors(&[("w.weight", "F32", format!("[0,{columns}]"), Vec::new())], None),
        );
        for (encoding, decoded) in
            [("q4", DType::F32), ("q8", DType::F32), ("seed4", DType::BF16), ("seed4p4", DType::BF16)]
        {
            let quantized = dir.path().join(format!("{encoding}-{columns}.safetensors"));
            let summary = succeeds(&["quantize", text(&input), text(&quantized), "--encoding", encoding]);
            assert!(summary.starts_with("quantized 1 weights"), "{summary}");
            let folder = QuantizedFolder::open(&quantized).unwrap();
            assert!(!matches!(folder.weight("w").unwrap(), EncodedWeight::Float(_)), "{encoding}");
            let restored = dir.path().join(format!("{encoding}-{columns}-restored.safetensors"));
            succeeds(&["dequantize", text(&quantized), text(&restored)]);
            let info = Archive::open(&restored).unwrap().info("w.weight").unwrap();
            assert_eq!((info.dtype, info.shape), (decoded, vec![0, columns as usize]), "{encoding} [0, {columns}]");
        }
    }
}

#[test]
fn hostile_files_allocate_nothing_they_claim_through_the_quantized_readers() {
    let dir = scratch();
    let blocks = format!("[1,0,{}]", 1u64 << 59);
    let entries = [
        ("w.seeds", "U16", blocks.clone(), Vec::new()),
        ("w.nibbles", "U16", blocks, Vec::new()),
        ("w.exp_bias", "I32", "[1]".to_string(), vec![0; 4]),
        ("v.weight", "U32", format!("[0,{}]", 1u64 << 59), Vec::new()),
        ("v.scales", "BF16", format!("[0,{}]", 1u64 << 56), Vec::new()),
        ("v.biases", "BF16", format!("[0,{}]", 1u64 << 56), Vec::new()),
    ];
    let path = write(dir.path(), "claims.safetensors", &safetensors(&entries, None));
    let (shapes, largest) = largest_allocation(|| {
        let folder = QuantizedFolder::open(&path).unwrap();
        ["w", "v"].map(|name| folder.weight(name).unwrap().to_float(DType::F32).unwrap().shape().to_vec())
    });
    assert_eq!(shapes, [vec![0, 1 << 62], vec![0, 1 << 62]]);
    assert!(largest < ALLOCATION_LIMIT, "allocated a block of {largest} bytes");
}
