//! Conversion in bounded memory (`cargo build --release -p nnx-cli && cargo bench --bench convert`):
//! a synthetic Llama-3-8B-shaped transformers folder of 10 layers (6.5 GB of BF16, a 1 GB
//! embedding and head) and a SafeTensors file of four 3-D expert stacks of 512 MiB, written by
//! this bench's setup and removed after.
//!
//! 1. Against llama.cpp on the same folder, in turn: `convert_hf_to_gguf.py --outtype f16` then
//!    `llama-quantize` (2 threads), and `nnx convert FOLDER OUT.gguf --type T` in one pass, for
//!    Q8_0 and Q4_K_M: wall time and peak RSS (GNU time's `%M`, mapped pages included).
//! 2. nnx alone: the folder to Q4_0, to Q8_0 split in shards of 2 GB (`--split-max-size 2G`, each
//!    tensor's type and bytes compared with the unsplit file's), the Q8_0 file back to
//!    SafeTensors F16, and the experts file to Q8_0 and Q4_K_M; each with its peak RSS against
//!    the bound the converter keeps: the largest input tensor, its output and 256 MiB.
//!
//! The release `nnx` binary is the one beside this bench (`target/release/nnx`), or `NNX_BINARY`.
//! llama.cpp's converter is `$NNX_CACHE/llama.cpp-src/.../convert_hf_to_gguf.py` run by the
//! `$NNX_CACHE/oracle` Python (`scripts/models/make_goldens.sh` sets both up) and
//! `llama-quantize` is `$NNX_CACHE/llama.cpp/bin/llama-quantize` (`scripts/llamacpp/build.sh`);
//! without them (or with `--no-peers`) the llama.cpp rows say so. The files go to
//! `$NNX_BENCH_DIR` (default: `target/bench-convert`), which needs about 25 GB.

#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::{gb, measured, nnx_binary, write_safetensors};
use nnx::Archive;

/// The folder's shape: Llama 3 8B's widths, fewer layers.
const HIDDEN: usize = 4096;
const INTERMEDIATE: usize = 14336;
const LAYERS: usize = 10;
const HEADS: usize = 32;
const KV_HEADS: usize = 8;
const VOCAB: usize = 128_256;

/// The window of the streaming writer, part of the bound.
const WINDOW: u64 = 256 << 20;

/// The Llama folder: `config.json`, the fixture's SentencePiece tokenizer (the converter pads
/// the vocabulary to `vocab_size`) and `model.safetensors`.
fn write_folder(dir: &Path) -> u64 {
    std::fs::create_dir_all(dir).expect("folder");
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "max_position_embeddings": 8192, "tie_word_embeddings": false,
        "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
    });
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config).expect("json")).expect("config");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/llama3");
    for name in ["tokenizer.model", "tokenizer_config.json"] {
        std::fs::copy(fixture.join(name), dir.join(name)).expect("tokenizer");
    }
    let head_dim = HIDDEN / HEADS;
    let mut entries: Vec<(String, Vec<usize>)> = vec![("model.embed_tokens.weight".into(), vec![VOCAB, HIDDEN])];
    for layer in 0..LAYERS {
        let p = format!("model.layers.{layer}");
        entries.extend([
            (format!("{p}.input_layernorm.weight"), vec![HIDDEN]),
            (format!("{p}.self_attn.q_proj.weight"), vec![HEADS * head_dim, HIDDEN]),
            (format!("{p}.self_attn.k_proj.weight"), vec![KV_HEADS * head_dim, HIDDEN]),
            (format!("{p}.self_attn.v_proj.weight"), vec![KV_HEADS * head_dim, HIDDEN]),
            (format!("{p}.self_attn.o_proj.weight"), vec![HIDDEN, HEADS * head_dim]),
            (format!("{p}.post_attention_layernorm.weight"), vec![HIDDEN]),
            (format!("{p}.mlp.gate_proj.weight"), vec![INTERMEDIATE, HIDDEN]),
            (format!("{p}.mlp.up_proj.weight"), vec![INTERMEDIATE, HIDDEN]),
            (format!("{p}.mlp.down_proj.weight"), vec![HIDDEN, INTERMEDIATE]),
        ]);
    }
    entries.push(("model.norm.weight".into(), vec![HIDDEN]));
    entries.push(("lm_head.weight".into(), vec![VOCAB, HIDDEN]));
    write_safetensors(&dir.join("model.safetensors"), &entries, 7);
    entries.iter().map(|(_, shape)| shape.iter().product::<usize>() as u64 * 2).sum()
}

/// A file of four expert stacks `[32, 2048, 4096]` (512 MiB each in BF16), named as GGUF files
/// name them (llama-quantize's rules quantize only names ending in `weight`).
fn write_experts(path: &Path) {
    let entries: Vec<(String, Vec<usize>)> = (0..2)
        .flat_map(|layer| {
            [
                (format!("blk.{layer}.ffn_up_exps.weight"), vec![32, 2048, 4096]),
                (format!("blk.{layer}.ffn_down_exps.weight"), vec![32, 4096, 2048]),
            ]
        })
        .collect();
    write_safetensors(path, &entries, 11);
}

/// The name, type and FNV-1a hash of every tensor of a GGUF file or split set.
fn tensors(path: &Path) -> Vec<(String, String, u64)> {
    let archive = Archive::open(path).expect("the GGUF file opens");
    let mut all: Vec<(String, String, u64)> = archive
        .names()
        .map(|name| {
            let packed = archive.ggml(name).expect("a tensor");
            let bytes = packed.bytes().expect("its bytes");
            let hash = common::fnv1a(&bytes);
            (name.to_string(), packed.ty.name().to_string(), hash)
        })
        .collect();
    all.sort();
    all
}

/// Where llama.cpp's converter and quantizer are, when both are.
fn llama_cpp() -> Option<(PathBuf, PathBuf, PathBuf)> {
    let cache = common::cache_dir();
    let python = cache.join("oracle/bin/python");
    let converter = cache.join("llama.cpp-src/llama_cpp_python-0.3.36/vendor/llama.cpp/convert_hf_to_gguf.py");
    let quantize = cache.join("llama.cpp/bin/llama-quantize");
    (python.is_file() && converter.is_file() && quantize.is_file()).then_some((python, converter, quantize))
}

fn main() {
    let peers = !std::env::args().any(|arg| arg == "--no-peers");
    let nnx = nnx_binary();
    assert!(nnx.is_file(), "{} is missing: run `cargo build --release -p nnx-cli` first", nnx.display());
    let dir = std::env::var_os("NNX_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-convert"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the bench folder");
    let folder = dir.join("llama");
    let start = Instant::now();
    let folder_bytes = write_folder(&folder);
    let experts = dir.join("experts.safetensors");
    write_experts(&experts);
    println!(
        "# Conversion in bounded memory\n\nsetup: a Llama folder of {} ({LAYERS} layers of Llama 3 8B's widths, embedding and head {}), and 4 expert stacks of {} each, written in {:.0} s\n",
        gb(folder_bytes),
        gb((VOCAB * HIDDEN * 2) as u64),
        gb((32 * 2048 * 4096 * 2) as u64),
        start.elapsed().as_secs_f64()
    );

    println!("## Against llama.cpp (convert_hf_to_gguf.py --outtype f16, then llama-quantize, 2 threads)\n");
    println!(
        "| type | llama.cpp convert | llama-quantize | llama.cpp total | llama.cpp peak RSS | nnx convert | nnx peak RSS | speed-up |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let peer = if peers { llama_cpp() } else { None };
    let f16 = dir.join("llamacpp-f16.gguf");
    let convert = peer.as_ref().map(|(python, converter, _)| {
        let mut command = Command::new(python);
        command.arg(converter).arg(&folder).arg("--outtype").arg("f16").arg("--outfile").arg(&f16);
        let src = converter.parent().expect("the source folder");
        command.env("PYTHONPATH", src.join("gguf-py"));
        measured(&mut command)
    });
    for (ty, quantize_ty) in [("q8_0", "Q8_0"), ("q4_k_m", "Q4_K_M")] {
        let theirs = match (&peer, &convert) {
            (Some((_, _, quantize)), Some(Ok((convert_s, convert_rss)))) => {
                let out = dir.join(format!("llamacpp-{ty}.gguf"));
                let result = measured(Command::new(quantize).arg(&f16).arg(&out).arg(quantize_ty).arg("2"));
                let _ = std::fs::remove_file(&out);
                result.map(|(s, rss)| (*convert_s, s, rss.max(*convert_rss)))
            }
            (_, Some(Err(reason))) => Err(reason.clone()),
            _ => Err("not run".into()),
        };
        let out = dir.join(format!("nnx-{ty}.gguf"));
        let ours = measured(Command::new(&nnx).arg("convert").arg(&folder).arg(&out).args(["--type", ty]));
        let (ours_s, ours_rss) = ours.clone().unwrap_or((f64::NAN, 0));
        match theirs {
            Ok((convert_s, quantize_s, rss)) => println!(
                "| {quantize_ty} | {convert_s:.1} s | {quantize_s:.1} s | {:.1} s | {} | {ours_s:.1} s | {} | {:.2}x |",
                convert_s + quantize_s,
                gb(rss),
                gb(ours_rss),
                (convert_s + quantize_s) / ours_s
            ),
            Err(reason) => println!("| {quantize_ty} | {reason} | | | | {ours_s:.1} s | {} | |", gb(ours_rss)),
        }
        if let Err(reason) = ours {
            println!("\nnnx failed: {reason}");
        }
    }
    let _ = std::fs::remove_file(&f16);

    println!("\n## nnx in bounded memory (peak RSS against the largest input tensor + its output + 256 MiB)\n");
    println!("| conversion | time | peak RSS | bound | within |");
    println!("|---|---:|---:|---:|:---:|");
    let embedding = (VOCAB * HIDDEN) as u64;
    let stack = 32 * 2048 * 4096u64;
    let row = |what: &str, result: Result<(f64, u64), String>, input: u64, output: u64| {
        let bound = input + output + WINDOW;
        match result {
            Ok((seconds, rss)) => {
                println!(
                    "| {what} | {seconds:.1} s | {} | {} | {} |",
                    gb(rss),
                    gb(bound),
                    if rss <= bound { "yes" } else { "NO" }
                );
            }
            Err(reason) => println!("| {what} | {reason} | | {} | |", gb(bound)),
        }
    };
    // Q8_0 is 34 bytes per 32 values, Q4_0 18, Q4_K 144 per 256 (Q6_K 210 for the head).
    let q8 = |values: u64| values / 32 * 34;
    let q4 = |values: u64| values / 32 * 18;
    let q8_file = dir.join("nnx-q8_0.gguf");
    let out = dir.join("nnx-q4_0.gguf");
    row(
        "folder -> Q4_0",
        measured(Command::new(&nnx).arg("convert").arg(&folder).arg(&out).args(["--type", "q4_0"])),
        embedding * 2,
        q4(embedding).max(embedding / 256 * 210),
    );
    let _ = std::fs::remove_file(&out);
    let split = dir.join("split");
    std::fs::create_dir_all(&split).expect("the split folder");
    let split_out = split.join("model.gguf");
    row(
        "folder -> Q8_0, --split-max-size 2G",
        measured(Command::new(&nnx).arg("convert").arg(&folder).arg(&split_out).args([
            "--type",
            "q8_0",
            "--split-max-size",
            "2G",
        ])),
        embedding * 2,
        q8(embedding),
    );
    let mut shards: Vec<PathBuf> =
        std::fs::read_dir(&split).expect("shards").map(|entry| entry.expect("a shard").path()).collect();
    shards.sort();
    if let Some(first) = shards.first() {
        let same = tensors(first) == tensors(&q8_file);
        println!(
            "| ... {} shards ({}), tensors equal to the unsplit file's | | | | {} |",
            shards.len(),
            shards
                .iter()
                .map(|shard| shard.file_name().unwrap_or_default().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(", "),
            if same { "yes" } else { "NO" }
        );
    }
    let _ = std::fs::remove_dir_all(&split);
    let back = dir.join("back-f16.safetensors");
    row(
        "Q8_0 GGUF -> SafeTensors F16",
        measured(Command::new(&nnx).arg("convert").arg(&q8_file).arg(&back).args(["--dtype", "f16"])),
        q8(embedding),
        embedding * 2,
    );
    let _ = std::fs::remove_file(&back);
    let _ = std::fs::remove_file(&q8_file);
    let _ = std::fs::remove_file(dir.join("nnx-q4_k_m.gguf"));
    for (ty, output) in [("q8_0", q8(stack)), ("q4_k_m", stack / 256 * 210)] {
        let out = dir.join(format!("experts-{ty}.gguf"));
        row(
            &format!("experts (3-D, 512 MiB each) -> {}", ty.to_uppercase()),
            measured(Command::new(&nnx).arg("convert").arg(&experts).arg(&out).args(["--type", ty])),
            stack * 2,
            output,
        );
        let _ = std::fs::remove_file(&out);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
