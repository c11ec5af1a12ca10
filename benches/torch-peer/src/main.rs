//! PyTorch checkpoint benchmark: nnx's `Archive::open` against candle-core's reader
//! (`candle_core::pickle::PthTensors`) on a generated Llama-shaped `torch.save` zip checkpoint
//! of about 1 GiB (BF16 matrices, F32 norms), printed as a markdown table.
//!
//! Run with `cargo run --release --manifest-path benches/torch-peer/Cargo.toml`. The checkpoint
//! is written once per run into a folder under the system temporary folder, or into
//! `NNX_BENCH_DIR` when set, and deleted at the end. It is written here, without Python: a zip
//! of stored records as `torch.save` lays them out (`archive/data.pkl`, `archive/byteorder`,
//! `archive/data/<key>` aligned to 64 bytes, `archive/version`).
//!
//! Warm steps run once as a warm-up (the file is then in the page cache) and report the median
//! of the timed runs that follow. Cold steps evict the file from the page cache before each run
//! (`/proc/sys/vm/drop_caches` when writable, else `posix_fadvise(DONTNEED)` on the file) and
//! report the median; the table says which eviction was used and how much of the file was still
//! cached afterwards.

use std::fs::File;
use std::hint::black_box;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use candle_core::pickle::PthTensors;
use candle_core::{CpuStorage, Storage};
use nnx::{Archive, DType};

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

/// One tensor of the checkpoint: its name, whether it is BF16 (else F32) and its shape.
struct Spec {
    name: String,
    bf16: bool,
    shape: Vec<usize>,
}

impl Spec {
    fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * if self.bf16 { 2 } else { 4 }
    }
}

/// The tensors of a Llama-shaped model: BF16 embedding and projections, F32 norms.
fn specs() -> Vec<Spec> {
    let matrix = |name: String, rows, columns| Spec { name, bf16: true, shape: vec![rows, columns] };
    let norm = |name: String| Spec { name, bf16: false, shape: vec![HIDDEN] };
    let mut specs = vec![matrix("model.embed_tokens.weight".into(), VOCAB, HIDDEN)];
    for layer in 0..LAYERS {
        let at = |part: &str| format!("model.layers.{layer}.{part}.weight");
        specs.push(matrix(at("self_attn.q_proj"), HIDDEN, HIDDEN));
        specs.push(matrix(at("self_attn.k_proj"), KEY_VALUE, HIDDEN));
        specs.push(matrix(at("self_attn.v_proj"), KEY_VALUE, HIDDEN));
        specs.push(matrix(at("self_attn.o_proj"), HIDDEN, HIDDEN));
        specs.push(matrix(at("mlp.gate_proj"), INTERMEDIATE, HIDDEN));
        specs.push(matrix(at("mlp.up_proj"), INTERMEDIATE, HIDDEN));
        specs.push(matrix(at("mlp.down_proj"), HIDDEN, INTERMEDIATE));
        specs.push(norm(at("input_layernorm")));
        specs.push(norm(at("post_attention_layernorm")));
    }
    specs.push(norm("model.norm.weight".into()));
    specs
}

/// A pickle (protocol 2) as `torch.save` writes a state dict: an `OrderedDict` of
/// `torch._utils._rebuild_tensor_v2(persistent_load(('storage', <dtype>Storage, key, 'cpu',
/// numel)), 0, size, stride, False, OrderedDict())`, storage `key` being the tensor's index.
struct Pickle(Vec<u8>);

impl Pickle {
    fn global(&mut self, module: &str, name: &str) {
        self.0.push(b'c');
        self.0.extend_from_slice(format!("{module}\n{name}\n").as_bytes());
    }

    fn text(&mut self, text: &str) {
        self.0.push(b'X');
        self.0.extend_from_slice(&u32::try_from(text.len()).expect("a short string").to_le_bytes());
        self.0.extend_from_slice(text.as_bytes());
    }

    fn int(&mut self, value: usize) {
        self.0.push(b'J');
        self.0.extend_from_slice(&i32::try_from(value).expect("an int below 2^31").to_le_bytes());
    }

    fn ints(&mut self, values: &[usize]) {
        self.0.push(b'(');
        for &value in values {
            self.int(value);
        }
        self.0.push(b't');
    }

    fn ordered_dict(&mut self) {
        self.global("collections", "OrderedDict");
        self.0.extend_from_slice(b")R");
    }

    fn state_dict(specs: &[Spec]) -> Vec<u8> {
        let mut pickle = Pickle(vec![0x80, 2]);
        pickle.ordered_dict();
        pickle.0.push(b'(');
        for (key, spec) in specs.iter().enumerate() {
            pickle.text(&spec.name);
            pickle.global("torch._utils", "_rebuild_tensor_v2");
            pickle.0.extend_from_slice(b"((");
            pickle.text("storage");
            pickle.global("torch", if spec.bf16 { "BFloat16Storage" } else { "FloatStorage" });
            pickle.text(&key.to_string());
            pickle.text("cpu");
            pickle.int(spec.shape.iter().product());
            pickle.0.extend_from_slice(b"tQ");
            pickle.int(0);
            pickle.ints(&spec.shape);
            let strides: Vec<usize> =
                (0..spec.shape.len()).map(|axis| spec.shape[axis + 1..].iter().product()).collect();
            pickle.ints(&strides);
            pickle.0.push(0x89);
            pickle.ordered_dict();
            pickle.0.extend_from_slice(b"tR");
        }
        pickle.0.extend_from_slice(b"u.");
        pickle.0
    }
}

/// Fills `bytes` with pseudo-random values like trained weights: BF16 lanes of magnitude 2^-7
/// to 2^-5, or F32 values near 1 (norm scales).
fn fill(bytes: &mut [u8], bf16: bool, state: &mut u64) {
    for word in bytes.chunks_exact_mut(8) {
        // xorshift64.
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        let value = if bf16 {
            (*state & 0x80ff_80ff_80ff_80ff) | 0x3c00_3c00_3c00_3c00
        } else {
            (*state & 0x0000_ffff_0000_ffff) | 0x3f80_0000_3f80_0000
        };
        word.copy_from_slice(&value.to_le_bytes());
    }
}

/// Writes the checkpoint and fsyncs it. Returns the pickle's size in bytes.
fn write_checkpoint(path: &Path, specs: &[Spec]) -> usize {
    let pickle = Pickle::state_dict(specs);
    let file = File::create(path).expect("the checkpoint can be created");
    let mut zip = zip::ZipWriter::new(file);
    let stored =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored).with_alignment(64);
    zip.start_file("archive/data.pkl", stored).expect("a record starts");
    zip.write_all(&pickle).expect("the pickle is written");
    zip.start_file("archive/byteorder", stored).expect("a record starts");
    zip.write_all(b"little").expect("the byte order is written");
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut buffer = Vec::new();
    for (key, spec) in specs.iter().enumerate() {
        buffer.resize(spec.bytes(), 0);
        fill(&mut buffer, spec.bf16, &mut state);
        zip.start_file(format!("archive/data/{key}"), stored).expect("a record starts");
        zip.write_all(&buffer).expect("a storage is written");
    }
    zip.start_file("archive/version", stored).expect("a record starts");
    zip.write_all(b"3\n").expect("the version is written");
    let file = zip.finish().expect("the zip is finished");
    file.sync_all().expect("the checkpoint reaches the disk");
    pickle.len()
}

/// Wrapping sum of the bytes as little-endian `u64` words (a trailing partial word is summed
/// byte by byte).
fn sum_words(bytes: &[u8]) -> u64 {
    let words = bytes.chunks_exact(8);
    let tail: u64 = words.remainder().iter().map(|&byte| u64::from(byte)).sum();
    words.fold(tail, |sum, word| sum.wrapping_add(u64::from_le_bytes(word.try_into().expect("eight bytes"))))
}

/// The bytes of a tensor candle read into memory.
fn candle_bytes(tensor: &candle_core::Tensor, mut read: impl FnMut(&[u8])) {
    let (storage, layout) = tensor.storage_and_layout();
    assert!(layout.is_contiguous() && layout.start_offset() == 0, "candle reads contiguous tensors");
    match &*storage {
        Storage::Cpu(CpuStorage::BF16(values)) => read(bytemuck::cast_slice(values)),
        Storage::Cpu(CpuStorage::F32(values)) => read(bytemuck::cast_slice(values)),
        _ => panic!("the checkpoint holds BF16 and F32 tensors on the CPU"),
    }
}

/// nnx: open, then every tensor's bytes summed (the views' pages are read through the mapping).
fn nnx_read_all(path: &Path, names: &[String]) -> u64 {
    let archive = Archive::open(path).expect("nnx opens the checkpoint");
    names.iter().fold(0u64, |sum, name| {
        let tensor = archive.try_get(name).expect("the entry exists");
        sum.wrapping_add(sum_words(&tensor.to_bytes().expect("a real tensor")))
    })
}

/// candle: open, then every tensor read (`get`) and its bytes summed.
fn candle_read_all(path: &Path, names: &[String]) -> u64 {
    let tensors = PthTensors::new(path, None).expect("candle opens the checkpoint");
    names.iter().fold(0u64, |sum, name| {
        let tensor = tensors.get(name).expect("candle reads the tensor").expect("the entry exists");
        let mut part = 0;
        candle_bytes(&tensor, |bytes| part = sum_words(bytes));
        sum.wrapping_add(part)
    })
}

/// How the page cache was emptied of the checkpoint.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Eviction {
    DropCaches,
    Fadvise,
}

/// Evicts the checkpoint from the page cache: every clean page with `drop_caches` where this
/// process may write it, else the file's pages with `posix_fadvise(DONTNEED)`.
fn evict(path: &Path) -> Eviction {
    // SAFETY: `sync` takes no arguments and only flushes dirty pages.
    unsafe { libc::sync() };
    if std::fs::write("/proc/sys/vm/drop_caches", "1\n").is_ok() {
        return Eviction::DropCaches;
    }
    let file = File::open(path).expect("the checkpoint opens");
    // SAFETY: the descriptor is open for the whole call; the advice changes no memory of ours.
    let status = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(status, 0, "posix_fadvise fails");
    Eviction::Fadvise
}

/// The share of the file's pages in the page cache, from `mincore` over a fresh mapping.
fn cached_share(path: &Path) -> f64 {
    let file = File::open(path).expect("the checkpoint opens");
    let len = usize::try_from(file.metadata().expect("the checkpoint exists").len()).expect("fits memory");
    // SAFETY: `sysconf` reads a constant of the system.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).expect("a page size");
    // SAFETY: a new private read-only mapping of the open file; nothing else refers to it and
    // it is unmapped below. Only its residency is asked, never its bytes.
    let map = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
    assert_ne!(map, libc::MAP_FAILED, "the checkpoint maps");
    let mut residency = vec![0u8; len.div_ceil(page)];
    // SAFETY: `map` spans `len` bytes and `residency` holds one byte per page of it.
    let status = unsafe { libc::mincore(map, len, residency.as_mut_ptr()) };
    // SAFETY: `map` and `len` are the mapping made above, unmapped once.
    unsafe { libc::munmap(map, len) };
    assert_eq!(status, 0, "mincore fails");
    residency.iter().filter(|&&flag| flag & 1 == 1).count() as f64 / residency.len() as f64
}

/// Times `run` after `setup` (not timed): with `warm_up`, one untimed run first; then the
/// median of `runs`.
fn measure<R>(runs: usize, warm_up: bool, mut setup: impl FnMut(), mut run: impl FnMut() -> R) -> Duration {
    if warm_up {
        setup();
        black_box(run());
    }
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            setup();
            let start = Instant::now();
            black_box(run());
            start.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2]
}

fn seconds(time: Duration) -> String {
    let secs = time.as_secs_f64();
    if secs < 0.1 { format!("{:.3} ms", secs * 1e3) } else { format!("{secs:.3} s") }
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

/// Checks that nnx and candle read the same names, dtypes, shapes and bytes for a sample of
/// tensors (the first, one of each kind in a middle layer, the last).
fn validate(path: &Path, specs: &[Spec]) {
    let mut zip = zip::ZipArchive::new(File::open(path).expect("the checkpoint opens")).expect("a zip");
    for at in 0..zip.len() {
        let record = zip.by_index_raw(at).expect("a record");
        let start = record.data_start().expect("a record's bytes start after its header");
        assert_eq!(start % 64, 0, "{} starts at {start}, not 64-byte aligned", record.name().expect("a name"));
    }
    let archive = Archive::open(path).expect("nnx opens the checkpoint");
    let tensors = PthTensors::new(path, None).expect("candle opens the checkpoint");
    assert_eq!(archive.len(), specs.len(), "nnx reads every tensor");
    assert_eq!(tensors.tensor_infos().len(), specs.len(), "candle reads every tensor");
    let middle = 1 + 9 * (LAYERS / 2);
    let sample = [0, middle, middle + 1, middle + 4, middle + 6, middle + 7, specs.len() - 1];
    for spec in sample.iter().map(|&at| &specs[at]) {
        let ours = archive.try_get(&spec.name).expect("nnx has the tensor");
        let theirs = tensors.get(&spec.name).expect("candle reads the tensor").expect("candle has the tensor");
        let (dtype, candle_dtype) =
            if spec.bf16 { (DType::BF16, candle_core::DType::BF16) } else { (DType::F32, candle_core::DType::F32) };
        assert_eq!(ours.dtype(), dtype, "{}: nnx's dtype", spec.name);
        assert_eq!(theirs.dtype(), candle_dtype, "{}: candle's dtype", spec.name);
        assert_eq!(ours.shape(), spec.shape.as_slice(), "{}: nnx's shape", spec.name);
        assert_eq!(theirs.dims(), spec.shape.as_slice(), "{}: candle's shape", spec.name);
        assert!(ours.is_mapped(), "{}: nnx's tensor is a view of the file", spec.name);
        let bytes = ours.to_bytes().expect("a real tensor");
        candle_bytes(&theirs, |theirs| assert!(*bytes == *theirs, "{}: the bytes differ", spec.name));
    }
    println!(
        "validated: every record 64-byte aligned; {} sampled tensors have the same dtype, shape and bytes in nnx and candle",
        sample.len()
    );
}

fn main() {
    let base = std::env::var_os("NNX_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let dir = base.join(format!("nnx-torch-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("the benchmark folder can be created");
    let kind = file_system(&dir);
    let path = dir.join("model.pt");
    let specs = specs();

    let started = Instant::now();
    let pickle_bytes = write_checkpoint(&path, &specs);
    let file_bytes = std::fs::metadata(&path).expect("the checkpoint exists").len();
    let gib = file_bytes as f64 / f64::from(1u32 << 30);
    println!(
        "checkpoint: {file_bytes} bytes ({gib:.3} GiB), {} tensors (BF16 matrices, F32 norms), pickle {pickle_bytes} \
         bytes, in {} ({kind}); written in {:.1} s",
        specs.len(),
        dir.display(),
        started.elapsed().as_secs_f64()
    );
    validate(&path, &specs);
    let names: Vec<String> = specs.iter().map(|spec| spec.name.clone()).collect();
    let mut rows: Vec<[String; 5]> = Vec::new();
    let row = |step: &str, nnx: Duration, candle: Duration, target: String| {
        [step.into(), seconds(nnx), seconds(candle), format!("{:.3}", nnx.as_secs_f64() / candle.as_secs_f64()), target]
    };

    // Open and list names: nnx maps the file, reads the zip directory and the pickle; candle
    // reads the zip directory and the pickle into tensor infos.
    let open_nnx = measure(
        21,
        true,
        || (),
        || Archive::open(&path).expect("nnx opens the checkpoint").names().map(str::len).sum::<usize>(),
    );
    let open_candle = measure(
        21,
        true,
        || (),
        || PthTensors::new(&path, None).expect("candle opens the checkpoint").tensor_infos().len(),
    );
    let verdict = if open_nnx.as_secs_f64() < 5e-3 { "met" } else { "MISSED" };
    rows.push(row(
        "open + list names (warm)",
        open_nnx,
        open_candle,
        format!("< 5 ms (pickle {pickle_bytes} B): {verdict}"),
    ));

    // Open and read every tensor with the file in the page cache. The sums are compared, so
    // both sides read the same bytes.
    let expected = nnx_read_all(&path, &names);
    assert_eq!(candle_read_all(&path, &names), expected, "nnx and candle read the same bytes");
    let read_nnx = measure(5, true, || (), || nnx_read_all(&path, &names));
    let read_candle = measure(5, true, || (), || candle_read_all(&path, &names));
    let verdict = if read_nnx < read_candle { "met" } else { "MISSED" };
    rows.push(row("open + read every tensor (warm)", read_nnx, read_candle, format!("faster than candle: {verdict}")));

    // The same from a cold page cache, evicted before each run.
    let mut eviction = Eviction::Fadvise;
    let mut evict_now = || eviction = evict(&path);
    evict_now();
    let residue = cached_share(&path);
    let cold_open_nnx = measure(3, false, &mut evict_now, || Archive::open(&path).expect("nnx opens").len());
    let cold_open_candle =
        measure(3, false, &mut evict_now, || PthTensors::new(&path, None).expect("candle opens").tensor_infos().len());
    rows.push(row("open + list names (cold)", cold_open_nnx, cold_open_candle, "-".into()));
    // How much of the file a cold open brings into the page cache (the archive stays open while
    // it is counted).
    evict_now();
    let archive = Archive::open(&path).expect("nnx opens the checkpoint");
    let open_cached_nnx = cached_share(&path);
    drop(archive);
    evict_now();
    let tensors = PthTensors::new(&path, None).expect("candle opens the checkpoint");
    let open_cached_candle = cached_share(&path);
    drop(tensors);
    let cold_nnx = measure(3, false, &mut evict_now, || nnx_read_all(&path, &names));
    let cold_candle = measure(3, false, &mut evict_now, || candle_read_all(&path, &names));
    let verdict = if cold_nnx < cold_candle { "met" } else { "MISSED" };
    rows.push(row("open + read every tensor (cold)", cold_nnx, cold_candle, format!("faster than candle: {verdict}")));

    println!("\n| step | nnx | candle-core | ratio | target |");
    println!("|---|---|---|---|---|");
    for [step, nnx, candle, ratio, target] in &rows {
        println!("| {step} | {nnx} | {candle} | {ratio} | {target} |");
    }
    println!("\nratio: nnx time / candle time (below 1: nnx is faster)");
    println!(
        "read: nnx sums the bytes of its views of the mapped file; candle reads each tensor into memory \
         (`PthTensors::get`) and the same sum runs over its storage; both on one thread"
    );
    println!(
        "read throughput (warm): nnx {:.0} MiB/s, candle {:.0} MiB/s",
        file_bytes as f64 / read_nnx.as_secs_f64() / f64::from(1u32 << 20),
        file_bytes as f64 / read_candle.as_secs_f64() / f64::from(1u32 << 20)
    );
    let how = match eviction {
        Eviction::DropCaches => "`echo 1 > /proc/sys/vm/drop_caches` (after `sync`)",
        Eviction::Fadvise => "`posix_fadvise(DONTNEED)` on the file (`/proc/sys/vm/drop_caches` is not writable here)",
    };
    println!("cold: evicted before each run with {how}; {:.1}% of the file was still cached after it", residue * 100.0);
    let mib = |share: f64| share * file_bytes as f64 / f64::from(1u32 << 20);
    println!(
        "cold open: the page cache then holds {:.1} MiB of the file after nnx's open, {:.1} MiB after candle's",
        mib(open_cached_nnx),
        mib(open_cached_candle)
    );
    if matches!(kind.as_str(), "tmpfs" | "ramfs") {
        println!("cold: the folder is on {kind}, whose pages cannot be evicted, so the cold rows are warm too");
    }
    std::fs::remove_dir_all(&dir).expect("the benchmark folder can be removed");
    println!("total time: {:.1} s", started.elapsed().as_secs_f64());
}
