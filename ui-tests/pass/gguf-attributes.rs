//! A Llama-like model named for both transformers checkpoints (`from`, `offset`) and llama.cpp's
//! GGUF files (`gguf`, `rope_permute`); each naming's walk reports its own sources and operations.

use nnx::nn::{Init, Linear, RmsNorm};
use nnx::{ImportOp, Module, Naming, Tensor};

#[derive(Module)]
struct Attention {
    #[nnx(from = "q_proj", gguf = "attn_q", rope_permute = "head_count")]
    q: Linear,
    #[nnx(from = "k_proj", gguf = "attn_k", rope_permute = "head_count_kv", offset = -0.5)]
    k: Linear,
    #[nnx(from = "o_proj", gguf = "attn_output")]
    o: Linear,
}

#[derive(Module)]
struct Layer {
    #[nnx(from = "input_layernorm", gguf = "attn_norm", offset = 1.0)]
    norm: RmsNorm,
    #[nnx(from = "self_attn", gguf = "")]
    attn: Attention,
    #[nnx(offset = 2)]
    scale: Tensor,
}

#[derive(Module)]
struct Model {
    #[nnx(from = "model.layers", gguf = "blk")]
    layers: Vec<Layer>,
    #[nnx(from = "model.norm", gguf = "output_norm", offset = 1.0)]
    norm: RmsNorm,
}

fn linear(seed: u64) -> Linear {
    Linear::builder(4, 4).bias(false).init(Init::Seeded(seed)).build()
}

fn entries(model: &Model, naming: Naming) -> Vec<(String, String, Vec<ImportOp>)> {
    let mut entries = Vec::new();
    nnx::for_each_entry_named(model, naming, |entry, _| {
        entries.push((entry.name.to_string(), entry.source.to_string(), entry.ops.to_vec()))
    });
    entries
}

fn main() {
    let model = Model {
        layers: vec![Layer {
            norm: RmsNorm::builder(4).build(),
            attn: Attention { q: linear(0), k: linear(1), o: linear(2) },
            scale: Tensor::zeros(nnx::DType::F32, &[4]),
        }],
        norm: RmsNorm::builder(4).build(),
    };
    let entry = |name: &str, source: &str, ops: &[ImportOp]| (name.to_string(), source.to_string(), ops.to_vec());
    assert_eq!(
        entries(&model, Naming::Transformers),
        [
            entry("layers.0.norm.weight", "model.layers.0.input_layernorm.weight", &[ImportOp::Offset(1.0)]),
            entry("layers.0.attn.q.weight", "model.layers.0.self_attn.q_proj.weight", &[]),
            entry("layers.0.attn.k.weight", "model.layers.0.self_attn.k_proj.weight", &[ImportOp::Offset(-0.5)]),
            entry("layers.0.attn.o.weight", "model.layers.0.self_attn.o_proj.weight", &[]),
            entry("layers.0.scale", "model.layers.0.scale", &[ImportOp::Offset(2.0)]),
            entry("norm.weight", "model.norm.weight", &[ImportOp::Offset(1.0)]),
        ]
    );
    assert_eq!(
        entries(&model, Naming::Gguf),
        [
            entry("layers.0.norm.weight", "blk.0.attn_norm.weight", &[]),
            entry("layers.0.attn.q.weight", "blk.0.attn_q.weight", &[ImportOp::RopePermute("head_count")]),
            entry("layers.0.attn.k.weight", "blk.0.attn_k.weight", &[ImportOp::RopePermute("head_count_kv")]),
            entry("layers.0.attn.o.weight", "blk.0.attn_output.weight", &[]),
            entry("layers.0.scale", "blk.0.scale", &[]),
            entry("norm.weight", "output_norm.weight", &[]),
        ]
    );
}
