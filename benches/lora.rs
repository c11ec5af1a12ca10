//! LoRA adapters on a 1B-class model (`cargo bench --bench lora`): a Llama of Llama 3.2 1B's
//! shape (hidden 2048, 16 layers, 32 heads, 8 key/value heads, MLP 8192; a 32,000-token
//! vocabulary to keep the bench's memory small) in BF16 with seeded random weights, and
//! adapters of rank 16 on all seven projections of every layer, as PEFT trains them.
//!
//! Printed as one table: the time and resident memory of attaching adapters for use at run
//! time (`LoraLayers::new` + `map_weights`), of switching one off and on, of merging one into
//! the weights and of unmerging it; and decoding speed (one token a step from an empty cache,
//! [`STEPS`] steps) of the base, with one and two adapters applied at run time, and with one
//! merged. No peer is run: candle has no LoRA and PEFT needs the whole of PyTorch; the
//! comparison that matters is run time against merged on the same model.

#[allow(dead_code)]
mod common;

use std::time::Instant;

use nnx::adapter::{Adapter, AdapterFormat, LoraKind, LoraModule};
use nnx::models::CausalLm;
use nnx::models::llama::{DecoderConfig, Llama, LlamaConfig};
use nnx::models::lora::{Lora, LoraLayers};
use nnx::models::{Dense, Weights};
use nnx::nn::Init;
use nnx::{DType, Tensor};

use crate::common::values;

/// Decoding steps timed per model.
const STEPS: usize = 8;
/// Adapter rank.
const RANK: usize = 16;

/// Resident memory of this process in MiB.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// A PEFT-like adapter of rank [`RANK`] on every projection of `config`'s layers.
fn adapter(config: &LlamaConfig, seed: u64) -> Adapter {
    let (hidden, inter) = (config.hidden_size, config.intermediate_size);
    let (q, kv) = (config.num_attention_heads * config.head_dim(), config.kv_heads() * config.head_dim());
    let shapes = [
        ("self_attn.q_proj", hidden, q),
        ("self_attn.k_proj", hidden, kv),
        ("self_attn.v_proj", hidden, kv),
        ("self_attn.o_proj", q, hidden),
        ("mlp.gate_proj", hidden, inter),
        ("mlp.up_proj", hidden, inter),
        ("mlp.down_proj", inter, hidden),
    ];
    let mut modules = Vec::new();
    for layer in 0..config.num_hidden_layers {
        for (index, (name, input, output)) in shapes.iter().enumerate() {
            let seed = seed * 1000 + (layer * 7 + index) as u64;
            modules.push(LoraModule {
                source: format!("model.layers.{layer}.{name}"),
                kind: LoraKind::Projection,
                a: Tensor::from_vec(values(RANK * input, seed), &[RANK, *input]).expect("A"),
                b: Tensor::from_vec(values(output * RANK, seed + 1), &[*output, RANK]).expect("B"),
                scale: 2.0,
                fan_in_fan_out: false,
                magnitude: None,
                bias: None,
            });
        }
    }
    Adapter {
        path: format!("synthetic-{seed}").into(),
        format: AdapterFormat::Peft,
        modules,
        saved: Default::default(),
        config: serde_json::json!({ "r": RANK, "lora_alpha": 2 * RANK }),
    }
}

/// Tokens per second of [`STEPS`] single-token steps from an empty cache.
fn decode<W: Weights>(model: &Llama<nnx::Host, W>) -> f64
where
    Llama<nnx::Host, W>: CausalLm<Device = nnx::Host>,
{
    let mut cache = model.new_cache(1, STEPS + 1).expect("a cache");
    model.forward_cached(&[1], &mut cache).expect("a warm-up step");
    let start = Instant::now();
    for step in 0..STEPS {
        std::hint::black_box(model.forward_cached(&[(step * 37 % 1000) as u32 + 2], &mut cache).expect("a step"));
    }
    STEPS as f64 / start.elapsed().as_secs_f64()
}

fn main() -> nnx::Result<()> {
    let threads = rayon::current_num_threads();
    let config: LlamaConfig = serde_json::from_value(serde_json::json!({
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "vocab_size": 32000, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "max_position_embeddings": 2048, "tie_word_embeddings": true,
    }))
    .expect("a Llama configuration");
    let pool = rayon::ThreadPoolBuilder::new().build().expect("a rayon pool");
    pool.install(|| -> nnx::Result<()> {
        let before = rss_mib();
        let base = Llama::new(&config, DType::BF16, Init::Seeded(7));
        let model_mib = rss_mib() - before;
        let (first, second) = (adapter(&config, 1), adapter(&config, 2));
        let factors_mib = first.modules.iter().map(|m| (m.a.len() + m.b.len()) * 4).sum::<usize>() as f64 / 1048576.0;
        let mut rows = Vec::new();
        let mut row = |what: &str, seconds: Option<f64>, mib: Option<f64>, speed: Option<f64>| {
            let cell = |value: Option<f64>, digits: usize| value.map_or("-".into(), |v| format!("{v:.digits$}"));
            rows.push(format!(
                "| {what} | {} | {} | {} |",
                cell(seconds.map(|s| s * 1e3), 1),
                cell(mib, 0),
                cell(speed, 2)
            ));
        };
        row("base model (BF16, 1.1B parameters)", None, Some(model_mib), Some(decode(&base)));

        let at = rss_mib();
        let start = Instant::now();
        let layers = LoraLayers::new(&base, &[&first, &second], false)?;
        let wrapped = base.map_weights::<Lora<Dense>>(|path, layer| Ok(layers.layer(path, layer)))?;
        let attach = start.elapsed().as_secs_f64();
        row("attach 2 adapters at run time (r 16, 7 projections x 16 layers)", Some(attach), Some(rss_mib() - at), None);
        let switches = layers.switches();
        switches.set(1, 0.0);
        row("decode, 1 adapter at run time", None, None, Some(decode(&wrapped)));
        switches.set(1, 1.0);
        row("decode, 2 adapters at run time", None, None, Some(decode(&wrapped)));
        let start = Instant::now();
        switches.set(0, 0.0);
        switches.set(0, 1.0);
        row("switch an adapter off and on", Some(start.elapsed().as_secs_f64()), Some(0.0), None);
        drop(wrapped);

        let mut merged = base.clone();
        let at = rss_mib();
        let start = Instant::now();
        let handle = first.merge_into(&mut merged)?;
        row("merge 1 adapter into the weights", Some(start.elapsed().as_secs_f64()), Some(rss_mib() - at), None);
        row("decode, 1 adapter merged", None, None, Some(decode(&merged)));
        let start = Instant::now();
        handle.unmerge(&mut merged);
        row("unmerge it (the kept originals put back)", Some(start.elapsed().as_secs_f64()), None, None);
        println!(
            "\n{threads} threads; adapter factors {factors_mib:.0} MiB each in f32; decode: {STEPS} single-token steps\n"
        );
        println!("| step | ms | RSS change MiB | decode tok/s |");
        println!("|---|---:|---:|---:|");
        for row in rows {
            println!("{row}");
        }
        Ok(())
    })
}
