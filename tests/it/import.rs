//! Importing published checkpoints through the derive's attributes: GPT-2 (fused, transposed,
//! tied) and Llama (grouped-query, BF16), checked against values read from the files without
//! the importer; plans, error reports, export, hooks and tensor-parallel slices.

use std::collections::BTreeMap;
use std::path::Path;

use half::bf16;
use nnx::models::gpt2::{Gpt2, Gpt2Config};
use nnx::models::llama::{DecoderConfig, Llama, LlamaConfig};
use nnx::nn::{Init, Linear};
use nnx::{Archive, DType, Error, ImportOptions, Module, Tensor, TensorParallel};

use crate::util::fixtures;

/// A SafeTensors file read with nothing but serde_json and byte slicing.
struct RawFile {
    bytes: Vec<u8>,
    header: BTreeMap<String, serde_json::Value>,
}

impl RawFile {
    fn read(path: &Path) -> RawFile {
        let bytes = std::fs::read(path).unwrap();
        let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let mut header: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
        header.remove("__metadata__");
        RawFile { bytes: bytes[8 + len..].to_vec(), header }
    }

    fn shape(&self, name: &str) -> Vec<usize> {
        self.header[name]["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect()
    }

    fn data(&self, name: &str) -> &[u8] {
        let offsets = self.header[name]["data_offsets"].as_array().unwrap();
        &self.bytes[offsets[0].as_u64().unwrap() as usize..offsets[1].as_u64().unwrap() as usize]
    }

    fn f32s(&self, name: &str) -> Vec<f32> {
        self.data(name).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    fn u16s(&self, name: &str) -> Vec<u16> {
        self.data(name).chunks_exact(2).map(|c| u16::from_le_bytes(c.try_into().unwrap())).collect()
    }
}

/// `rows x cols` row-major values: columns `start..start + width`, transposed to `[width, rows]`.
fn columns_transposed(values: &[f32], cols: usize, start: usize, width: usize) -> Vec<f32> {
    let rows = values.len() / cols;
    let mut out = Vec::with_capacity(width * rows);
    for col in start..start + width {
        for row in 0..rows {
            out.push(values[row * cols + col]);
        }
    }
    out
}

fn gpt2_config() -> Gpt2Config {
    Gpt2Config::from_file(fixtures().join("gpt2-tiny/config.json")).unwrap()
}

fn llama_config() -> LlamaConfig {
    LlamaConfig::from_file(fixtures().join("llama-tiny/config.json")).unwrap()
}

#[test]
fn gpt2_imports_as_views_matching_the_file() {
    let path = fixtures().join("gpt2-tiny/model.safetensors");
    let config = gpt2_config();
    let mut model = Gpt2::new(&config, DType::F32, Init::Meta);
    let report = Archive::open(&path).unwrap().import_into(&mut model, "").unwrap();
    assert_eq!(report.tied, ["lm_head.weight"]);
    assert!(report.unused.is_empty() && report.cast.is_empty() && report.absent.is_empty());
    assert!(model.flat_state_dict().iter().all(|(_, t)| t.is_mapped()), "every tensor is a view of the file");
    assert!(model.lm_head.weight.shares_storage(&model.wte.weight));

    let raw = RawFile::read(&path);
    let width = config.n_embd;
    for layer in 0..config.n_layer {
        let prefix = format!("transformer.h.{layer}.attn");
        let fused = raw.f32s(&format!("{prefix}.c_attn.weight"));
        let fused_bias = raw.f32s(&format!("{prefix}.c_attn.bias"));
        assert_eq!(raw.shape(&format!("{prefix}.c_attn.weight")), [width, 3 * width]);
        let attn = &model.h[layer].attn;
        for (piece, linear) in [&attn.q, &attn.k, &attn.v].into_iter().enumerate() {
            assert_eq!(linear.weight.shape(), &[width, width]);
            assert_eq!(
                linear.weight.to_vec::<f32>().unwrap(),
                columns_transposed(&fused, 3 * width, piece * width, width)
            );
            assert_eq!(
                linear.bias.as_ref().unwrap().to_vec::<f32>().unwrap(),
                fused_bias[piece * width..(piece + 1) * width]
            );
        }
        let proj = raw.f32s(&format!("{prefix}.c_proj.weight"));
        assert_eq!(attn.out.weight.to_vec::<f32>().unwrap(), columns_transposed(&proj, width, 0, width));
        let up = raw.f32s(&format!("transformer.h.{layer}.mlp.c_fc.weight"));
        assert_eq!(
            model.h[layer].mlp.up.weight.to_vec::<f32>().unwrap(),
            columns_transposed(&up, config.inner(), 0, config.inner())
        );
    }
    assert_eq!(model.wte.weight.to_vec::<f32>().unwrap(), raw.f32s("transformer.wte.weight"));
    assert_eq!(model.lm_head.weight.to_vec::<f32>().unwrap(), raw.f32s("transformer.wte.weight"));
}

#[test]
fn gpt2_exports_back_to_the_same_bytes() {
    let path = fixtures().join("gpt2-tiny/model.safetensors");
    let original = Archive::open(&path).unwrap();
    let mut model = Gpt2::new(&gpt2_config(), DType::F32, Init::Meta);
    original.import_into(&mut model, "").unwrap();
    let exported = Archive::export_from(&model, "").unwrap();
    let mut names: Vec<&str> = exported.names().collect();
    let mut expected: Vec<&str> = original.names().collect();
    names.sort();
    expected.sort();
    assert_eq!(names, expected);
    for name in expected {
        let (a, b) = (original.get(name).unwrap(), exported.get(name).unwrap());
        assert_eq!((a.dtype(), a.shape()), (b.dtype(), b.shape()), "{name}");
        assert_eq!(a.to_bytes().unwrap(), b.to_bytes().unwrap(), "{name}");
    }
    let dir = crate::util::scratch();
    let out = dir.path().join("gpt2.safetensors");
    exported.save(&out).unwrap();
    let mut again = Gpt2::new(&gpt2_config(), DType::F32, Init::Meta);
    Archive::open(&out).unwrap().import_into(&mut again, "").unwrap();
    assert_eq!(again.h[1].attn.v.weight.to_vec::<f32>().unwrap(), model.h[1].attn.v.weight.to_vec::<f32>().unwrap());
}

#[test]
fn llama_keeps_bf16_as_views_of_the_file() {
    let path = fixtures().join("llama-tiny/model.safetensors");
    let config = llama_config();
    let mut model = Llama::new(&config, DType::BF16, Init::Meta);
    let report = Archive::open(&path).unwrap().import_into(&mut model, "").unwrap();
    assert_eq!(report.imported.len(), 21);
    assert!(model.flat_state_dict().iter().all(|(_, t)| t.is_mapped() && t.dtype() == DType::BF16));
    let raw = RawFile::read(&path);
    assert_eq!(model.layers[1].attn.k.weight.shape(), &[32, 64], "grouped-query: 2 key/value heads of 16");
    let bits = |t: &Tensor| t.to_vec::<bf16>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<u16>>();
    assert_eq!(bits(&model.layers[1].attn.k.weight), raw.u16s("model.layers.1.self_attn.k_proj.weight"));
    assert_eq!(bits(&model.layers[0].mlp.gate.weight), raw.u16s("model.layers.0.mlp.gate_proj.weight"));
    assert_eq!(bits(&model.lm_head.as_ref().unwrap().weight), raw.u16s("lm_head.weight"));
    assert_eq!(bits(&model.norm.weight), raw.u16s("model.norm.weight"));
}

#[test]
fn float_models_cast_what_they_import() {
    let path = fixtures().join("llama-tiny/model.safetensors");
    let mut model = Llama::new(&llama_config(), DType::F32, Init::Meta);
    let report = Archive::open(&path).unwrap().import_into(&mut model, "").unwrap();
    assert_eq!(report.cast.len(), 21);
    let raw = RawFile::read(&path);
    let expected: Vec<f32> =
        raw.u16s("model.embed_tokens.weight").into_iter().map(|b| bf16::from_bits(b).to_f32()).collect();
    assert_eq!(model.embed.weight.to_vec::<f32>().unwrap(), expected);
    assert!(!model.embed.weight.is_mapped());
}

#[test]
fn import_plans_render_without_reading() {
    let gpt2 = Archive::open(fixtures().join("gpt2-tiny/model.safetensors")).unwrap();
    let plan = gpt2.import_plan(&Gpt2::new(&gpt2_config(), DType::F32, Init::Meta), "").unwrap();
    assert!(plan.is_valid());
    insta::assert_snapshot!(
        "gpt2_import_plan",
        plan.to_string().replace(&fixtures().display().to_string(), "fixtures")
    );
    let llama = Archive::open(fixtures().join("llama-tiny/model.safetensors")).unwrap();
    let plan = llama.import_plan(&Llama::new(&llama_config(), DType::BF16, Init::Meta), "").unwrap();
    insta::assert_snapshot!(
        "llama_import_plan",
        plan.to_string().replace(&fixtures().display().to_string(), "fixtures")
    );
}

fn import_error(model: &mut impl Module, path: &Path) -> String {
    let before: Vec<_> =
        model.flat_state_dict().iter().map(|(n, t)| (n.to_string(), t.shape().to_vec(), t.is_meta())).collect();
    let error = Archive::open(path).unwrap().import_into(model, "").unwrap_err();
    assert!(matches!(error, Error::Load(_)), "{error}");
    let after: Vec<_> =
        model.flat_state_dict().iter().map(|(n, t)| (n.to_string(), t.shape().to_vec(), t.is_meta())).collect();
    assert_eq!(before, after, "a failed import leaves the model unchanged");
    error.to_string().replace(&fixtures().display().to_string(), "fixtures")
}

#[test]
fn wrong_configs_get_full_reports() {
    let path = fixtures().join("gpt2-tiny/model.safetensors");
    let mut wide = gpt2_config();
    wide.n_embd = 96;
    wide.n_layer = 1;
    let report = import_error(&mut Gpt2::new(&wide, DType::F32, Init::Meta), &path);
    insta::assert_snapshot!("gpt2_wrong_hidden_size", report);

    let mut deep = gpt2_config();
    deep.n_layer = 4;
    let report = import_error(&mut Gpt2::new(&deep, DType::F32, Init::Meta), &path);
    insta::assert_snapshot!("gpt2_missing_layers", report);
}

/// GPT-2 attention with a misspelt source name.
#[derive(Module)]
struct TypoAttention {
    #[nnx(from = "c_atn", split(axis = -1, parts = 3, index = 0), transpose)]
    q: Linear,
    #[nnx(from = "c_proj", transpose)]
    out: Linear,
}

#[derive(Module)]
struct TypoModel {
    #[nnx(from = "transformer.h.0.attn")]
    attn: TypoAttention,
}

#[test]
fn typos_in_from_get_suggestions() {
    let linear = || Linear::builder(64, 64).init(Init::Meta).build();
    let mut model = TypoModel { attn: TypoAttention { q: linear(), out: linear() } };
    let report = import_error(&mut model, &fixtures().join("gpt2-tiny/model.safetensors"));
    insta::assert_snapshot!("typo_in_from", report);
}

#[test]
fn unused_entries_are_reported_or_refused() {
    let dir = crate::util::scratch();
    let path = dir.path().join("extra.safetensors");
    let mut archive = Archive::open(fixtures().join("gpt2-tiny/model.safetensors")).unwrap().select("");
    archive.insert("transformer.h.0.attn.masked_bias", Tensor::zeros(DType::F32, &[1]));
    archive.save(&path).unwrap();
    let file = Archive::open(&path).unwrap();
    let mut model = Gpt2::new(&gpt2_config(), DType::F32, Init::Meta);
    let report = file.import_into(&mut model, "").unwrap();
    assert_eq!(report.unused, ["transformer.h.0.attn.masked_bias"]);
    let mut model = Gpt2::new(&gpt2_config(), DType::F32, Init::Meta);
    let options = ImportOptions::default().with_strict_coverage();
    let message = file.import_into_with(&mut model, "", &options).unwrap_err().to_string();
    assert!(
        message.contains("transformer.h.0.attn.masked_bias: entry is not read by the model (strict coverage)"),
        "{message}"
    );
    assert!(model.wte.weight.is_meta());
}

#[test]
fn hooks_supply_what_attributes_cannot_express() {
    // Reverse the order of the 4 query heads of layer 0: a permutation no attribute describes.
    let path = fixtures().join("gpt2-tiny/model.safetensors");
    let archive = Archive::open(&path).unwrap();
    let config = gpt2_config();
    let head_dim = config.n_embd / config.n_head;
    let options = ImportOptions::default().hook(
        "h.0.attn.q.weight",
        ["transformer.h.0.attn.c_attn.weight"],
        move |archive, context| {
            let fused = archive.try_get(context.source)?;
            let q = fused.split(1, 3)?.swap_remove(0).transpose(0, 1)?;
            let heads: Vec<Tensor> = q.split(0, context.shape[0] / head_dim)?.into_iter().rev().collect();
            Tensor::concat(&heads, 0)
        },
    );
    let mut model = Gpt2::new(&config, DType::F32, Init::Meta);
    let report = archive.import_into_with(&mut model, "", &options).unwrap();
    assert!(report.imported.contains(&"h.0.attn.q.weight".to_string()));
    let mut plain = Gpt2::new(&config, DType::F32, Init::Meta);
    archive.import_into(&mut plain, "").unwrap();
    let (hooked, straight) =
        (model.h[0].attn.q.weight.to_vec::<f32>().unwrap(), plain.h[0].attn.q.weight.to_vec::<f32>().unwrap());
    let block = head_dim * config.n_embd;
    for head in 0..config.n_head {
        let mirrored = config.n_head - 1 - head;
        assert_eq!(hooked[head * block..(head + 1) * block], straight[mirrored * block..(mirrored + 1) * block]);
    }
    assert_eq!(model.h[1].attn.q.weight.to_vec::<f32>().unwrap(), plain.h[1].attn.q.weight.to_vec::<f32>().unwrap());
}

/// A meta BF16 Llama for one rank of `world`: the heads and the MLP width divided among the
/// ranks, row-parallel layers (`o`, `down`) keeping the full output width.
pub(crate) fn llama_rank(config: &LlamaConfig, world: usize) -> Llama {
    let mut local = config.clone();
    local.num_attention_heads /= world;
    local.num_key_value_heads = Some(config.kv_heads() / world);
    local.head_dim = Some(config.head_dim());
    local.intermediate_size /= world;
    let mut model = Llama::new(&local, DType::BF16, Init::Meta);
    let linear = |input, output| Linear::builder(input, output).bias(false).dtype(DType::BF16).init(Init::Meta).build();
    for layer in &mut model.layers {
        layer.attn.o = linear(local.num_attention_heads * config.head_dim(), config.hidden_size);
        layer.mlp.down = linear(local.intermediate_size, config.hidden_size);
    }
    model
}

/// The Megatron split of [`llama_rank`]: q, k, v, gate and up by output rows, o and down by
/// input columns.
pub(crate) fn llama_placement(world: usize, rank: usize) -> TensorParallel {
    TensorParallel {
        world_size: world,
        rank,
        column: ["attn.q", "attn.k", "attn.v", "mlp.gate", "mlp.up"].map(|p| format!("layers.*.{p}")).to_vec(),
        row: vec!["layers.*.attn.o".into(), "layers.*.mlp.down".into()],
    }
}

#[test]
fn tensor_parallel_ranks_take_halves_of_the_mapped_file() {
    let path = fixtures().join("llama-tiny/model.safetensors");
    let archive = Archive::open(&path).unwrap();
    let config = llama_config();
    let mut whole = Llama::new(&config, DType::BF16, Init::Meta);
    archive.import_into(&mut whole, "").unwrap();
    let mut ranks = Vec::new();
    for rank in 0..2 {
        let mut model = llama_rank(&config, 2);
        let placement = llama_placement(2, rank);
        let options = ImportOptions::default().with_placement(placement);
        archive.import_into_with(&mut model, "", &options).unwrap();
        assert!(model.flat_state_dict().iter().all(|(_, t)| t.is_mapped()), "rank {rank} reads its slice of the file");
        assert_eq!(model.layers[0].attn.q.weight.shape(), &[32, 64]);
        assert_eq!(model.layers[0].attn.o.weight.shape(), &[64, 32]);
        ranks.push(model);
    }
    fn pick<'a>(model: &'a Llama, layer: usize, which: &str) -> &'a Tensor {
        let layer = &model.layers[layer];
        match which {
            "q" => &layer.attn.q.weight,
            "down" => &layer.mlp.down.weight,
            _ => &layer.attn_norm.weight,
        }
    }
    for layer in 0..2 {
        let joined = |axis: usize, which: &str| {
            let pieces = [pick(&ranks[0], layer, which).clone(), pick(&ranks[1], layer, which).clone()];
            Tensor::concat(&pieces, axis).unwrap().to_vec::<bf16>().unwrap()
        };
        let full = |which: &str| pick(&whole, layer, which).to_vec::<bf16>().unwrap();
        assert_eq!(joined(0, "q"), full("q"));
        assert_eq!(joined(1, "down"), full("down"));
        assert_eq!(
            pick(&ranks[0], layer, "norm").to_vec::<bf16>().unwrap(),
            full("norm"),
            "unmatched layers stay whole"
        );
    }
}

#[derive(Module)]
struct Depthwise {
    #[nnx(from = "conv1d.weight")]
    taps: Tensor,
}

#[test]
fn an_entry_that_differs_by_axes_of_one_reads_into_the_model_shape() {
    // PyTorch's depthwise convolution stores `[channels, 1, kernel]`; the model holds
    // `[channels, kernel]`. Other shapes of the same size are still refused.
    let values: Vec<f32> = (0..12).map(|v| v as f32).collect();
    let mut archive = Archive::new();
    archive.insert("conv1d.weight", Tensor::from_vec(values.clone(), &[4, 1, 3]).unwrap());
    let mut model = Depthwise { taps: Tensor::meta(DType::F32, &[4, 3]) };
    archive.import_into(&mut model, "").unwrap();
    assert_eq!(model.taps.shape(), &[4, 3]);
    assert_eq!(model.taps.to_vec::<f32>().unwrap(), values);
    let mut other = Depthwise { taps: Tensor::meta(DType::F32, &[3, 4]) };
    let error = archive.import_into(&mut other, "").expect_err("another shape").to_string();
    assert!(error.contains("conv1d.weight") && error.contains("[3, 4]"), "{error}");
    // The renamed view reads the same entries under new names, and refuses two of one name.
    let renamed = archive.renamed(|name| Some(format!("model.{name}"))).unwrap();
    assert_eq!(renamed.names().collect::<Vec<_>>(), ["model.conv1d.weight"]);
    archive.insert("other", Tensor::zeros(DType::F32, &[1]));
    assert!(archive.renamed(|_| Some("same".into())).is_err());
}
