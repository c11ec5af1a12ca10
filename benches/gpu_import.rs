//! Importing straight onto the GPU: host memory used while a 1 GiB BF16 checkpoint is imported
//! as F32 onto the device, beside importing on the host and then placing; then the same
//! page-aligned checkpoint placed as stored, zero-copy over the file's pages against uploads.
//!
//! Run with `cargo bench --bench gpu_import` (`NNX_GPU` picks the adapter, `NNX_BENCH_DIR` the
//! folder of the checkpoint). A thread samples the process's anonymous resident memory
//! (`RssAnon`, so the mapped checkpoint's file pages do not count) every millisecond. On a
//! software adapter (lavapipe) device buffers are host memory too, so the table subtracts the
//! bytes placed: what remains is what the import itself held on the host.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nnx::nn::{Init, Linear};
use nnx::{Archive, DType, Device, Gpu, Host, Module};

/// Layers of the stack: 16 of `[4096, 8192]` are 1 GiB in BF16 and 2 GiB in F32.
const LAYERS: usize = 16;
const OUT: usize = 4096;
const IN: usize = 8192;

#[derive(Module)]
struct Stack<D: Device = Host> {
    layers: Vec<Linear<D>>,
}

fn stack(dtype: DType, init: Init) -> Stack {
    let layers =
        (0..LAYERS).map(|at| Linear::builder(IN, OUT).bias(false).dtype(dtype).init(init.at(&format!("{at}"))).build());
    Stack { layers: layers.collect() }
}

/// `RssAnon` of this process, in bytes.
fn rss_anon() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("RssAnon:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// Runs `work` while sampling `RssAnon`; returns its result, the peak growth over the start,
/// and the time taken.
fn measured<T>(work: impl FnOnce() -> T) -> (T, u64, Duration) {
    let start = rss_anon();
    let peak = Arc::new(AtomicU64::new(start));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (Arc::clone(&peak), Arc::clone(&done));
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_anon(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let began = Instant::now();
    let result = work();
    let elapsed = began.elapsed();
    peak.fetch_max(rss_anon(), Ordering::Relaxed);
    done.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    (result, peak.load(Ordering::Relaxed).saturating_sub(start), elapsed)
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1u64 << 20) as f64)
}

fn main() -> nnx::Result<()> {
    let index = std::env::var("NNX_GPU").ok().and_then(|index| index.parse().ok()).unwrap_or(0);
    let gpu = match Gpu::open(index) {
        Ok(gpu) => gpu,
        Err(error) => {
            println!("no GPU to import onto: {error}");
            return Ok(());
        }
    };
    let base = std::env::var_os("NNX_BENCH_DIR").map_or_else(std::env::temp_dir, std::path::PathBuf::from);
    let dir = base.join(format!("nnx-gpu-import-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|source| nnx::Error::Io { action: "create", path: dir.clone(), source })?;
    let path = dir.join("stack.safetensors");
    {
        let weights = stack(DType::BF16, Init::Seeded(1));
        let options = nnx::SaveOptions { page_align: true, ..nnx::SaveOptions::default() };
        Archive::from_module(&weights, "").save_with(&path, &options)?;
    }
    let placed_bytes = (LAYERS * OUT * IN * 4) as u64;
    let largest_cast = (OUT * IN * 4) as u64;
    let info = gpu.info();
    println!("adapter: {} ({:?}, {:?})", info.name, info.backend, info.device_type);
    println!(
        "checkpoint: {LAYERS} x [{OUT}, {IN}] BF16 = {}, imported as F32 = {}",
        mib(placed_bytes / 2),
        mib(placed_bytes)
    );
    println!();
    println!("| path | time | peak RssAnon growth | minus bytes placed | largest leaf's cast |");
    println!("|---|---|---|---|---|");

    let archive = Archive::open(&path)?;
    let (model, growth, elapsed) = measured(|| -> nnx::Result<Stack<Gpu>> {
        let mut model = stack(DType::F32, Init::Meta).place(&gpu)?;
        archive.import_into(&mut model, "")?;
        Ok(model)
    });
    let model = model?;
    let _ = model.layers[LAYERS - 1].weight.narrow(0, 0, 1)?.to_host()?;
    println!(
        "| import onto the GPU | {:.2} s | {} | {} | {} |",
        elapsed.as_secs_f64(),
        mib(growth),
        mib(growth.saturating_sub(placed_bytes)),
        mib(largest_cast)
    );
    drop(model);

    let (model, growth, elapsed) = measured(|| -> nnx::Result<Stack<Gpu>> {
        let mut host = stack(DType::F32, Init::Meta);
        archive.import_into(&mut host, "")?;
        host.place(&gpu)
    });
    let model = model?;
    let _ = model.layers[LAYERS - 1].weight.narrow(0, 0, 1)?.to_host()?;
    println!(
        "| import on the host, then place | {:.2} s | {} | {} | {} |",
        elapsed.as_secs_f64(),
        mib(growth),
        mib(growth.saturating_sub(placed_bytes)),
        mib(largest_cast)
    );
    drop(model);

    // The checkpoint as stored (BF16, every entry on a 16 KiB page): placed over the file's
    // pages, or uploaded. Reading every weight back once touches every page, a cost the
    // zero-copy placement defers to first use.
    println!();
    match gpu.zero_copy_alignment() {
        Some(alignment) => println!("zero-copy placement: host pages imported at {alignment}-byte alignment"),
        None => println!("zero-copy placement: not available on this adapter (both rows upload)"),
    }
    println!();
    println!(
        "| 1 GiB BF16, as stored | place | peak RssAnon growth placing | read every weight back | RssAnon after | zero-copy tensors |"
    );
    println!("|---|---|---|---|---|---|");
    for (label, device) in [("zero-copy", gpu.clone()), ("upload", gpu.with_zero_copy(false))] {
        let archive = Archive::open(&path)?;
        let start = rss_anon();
        let (model, growth, placed) = measured(|| -> nnx::Result<(Stack<Gpu>, nnx::ImportReport)> {
            let mut model = stack(DType::BF16, Init::Meta).place(&device)?;
            let report = archive.import_into(&mut model, "")?;
            Ok((model, report))
        });
        let (model, report) = model?;
        let began = Instant::now();
        for layer in &model.layers {
            drop(layer.weight.to_host()?);
        }
        let read = began.elapsed();
        let after = rss_anon().saturating_sub(start);
        println!(
            "| {label} | {:.3} s | {} | {:.2} s | {} | {}/{LAYERS} |",
            placed.as_secs_f64(),
            mib(growth),
            read.as_secs_f64(),
            mib(after),
            report.zero_copy.len()
        );
        drop(model);
        drop(archive);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
