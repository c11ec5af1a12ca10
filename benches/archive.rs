//! Archive benchmark: nnx against the `safetensors` crate with `memmap2` doing the same work on a
//! generated BF16 Llama-shaped checkpoint of about 1 GiB, printed as a markdown table.
//!
//! Run with `cargo bench --bench archive`. The checkpoint is written once per run into a folder
//! under the system temporary folder, or into `NNX_BENCH_DIR` when set (a tmpfs such as
//! `/dev/shm`, or a folder on a disk), and deleted at the end. On a disk the save is also
//! compared with `dd bs=16M conv=fsync`.
//!
//! Every step runs once as a warm-up (the source file is then in the page cache) and reports
//! the median of the timed runs that follow.

#[allow(dead_code)]
mod common;

use std::collections::HashMap;
use std::fs::File;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use half::bf16;
use half::slice::HalfFloatSliceExt;
use memmap2::Mmap;
use nnx::nn::{Embedding, Init, Linear, RmsNorm};
use nnx::{Archive, DType, Module, SaveOptions, Tensor};
use safetensors::SafeTensors;
use safetensors::tensor::TensorView;

/// Model width.
const HIDDEN: usize = 2048;
/// Width of the feed-forward block.
const INTERMEDIATE: usize = 5632;
/// Width of the key and value projections (4 grouped key-value heads of 64).
const KEY_VALUE: usize = 256;
/// Decoder layers: 11 give 101 tensors and about 1 GiB with tied embeddings.
const LAYERS: usize = 11;
/// Vocabulary size.
const VOCAB: usize = 32_000;

/// The prefix of the checkpoint's names (`model.layers.0...`); the head is tied to the
/// embedding, so everything is under it.
const PREFIX: &str = "model";

#[derive(Module)]
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
}

#[derive(Module)]
struct FeedForward {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

#[derive(Module)]
struct DecoderLayer {
    self_attn: Attention,
    mlp: FeedForward,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

#[derive(Module)]
struct Llama {
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
}

impl Llama {
    /// A model of meta tensors: dtypes and shapes, no storage.
    fn meta() -> Llama {
        let linear =
            |inputs, outputs| Linear::builder(inputs, outputs).bias(false).dtype(DType::BF16).init(Init::Meta).build();
        let norm = || RmsNorm::builder(HIDDEN).eps(1e-5).dtype(DType::BF16).init(Init::Meta).build();
        let layer = || DecoderLayer {
            self_attn: Attention {
                q_proj: linear(HIDDEN, HIDDEN),
                k_proj: linear(HIDDEN, KEY_VALUE),
                v_proj: linear(HIDDEN, KEY_VALUE),
                o_proj: linear(HIDDEN, HIDDEN),
            },
            mlp: FeedForward {
                gate_proj: linear(HIDDEN, INTERMEDIATE),
                up_proj: linear(HIDDEN, INTERMEDIATE),
                down_proj: linear(INTERMEDIATE, HIDDEN),
            },
            input_layernorm: norm(),
            post_attention_layernorm: norm(),
        };
        Llama {
            embed_tokens: Embedding::builder(VOCAB, HIDDEN).dtype(DType::BF16).init(Init::Meta).build(),
            layers: (0..LAYERS).map(|_| layer()).collect(),
            norm: norm(),
        }
    }

    /// Every tensor of the model in walk order.
    fn tensors(&self) -> Vec<Tensor> {
        self.flat_state_dict().iter().map(|(_, tensor)| tensor.clone()).collect()
    }
}

/// Writes the checkpoint with the `safetensors` crate: every name and shape of the model under
/// [`PREFIX`], filled with small pseudo-random BF16 values. Returns the number of tensors.
fn write_checkpoint(path: &Path) -> usize {
    let specs: Vec<(String, Vec<usize>)> = Llama::meta()
        .flat_state_dict()
        .iter()
        .map(|(name, tensor)| (format!("{PREFIX}.{name}"), tensor.shape().to_vec()))
        .collect();
    let total: usize = specs.iter().map(|(_, shape)| shape.iter().product::<usize>() * 2).sum();
    let mut words = vec![0u64; total / 8];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for word in &mut words {
        // xorshift64; each 16-bit lane keeps its sign, the low exponent bit and the mantissa,
        // and gets exponent 120 or 121: values of magnitude 2^-7 to 2^-5, like trained weights.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        *word = (state & 0x80ff_80ff_80ff_80ff) | 0x3c00_3c00_3c00_3c00;
    }
    let bytes: &[u8] = bytemuck::cast_slice(&words);
    let mut views = Vec::with_capacity(specs.len());
    let mut cursor = 0;
    for (name, shape) in &specs {
        let len = shape.iter().product::<usize>() * 2;
        let view = TensorView::new(safetensors::Dtype::BF16, shape.clone(), &bytes[cursor..cursor + len])
            .expect("the view's size matches its shape");
        views.push((name.clone(), view));
        cursor += len;
    }
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(metadata), path).expect("the checkpoint can be written");
    specs.len()
}

/// Times `run` on a fresh value from `setup` (not timed): one warm-up run, then the median of
/// `runs`. What `run` returns is dropped after the clock stops.
fn measure<S, R>(runs: usize, mut setup: impl FnMut() -> S, mut run: impl FnMut(S) -> R) -> Duration {
    drop(black_box(run(setup())));
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let input = setup();
            let start = Instant::now();
            let output = black_box(run(input));
            let elapsed = start.elapsed();
            drop(output);
            elapsed
        })
        .collect();
    times.sort();
    times[runs / 2]
}

/// Maps `path` read-only.
fn map(path: &Path) -> Mmap {
    let file = File::open(path).expect("the checkpoint opens");
    // SAFETY: the checkpoint is written before it is mapped and never changed while mapped.
    unsafe { Mmap::map(&file) }.expect("the checkpoint maps")
}

/// Wrapping sum of the bytes as little-endian `u64` words (a trailing partial word is summed
/// byte by byte): one pass over memory, little arithmetic.
fn sum_words(bytes: &[u8]) -> u64 {
    let words = bytes.chunks_exact(8);
    let tail: u64 = words.remainder().iter().map(|&byte| u64::from(byte)).sum();
    words.fold(tail, |sum, word| sum.wrapping_add(u64::from_le_bytes(word.try_into().expect("eight bytes"))))
}

/// Resident memory of this process, in bytes, from `/proc/self/status` (0 where unavailable).
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// The file system type of the mount holding `dir`, from `/proc/self/mounts`.
fn file_system(dir: &Path) -> String {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
            dir.starts_with(point).then(|| (point.len(), kind.to_string()))
        })
        .max()
        .map_or_else(|| "unknown".to_string(), |(_, kind)| kind)
}

fn seconds(time: Duration) -> String {
    let secs = time.as_secs_f64();
    if secs < 0.01 { format!("{:.1} µs", secs * 1e6) } else { format!("{secs:.3} s") }
}

/// `at most `limit` seconds`, scaled from 1 GiB to the file's size, and whether it was met.
fn time_target(time: Duration, limit_per_gib: f64, gib: f64) -> String {
    let limit = limit_per_gib * gib;
    let verdict = if time.as_secs_f64() <= limit { "met" } else { "MISSED" };
    format!("≤ {limit:.2} s ({limit_per_gib} s/GiB): {verdict}")
}

struct Row {
    step: String,
    nnx: String,
    other: String,
    ratio: String,
    target: String,
}

impl Row {
    fn timed(step: &str, nnx: Duration, other: Duration, target: String) -> Row {
        Row {
            step: step.into(),
            nnx: seconds(nnx),
            other: seconds(other),
            ratio: format!("{:.2}", nnx.as_secs_f64() / other.as_secs_f64()),
            target,
        }
    }
}

fn main() {
    let base = std::env::var_os("NNX_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let dir = base.join(format!("nnx-archive-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("the benchmark folder can be created");
    let kind = file_system(&dir);
    let on_disk = !matches!(kind.as_str(), "tmpfs" | "ramfs");
    let src = dir.join("model.safetensors");
    let dst = dir.join("copy.safetensors");

    let started = Instant::now();
    let count = write_checkpoint(&src);
    let file_bytes = std::fs::metadata(&src).expect("the checkpoint exists").len();
    let gib = file_bytes as f64 / f64::from(1u32 << 30);
    println!(
        "checkpoint: {file_bytes} bytes ({gib:.3} GiB), {count} BF16 tensors, in {} ({kind}); written in {:.1} s",
        dir.display(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "each step: one warm-up run (page cache warm), then the median of the timed runs; nnx's rayon pool: {} \
         threads, the safetensors crate: 1 thread\n",
        common::rayon_threads()
    );
    let mut rows = Vec::new();
    let mut notes = Vec::new();

    // 1. Open and list names: nnx parses and validates the header; the safetensors crate
    //    parses and validates it from a fresh mapping.
    let nnx = measure(
        21,
        || (),
        |()| {
            let archive = Archive::open(&src).expect("nnx opens the checkpoint");
            archive.names().map(str::len).sum::<usize>()
        },
    );
    let other = measure(
        21,
        || (),
        |()| {
            let map = map(&src);
            let (_, metadata) = SafeTensors::read_metadata(&map).expect("safetensors reads the header");
            metadata.offset_keys().iter().map(String::len).sum::<usize>()
        },
    );
    rows.push(Row::timed("1. open + list names", nnx, other, "-".into()));

    // 2. Open and load into a model of meta tensors (strict: every name, dtype and shape is
    //    checked) against deserializing and collecting every view.
    let nnx = measure(11, Llama::meta, |mut model| {
        Archive::open(&src).expect("nnx opens the checkpoint").load_into(&mut model, PREFIX).expect("the model loads");
        model
    });
    let other = measure(
        11,
        || (),
        |()| {
            let map = map(&src);
            let count = SafeTensors::deserialize(&map).expect("safetensors reads the header").tensors().len();
            (map, count)
        },
    );
    rows.push(Row::timed("2. open + load (meta model / `tensors()`)", nnx, other, "-".into()));

    let mut model = Llama::meta();
    let before = resident_bytes();
    Archive::open(&src).expect("nnx opens the checkpoint").load_into(&mut model, PREFIX).expect("the model loads");
    let nnx_growth = resident_bytes().saturating_sub(before);
    let tensors = model.tensors();
    let mapped = tensors.iter().filter(|tensor| tensor.is_mapped()).count();
    drop(model);
    let before = resident_bytes();
    let map_for_views = map(&src);
    let views = SafeTensors::deserialize(&map_for_views).expect("safetensors reads the header").tensors();
    let other_growth = resident_bytes().saturating_sub(before);
    drop(views);
    drop(map_for_views);
    rows.push(Row {
        step: "2. resident memory growth of the load".into(),
        nnx: format!("{} KiB", nnx_growth / 1024),
        other: format!("{} KiB", other_growth / 1024),
        ratio: "-".into(),
        target: format!("no copy: {mapped}/{} tensors mapped", tensors.len()),
    });
    notes.push(format!(
        "load: {mapped} of {} loaded tensors are views of the mapped file (`is_mapped`), none copied",
        tensors.len()
    ));

    // 3. Touch every byte: a fresh open each run, so every run pays the same page faults of a
    //    new mapping over a warm page cache; the sum is single-threaded on both sides.
    let names: Vec<String> = Archive::open(&src).expect("nnx opens the checkpoint").names().map(String::from).collect();
    let nnx = measure(
        5,
        || (),
        |()| {
            let archive = Archive::open(&src).expect("nnx opens the checkpoint");
            names.iter().fold(0u64, |sum, name| {
                let tensor = archive.try_get(name).expect("the entry exists");
                let slice = tensor.as_slice::<bf16>().expect("a bf16 tensor").expect("a contiguous tensor");
                sum.wrapping_add(sum_words(bytemuck::cast_slice(slice)))
            })
        },
    );
    let other = measure(
        5,
        || (),
        |()| {
            let map = map(&src);
            let safetensors = SafeTensors::deserialize(&map).expect("safetensors reads the header");
            safetensors.iter().fold(0u64, |sum, (_, view)| sum.wrapping_add(sum_words(view.data())))
        },
    );
    rows.push(Row::timed("3. open + sum every byte (u64 words)", nnx, other, "-".into()));

    // 4. Cast every tensor to f32: nnx allocates each result (on all cores); the `half` crate
    //    converts on one core into a buffer allocated once.
    let mut model = Llama::meta();
    Archive::open(&src).expect("nnx opens the checkpoint").load_into(&mut model, PREFIX).expect("the model loads");
    let tensors = model.tensors();
    let nnx = measure(
        5,
        || (),
        |()| {
            tensors.iter().fold(0u32, |sum, tensor| {
                let wide = tensor.to_dtype(DType::F32).expect("bf16 casts to f32");
                let first = wide.as_slice::<f32>().expect("an f32 tensor").expect("a contiguous tensor")[0];
                sum.wrapping_add(first.to_bits())
            })
        },
    );
    let map_for_cast = map(&src);
    let safetensors = SafeTensors::deserialize(&map_for_cast).expect("safetensors reads the header");
    let largest = safetensors.iter().map(|(_, view)| view.data().len() / 2).max().unwrap_or(0);
    let mut buffer = vec![0f32; largest];
    let other = measure(
        5,
        || (),
        |()| {
            safetensors.iter().fold(0u32, |sum, (_, view)| {
                let narrow: &[bf16] = bytemuck::cast_slice(view.data());
                let wide = &mut buffer[..narrow.len()];
                narrow.convert_to_f32_slice(wide);
                sum.wrapping_add(wide[0].to_bits())
            })
        },
    );
    drop(safetensors);
    drop(map_for_cast);
    drop(tensors);
    drop(model);
    rows.push(Row::timed(
        "4. cast all to f32 (`half`: 1 core, reused buffer)",
        nnx,
        other,
        time_target(nnx, 0.45, gib),
    ));

    // 5. Read and save: nnx saves atomically with an fsync; the safetensors crate writes the
    //    views of a fresh mapping, then the copy is fsynced too, so both leave the same durable
    //    file. The copy is removed before each run and the removal flushed to the disk, so no
    //    run pays for freeing the blocks of the one before.
    let runs = if on_disk { 3 } else { 5 };
    let remove_copy = || {
        let _ = std::fs::remove_file(&dst);
        File::open(&dir).and_then(|folder| folder.sync_all()).expect("the benchmark folder syncs");
    };
    let nnx = measure(runs, remove_copy, |()| {
        Archive::open(&src).expect("nnx opens the checkpoint").save(&dst).expect("nnx saves the copy");
    });
    let other_unsynced = measure(runs, remove_copy, |()| {
        let map = map(&src);
        let safetensors = SafeTensors::deserialize(&map).expect("safetensors reads the header");
        let metadata = SafeTensors::read_metadata(&map).expect("safetensors reads the header").1.metadata().clone();
        safetensors::serialize_to_file(safetensors.tensors(), metadata, &dst).expect("safetensors saves the copy");
    });
    let other = measure(runs, remove_copy, |()| {
        let map = map(&src);
        let safetensors = SafeTensors::deserialize(&map).expect("safetensors reads the header");
        let metadata = SafeTensors::read_metadata(&map).expect("safetensors reads the header").1.metadata().clone();
        safetensors::serialize_to_file(safetensors.tensors(), metadata, &dst).expect("safetensors saves the copy");
        File::open(&dst).and_then(|file| file.sync_all()).expect("the copy reaches the disk");
    });
    let target = if on_disk { "-".into() } else { time_target(nnx, 0.40, gib) };
    rows.push(Row::timed("5. open + save a copy (fsync)", nnx, other, target));
    notes.push(format!(
        "save: `serialize_to_file` alone (no fsync, not atomic against a crash) takes {}",
        seconds(other_unsynced)
    ));
    let throughput = |time: Duration| file_bytes as f64 / time.as_secs_f64() / f64::from(1u32 << 20);

    // 6. Sharded save over the previous sharded save (shards of at most 256 MiB): the shards
    //    and the index are written, each fsynced, and the shards the new index no longer names
    //    are removed. Compared with the single-file save of step 5.
    let sharded = dir.join("sharded");
    std::fs::create_dir_all(&sharded).expect("the sharded folder can be created");
    let shard_options = SaveOptions { max_shard_bytes: Some(256 << 20), ..SaveOptions::default() };
    let nnx_sharded = measure(
        runs,
        || (),
        |()| {
            Archive::open(&src)
                .expect("nnx opens the checkpoint")
                .save_with(sharded.join("model.safetensors"), &shard_options)
                .expect("nnx saves the sharded copy");
        },
    );
    rows.push(Row {
        step: "6. open + save sharded over the last one (256 MiB shards)".into(),
        nnx: seconds(nnx_sharded),
        other: format!("nnx single file: {}", seconds(nnx)),
        ratio: format!("{:.2}", nnx_sharded.as_secs_f64() / nnx.as_secs_f64()),
        target: "-".into(),
    });

    if on_disk {
        let mut summaries = Vec::new();
        let dd = measure(runs, remove_copy, |()| {
            let output = Command::new("dd")
                .arg(format!("if={}", src.display()))
                .arg(format!("of={}", dst.display()))
                .args(["bs=16M", "conv=fsync"])
                .output()
                .expect("dd runs");
            assert!(output.status.success(), "dd failed: {}", String::from_utf8_lossy(&output.stderr));
            summaries.push(String::from_utf8_lossy(&output.stderr).lines().last().unwrap_or_default().to_string());
        });
        let share = throughput(nnx) / throughput(dd);
        let verdict = if share >= 0.9 { "met" } else { "MISSED" };
        rows.push(Row {
            step: "5. open + save vs `dd bs=16M conv=fsync` (disk)".into(),
            nnx: seconds(nnx),
            other: format!("dd: {}", seconds(dd)),
            ratio: format!("{:.2}", nnx.as_secs_f64() / dd.as_secs_f64()),
            target: format!("≥ 0.9x dd throughput: {share:.2}x, {verdict}"),
        });
        notes.push(format!("dd's own reports (warm-up first): {}", summaries.join(" | ")));
        notes.push(format!(
            "disk throughput: nnx {:.0} MiB/s, dd {:.0} MiB/s, safetensors + fsync {:.0} MiB/s",
            throughput(nnx),
            throughput(dd),
            throughput(other)
        ));
    } else {
        notes.push(format!(
            "save throughput: nnx {:.0} MiB/s, safetensors + fsync {:.0} MiB/s",
            throughput(nnx),
            throughput(other)
        ));
    }

    println!("| step | nnx | safetensors+memmap2 | ratio | target |");
    println!("|---|---|---|---|---|");
    for row in &rows {
        println!("| {} | {} | {} | {} | {} |", row.step, row.nnx, row.other, row.ratio, row.target);
    }
    println!("\nratio: nnx time / other time (below 1: nnx is faster)");
    for note in &notes {
        println!("{note}");
    }
    std::fs::remove_dir_all(&dir).expect("the benchmark folder can be removed");
    println!("total time: {:.1} s", started.elapsed().as_secs_f64());
}
