//! GPT-2 and Llama forward passes and text generation against the Hugging Face references:
//! logits, greedy decoding through the key/value cache (alone, batched, on the GPU), sampling,
//! stop conditions, text in and out, and the examples' command lines.

use std::process::Command;

use nnx::generate::{FinishReason, Generation, GenerationConfig, Generator, KvCache, Sampling, TextStream, Tokenizer};
use nnx::models::gpt2::{Gpt2, Gpt2Config};
use nnx::models::llama::{Llama, LlamaConfig};
use nnx::models::{CausalLm, Dense, Quantize};
use nnx::nn::Init;

use nnx::{Archive, DType, Module};

use crate::util::{example_binary, fixtures, json_field, max_abs_diff, scratch};

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

/// A fixture folder's `generation.json`: transformers' greedy decoding of text prompts, alone
/// and as a left-padded batch (`scripts/make_generation_reference.py`).
fn generation_reference(model: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join(model).join("generation.json")).unwrap()).unwrap()
}

fn gpt2() -> Gpt2 {
    let dir = fixtures().join("gpt2-tiny");
    let mut model = Gpt2::new(&Gpt2Config::from_file(dir.join("config.json")).unwrap(), DType::F32, Init::Meta);
    Archive::open(&dir).unwrap().import_into(&mut model, "").unwrap();
    model
}

fn llama(dtype: DType) -> Llama {
    let dir = fixtures().join("llama-tiny");
    let mut model = Llama::new(&LlamaConfig::from_file(dir.join("config.json")).unwrap(), dtype, Init::Meta);
    Archive::open(&dir).unwrap().import_into(&mut model, "").unwrap();
    model
}

fn tokenizer(model: &str) -> Tokenizer {
    Tokenizer::from_folder(fixtures().join(model)).unwrap()
}

/// Greedy decoding without a cache: the whole sequence is computed again for every token.
fn uncached_greedy(model: &impl CausalLm, ids: &[u32], steps: usize) -> Vec<u32> {
    let mut ids = ids.to_vec();
    for _ in 0..steps {
        let logits = model.logits(&ids).unwrap().to_vec::<f32>().unwrap();
        let vocab = logits.len() / ids.len();
        ids.push(argmax(&logits[logits.len() - vocab..]) as u32);
    }
    ids
}

/// `prompts` decoded together with `config`.
fn generate(model: &impl CausalLm, prompts: &[Vec<u32>], config: GenerationConfig) -> Generation {
    Generator::new(model, prompts, config).unwrap().run().unwrap()
}

fn greedy(max_new_tokens: usize) -> GenerationConfig {
    GenerationConfig { max_new_tokens, ..GenerationConfig::default() }
}

fn sampled(max_new_tokens: usize, seed: u64, top_k: Option<usize>) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens,
        seed,
        sampling: Sampling::Random { temperature: 1.0, top_k, top_p: None, min_p: None },
        ..GenerationConfig::default()
    }
}

/// A prompt and its expected greedy continuation (prompt included) from a reference file.
fn case(reference: &serde_json::Value, prompt: &str, expected: &str) -> (Vec<u32>, Vec<u32>) {
    (json_field(reference, prompt), json_field(reference, expected))
}

#[test]
fn cached_greedy_decoding_equals_recomputing_and_transformers() {
    let gpt2 = gpt2();
    let cases = [
        case(&reference("gpt2-tiny"), "input_ids", "greedy_ids"),
        case(&generation_reference("gpt2-tiny"), "prompt_ids", "greedy_ids"),
    ];
    for (prompt, expected) in cases {
        let steps = expected.len() - prompt.len();
        assert_eq!(gpt2.generate(&prompt, steps).unwrap(), expected, "GPT-2");
        assert_eq!(uncached_greedy(&gpt2, &prompt, steps), expected, "GPT-2 without a cache");
    }
    // BF16 weights widen to f32 exactly, so both dtypes decode as transformers in f32.
    let reference = generation_reference("llama-tiny");
    for dtype in [DType::F32, DType::BF16] {
        let model = llama(dtype);
        for (prompt, expected) in
            [case(&reference, "input_ids", "input_greedy_ids"), case(&reference, "prompt_ids", "greedy_ids")]
        {
            let steps = expected.len() - prompt.len();
            assert_eq!(model.generate(&prompt, steps).unwrap(), expected, "Llama {dtype:?}");
            assert_eq!(uncached_greedy(&model, &prompt, steps), expected, "Llama {dtype:?} without a cache");
        }
    }
}

#[test]
fn cached_logits_equal_the_full_forward_pass() {
    fn check(model: &impl CausalLm, ids: &[u32], what: &str) {
        let vocab = model.logits(&ids[..1]).unwrap().shape()[1];
        let mut cache = model.new_cache(1, ids.len()).unwrap();
        // The prompt at once, then one token at a time.
        let split = ids.len() - 3;
        let mut rows = vec![model.forward_cached(&ids[..split], &mut cache).unwrap()];
        for &id in &ids[split..ids.len() - 1] {
            rows.push(model.forward_cached(&[id], &mut cache).unwrap());
        }
        assert_eq!(cache.len(), ids.len() - 1);
        let full = model.logits(&ids[..ids.len() - 1]).unwrap().to_vec::<f32>().unwrap();
        for (at, row) in rows.iter().enumerate() {
            assert_eq!(row.shape(), [1, vocab]);
            let position = split - 1 + at;
            let expected = &full[position * vocab..(position + 1) * vocab];
            let difference = max_abs_diff(&row.to_vec::<f32>().unwrap(), expected, what);
            assert!(difference <= 1e-5, "{what}: position {position} differs by {difference}");
        }
        let error = model.forward_cached(&ids[..2], &mut cache).unwrap_err();
        assert!(matches!(error, nnx::Error::CacheFull { .. }), "{error}");
        assert!(model.new_cache(1, model.context_length() + 1).is_err());
    }
    let ids = [1u32, 17, 200, 33, 5, 99, 250, 7, 45, 162];
    check(&gpt2(), &ids, "GPT-2");
    check(&llama(DType::BF16), &ids, "Llama");
}

#[test]
fn a_batch_of_prompts_decodes_as_each_alone_and_as_transformers_batch() {
    fn check(model: &impl CausalLm, name: &str) {
        let reference = generation_reference(name);
        let prompts: Vec<Vec<u32>> = json_field(&reference["batch"], "prompt_ids");
        let expected: Vec<Vec<u32>> = json_field(&reference["batch"], "greedy_ids");
        assert_ne!(prompts[0].len(), prompts[1].len(), "the batch pads one prompt");
        let steps = expected[0].len() - prompts[0].len();
        let batch = generate(model, &prompts, greedy(steps));
        for (index, prompt) in prompts.iter().enumerate() {
            let alone = generate(model, std::slice::from_ref(prompt), greedy(steps));
            assert_eq!(batch.sequences[index], alone.sequences[0], "{name}: sequence {index} batched and alone");
            assert_eq!([prompt.as_slice(), &batch.sequences[index]].concat(), expected[index], "{name}: transformers");
        }
        assert_eq!(batch.finish_reasons, [FinishReason::Length; 2]);
        // Draws too: sequence `i` draws from stream `i` of the seed, the first as it would alone.
        let batch = generate(model, &prompts, sampled(8, 3, None));
        let alone = generate(model, &prompts[..1], sampled(8, 3, None));
        assert_eq!(batch.sequences[0], alone.sequences[0], "{name}: drawn batched and alone");
        assert_ne!(batch.sequences[1], generate(model, &prompts[1..], sampled(8, 3, None)).sequences[0]);
    }
    check(&gpt2(), "gpt2-tiny");
    check(&llama(DType::BF16), "llama-tiny");
}

#[test]
fn the_seed_decides_the_draws_and_top_k_of_one_is_greedy() {
    let model = llama(DType::BF16);
    let prompt = vec![json_field::<Vec<u32>>(&generation_reference("llama-tiny"), "prompt_ids")];
    let draw = |seed| generate(&model, &prompt, sampled(24, seed, None)).sequences.remove(0);
    assert_eq!(draw(7), draw(7), "the same seed draws the same tokens");
    assert_ne!(draw(7), draw(8), "another seed draws other tokens (24 draws over 256 tokens)");
    let greedy_tokens = generate(&model, &prompt, greedy(24)).sequences.remove(0);
    assert_ne!(draw(7), greedy_tokens, "drawing at temperature 1 is not greedy");
    for seed in [1, 2] {
        assert_eq!(generate(&model, &prompt, sampled(24, seed, Some(1))).sequences[0], greedy_tokens);
    }
    let cold = GenerationConfig {
        sampling: Sampling::Random { temperature: 1e-4, top_k: None, top_p: Some(0.9), min_p: None },
        ..sampled(24, 5, None)
    };
    assert_eq!(generate(&model, &prompt, cold).sequences[0], greedy_tokens, "a cold draw is the argmax");
}

#[test]
fn generation_stops_at_end_of_sequence_stop_strings_length_and_context() {
    let model = llama(DType::BF16);
    let tokenizer = tokenizer("llama-tiny");
    let prompt = vec![json_field::<Vec<u32>>(&generation_reference("llama-tiny"), "prompt_ids")];
    let free = generate(&model, &prompt, greedy(16)).sequences.remove(0);
    assert_eq!(free.len(), 16);

    // An end-of-sequence token ends the sequence at its first occurrence, kept as the last token.
    let eos = free[4];
    let first = free.iter().position(|&token| token == eos).unwrap();
    let stopped = generate(&model, &prompt, GenerationConfig { eos_token_ids: vec![999, eos], ..greedy(16) });
    assert_eq!(stopped.sequences[0], free[..=first]);
    assert_eq!(stopped.finish_reasons, [FinishReason::EndOfSequence]);

    // A stop string ends the sequence with the token that completes it.
    let stop = tokenizer.decode(&free[2..4]).unwrap();
    let completes = (1..=free.len()).find(|&n| tokenizer.decode(&free[..n]).unwrap().contains(&stop)).unwrap();
    let config = GenerationConfig { stop_strings: vec!["never there".into(), stop.clone()], ..greedy(16) };
    let mut generator = Generator::new(&model, &prompt, config.clone()).unwrap().with_tokenizer(&tokenizer);
    while generator.step().unwrap().is_some() {}
    assert_eq!(generator.generated(0), &free[..completes], "stop string {stop:?}");
    assert_eq!(generator.finish_reason(0), Some(FinishReason::StopString));
    let mut without_decoder = Generator::new(&model, &prompt, config).unwrap();
    assert!(matches!(
        without_decoder.step().unwrap_err(),
        nnx::Error::GenerationSetting { setting: "stop_strings", .. }
    ));

    // The context: a prompt 4 positions short of it leaves room for 5 tokens.
    let gpt2 = gpt2();
    let context = gpt2.context_length();
    let long = vec![(0..context as u32 - 4).map(|id| id % 500).collect::<Vec<u32>>()];
    let full = generate(&gpt2, &long, greedy(10));
    assert_eq!((full.sequences[0].len(), full.finish_reasons[0]), (5, FinishReason::Context));
    let too_long = vec![vec![3u32; context + 1]];
    let error = Generator::new(&gpt2, &too_long, greedy(1)).err().unwrap();
    assert!(matches!(error, nnx::Error::CacheFull { .. }), "{error}");
    assert!(generate(&gpt2, &long, greedy(0)).sequences[0].is_empty());
    assert!(Generator::new(&gpt2, &[Vec::<u32>::new()], greedy(1)).is_err());
}

#[test]
fn the_repetition_penalty_breaks_repeats() {
    let model = gpt2();
    let prompt = vec![json_field::<Vec<u32>>(&generation_reference("gpt2-tiny"), "prompt_ids")];
    let distinct = |tokens: &[u32]| tokens.iter().collect::<std::collections::BTreeSet<_>>().len();
    let plain = generate(&model, &prompt, greedy(16)).sequences.remove(0);
    let penalized = generate(&model, &prompt, GenerationConfig { repetition_penalty: 5.0, ..greedy(16) });
    assert!(distinct(&penalized.sequences[0]) > distinct(&plain) + 4, "{:?} against {plain:?}", penalized.sequences[0]);
}

#[test]
fn settings_come_from_the_folder_and_are_checked() {
    let llama = GenerationConfig::from_folder(fixtures().join("llama-tiny")).unwrap();
    assert_eq!((llama.eos_token_ids.as_slice(), llama.sampling), ([2u32].as_slice(), Sampling::Greedy));
    let dir = scratch();
    let write = |text: &str| std::fs::write(dir.path().join("generation_config.json"), text).unwrap();
    write(r#"{"do_sample": true, "temperature": 0.7, "top_p": 0.9, "eos_token_id": [5, 6], "max_new_tokens": 9}"#);
    let config = GenerationConfig::from_folder(dir.path()).unwrap();
    assert_eq!(config.sampling, Sampling::Random { temperature: 0.7, top_k: Some(50), top_p: Some(0.9), min_p: None });
    assert_eq!((config.eos_token_ids, config.max_new_tokens), (vec![5, 6], 9));
    // The end-of-sequence id of `config.json` when the generation settings have none.
    write(r#"{"do_sample": false, "top_k": 0}"#);
    std::fs::write(dir.path().join("config.json"), r#"{"eos_token_id": 7}"#).unwrap();
    let config = GenerationConfig::from_folder(dir.path()).unwrap();
    assert_eq!((config.eos_token_ids, config.sampling), (vec![7], Sampling::Greedy));
    write(r#"{"do_sample": true, "top_p": 1.5}"#);
    let error = GenerationConfig::from_folder(dir.path()).unwrap_err();
    assert!(matches!(error, nnx::Error::GenerationSetting { setting: "top_p", .. }), "{error}");
    write(r#"{"eos_token_id": "</s>"}"#);
    let error = GenerationConfig::from_folder(dir.path()).unwrap_err();
    assert!(error.to_string().contains("eos_token_id"), "{error}");
    let negative = GenerationConfig { repetition_penalty: 0.0, ..GenerationConfig::default() };
    assert!(negative.check().is_err());
}

#[test]
fn tokenizers_encode_as_transformers_and_streams_print_whole_characters() {
    for name in ["gpt2-tiny", "llama-tiny"] {
        let reference = generation_reference(name);
        let tokenizer = tokenizer(name);
        let prompt: String = json_field(&reference, "prompt");
        assert_eq!(tokenizer.encode(&prompt).unwrap(), json_field::<Vec<u32>>(&reference, "prompt_ids"), "{name}");
        assert_eq!(tokenizer.vocab_size(), if name == "gpt2-tiny" { 512 } else { 256 });
    }
    // The Llama fixture's tokens are bytes: characters past ASCII span several tokens.
    let tokenizer = tokenizer("llama-tiny");
    let text = "Café 日本 ok";
    let ids = tokenizer.encode(text).unwrap();
    assert_eq!(ids.len(), 1 + text.len(), "`<s>` and one token per byte");
    let mut stream = TextStream::new(&tokenizer, &ids[..1]);
    let pieces: Vec<String> = ids[1..].iter().map(|&id| stream.push(id).unwrap()).collect();
    assert_eq!(pieces.concat(), text);
    assert!(pieces.iter().all(|piece| !piece.contains(char::REPLACEMENT_CHARACTER)));
    let bytes_of_ja = "日".len();
    let ja = text.find('日').unwrap();
    assert_eq!(&pieces[ja..ja + bytes_of_ja], ["", "", "日"], "held back until the character is whole");
    assert_eq!(stream.finish().unwrap(), "");
    // Bytes that never make a character come out as U+FFFD, once the next text arrives or at
    // the end.
    let mut stream = TextStream::new(&tokenizer, &ids[..2]);
    let continuation = u32::from("é".as_bytes()[1]);
    assert_eq!(stream.push(continuation).unwrap(), "");
    assert_eq!(stream.push(u32::from(b'P')).unwrap(), "\u{FFFD}P");
    let lead = u32::from("日".as_bytes()[0]);
    assert_eq!(stream.push(lead).unwrap(), "");
    assert_eq!(stream.finish().unwrap(), "\u{FFFD}");
    // The first token after the prompt decodes in context: GPT-2's leading space survives.
    let tokenizer = self::tokenizer("gpt2-tiny");
    let prompt = tokenizer.encode("Once upon a").unwrap();
    let next = tokenizer.encode(" time").unwrap();
    let mut stream = TextStream::new(&tokenizer, &prompt);
    assert_eq!(next.iter().map(|&id| stream.push(id).unwrap()).collect::<String>(), " time");
}

fn run_example(name: &str, args: &[&str]) -> (String, String) {
    let output = Command::new(example_binary(name)).args(args).output().unwrap();
    let (stdout, stderr) =
        (String::from_utf8(output.stdout).unwrap(), String::from_utf8_lossy(&output.stderr).into_owned());
    assert!(output.status.success(), "{name} {args:?}: {stderr}");
    (stdout, stderr)
}

#[test]
fn the_examples_generate_from_a_text_prompt() {
    let reference = generation_reference("llama-tiny");
    let prompt: String = json_field(&reference, "prompt");
    let (prompt_ids, expected) = case(&reference, "prompt_ids", "greedy_ids");
    let new = expected.len() - prompt_ids.len();
    let steps = new.to_string();
    let (stdout, _) = run_example("llama", &["--prompt", &prompt, "--max-new-tokens", &steps, "--json"]);
    let object: serde_json::Value = serde_json::from_str(stdout.trim_end()).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one JSON object: {stdout}");
    assert_eq!(json_field::<Vec<u32>>(&object, "prompt_ids"), prompt_ids);
    assert_eq!(json_field::<Vec<u32>>(&object, "generated_ids"), expected[prompt_ids.len()..]);
    for speed in ["prefill_tokens_per_s", "decode_tokens_per_s"] {
        assert!(json_field::<f64>(&object, speed) > 0.0, "{speed}");
    }
    // Streamed text: the prompt, then the generated text, whole characters only; speeds on
    // stderr.
    let (stdout, stderr) = run_example("llama", &["--prompt", &prompt, "--max-new-tokens", &steps]);
    assert_eq!(stdout, format!("{}\n", tokenizer("llama-tiny").decode(&expected).unwrap()));
    assert!(stderr.contains("tokens/s") && stderr.contains("prefill") && stderr.contains("decode"), "{stderr}");
    // Draws with a seed repeat; a stop string ends the text.
    let draw = |seed: &str| {
        let args =
            ["--prompt", &prompt, "--temperature", "0.9", "--top-k", "40", "--top-p", "0.95", "--seed", seed, "--json"];
        let object: serde_json::Value = serde_json::from_str(run_example("llama", &args).0.trim_end()).unwrap();
        json_field::<Vec<u32>>(&object, "generated_ids")
    };
    assert_eq!(draw("11"), draw("11"));
    assert_ne!(draw("11"), draw("12"));
    let (stdout, _) = run_example("gpt2", &["--prompt", "Once upon a time", "--stop", " time", "--json"]);
    let object: serde_json::Value = serde_json::from_str(stdout.trim_end()).unwrap();
    assert_eq!(json_field::<String>(&object, "text"), " time", "GPT-2's first token completes the stop string");
    let output = Command::new(example_binary("gpt2")).args(["--model", "/nonexistent-model-folder"]).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).starts_with("error: "));
}

/// Asserts that `model` decodes the batch of `generation.json` of `name` as transformers.
fn assert_batch_as_transformers(model: &impl CausalLm, name: &str, what: &str) {
    let batch = &generation_reference(name)["batch"];
    let prompts: Vec<Vec<u32>> = json_field(batch, "prompt_ids");
    let expected: Vec<Vec<u32>> = json_field(batch, "greedy_ids");
    let found = generate(model, &prompts, greedy(expected[0].len() - prompts[0].len()));
    for (index, prompt) in prompts.iter().enumerate() {
        assert_eq!([prompt.as_slice(), &found.sequences[index]].concat(), expected[index], "{what}: sequence {index}");
    }
}

#[test]
fn generation_on_the_gpu_equals_the_host_and_transformers() {
    let Some(gpu) = crate::gpu::gpu() else { return };
    let gpt2 = gpt2().place(&gpu).unwrap();
    let (prompt, expected) = case(&reference("gpt2-tiny"), "input_ids", "greedy_ids");
    assert_eq!(gpt2.generate(&prompt, expected.len() - prompt.len()).unwrap(), expected, "GPT-2 on the GPU");
    assert_batch_as_transformers(&gpt2, "gpt2-tiny", "GPT-2 batch on the GPU");
    let cache: KvCache<nnx::Gpu> = gpt2.new_cache(2, 8).unwrap();
    assert_eq!((cache.batch(), cache.capacity(), cache.len()), (2, 8, 0));

    let llama = llama(DType::BF16).place(&gpu).unwrap();
    let reference = generation_reference("llama-tiny");
    for (prompt, expected) in
        [case(&reference, "input_ids", "input_greedy_ids"), case(&reference, "prompt_ids", "greedy_ids")]
    {
        assert_eq!(llama.generate(&prompt, expected.len() - prompt.len()).unwrap(), expected, "Llama on the GPU");
    }
    assert_batch_as_transformers(&llama, "llama-tiny", "Llama batch on the GPU");

    // The example, on the GPU.
    let prompt: String = json_field(&reference, "prompt");
    let (stdout, _) =
        run_example("llama", &["--prompt", &prompt, "--max-new-tokens", "4", "--device", "gpu", "--json"]);
    let object: serde_json::Value = serde_json::from_str(stdout.trim_end()).unwrap();
    let (prompt_ids, expected) = case(&reference, "prompt_ids", "greedy_ids");
    assert_eq!(json_field::<Vec<u32>>(&object, "generated_ids"), expected[prompt_ids.len()..prompt_ids.len() + 4]);
}

#[test]
fn a_quantized_llama_decodes_as_the_model_of_its_dequantized_weights() {
    // The fixture's MLP is 176 wide, not a multiple of any MLX group: quantizing it is refused
    // with an error, not a panic.
    assert!(llama(DType::F32).quantize(4, 32).is_err());
    let mut config = serde_json::from_str::<serde_json::Value>(
        &std::fs::read_to_string(fixtures().join("llama-tiny").join("config.json")).unwrap(),
    )
    .unwrap();
    config["intermediate_size"] = 128.into();
    let config: LlamaConfig = serde_json::from_value(config).unwrap();
    let dense = Llama::new(&config, DType::F32, nnx::nn::Init::Seeded(11));
    for (bits, group) in [(4, 32), (8, 64)] {
        let quantized = dense.quantize(bits, group).unwrap();
        // MLX's layout: packed U32 `weight`, `scales` and `biases` per projection.
        let names = quantized.flat_state_dict();
        assert_eq!(names.get("layers.1.mlp.down.weight").unwrap().dtype(), DType::U32);
        assert_eq!(names.get("layers.1.mlp.down.scales").unwrap().shape(), [64, 128 / group]);
        assert!(names.contains_key("lm_head.biases") && names.contains_key("embed.weight"));
        let dequantized = quantized.map_weights::<Dense>(|_, layer| layer.to_linear(DType::F32)).unwrap();
        let ids = [1u32, 40, 7, 99, 3, 250, 18];
        let (ours, theirs) = (quantized.logits(&ids).unwrap(), dequantized.logits(&ids).unwrap());
        let (ours, theirs) = (ours.to_vec::<f32>().unwrap(), theirs.to_vec::<f32>().unwrap());
        let diff = max_abs_diff(&ours, &theirs, "quantized Llama logits");
        assert!(diff <= 1e-4, "Q{bits} g{group}: logits differ from the dequantized model's by {diff}");
        // One token at a time through the cache (the one-row packed products) decodes as the
        // whole sequence recomputed (the batched decoding products), and as the float model.
        let steps = 12;
        let cached = quantized.generate(&ids, steps).unwrap();
        assert_eq!(cached, uncached_greedy(&quantized, &ids, steps), "Q{bits} g{group} without a cache");
        assert_eq!(cached, dequantized.generate(&ids, steps).unwrap(), "Q{bits} g{group} against dequantized");
        // Placed on the GPU with the weights still packed, decoded inside its products.
        if let Some(gpu) = crate::gpu::gpu() {
            let placed = quantized.place(&gpu).unwrap();
            assert_eq!(placed.generate(&ids, steps).unwrap(), cached, "Q{bits} g{group} on the GPU");
        }
    }
}

#[test]
fn a_llama_of_ggml_blocks_decodes_as_the_model_of_its_decoded_weights() {
    use nnx::quant::ggml::{GgmlLinear, GgmlType};
    let mut config = serde_json::from_str::<serde_json::Value>(
        &std::fs::read_to_string(fixtures().join("llama-tiny").join("config.json")).unwrap(),
    )
    .unwrap();
    config["intermediate_size"] = 256.into();
    config["hidden_size"] = 256.into();
    let config: LlamaConfig = serde_json::from_value(config).unwrap();
    let dense = Llama::new(&config, DType::F32, nnx::nn::Init::Seeded(5));
    let ids = [1u32, 40, 7, 99, 3, 250, 18];
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        // Rows that do not hold whole blocks take llama.cpp's fallback type.
        let packed = dense
            .map_weights::<nnx::models::Ggml>(|_, layer| {
                GgmlLinear::from_linear(layer, nnx::gguf::fallback(ty, layer.weight.shape()[1]))
            })
            .unwrap();
        let names = packed.flat_state_dict();
        assert_eq!(names.get("layers.1.mlp.down.weight").unwrap().dtype(), DType::U8, "{ty} blocks stay packed");
        let decoded = packed.map_weights::<Dense>(|_, layer| layer.to_linear(DType::F32)).unwrap();
        let (ours, theirs) = (packed.logits(&ids).unwrap(), decoded.logits(&ids).unwrap());
        let (ours, theirs) = (ours.to_vec::<f32>().unwrap(), theirs.to_vec::<f32>().unwrap());
        let scale = theirs.iter().fold(0f32, |m, v| m.max(v.abs()));
        // The packed products quantize activations to 8 bits per block, as ggml's do.
        let diff = max_abs_diff(&ours, &theirs, "ggml-block Llama logits");
        assert!(diff <= 0.02 * scale, "{ty}: logits differ from the decoded model's by {diff} (scale {scale})");
        let steps = 8;
        let cached = packed.generate(&ids, steps).unwrap();
        assert_eq!(cached, uncached_greedy(&packed, &ids, steps), "{ty} without a cache");
        // On the GPU the blocks stay packed and are decoded inside its products (in f32, where
        // the host quantizes activations): the logits agree within the same tolerance.
        if let Some(gpu) = crate::gpu::gpu() {
            let placed = packed.place(&gpu).unwrap();
            let logits = placed.logits(&ids).unwrap().to_vec::<f32>().unwrap();
            let diff = max_abs_diff(&logits, &theirs, "ggml-block Llama logits on the GPU");
            assert!(diff <= 0.02 * scale, "{ty} on the GPU: logits differ by {diff} (scale {scale})");
        }
    }
}
