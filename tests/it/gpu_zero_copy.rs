//! Zero-copy placement: page-aligned entries of a mapped checkpoint become GPU buffers over the
//! file's own pages. On lavapipe (CI) device memory is host memory, so an upload shows in the
//! process's anonymous resident memory and an imported page does not.

use nnx::models::llama::{Llama, LlamaConfig};
use nnx::nn::{Init, Linear};
use nnx::{Archive, DType, Device, Gpu, Host, Module, Placement, SaveOptions};

use crate::gpu::gpu;

/// A GPU that can import host pages; under CI (lavapipe) one that cannot fails the test.
fn zero_copy_gpu() -> Option<Gpu> {
    let gpu = gpu()?;
    match gpu.zero_copy_alignment() {
        Some(_) => Some(gpu),
        None if std::env::var_os("CI").is_some() => {
            panic!("CI runs on lavapipe, which imports host pages: {} cannot", gpu.name())
        }
        None => {
            eprintln!("skipping: {} cannot import host pages", gpu.name());
            None
        }
    }
}

fn config() -> LlamaConfig {
    serde_json::from_value(serde_json::json!({
        "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5
    }))
    .unwrap()
}

/// A Llama with random weights in transformers' names, saved page-aligned in `dtype` as nnx
/// writes it: entries whose size is a multiple of the page start on a page.
fn checkpoint(dir: &std::path::Path, name: &str, dtype: DType) -> std::path::PathBuf {
    let path = dir.join(name);
    let model = Llama::new(&config(), dtype, Init::Seeded(11));
    let options = SaveOptions { page_align: true, ..SaveOptions::default() };
    Archive::export_from(&model, "").unwrap().save_with(&path, &options).unwrap();
    path
}

fn widest(ours: &nnx::Tensor, theirs: &nnx::Tensor) -> f32 {
    let (a, b) = (ours.to_vec::<f32>().unwrap(), theirs.to_vec::<f32>().unwrap());
    assert_eq!(a.len(), b.len());
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max)
}

#[test]
fn page_aligned_entries_are_placed_over_the_files_pages() {
    let Some(gpu) = zero_copy_gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = checkpoint(dir.path(), "llama.safetensors", DType::F32);
    let ids = [3u32, 1, 4, 1, 5, 9, 2, 6];

    let archive = Archive::open(&path).unwrap();
    let mut on_host = Llama::new(&config(), DType::F32, Init::Meta);
    archive.import_into(&mut on_host, "").unwrap();
    let expected = on_host.forward(&ids).unwrap();

    let mut on_gpu = Llama::new(&config(), DType::F32, Init::Meta).place(&gpu).unwrap();
    let report = archive.import_into(&mut on_gpu, "").unwrap();
    let mut whole_pages = Vec::new();
    let mut partial = Vec::new();
    for (name, tensor) in on_host.flat_state_dict() {
        let list = if tensor.byte_len().is_multiple_of(nnx::PAGE_BYTES) { &mut whole_pages } else { &mut partial };
        list.push(name.to_string());
    }
    assert!(whole_pages.len() >= 10 && !partial.is_empty(), "{whole_pages:?} {partial:?}");
    // Every entry that fills whole pages starts on one and is placed zero-copy. A smaller
    // entry is placed zero-copy too when it happens to start on a page (the one after the
    // page-sized ones does); the rest are uploaded.
    for name in &whole_pages {
        assert!(report.zero_copy.contains(name), "{name} was not placed zero-copy: {report:?}");
    }
    assert!(report.zero_copy.len() <= whole_pages.len() + 1, "{:?}", report.zero_copy);
    assert!(report.uploaded.len() + 1 >= partial.len(), "{:?}", report.uploaded);
    for name in &report.imported {
        let placed = [report.zero_copy.contains(name), report.uploaded.contains(name)];
        assert_eq!(placed.iter().filter(|&&placed| placed).count(), 1, "{name}: {report:?}");
    }
    assert!(report.cast.is_empty());
    assert_eq!(report.placement("embed.weight"), Some(Placement::ZeroCopy));
    assert_eq!(report.placement("norm.weight"), Some(Placement::Uploaded));
    assert_eq!(report.placement("rope.cos"), None, "not in the file");

    // The buffers keep the mapping alive: the archive can go.
    drop(archive);
    let zero_copy = on_gpu.forward(&ids).unwrap().to_host().unwrap();
    let diff = widest(&zero_copy, &expected);
    assert!(diff <= 1e-4, "zero-copy logits differ from the host's by {diff}");
    // The same kernels over uploaded copies give the same bits.
    let uploads = gpu.with_zero_copy(false);
    assert_eq!(uploads.zero_copy_alignment(), None);
    let mut uploaded = Llama::new(&config(), DType::F32, Init::Meta).place(&uploads).unwrap();
    let report = Archive::open(&path).unwrap().import_into(&mut uploaded, "").unwrap();
    assert!(report.zero_copy.is_empty() && report.uploaded.len() == report.imported.len());
    let copied = uploaded.forward(&ids).unwrap().to_host().unwrap();
    assert_eq!(copied.to_bytes().unwrap(), zero_copy.to_bytes().unwrap());
    // Weights read back are the file's bytes.
    assert_eq!(
        on_gpu.layers[1].mlp.up.weight.to_host().unwrap().to_bytes().unwrap(),
        on_host.layers[1].mlp.up.weight.to_bytes().unwrap()
    );
}

#[test]
fn placement_is_reported_per_tensor() {
    let Some(gpu) = zero_copy_gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    // A BF16 checkpoint imported as F32: every tensor is cast on the host, then uploaded.
    let path = checkpoint(dir.path(), "bf16.safetensors", DType::BF16);
    let mut cast = Llama::new(&config(), DType::F32, Init::Meta).place(&gpu).unwrap();
    let report = Archive::open(&path).unwrap().import_into(&mut cast, "").unwrap();
    assert!(report.zero_copy.is_empty(), "{:?}", report.zero_copy);
    assert_eq!(report.cast, report.imported);
    assert_eq!(report.uploaded, report.imported);
    // Read as stored, its page-sized entries are placed zero-copy.
    let mut stored = Llama::new(&config(), DType::BF16, Init::Meta).place(&gpu).unwrap();
    let report = Archive::open(&path).unwrap().import_into(&mut stored, "").unwrap();
    assert!(report.placement("layers.0.mlp.up.weight") == Some(Placement::ZeroCopy), "{report:?}");
    // A file saved without page alignment has no entry on a page boundary past the first.
    let unaligned = dir.path().join("unaligned.safetensors");
    Archive::export_from(&Llama::new(&config(), DType::F32, Init::Seeded(2)), "").unwrap().save(&unaligned).unwrap();
    let mut model = Llama::new(&config(), DType::F32, Init::Meta).place(&gpu).unwrap();
    let report = Archive::open(&unaligned).unwrap().import_into(&mut model, "").unwrap();
    assert!(report.zero_copy.len() <= 1, "{:?}", report.zero_copy);
    // Placing a mapped host model shares the same path: `place` imports its pages too.
    let path = checkpoint(dir.path(), "llama.safetensors", DType::F32);
    let mut host = Llama::new(&config(), DType::F32, Init::Meta);
    let report = Archive::open(&path).unwrap().import_into(&mut host, "").unwrap();
    assert_eq!(report.placement("embed.weight"), Some(Placement::Shared));
    assert!(host.embed.weight.is_mapped());
    let placed = host.place(&gpu).unwrap();
    assert_eq!(placed.embed.weight.to_host().unwrap().to_bytes().unwrap(), host.embed.weight.to_bytes().unwrap());
}

/// Layers of the stack measured in a child process: 8 of `[1024, 2048]` F32, 64 MiB.
#[derive(Module)]
struct Stack<D: Device = Host> {
    layers: Vec<Linear<D>>,
}

const LAYERS: usize = 8;

fn stack(init: Init) -> Stack {
    let layers = (0..LAYERS).map(|at| Linear::builder(2048, 1024).bias(false).init(init.at(&format!("{at}"))).build());
    Stack { layers: layers.collect() }
}

fn rss_anon() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find_map(|line| line.strip_prefix("RssAnon:")).unwrap();
    line.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap() * 1024
}

/// Imports the stack onto `gpu`, runs every layer once (which reads every page) and returns
/// the growth of `RssAnon` and the report.
fn import_and_run(gpu: &Gpu, path: &std::path::Path) -> (u64, nnx::ImportReport) {
    let before = rss_anon();
    let mut model = stack(Init::Meta).place(gpu).unwrap();
    let report = Archive::open(path).unwrap().import_into(&mut model, "").unwrap();
    let x = nnx::Tensor::from_vec(vec![0.5f32; 2048], &[1, 2048]).unwrap().to_device(gpu).unwrap();
    for layer in &model.layers {
        let y = layer.forward(&x).unwrap().to_host().unwrap();
        assert!(y.to_vec::<f32>().unwrap().iter().all(|v| v.is_finite()));
    }
    let grown = rss_anon().saturating_sub(before);
    drop(model);
    (grown, report)
}

/// The measurement, run alone in a child process so that no other test's allocations count.
#[test]
#[ignore = "run by zero_copy_placement_does_not_grow_anonymous_memory in a child process"]
fn child_measures_anonymous_memory() {
    let Ok(dir) = std::env::var("NNX_ZERO_COPY_DIR") else { return };
    let gpu = zero_copy_gpu().expect("the parent checked the adapter");
    let path = std::path::Path::new(&dir).join("stack.safetensors");
    let (zero_copy, report) = import_and_run(&gpu, &path);
    assert_eq!(report.zero_copy.len(), LAYERS, "{report:?}");
    let (uploaded, report) = import_and_run(&gpu.with_zero_copy(false), &path);
    assert_eq!(report.uploaded.len(), LAYERS, "{report:?}");
    println!("RSS_ANON zero_copy={zero_copy} uploaded={uploaded}");
}

#[test]
fn zero_copy_placement_does_not_grow_anonymous_memory() {
    let Some(_) = zero_copy_gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let options = SaveOptions { page_align: true, ..SaveOptions::default() };
    Archive::from_module(&stack(Init::Seeded(5)), "")
        .save_with(dir.path().join("stack.safetensors"), &options)
        .unwrap();
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["gpu_zero_copy::child_measures_anonymous_memory", "--ignored", "--exact", "--nocapture"])
        .env("NNX_ZERO_COPY_DIR", dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let line = stdout.lines().find_map(|line| line.strip_prefix("RSS_ANON ")).expect("the child reports");
    let value = |key: &str| -> u64 {
        line.split_whitespace().find_map(|pair| pair.strip_prefix(key)?.strip_prefix('=')?.parse().ok()).unwrap()
    };
    let (zero_copy, uploaded) = (value("zero_copy"), value("uploaded"));
    let weights = (LAYERS * 1024 * 2048 * 4) as u64;
    println!(
        "RssAnon growth over {} MiB of weights: zero-copy {} KiB, uploaded {} KiB",
        weights >> 20,
        zero_copy >> 10,
        uploaded >> 10
    );
    // Uploads hold the weights in (lavapipe's) device memory; the imported pages are the file's.
    assert!(uploaded >= weights * 9 / 10, "uploading grew RssAnon by only {uploaded} bytes");
    assert!(zero_copy <= weights / 8, "zero-copy placement grew RssAnon by {zero_copy} bytes");
}
