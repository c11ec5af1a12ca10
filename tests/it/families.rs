//! Qwen2, Qwen3 and Gemma 3 against transformers: the logits of every position of the
//! fixture's ids (computed by transformers in f32 from the BF16 weights of the folder),
//! greedy decoding through the key/value cache, and the cached pass against the full one.

use std::path::PathBuf;

use nnx::models::CausalLm;
use nnx::models::gemma3::{Gemma3, Gemma3Config};
use nnx::models::qwen::{Qwen, QwenConfig};
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
    assert!(config.is_sliding(0) && !config.is_sliding(5) && config.rope_factor(false) == Some(8.0));
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
