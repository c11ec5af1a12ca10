//! Qwen2, Qwen3 and Gemma 3 against transformers: the logits of every position of the
//! fixture's ids (computed by transformers in f32 from the BF16 weights of the folder),
//! greedy decoding through the key/value cache, and the cached pass against the full one.

use std::path::PathBuf;

use nnx::models::gemma3::{Gemma3, Gemma3Config};
use nnx::models::qwen::{Qwen, QwenConfig};
use nnx::models::{CausalLm, DecoderConfig};
use nnx::nn::Init;
use nnx::{Archive, DType, Pretrained};

use crate::util::{fixtures, json_field, max_abs_diff};

fn folder(name: &str) -> PathBuf {
    fixtures().join("models").join(name)
}

fn reference(name: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(folder(name).join("reference.json")).unwrap()).unwrap()
}

/// The Qwen folder `name` (`qwen2` or `qwen3`) in F32, imported from its BF16 SafeTensors.
fn qwen(name: &str) -> Qwen {
    let dir = folder(name);
    let mut model = Qwen::new(&QwenConfig::from_file(dir.join("config.json")).unwrap(), DType::F32, Init::Meta);
    Archive::open(&dir).unwrap().import_into(&mut model, "").unwrap();
    model
}

fn gemma3() -> Gemma3 {
    let dir = folder("gemma3");
    let mut model = Gemma3::new(&Gemma3Config::from_file(dir.join("config.json")).unwrap(), DType::F32, Init::Meta);
    Archive::open(&dir).unwrap().import_into(&mut model, "").unwrap();
    model
}

/// The model's logits for the reference ids are within 1e-4 of transformers', its greedy
/// continuation (through the cache) is transformers', and each cached step gives the logits of
/// the full pass.
fn check(model: &impl CausalLm, name: &str) {
    let reference = reference(name);
    let ids: Vec<u32> = json_field(&reference, "ids");
    let logits = model.logits(&ids).unwrap();
    let expected: Vec<Vec<f32>> = json_field(&reference, "logits");
    assert_eq!(expected.len(), ids.len(), "{name}: one reference row per position");
    let vocab = expected[0].len();
    assert_eq!(logits.shape(), [ids.len(), vocab], "{name}: logits of every position");
    let ours = logits.to_vec::<f32>().unwrap();
    let max_diff = max_abs_diff(&ours, &expected.concat(), name);
    println!("{name}: logits within {max_diff:e} of transformers");
    assert!(max_diff <= 1e-4, "{name}: logits differ by {max_diff}");

    let greedy: Vec<u32> = json_field(&reference, "greedy");
    let generated = model.generate(&ids, greedy.len()).unwrap();
    assert_eq!(generated[ids.len()..], greedy, "{name}: greedy decoding");

    // The prompt at once, then one token at a time, against the full pass over the same ids.
    let all = &generated[..ids.len() + 4];
    let full = model.logits(all).unwrap().to_vec::<f32>().unwrap();
    let mut cache = model.new_cache(1, all.len()).unwrap();
    let mut rows = vec![model.forward_cached(&all[..ids.len()], &mut cache).unwrap()];
    for &id in &all[ids.len()..] {
        rows.push(model.forward_cached(&[id], &mut cache).unwrap());
    }
    for (step, row) in rows.iter().enumerate() {
        let position = ids.len() - 1 + step;
        let difference = max_abs_diff(&row.to_vec::<f32>().unwrap(), &full[position * vocab..][..vocab], name);
        assert!(difference <= 1e-5, "{name}: cached logits at position {position} differ by {difference}");
    }
}

#[test]
fn qwen2_matches_transformers() {
    let model = qwen("qwen2");
    assert!(model.lm_head.is_none(), "the fixture ties its head to the embedding");
    assert!(model.layers[0].attn.q.bias.is_some() && model.layers[0].attn.o.bias.is_none());
    assert!(model.layers[0].attn.q_norm.is_none());
    check(&model, "qwen2");
}

#[test]
fn qwen3_matches_transformers() {
    let model = qwen("qwen3");
    assert!(model.layers[0].attn.q_norm.is_some() && model.layers[0].attn.q.bias.is_none());
    assert_ne!(model.config.head_dim() * model.config.num_attention_heads, model.config.hidden_size);
    check(&model, "qwen3");
}

#[test]
fn gemma3_matches_transformers() {
    let model = gemma3();
    let config = &model.config;
    assert!(config.is_sliding(0) && !config.is_sliding(5));
    assert_eq!(config.rope_of(false).1, Some(vec![8.0; config.head_dim / 2]));
    let norm = &model.layers[0].attn_norm.weight;
    assert_eq!(norm.dtype(), DType::F32, "norms are F32");
    check(&model, "gemma3");
}

#[test]
fn gemma3_norms_import_as_their_multipliers() {
    // transformers stores `w` of `x * (1 + w)`; the model holds `1 + w`.
    let dir = folder("gemma3");
    let stored = Archive::open(&dir).unwrap().try_get("model.layers.0.input_layernorm.weight").unwrap();
    let stored = stored.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    let held = gemma3().layers[0].attn_norm.weight.to_vec::<f32>().unwrap();
    let shifted: Vec<f32> = stored.iter().map(|w| w + 1.0).collect();
    assert_eq!(held, shifted);
}

#[test]
fn a_batch_decodes_as_each_sequence_alone() {
    fn check(model: &impl CausalLm, name: &str) {
        let ids: Vec<u32> = json_field(&reference(name), "ids");
        let prompts = vec![ids[..10].to_vec(), ids[3..].to_vec()];
        let config = |steps| nnx::generate::GenerationConfig { max_new_tokens: steps, ..Default::default() };
        let batch = nnx::generate::Generator::new(model, &prompts, config(6)).unwrap().run().unwrap();
        for (index, prompt) in prompts.iter().enumerate() {
            let alone =
                nnx::generate::Generator::new(model, std::slice::from_ref(prompt), config(6)).unwrap().run().unwrap();
            assert_eq!(batch.sequences[index], alone.sequences[0], "{name}: sequence {index} batched and alone");
        }
    }
    check(&qwen("qwen3"), "qwen3");
    check(&gemma3(), "gemma3");
}

#[test]
fn qwen2_loads_as_a_pretrained_folder_and_qwen3_is_refused_there() {
    let model = Qwen::from_pretrained(folder("qwen2")).unwrap();
    assert_eq!(model.embed.weight.dtype(), DType::BF16, "the folder's dtype");
    let ids: Vec<u32> = json_field(&reference("qwen2"), "ids");
    let ours = model.logits(&ids).unwrap().to_vec::<f32>().unwrap();
    let expected: Vec<f32> = json_field::<Vec<Vec<f32>>>(&reference("qwen2"), "logits").concat();
    assert!(max_abs_diff(&ours, &expected, "qwen2 (BF16)") <= 1e-4, "BF16 weights widen to f32 exactly");
    let error = Qwen::from_pretrained(folder("qwen3")).unwrap_err();
    assert!(error.to_string().contains("QwenConfig::from_file"), "{error}");
}

#[test]
fn gemma3_loads_as_a_pretrained_folder() {
    let model = Gemma3::from_pretrained(folder("gemma3")).unwrap();
    assert_eq!((model.embed.weight.dtype(), model.norm.weight.dtype()), (DType::BF16, DType::F32));
    let ids: Vec<u32> = json_field(&reference("gemma3"), "ids");
    let ours = model.logits(&ids).unwrap().to_vec::<f32>().unwrap();
    let expected: Vec<f32> = json_field::<Vec<Vec<f32>>>(&reference("gemma3"), "logits").concat();
    assert!(max_abs_diff(&ours, &expected, "gemma3 (BF16)") <= 1e-4);
}

/// The family table against the fixtures: every fixture's `model_type` and GGUF
/// `general.architecture` has a row, each loads as that row (an encoder is refused for
/// `nnx embed` and planned), every row has a fixture, and a GGUF naming an architecture of no
/// row is refused alike by the loader and the import plan.
#[test]
fn every_family_loads_its_fixtures_and_every_fixture_has_a_family() {
    use nnx::models::family::{self, FAMILIES};

    let mut folders: Vec<PathBuf> = std::fs::read_dir(fixtures().join("models"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|dir| dir.join("config.json").is_file())
        .collect();
    folders.extend([fixtures().join("gpt2-tiny"), fixtures().join("llama-tiny"), crate::minilm::model_folder()]);
    let mut covered = std::collections::HashSet::new();
    for dir in &folders {
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
        let model_type = config["model_type"].as_str().unwrap();
        let family = family::from_model_type(model_type)
            .unwrap_or_else(|| panic!("`{}`: `model_type` `{model_type}` has no row", dir.display()));
        covered.insert(family.name);
        let source = dir.to_str().unwrap();
        if family.generates() {
            let loaded = nnx::models::load(source).unwrap_or_else(|error| panic!("{source}: {error}"));
            assert_eq!(loaded.architecture, family.name, "{source}");
        } else {
            let error = nnx::models::load(source).unwrap_err();
            assert!(matches!(error, nnx::Error::Encoder { .. }), "{source}: {error}");
            let (_, plan) = nnx::models::import_plan(source, None).unwrap();
            assert!(plan.is_valid(), "{source}: {:?}", plan.problems());
        }
        for file in std::fs::read_dir(dir).unwrap().map(|entry| entry.unwrap().path()) {
            if file.extension().is_none_or(|extension| extension != "gguf") {
                continue;
            }
            let archive = Archive::open(&file).unwrap();
            let architecture = archive.gguf_metadata().unwrap().architecture().unwrap().to_string();
            let family = family::from_gguf_architecture(&architecture)
                .unwrap_or_else(|| panic!("`{}`: `{architecture}` has no row", file.display()));
            covered.insert(family.name);
            let loaded = nnx::models::load(file.to_str().unwrap()).unwrap();
            assert_eq!(loaded.architecture, family.name, "{}", file.display());
        }
    }
    for family in FAMILIES {
        assert!(covered.contains(family.name), "no fixture is a `{}` model", family.name);
    }

    // llama.cpp writes Mistral as `llama`: a file that says `mistral` is refused by the table,
    // by the loader and the import plan alike, naming what it runs.
    let dir = crate::util::scratch();
    let source = folder("mistral").join("model-f32.gguf");
    let mistral = nnx::gguf::Value::String("mistral".into());
    let renamed = crate::hostile_models::rewritten_gguf(&source, "general.architecture", mistral, dir.path(), "m.gguf");
    let load = nnx::models::load(renamed.to_str().unwrap()).unwrap_err().to_string();
    let plan = nnx::models::import_plan(renamed.to_str().unwrap(), None).unwrap_err().to_string();
    assert_eq!(load, plan);
    assert!(load.contains("`general.architecture` is `mistral`") && load.contains(&family::supported(true)), "{load}");
}
