//! GPT-2 and Llama forward passes and greedy decoding against the Hugging Face references.

use nnx::models::CausalLm;
use nnx::models::gpt2::{Gpt2, Gpt2Config};
use nnx::models::llama::{Llama, LlamaConfig};
use nnx::nn::Init;
use nnx::{Archive, DType};

use crate::util::{fixtures, json_field};

fn reference(model: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join(model).join("reference.json")).unwrap()).unwrap()
}

fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold(0, |best, (at, v)| if *v > row[best] { at } else { best })
}

#[test]
fn gpt2_logits_and_greedy_ids_match() {
    let dir = fixtures().join("gpt2-tiny");
    let config = Gpt2Config::from_file(dir.join("config.json")).unwrap();
    let mut model = Gpt2::new(&config, DType::F32, Init::Meta);
    Archive::open(&dir).unwrap().import_into(&mut model, "").unwrap();
    let reference = reference("gpt2-tiny");
    let input = json_field::<Vec<u32>>(&reference, "input_ids");
    let logits = model.forward(&input).unwrap();
    let expected = json_field::<Vec<Vec<f32>>>(&reference, "logits");
    assert_eq!(logits.shape(), &[input.len(), config.vocab_size]);
    let ours = logits.to_vec::<f32>().unwrap();
    let max_diff = ours.iter().zip(expected.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    println!("GPT-2 logits: max abs difference {max_diff:e}");
    assert!(max_diff <= 1e-3, "GPT-2 logits differ by {max_diff}");
    let greedy = json_field::<Vec<u32>>(&reference, "greedy_ids");
    assert_eq!(model.generate(&input, greedy.len() - input.len()).unwrap(), greedy);
}

#[test]
fn llama_with_bf16_weights_matches_the_file_dtype_reference() {
    let dir = fixtures().join("llama-tiny");
    let config = LlamaConfig::from_file(dir.join("config.json")).unwrap();
    let mut model = Llama::new(&config, DType::BF16, Init::Meta);
    Archive::open(&dir).unwrap().import_into(&mut model, "").unwrap();
    assert!(model.layers[0].attn.q.weight.is_mapped() && model.layers[0].attn.q.weight.dtype() == DType::BF16);
    let reference = reference("llama-tiny");
    let input = json_field::<Vec<u32>>(&reference, "input_ids");
    let logits = model.logits(&input).unwrap().to_vec::<f32>().unwrap();
    let expected = json_field::<Vec<Vec<f32>>>(&reference, "logits_file_dtype");
    let mut max_diff = 0.0f32;
    for (position, row) in expected.iter().enumerate() {
        let ours = &logits[position * config.vocab_size..(position + 1) * config.vocab_size];
        max_diff = ours.iter().zip(row).map(|(a, b)| (a - b).abs()).fold(max_diff, f32::max);
        assert_eq!(argmax(ours), argmax(row), "argmax at position {position}");
    }
    println!("Llama logits (BF16 weights): max abs difference {max_diff:e}");
    assert!(max_diff <= 3e-2, "Llama logits differ by {max_diff}");
}
