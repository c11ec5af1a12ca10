//! Llama, Mistral, Qwen2, Qwen3 and Gemma 3 loaded by `nnx::models::load` from the GGUF files
//! llama.cpp's own converter and quantizer made of small random models
//! (`tests/fixtures/models/`, made by `scripts/models/make_goldens.sh`): F32 files against the
//! transformers logits of the same weights, quantized files against llama.cpp's logits and
//! greedy tokens on the same file.

use std::path::PathBuf;

use nnx::models::{CausalLm, Quantize};
use serde_json::Value;

use crate::util::{fixtures, floats, ids, max_abs_diff};

const CASES: [&str; 5] = ["llama3", "mistral", "qwen2", "qwen3", "gemma3"];

fn case(name: &str) -> PathBuf {
    fixtures().join("models").join(name)
}

fn json(path: PathBuf) -> Value {
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// All-position logits of `file` in `case` for the reference ids.
fn logits(case_name: &str, file: &str) -> (Vec<f32>, nnx::models::LoadedModel) {
    let reference = json(case(case_name).join("reference.json"));
    let loaded = nnx::models::load(case(case_name).join(file).to_str().unwrap()).unwrap();
    let logits = loaded.model.logits(&ids(&reference["ids"])).unwrap().to_vec::<f32>().unwrap();
    (logits, loaded)
}

#[test]
fn f32_gguf_files_give_the_transformers_logits_of_their_weights() {
    for name in CASES {
        let reference = json(case(name).join("reference.json"));
        let (ours, loaded) = logits(name, "model-f32.gguf");
        let architecture = if name.starts_with("llama") || name == "mistral" { "llama" } else { name };
        assert_eq!(loaded.architecture, architecture);
        let diff = max_abs_diff(&ours, &floats(&reference["logits"]), name);
        println!("{name} model-f32.gguf vs transformers: max abs difference {diff:e}");
        assert!(diff <= 1e-4, "{name}: the F32 GGUF logits differ from transformers' by {diff}");
    }
}

#[test]
fn f32_gguf_files_give_llama_cpps_logits() {
    // llama.cpp's own logits with an F32 key/value cache: the same arithmetic up to rounding
    // (Gemma's GELU reads an F16 table in ggml, hence its wider bound).
    for name in CASES {
        let expected = json(case(name).join("llamacpp.json"));
        let (ours, _) = logits(name, "model-f32.gguf");
        let diff = max_abs_diff(&ours, &floats(&expected["model-f32.gguf"]["logits_kv_f32"]), name);
        println!("{name} model-f32.gguf vs llama.cpp: max abs difference {diff:e}");
        let bound = if name == "gemma3" { 1e-2 } else { 1e-4 };
        assert!(diff <= bound, "{name}: logits differ from llama.cpp's by {diff}");
    }
}

#[test]
fn quantized_gguf_files_decode_as_llama_cpp_does() {
    let mut files = Vec::new();
    for name in CASES.iter().chain(&["llama3-wide"]) {
        for file in ["model-q8_0.gguf", "model-q4_k_m.gguf"] {
            if case(name).join(file).exists() {
                files.push((*name, file));
            }
        }
    }
    assert!(files.len() >= 7, "the quantized fixtures are present");
    for (name, file) in files {
        let expected = &json(case(name).join("llamacpp.json"))[file];
        let (ours, loaded) = logits(name, file);
        let theirs = floats(&expected["logits"]);
        let diff = max_abs_diff(&ours, &theirs, name);
        let scale = theirs.iter().fold(0f32, |m, x| m.max(x.abs()));
        println!(
            "{name} {file} ({}) vs llama.cpp: max abs difference {diff:e} of logits up to {scale}",
            loaded.weights
        );
        // llama.cpp rounds activations to 8-bit blocks (and keys and values to F16) inside its
        // products; nnx multiplies a prompt's f32 activations by the same weight blocks.
        assert!(diff <= 0.08 * scale, "{name} {file}: logits differ from llama.cpp's by {diff}");
    }
}

#[test]
fn transformers_folders_load_through_the_same_loader() {
    for name in CASES {
        let reference = json(case(name).join("reference.json"));
        let (ours, loaded) = logits(name, "");
        assert_eq!(loaded.weights, "bf16", "{name}: the folder's weights load as stored");
        let diff = max_abs_diff(&ours, &floats(&reference["logits"]), name);
        println!("{name} folder vs transformers: max abs difference {diff:e}");
        assert!(diff <= 1e-4, "{name}: the folder's logits differ from transformers' by {diff}");
        assert!(loaded.chat_template.is_some(), "{name}: the folder has a chat template");
        assert!(!loaded.generation.eos_token_ids.is_empty(), "{name}: the folder names its end of sequence");
    }
}

#[test]
fn a_tied_gguf_head_reads_the_embedding_blocks() {
    // Qwen2's fixture ties its head: the file has no `output.weight`, and the head is the
    // Q8_0 embedding, as llama.cpp computes it.
    let file = case("qwen2").join("model-q8_0.gguf");
    let archive = nnx::Archive::open(&file).unwrap();
    assert!(!archive.contains("output.weight"));
    let reference = json(case("qwen2").join("reference.json"));
    let loaded = nnx::models::load(file.to_str().unwrap()).unwrap();
    let greedy = loaded.model.generate(&ids(&reference["ids"]), 4).unwrap();
    assert_eq!(greedy.len(), 20);

    // The loader keeps the table in its blocks: a lookup decodes the rows, and the tied head
    // is the product with the same blocks.
    let entry = archive.ggml("token_embd.weight").unwrap();
    let [vocab, hidden] = entry.shape[..] else { panic!("a 2-D embedding") };
    let row_bytes = entry.data.shape()[0] / vocab;
    let embed = nnx::models::TokenEmbedding {
        weight: entry.data.reshape(&[vocab, row_bytes]).unwrap(),
        ggml: Some((entry.ty, hidden)),
    };
    let decoded = entry.dequantize().unwrap().to_vec::<f32>().unwrap();
    let rows = embed.forward(&[7, 0, 7, vocab as u32 - 1]).unwrap();
    assert_eq!(rows.shape(), [4, hidden]);
    let expected: Vec<f32> =
        [7, 0, 7, vocab - 1].iter().flat_map(|&id| decoded[id * hidden..(id + 1) * hidden].to_vec()).collect();
    assert_eq!(rows.to_vec::<f32>().unwrap(), expected);
    let head = nnx::quant::ggml::GgmlLinear::new(embed.weight.clone(), None, entry.ty, hidden).unwrap();
    assert_eq!(
        embed.project(&rows).unwrap().to_vec::<f32>().unwrap(),
        head.forward(&rows).unwrap().to_vec::<f32>().unwrap()
    );
    let error = embed.forward(&[1, vocab as u32]).unwrap_err().to_string();
    assert!(error.contains(&format!("id {vocab} at position 1")), "{error}");
}

#[test]
fn a_gguf_of_an_unknown_architecture_is_refused_by_name() {
    let dir = crate::util::scratch();
    let path = dir.path().join("other.gguf");
    let mut writer = nnx::gguf::GgufWriter::new();
    writer.metadata_mut().set("general.architecture", nnx::gguf::Value::String("rwkv7".into()));
    writer.write(&path).unwrap();
    let error = nnx::models::load(path.to_str().unwrap()).unwrap_err().to_string();
    assert!(error.contains("`rwkv7`") && error.contains("qwen2"), "{error}");
}

#[test]
fn a_head_count_that_does_not_fit_the_rows_is_named() {
    // Rewrite the F32 Llama file with a head count whose rotary groups do not divide q's rows.
    let source = case("llama3").join("model-f32.gguf");
    let archive = nnx::Archive::open(&source).unwrap();
    let mut writer = nnx::gguf::GgufWriter::new();
    *writer.metadata_mut() = archive.gguf_metadata().unwrap().clone();
    writer.metadata_mut().set("llama.attention.head_count", nnx::gguf::Value::U32(6));
    writer.metadata_mut().remove("general.alignment");
    for name in archive.names() {
        writer.add(name, archive.ggml(name).unwrap()).unwrap();
    }
    let dir = crate::util::scratch();
    let path = dir.path().join("bad-heads.gguf");
    writer.write(&path).unwrap();
    let error = nnx::models::load(path.to_str().unwrap()).unwrap_err().to_string();
    assert!(error.contains("blk.0.attn_q.weight") && error.contains("64 rows do not form 6 heads"), "{error}");
}

/// The logits of a Llama GGUF file computed from its blocks decoded to f32: the exact
/// arithmetic that packed products approximate.
fn decoded_llama_logits(name: &str, file: &str) -> Vec<f32> {
    use nnx::models::llama::{Llama, LlamaConfig};
    let archive = nnx::Archive::open(case(name).join(file)).unwrap();
    let config = LlamaConfig::from_gguf(archive.gguf_metadata().unwrap(), !archive.contains("output.weight")).unwrap();
    let mut dense = Llama::new(&config, nnx::DType::F32, nnx::nn::Init::Meta);
    // Llama 3's rope scaling is in the file only as `rope_freqs.weight`.
    if let Some((_, shape)) = archive.entry_spec("rope_freqs.weight").unwrap() {
        dense.rope_freqs = Some(nnx::Tensor::meta(nnx::DType::F32, &shape));
    }
    archive.import_into(&mut dense, "").unwrap();
    let reference = json(case(name).join("reference.json"));
    dense.forward(&ids(&reference["ids"])).unwrap().to_vec::<f32>().unwrap()
}

#[test]
fn host_products_are_exact_for_prompts_and_round_single_tokens_as_llama_cpp_does() {
    // A prompt (16 rows and more) multiplies decoded weight panels in f32: the exact logits of
    // the blocks. A decoded token (one row) rounds its activations to 8-bit blocks, as
    // llama.cpp's CPU products do: within a few percent of the exact logits, like llama.cpp.
    for (name, file) in [("llama3", "model-q8_0.gguf"), ("llama3-wide", "model-q4_k_m.gguf")] {
        let exact = decoded_llama_logits(name, file);
        let (prompt, loaded) = logits(name, file);
        let diff = max_abs_diff(&prompt, &exact, name);
        println!("{name} {file}: the prompt's logits {diff:e} from the exact ones");
        assert!(diff <= 1e-4, "{name} {file}: {diff}");
        let ids = ids(&json(case(name).join("reference.json"))["ids"]);
        let mut cache = loaded.model.new_cache(1, ids.len()).unwrap();
        let mut stepped = Vec::new();
        for id in &ids {
            stepped.extend(loaded.model.forward_cached(&[*id], &mut cache).unwrap().to_vec::<f32>().unwrap());
        }
        let theirs = floats(&json(case(name).join("llamacpp.json"))[file]["logits"]);
        let scale = exact.iter().fold(0f32, |m, x| m.max(x.abs()));
        let (ours_gap, theirs_gap) = (max_abs_diff(&stepped, &exact, name), max_abs_diff(&theirs, &exact, name));
        println!(
            "{name} {file} token by token: nnx {ours_gap:e} and llama.cpp {theirs_gap:e} from the exact logits (up to {scale})"
        );
        assert!(ours_gap <= 0.06 * scale, "{name} {file}: {ours_gap}");
    }
}

#[cfg(feature = "gpu")]
#[test]
fn gguf_models_run_on_the_gpu() {
    let Some(gpu) = crate::gpu::gpu() else { return };
    // The GPU's packed products keep activations in f32: the exact logits of the blocks.
    for (name, file) in [("llama3", "model-q8_0.gguf"), ("llama3-wide", "model-q4_k_m.gguf")] {
        let exact = decoded_llama_logits(name, file);
        let reference = json(case(name).join("reference.json"));
        let options = nnx::models::LoadOptions::on(gpu.clone());
        let loaded = nnx::models::load_with(case(name).join(file).to_str().unwrap(), &options).unwrap();
        let ours = loaded.model.logits(&ids(&reference["ids"])).unwrap().to_vec::<f32>().unwrap();
        let diff = max_abs_diff(&ours, &exact, name);
        println!("{name} {file} on the GPU vs its decoded blocks: max abs difference {diff:e}");
        assert!(diff <= 1e-4, "{name} {file}: the GPU's logits differ by {diff}");
    }
    // A folder of MXFP4 expert pairs: its stacks uploaded packed, products in f32.
    let reference = json(case("gpt-oss-mxfp4").join("reference.json"));
    let options = nnx::models::LoadOptions::on(gpu.clone());
    let loaded = nnx::models::load_with(case("gpt-oss-mxfp4").to_str().unwrap(), &options).unwrap();
    let ours = loaded.model.logits(&ids(&reference["ids"])).unwrap().to_vec::<f32>().unwrap();
    let diff = max_abs_diff(&ours, &floats(&reference["logits"]), "gpt-oss-mxfp4");
    println!("gpt-oss-mxfp4 folder on the GPU vs transformers: max abs difference {diff:e}");
    assert!(diff <= 1e-4, "gpt-oss-mxfp4: the GPU's logits differ from transformers' by {diff}");
    // F32 files of every family on the GPU give transformers' logits, the mixtures of experts'
    // included.
    for name in CASES.iter().chain(&MOE).chain(&HYBRID).chain(&["gemma4", "gemma4moe"]) {
        let reference = json(case(name).join("reference.json"));
        let options = nnx::models::LoadOptions::on(gpu.clone());
        let loaded = nnx::models::load_with(case(name).join("model-f32.gguf").to_str().unwrap(), &options).unwrap();
        let ours = loaded.model.logits(&ids(&reference["ids"])).unwrap().to_vec::<f32>().unwrap();
        let diff = max_abs_diff(&ours, &floats(&reference["logits"]), name);
        println!("{name} model-f32.gguf on the GPU vs transformers: max abs difference {diff:e}");
        assert!(diff <= 1e-4, "{name}: the GPU's logits differ from transformers' by {diff}");
        // Quantized: the GPU's products over the packed blocks (and the expert stacks' views)
        // keep the activations in f32, so they give the logits of the decoded blocks: those of
        // the file converted to F32 by `nnx convert --type f32`, run on the host.
        let dir = crate::util::scratch();
        for file in ["model-q8_0.gguf", "model-q4_k_m.gguf", "model-mxfp4_moe.gguf"] {
            let source = case(name).join(file);
            if !source.exists() {
                continue;
            }
            let decoded = dir.path().join(file);
            let args = ["convert".as_ref(), source.as_os_str(), decoded.as_os_str(), "--type".as_ref(), "f32".as_ref()];
            let (code, _, stderr) = crate::util::run_nnx(&args);
            assert_eq!(code, 0, "{stderr}");
            let host = nnx::models::load(decoded.to_str().unwrap()).unwrap();
            let host = host.model.logits(&ids(&reference["ids"])).unwrap().to_vec::<f32>().unwrap();
            let loaded = nnx::models::load_with(source.to_str().unwrap(), &options).unwrap();
            let ours = loaded.model.logits(&ids(&reference["ids"])).unwrap().to_vec::<f32>().unwrap();
            let diff = max_abs_diff(&ours, &host, file);
            println!("{name} {file} on the GPU vs its decoded blocks: max abs difference {diff:e}");
            assert!(diff <= 1e-4, "{name} {file}: the GPU's logits differ from the decoded blocks' by {diff}");
        }
    }
}

/// `case`'s folder quantized by `nnx quantize` to MLX affine 4-bit in groups of 32 (the layout
/// mlx-lm writes, `quantization` in `config.json`), with its tokenizer beside it.
fn mlx_folder(name: &str) -> tempfile::TempDir {
    let dir = crate::util::scratch();
    let out = dir.path().join("mlx");
    let source = case(name);
    let args = vec![
        "quantize".to_string(),
        source.to_str().unwrap().into(),
        out.to_str().unwrap().into(),
        "--encoding".into(),
        "q4".into(),
        "--group-size".into(),
        "32".into(),
    ];
    let (code, _, stderr) = crate::util::run_nnx(&args);
    assert_eq!(code, 0, "{stderr}");
    for file in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(source.join(file), out.join(file)).unwrap();
    }
    dir
}

#[test]
fn mlx_affine_folders_load_as_affine_layers() {
    use nnx::models::llama::{Llama, LlamaConfig};
    use nnx::quant::{AffineSpec, AffineWeight};
    let reference = json(case("llama3").join("reference.json"));
    let ids = ids(&reference["ids"]);
    let dir = mlx_folder("llama3");
    let folder = dir.path().join("mlx");
    let loaded = nnx::models::load(folder.to_str().unwrap()).unwrap();
    assert_eq!(loaded.weights, "mlx affine 4-bit, groups of 32");
    let ours = loaded.model.logits(&ids).unwrap().to_vec::<f32>().unwrap();
    // nnx's own quantizer on the same BF16 weights gives the same layers; the embedding, which
    // mlx-lm packs too, is decoded on import.
    let config = LlamaConfig::from_file(case("llama3").join("config.json")).unwrap();
    let mut dense = Llama::new(&config, nnx::DType::BF16, nnx::nn::Init::Meta);
    nnx::Archive::open(case("llama3")).unwrap().import_into(&mut dense, "").unwrap();
    let mut expected = dense.quantize(4, 32).unwrap();
    let mlx = nnx::Archive::open(&folder).unwrap();
    let part = |suffix: &str| mlx.try_get(&format!("model.embed_tokens.{suffix}")).unwrap();
    let embedding = AffineWeight::new(part("weight"), part("scales"), part("biases"), AffineSpec::new(4, 32).unwrap());
    expected.embed.weight = embedding.unwrap().dequantize().unwrap().to_dtype(nnx::DType::BF16).unwrap();
    let expected = expected.forward(&ids).unwrap().to_vec::<f32>().unwrap();
    let diff = max_abs_diff(&ours, &expected, "mlx folder");
    println!("mlx folder vs Llama::quantize: max abs difference {diff:e}");
    assert!(diff <= 1e-4, "the MLX folder's logits differ by {diff}");
}

#[test]
fn seed_folders_load_as_seed_layers() {
    // `llama3-seed4` is `llama3` packed by `nnx quantize --encoding seed4` (every projection,
    // the head and the embedding; the encoder's search is too slow to run in a test). The
    // loaded model computes what the same weights decoded to floats (`nnx dequantize`) compute.
    let dir = crate::util::scratch();
    let (packed, decoded) = (case("llama3-seed4"), dir.path().join("decoded"));
    let (code, _, stderr) = crate::util::run_nnx(&["dequantize", packed.to_str().unwrap(), decoded.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    for file in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(packed.join(file), decoded.join(file)).unwrap();
    }
    let ids = ids(&json(case("llama3").join("reference.json"))["ids"]);
    let loaded = nnx::models::load(packed.to_str().unwrap()).unwrap();
    assert_eq!(loaded.weights, "seed");
    let ours = loaded.model.logits(&ids).unwrap().to_vec::<f32>().unwrap();
    let expected = nnx::models::load(decoded.to_str().unwrap()).unwrap().model.logits(&ids).unwrap();
    let diff = max_abs_diff(&ours, &expected.to_vec::<f32>().unwrap(), "seed folder");
    println!("seed folder vs its decoded weights: max abs difference {diff:e}");
    assert!(diff <= 1e-3, "the SEED folder's logits differ by {diff}");
}

#[test]
fn stored_rope_rows_keep_the_files_order_and_give_the_same_logits() {
    use nnx::models::llama::{Llama, LlamaConfig};
    // Mistral's GGUF file stores q and k in llama.cpp's rotary pair order.
    let archive = nnx::Archive::open(case("mistral").join("model-f32.gguf")).unwrap();
    let config = LlamaConfig::from_gguf(archive.gguf_metadata().unwrap(), !archive.contains("output.weight")).unwrap();
    let mut reordered = Llama::new(&config, nnx::DType::F32, nnx::nn::Init::Meta);
    archive.import_into(&mut reordered, "").unwrap();
    let mut stored = Llama::new(&config, nnx::DType::F32, nnx::nn::Init::Meta);
    stored.stored_rope_rows = true;
    let options = nnx::ImportOptions::default().with_stored_rope_rows();
    archive.import_into_with(&mut stored, "", &options).unwrap();

    let file_q = archive.ggml("blk.0.attn_q.weight").unwrap().dequantize().unwrap().to_vec::<f32>().unwrap();
    assert_eq!(stored.layers[0].attn.q.weight.to_vec::<f32>().unwrap(), file_q, "the file's rows as they are");
    assert_ne!(reordered.layers[0].attn.q.weight.to_vec::<f32>().unwrap(), file_q, "transformers' row order");
    let reference = json(case("mistral").join("reference.json"));
    let ids = ids(&reference["ids"]);
    let (a, b) = (reordered.forward(&ids).unwrap(), stored.forward(&ids).unwrap());
    let diff = max_abs_diff(&a.to_vec::<f32>().unwrap(), &b.to_vec::<f32>().unwrap(), "logits");
    assert!(diff < 1e-5, "stored order vs reordered rows: {diff}");
}

#[test]
fn qwen3_moe_gguf_files_route_as_transformers() {
    let reference = json(case("qwen3moe").join("reference.json"));
    let (ours, loaded) = logits("qwen3moe", "model-f32.gguf");
    assert_eq!(loaded.architecture, "qwen3moe");
    let diff = max_abs_diff(&ours, &floats(&reference["logits"]), "qwen3moe");
    println!("qwen3moe model-f32.gguf vs transformers: max abs difference {diff:e}");
    assert!(diff <= 1e-4, "qwen3moe: the F32 GGUF logits differ from transformers' by {diff}");
    // The experts are the file's stacked entries, mapped: nothing copied.
    let archive = nnx::Archive::open(case("qwen3moe").join("model-f32.gguf")).unwrap();
    let info = archive.info("blk.0.ffn_gate_exps.weight").unwrap();
    assert_eq!(info.shape, [8, 48, 64]);
    // The transformers folder keeps one tensor per expert; its BF16 weights are the ones the
    // F32 file was converted from, and stacked they give the same logits.
    let folder = nnx::models::load(case("qwen3moe").to_str().unwrap()).unwrap();
    let from_folder = folder.model.logits(&ids(&reference["ids"])).unwrap().to_vec::<f32>().unwrap();
    let diff = max_abs_diff(&from_folder, &ours, "qwen3moe folder");
    println!("qwen3moe folder vs model-f32.gguf: max abs difference {diff:e}");
    assert!(diff <= 1e-2, "qwen3moe: the folder's logits differ from the GGUF file's by {diff}");
}

#[test]
fn quantized_experts_are_read_in_their_stored_blocks() {
    use nnx::models::moe::Experts;
    // llama.cpp's quantizer writes the experts in Q8_0, Q5_0, MXFP4 and, for widths that are
    // not whole blocks, F16; each stack is read in its own type, and an expert's product over
    // its packed rows is the product over the rows decoded (up to the activations' rounding to
    // 8-bit blocks, as llama.cpp rounds them).
    let cases = [
        ("qwen3moe", &["model-q8_0.gguf", "model-q4_k_m.gguf"][..]),
        ("gpt-oss", &["model-q8_0.gguf", "model-q4_k_m.gguf", "model-mxfp4_moe.gguf"][..]),
    ];
    let mut types = std::collections::BTreeSet::new();
    for (name, files) in cases {
        for file in files {
            let archive = nnx::Archive::open(case(name).join(file)).unwrap();
            for entry in ["blk.0.ffn_gate_exps.weight", "blk.1.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight"] {
                let stored = archive.ggml(entry).unwrap();
                let [count, out, input] = stored.shape[..] else { panic!("{entry}: {:?}", stored.shape) };
                let row_bytes = stored.ty.row_bytes(input).unwrap();
                let packed = Experts {
                    weight: stored.data.reshape(&[count, out, row_bytes]).unwrap(),
                    bias: None,
                    ggml: Some((stored.ty, input)),
                };
                let decoded = Experts { weight: stored.dequantize().unwrap(), bias: None, ggml: None };
                let x: Vec<f32> = (0..3 * input).map(|at| (at as f32 * 0.61).sin()).collect();
                let x = nnx::Tensor::from_vec(x, &[3, input]).unwrap();
                for expert in 0..count {
                    let ours = packed.project(expert, &x).unwrap().to_vec::<f32>().unwrap();
                    let theirs = decoded.project(expert, &x).unwrap().to_vec::<f32>().unwrap();
                    let scale = theirs.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let diff = max_abs_diff(&ours, &theirs, entry);
                    let ty = stored.ty.name();
                    assert!(diff <= 2e-2 * scale, "{name} {file} {entry} ({ty}) expert {expert}: {diff} of {scale}");
                }
                types.insert(stored.ty.name());
            }
            // The whole model runs over them.
            let (logits, loaded) = logits(name, file);
            assert!(logits.iter().all(|v| v.is_finite()), "{name} {file}");
            println!("{name} {file}: {}", loaded.weights);
        }
    }
    assert!(["Q8_0", "Q5_0", "MXFP4", "F16"].iter().all(|ty| types.contains(ty)), "{types:?}");
}

#[test]
fn gpt_oss_gguf_files_compute_as_transformers() {
    let reference = json(case("gpt-oss").join("reference.json"));
    let (ours, loaded) = logits("gpt-oss", "model-f32.gguf");
    assert_eq!(loaded.architecture, "gpt-oss");
    let diff = max_abs_diff(&ours, &floats(&reference["logits"]), "gpt-oss");
    println!("gpt-oss model-f32.gguf vs transformers: max abs difference {diff:e}");
    assert!(diff <= 1e-4, "gpt-oss: the F32 GGUF logits differ from transformers' by {diff}");
    // The transformers folder fuses gate and up (interleaved columns, stored input-major) and
    // keeps the sinks without `.weight`: the same model.
    let folder = nnx::models::load(case("gpt-oss").to_str().unwrap()).unwrap();
    let from_folder = folder.model.logits(&ids(&reference["ids"])).unwrap().to_vec::<f32>().unwrap();
    let diff = max_abs_diff(&from_folder, &floats(&reference["logits"]), "gpt-oss folder");
    println!("gpt-oss folder vs transformers: max abs difference {diff:e}");
    assert!(diff <= 1e-4, "gpt-oss: the folder's logits differ from transformers' by {diff}");
}

/// The mixtures of experts, apart from `CASES`: their files run on the host only.
const MOE: [&str; 2] = ["qwen3moe", "gpt-oss"];

/// Greedy ids after `ids` through the model's cache: the prompt at once, then one id a step.
fn greedy_with_cache(model: &dyn nnx::models::CausalLm<Device = nnx::Host>, ids: &[u32], steps: usize) -> Vec<u32> {
    let mut cache = model.new_cache(1, ids.len() + steps).unwrap();
    let mut logits = model.forward_cached(ids, &mut cache).unwrap().to_vec::<f32>().unwrap();
    let mut out = Vec::new();
    for _ in 0..steps {
        let best = logits
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |best, (at, &v)| if v > best.1 { (at, v) } else { best });
        let next = best.0 as u32;
        out.push(next);
        logits = model.forward_cached(&[next], &mut cache).unwrap().to_vec::<f32>().unwrap();
    }
    out
}

#[test]
fn mixture_of_experts_files_decode_as_llama_cpp_does() {
    for name in MOE {
        let expected = json(case(name).join("llamacpp.json"));
        let reference = json(case(name).join("reference.json"));
        let ids = ids(&reference["ids"]);
        // F32: llama.cpp's logits with an F32 key/value cache, and its greedy ids through the
        // cache (a sliding window and sinks on gpt-oss's first layer).
        let (ours, loaded) = logits(name, "model-f32.gguf");
        let diff = max_abs_diff(&ours, &floats(&expected["model-f32.gguf"]["logits_kv_f32"]), name);
        println!("{name} model-f32.gguf vs llama.cpp: max abs difference {diff:e}");
        assert!(diff <= 1e-4, "{name}: logits differ from llama.cpp's by {diff}");
        let greedy: Vec<u32> = serde_json::from_value(expected["model-f32.gguf"]["greedy"].clone()).unwrap();
        assert_eq!(greedy_with_cache(loaded.model.as_ref(), &ids, greedy.len()), greedy, "{name}: greedy ids");
        for file in ["model-q8_0.gguf", "model-q4_k_m.gguf", "model-mxfp4_moe.gguf"] {
            if !case(name).join(file).exists() {
                continue;
            }
            let (ours, loaded) = logits(name, file);
            let theirs = floats(&expected[file]["logits"]);
            let rows: Vec<f32> =
                ours.chunks(320).zip(theirs.chunks(320)).map(|(a, b)| max_abs_diff(a, b, file)).collect();
            let scale = theirs.iter().fold(0f32, |m, x| m.max(x.abs()));
            println!("{name} {file} ({}) vs llama.cpp by position, logits up to {scale}: {rows:?}", loaded.weights);
            // llama.cpp rounds activations to 8-bit blocks inside its products, nnx multiplies a
            // prompt's f32 activations: a router's near tie can then pick another expert, and
            // the positions after it part ways (qwen3moe's Q8_0 file does at position 8). The
            // first half agrees as a dense model's positions do.
            assert!(rows[..8].iter().all(|&diff| diff <= 0.05 * scale), "{name} {file}: {rows:?}");
        }
    }
}

#[test]
fn a_folder_of_mxfp4_expert_pairs_reads_them_as_transformers_and_llama_cpps_converter_do() {
    // gpt-oss as published: the fused experts as `*_blocks`/`*_scales` pairs, gate and up rows
    // interleaved (scripts/models/mxfp4_folder.py). The references are llama.cpp's converter's
    // GGUF file of the same folder (its ggml MXFP4 blocks) and transformers' own MXFP4 decoder:
    // a wrong nibble or row order would part from both.
    let name = "gpt-oss-mxfp4";
    let reference = json(case(name).join("reference.json"));
    let expected = floats(&reference["logits"]);
    let unquantized = floats(&json(case("gpt-oss").join("reference.json"))["logits"]);
    let moved = max_abs_diff(&expected, &unquantized, name);
    assert!(moved > 0.5, "the MXFP4 folder is not the BF16 model ({moved})");
    let (folder, loaded) = logits(name, "");
    let (gguf, _) = logits(name, "model.gguf");
    assert_eq!(folder, gguf, "the folder's stacks are the converter's blocks, run alike");
    // The converter's blocks decoded to F32 (`nnx convert --type f32`) give transformers' logits.
    let dir = crate::util::scratch();
    let decoded = dir.path().join("decoded.gguf");
    let source = case(name).join("model.gguf");
    let args = ["convert".as_ref(), source.as_os_str(), decoded.as_os_str(), "--type".as_ref(), "f32".as_ref()];
    let (code, _, stderr) = crate::util::run_nnx(&args);
    assert_eq!(code, 0, "{stderr}");
    let host = nnx::models::load(decoded.to_str().unwrap()).unwrap();
    let host = host.model.logits(&ids(&reference["ids"])).unwrap().to_vec::<f32>().unwrap();
    let diff = max_abs_diff(&host, &expected, name);
    println!("{name} decoded blocks vs transformers: max abs difference {diff:e} (MXFP4 moved the logits {moved:e})");
    assert!(diff <= 1e-4, "{name}: the decoded blocks' logits differ from transformers' by {diff}");
    // The packed products round a prompt's activations to 8-bit blocks, as llama.cpp's do.
    let diff = max_abs_diff(&folder, &expected, name);
    let scale = expected.iter().fold(0f32, |m, x| m.max(x.abs()));
    println!("{name} folder vs transformers: max abs difference {diff:e} of logits up to {scale}");
    assert!(diff <= 0.05 * scale, "{name}: the folder's logits differ from transformers' by {diff}");
    let greedy = ids(&reference["greedy"]);
    assert_eq!(greedy_with_cache(loaded.model.as_ref(), &ids(&reference["ids"]), greedy.len()), greedy);
}

#[test]
fn mxfp4_expert_pairs_that_do_not_fit_the_model_are_refused_by_entry() {
    let source = case("gpt-oss-mxfp4");
    let archive = nnx::Archive::open(source.join("model.safetensors")).unwrap();
    let scales = "model.layers.1.mlp.experts.down_proj_scales";
    for (broken, expected) in [(Some([8, 64, 1]), "found U8 [8, 64, 1]"), (None, "lacks")] {
        let dir = crate::util::scratch();
        for file in ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(source.join(file), dir.path().join(file)).unwrap();
        }
        let mut written = nnx::Archive::new();
        for name in archive.names().map(str::to_string).collect::<Vec<_>>() {
            match (name == scales, broken) {
                (true, Some(shape)) => written.insert(&name, nnx::Tensor::zeros(nnx::DType::U8, &shape)),
                (true, None) => {}
                (false, _) => written.insert(&name, archive.get(&name).unwrap()),
            }
        }
        written.save(dir.path().join("model.safetensors")).unwrap();
        let error = nnx::models::load(dir.path().to_str().unwrap()).map(|_| ()).expect_err("refused").to_string();
        assert!(error.contains(scales) && error.contains(expected), "{error}");
    }
}

/// The hybrids (Gated DeltaNet with full attention), apart from `CASES`.
const HYBRID: [&str; 2] = ["qwen35", "qwen35moe"];

#[test]
fn hybrid_files_and_folders_compute_as_transformers_and_llama_cpp_do() {
    for name in HYBRID {
        let reference = json(case(name).join("reference.json"));
        let expected = json(case(name).join("llamacpp.json"));
        let ids = ids(&reference["ids"]);
        // F32 GGUF (value heads in llama.cpp's order, `-exp(A_log)`) and the folder
        // (transformers' order, `A_log`, norms offset on import) against transformers.
        for file in ["model-f32.gguf", ""] {
            let (ours, loaded) = logits(name, file);
            assert_eq!(loaded.architecture, name);
            let diff = max_abs_diff(&ours, &floats(&reference["logits"]), name);
            println!("{name} {file:?} vs transformers: max abs difference {diff:e}");
            assert!(diff <= 1e-4, "{name} {file:?}: logits differ from transformers' by {diff}");
        }
        let (ours, loaded) = logits(name, "model-f32.gguf");
        let diff = max_abs_diff(&ours, &floats(&expected["model-f32.gguf"]["logits_kv_f32"]), name);
        println!("{name} model-f32.gguf vs llama.cpp: max abs difference {diff:e}");
        assert!(diff <= 1e-4, "{name}: logits differ from llama.cpp's by {diff}");
        // The prompt's chunked rule, then one recurrent step a token, through the cache.
        let greedy: Vec<u32> = serde_json::from_value(expected["model-f32.gguf"]["greedy"].clone()).unwrap();
        assert_eq!(greedy_with_cache(loaded.model.as_ref(), &ids, greedy.len()), greedy, "{name}: greedy ids");
        let dir = crate::util::scratch();
        for file in ["model-q8_0.gguf", "model-q4_k_m.gguf"] {
            // A prompt of 16 multiplies the blocks decoded, in f32: the logits of the file
            // converted to F32 (`nnx convert --type f32`).
            let (ours, loaded) = logits(name, file);
            let decoded = dir.path().join(file);
            let source = case(name).join(file);
            let args = ["convert".as_ref(), source.as_os_str(), decoded.as_os_str(), "--type".as_ref(), "f32".as_ref()];
            let (code, _, stderr) = crate::util::run_nnx(&args);
            assert_eq!(code, 0, "{stderr}");
            let exact = nnx::models::load(decoded.to_str().unwrap()).unwrap();
            let exact = exact.model.logits(&ids).unwrap().to_vec::<f32>().unwrap();
            let diff = max_abs_diff(&ours, &exact, file);
            println!("{name} {file} ({}) vs its decoded blocks: max abs difference {diff:e}", loaded.weights);
            // An expert sees a few of the prompt's rows, which its packed product rounds to 8
            // bits as a decoded token's are: only the dense model's products are all exact.
            if name == "qwen35" {
                assert!(diff <= 1e-4, "{name} {file}: logits differ from the decoded blocks' by {diff}");
            }
            // llama.cpp rounds a prompt's activations to 8-bit blocks inside its products (its
            // DeltaNet's projections included), and the recurrent states carry that on.
            let theirs = floats(&expected[file]["logits"]);
            let rows: Vec<f32> =
                ours.chunks(320).zip(theirs.chunks(320)).map(|(a, b)| max_abs_diff(a, b, file)).collect();
            let scale = theirs.iter().fold(0f32, |m, x| m.max(x.abs()));
            println!("{name} {file} vs llama.cpp by position, logits up to {scale}: {rows:?}");
            // On the mixture, those 8-bit activations also tip routers' near ties to other
            // experts (qwen35moe's Q8_0 file at positions 3 and 6), and the states carry each
            // tip on: the middle position agrees still, and the perplexity to 2 % (run_cli).
            let mut sorted = rows.clone();
            sorted.sort_by(f32::total_cmp);
            let worst = if name == "qwen35" { sorted[rows.len() - 1] } else { sorted[rows.len() / 2] };
            assert!(worst <= 0.12 * scale, "{name} {file}: {rows:?}");
        }
    }
}

#[test]
fn a_hybrids_prompt_in_chunks_equals_its_tokens_one_step_at_a_time() {
    // 100 ids: the prompt's rule in two chunks (64 and 36) against 100 recurrent steps through
    // the cache, each step's logits against the prompt's row.
    for name in HYBRID {
        let loaded = nnx::models::load(case(name).join("model-f32.gguf").to_str().unwrap()).unwrap();
        let ids: Vec<u32> = (0..100u32).map(|at| (at * 37 + 11) % 300).collect();
        let all = loaded.model.logits(&ids).unwrap().to_vec::<f32>().unwrap();
        let mut cache = loaded.model.new_cache(1, ids.len()).unwrap();
        let mut worst = 0f32;
        for (at, &id) in ids.iter().enumerate() {
            let step = loaded.model.forward_cached(&[id], &mut cache).unwrap().to_vec::<f32>().unwrap();
            worst = worst.max(max_abs_diff(&step, &all[at * 320..(at + 1) * 320], name));
        }
        // The rule itself agrees to 1e-5 (`delta_net`'s tests); through four layers, the prompt's
        // matrix products and the steps' row products, logits of up to 6 agree to 1e-4.
        // (The mixture's routers pass their rounding on through the experts' weights: 2e-4.)
        let bound = if name == "qwen35" { 1e-4 } else { 2e-4 };
        println!("{name}: chunked prompt vs recurrent steps: max abs difference {worst:e}");
        assert!(worst <= bound, "{name}: chunked and recurrent logits differ by {worst}");
    }
}

#[test]
fn a_hybrids_padded_batch_equals_its_sequences_alone() {
    // Two prompts of different lengths in one batch: the shorter one left-padded. Padding
    // enters the DeltaNet as zeros, which leave its state at zero.
    let loaded = nnx::models::load(case("qwen35").join("model-f32.gguf").to_str().unwrap()).unwrap();
    let model = loaded.model.as_ref();
    let (long, short): (Vec<u32>, Vec<u32>) = ((10..22).collect(), (40..47).collect());
    let alone = |prompt: &[u32]| {
        let mut cache = model.new_cache(1, 16).unwrap();
        let first = model.forward_cached(prompt, &mut cache).unwrap().to_vec::<f32>().unwrap();
        let next = model.forward_cached(&[5], &mut cache).unwrap().to_vec::<f32>().unwrap();
        (first, next)
    };
    let mut cache = model.new_cache(2, 16).unwrap();
    let padding = long.len() - short.len();
    cache.set_padding(&[0, padding]).unwrap();
    let mut rows = long.clone();
    rows.extend(std::iter::repeat_n(0, padding).chain(short.iter().copied()));
    let first = model.forward_cached(&rows, &mut cache).unwrap().to_vec::<f32>().unwrap();
    let next = model.forward_cached(&[5, 5], &mut cache).unwrap().to_vec::<f32>().unwrap();
    for (at, prompt) in [&long, &short].into_iter().enumerate() {
        let (first_alone, next_alone) = alone(prompt);
        let diff = max_abs_diff(&first[at * 320..(at + 1) * 320], &first_alone, "prompt");
        let diff_next = max_abs_diff(&next[at * 320..(at + 1) * 320], &next_alone, "step");
        assert!(diff <= 1e-4 && diff_next <= 1e-4, "sequence {at}: {diff}, {diff_next}");
    }
}

#[test]
fn published_multimodal_folders_read_their_language_model() {
    // Qwen3.5 and Gemma 4 as published (`*ForConditionalGeneration`): the text model's fields
    // under `text_config`, its weights under `model.language_model.`, a vision tower (and
    // Qwen3.5's MTP head) beside them.
    for (name, model_type, tower) in [
        ("qwen35", "qwen3_5", "model.visual.patch_embed.proj.weight"),
        ("gemma4", "gemma4", "model.vision_tower.patch.weight"),
    ] {
        published_layout(name, model_type, tower);
    }
}

fn published_layout(name: &str, model_type: &str, tower: &str) {
    let source = case(name);
    let dir = crate::util::scratch();
    for file in ["generation_config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(source.join(file), dir.path().join(file)).unwrap();
    }
    let text = json(source.join("config.json"));
    let config = serde_json::json!({
        "architectures": ["ForConditionalGeneration"],
        "model_type": model_type,
        "text_config": text,
        "vision_config": {"model_type": model_type, "depth": 2},
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let archive = nnx::Archive::open(source.join("model.safetensors")).unwrap();
    let mut wrapped = nnx::Archive::new();
    for name in archive.names().map(str::to_string).collect::<Vec<_>>() {
        let renamed = match name.strip_prefix("model.") {
            Some(rest) => format!("model.language_model.{rest}"),
            None => name.clone(),
        };
        wrapped.insert(renamed, archive.get(&name).unwrap());
    }
    wrapped.insert(tower, nnx::Tensor::zeros(nnx::DType::F32, &[4, 3]));
    wrapped.insert("mtp.fc.weight", nnx::Tensor::zeros(nnx::DType::F32, &[64, 128]));
    wrapped.save(dir.path().join("model.safetensors")).unwrap();
    let reference = json(source.join("reference.json"));
    let loaded = nnx::models::load(dir.path().to_str().unwrap()).unwrap();
    assert_eq!(loaded.architecture, name);
    let ours = loaded.model.logits(&ids(&reference["ids"])).unwrap().to_vec::<f32>().unwrap();
    let diff = max_abs_diff(&ours, &floats(&reference["logits"]), name);
    assert!(diff <= 1e-4, "{name}: the published layout's logits differ from transformers' by {diff}");
}

#[test]
fn a_qwen35_file_with_its_prediction_head_runs_the_model_without_it() {
    // llama.cpp's converter keeps Qwen3.5's multi-token-prediction head as one more block
    // (`blk.4.nextn.*` and a full-attention layer; scripts/models/qwen35_mtp.py): the model is
    // the blocks before it, and the head's tensors stay in the file, unread.
    let reference = json(case("qwen35").join("reference.json"));
    let (plain, _) = logits("qwen35", "model-f32.gguf");
    let (with_head, loaded) = logits("qwen35", "model-mtp-f32.gguf");
    assert_eq!(plain, with_head);
    let diff = max_abs_diff(&with_head, &floats(&reference["logits"]), "qwen35 mtp");
    assert!(diff <= 1e-4, "{diff}");
    let archive = nnx::Archive::open(case("qwen35").join("model-mtp-f32.gguf")).unwrap();
    let plan = nnx::models::import_plan(case("qwen35").join("model-mtp-f32.gguf").to_str().unwrap(), None).unwrap().1;
    let unused = plan.unused().iter().filter(|name| name.starts_with("blk.4.")).count();
    assert_eq!(unused, archive.names().filter(|name| name.starts_with("blk.4.")).count(), "{plan}");
    assert_eq!(loaded.architecture, "qwen35");
}

#[test]
fn gemma4_files_and_folders_compute_as_transformers_and_llama_cpp_do() {
    // Sliding and global layers of their own head widths and counts, keys serving as values,
    // proportional rotary, per-layer embeddings, shared keys and values, layer scales; and the
    // mixture of experts beside the MLP.
    for name in ["gemma4", "gemma4moe"] {
        gemma4_case(name);
    }
}

fn gemma4_case(name: &str) {
    let reference = json(case(name).join("reference.json"));
    let expected = json(case(name).join("llamacpp.json"));
    let ids = ids(&reference["ids"]);
    for file in ["model-f32.gguf", ""] {
        let (ours, loaded) = logits(name, file);
        assert_eq!(loaded.architecture, "gemma4");
        let diff = max_abs_diff(&ours, &floats(&reference["logits"]), name);
        println!("{name} {file:?} vs transformers: max abs difference {diff:e}");
        assert!(diff <= 1e-4, "{name} {file:?}: logits differ from transformers' by {diff}");
    }
    // llama.cpp computes GELU through a table of F16 values, which Gemma 4's unscaled
    // attention scores carry further than Gemma 3's: 2e-2 of logits up to 5.
    let (ours, loaded) = logits(name, "model-f32.gguf");
    let diff = max_abs_diff(&ours, &floats(&expected["model-f32.gguf"]["logits_kv_f32"]), name);
    println!("{name} model-f32.gguf vs llama.cpp: max abs difference {diff:e}");
    assert!(diff <= 3e-2, "{name}: logits differ from llama.cpp's by {diff}");
    let greedy: Vec<u32> = serde_json::from_value(expected["model-f32.gguf"]["greedy"].clone()).unwrap();
    assert_eq!(greedy_with_cache(loaded.model.as_ref(), &ids, greedy.len()), greedy, "{name}: greedy ids");
    let dir = crate::util::scratch();
    for file in ["model-q8_0.gguf", "model-q4_k_m.gguf"] {
        let (ours, loaded) = logits(name, file);
        let decoded = dir.path().join(file);
        let source = case(name).join(file);
        let args = ["convert".as_ref(), source.as_os_str(), decoded.as_os_str(), "--type".as_ref(), "f32".as_ref()];
        let (code, _, stderr) = crate::util::run_nnx(&args);
        assert_eq!(code, 0, "{stderr}");
        let exact = nnx::models::load(decoded.to_str().unwrap()).unwrap();
        let exact = exact.model.logits(&ids).unwrap().to_vec::<f32>().unwrap();
        let diff = max_abs_diff(&ours, &exact, file);
        println!("{name} {file} ({}) vs its decoded blocks: max abs difference {diff:e}", loaded.weights);
        // An expert's few rows are rounded to 8 bits by its packed product.
        if name == "gemma4" {
            assert!(diff <= 1e-4, "{name} {file}: logits differ from the decoded blocks' by {diff}");
        }
        // llama.cpp also rounds the activations to 8 bits and the keys and values to F16; with
        // unscaled attention scores a few positions move far (its perplexity stays within 1 %,
        // run_cli): the middle position agrees.
        let theirs = floats(&expected[file]["logits"]);
        let mut rows: Vec<f32> =
            ours.chunks(320).zip(theirs.chunks(320)).map(|(a, b)| max_abs_diff(a, b, file)).collect();
        let scale = theirs.iter().fold(0f32, |m, x| m.max(x.abs()));
        println!("{name} {file} vs llama.cpp by position, logits up to {scale}: {rows:?}");
        rows.sort_by(f32::total_cmp);
        assert!(rows[rows.len() / 2] <= 0.08 * scale, "{name} {file}: {rows:?}");
    }
}

#[test]
fn gemma4_caches_its_shared_layers_as_it_computes_a_prompt() {
    // The shared layers read the keys and values their source layers cached: one step at a
    // time through the cache gives the prompt's logits.
    let loaded = nnx::models::load(case("gemma4").join("model-f32.gguf").to_str().unwrap()).unwrap();
    let ids: Vec<u32> = (0..24u32).map(|at| (at * 37 + 11) % 300).collect();
    let all = loaded.model.logits(&ids).unwrap().to_vec::<f32>().unwrap();
    let mut cache = loaded.model.new_cache(1, ids.len()).unwrap();
    let mut worst = 0f32;
    for (at, &id) in ids.iter().enumerate() {
        let step = loaded.model.forward_cached(&[id], &mut cache).unwrap().to_vec::<f32>().unwrap();
        worst = worst.max(max_abs_diff(&step, &all[at * 320..(at + 1) * 320], "gemma4"));
    }
    assert!(worst <= 1e-4, "cached steps differ from the prompt's logits by {worst}");
}
