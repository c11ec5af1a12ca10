//! GPT-2 and Llama forward passes and greedy decoding against the Hugging Face references.

use nnx::models::CausalLm;
use nnx::models::gpt2::{Gpt2, Gpt2Config};
use nnx::models::llama::{Llama, LlamaConfig};
use nnx::nn::Init;
use nnx::{Archive, DType};

use crate::util::{fixtures, json_field, max_abs_diff};

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
    assert_eq!(expected.len(), input.len(), "one reference row per input position");
    let ours = logits.to_vec::<f32>().unwrap();
    let expected: Vec<f32> = expected.into_iter().flatten().collect();
    let max_diff = max_abs_diff(&ours, &expected, "GPT-2 logits");
    println!("GPT-2 logits: max abs difference {max_diff:e}");
    assert!(max_diff <= 1e-4, "GPT-2 logits differ by {max_diff}");
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
    assert_eq!(expected.len(), input.len(), "one reference row per input position");
    assert_eq!(logits.len(), input.len() * config.vocab_size, "logits of every position");
    let mut max_diff = 0.0f32;
    for (position, row) in expected.iter().enumerate() {
        let ours = &logits[position * config.vocab_size..(position + 1) * config.vocab_size];
        max_diff = max_diff.max(max_abs_diff(ours, row, "Llama logits"));
        assert_eq!(argmax(ours), argmax(row), "argmax at position {position}");
    }
    println!("Llama logits (BF16 weights): max abs difference {max_diff:e}");
    assert!(max_diff <= 3e-2, "Llama logits differ by {max_diff}");
}

#[test]
fn llama_with_f32_weights_matches_the_f32_reference() {
    let dir = fixtures().join("llama-tiny");
    let config = LlamaConfig::from_file(dir.join("config.json")).unwrap();
    let mut model = Llama::new(&config, DType::F32, Init::Meta);
    Archive::open(&dir).unwrap().import_into(&mut model, "").unwrap();
    assert_eq!(model.layers[0].attn.q.weight.dtype(), DType::F32, "the BF16 file is cast on import");
    let reference = reference("llama-tiny");
    let input = json_field::<Vec<u32>>(&reference, "input_ids");
    let logits = model.logits(&input).unwrap().to_vec::<f32>().unwrap();
    let expected = json_field::<Vec<Vec<f32>>>(&reference, "logits_f32_weights");
    assert_eq!(expected.len(), input.len(), "one reference row per input position");
    let expected: Vec<f32> = expected.into_iter().flatten().collect();
    let max_diff = max_abs_diff(&logits, &expected, "Llama logits (F32 weights)");
    // The file holds the BF16 rounding of the weights the reference was computed with, so the
    // rounding of the weights bounds how close any reader can come. The reference's own BF16
    // forward pass is 7.8e-3 away from it; f32 arithmetic over the file's weights must be
    // closer than that.
    let file_dtype: Vec<f32> =
        json_field::<Vec<Vec<f32>>>(&reference, "logits_file_dtype").into_iter().flatten().collect();
    let reference_gap = max_abs_diff(&file_dtype, &expected, "the two Llama references");
    println!("Llama logits (F32 weights): max abs difference {max_diff:e} (the BF16 reference: {reference_gap:e})");
    assert!(max_diff <= 5e-3 && max_diff < reference_gap, "Llama logits differ by {max_diff}");
}
