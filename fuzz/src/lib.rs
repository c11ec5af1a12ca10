//! What the fuzz targets share: a scratch folder per process for the files they write, a
//! reader that touches every entry of an archive the ways a program would, and a builder of
//! small valid SafeTensors files.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use half::{bf16, f16};
use nnx::{Archive, DType, Tensor};

/// A folder of this process for the files of `target`, created on first use and reused by
/// every input: under `NNX_FUZZ_DIR` when set, else in `/dev/shm` (memory, no disk writes)
/// when it exists, else in the system's temporary folder.
pub fn scratch(target: &str) -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = match std::env::var_os("NNX_FUZZ_DIR") {
            Some(dir) => PathBuf::from(dir),
            None if Path::new("/dev/shm").is_dir() => PathBuf::from("/dev/shm"),
            None => std::env::temp_dir(),
        };
        let dir = base.join(format!("nnx-fuzz-{target}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("the scratch folder can be created");
        dir
    })
}

/// Writes `bytes` to `path`, replacing what was there.
///
/// # Panics
/// When the file cannot be written: the target could not test anything.
pub fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).expect("the scratch file can be written");
}

/// Reads every entry of `archive` every way a program would: headers only (`info`, `specs`),
/// the stored tensor (`get`, `try_get`), its bytes, its typed elements, and for float entries
/// the cast to F32. Errors are expected and only formatted; a panic is a bug.
pub fn read_every_entry(archive: &Archive) {
    let _ = archive.len();
    let _ = format!("{archive:?}");
    let _ = archive.metadata();
    report(archive.specs(""));
    let names: Vec<String> = archive.names().map(str::to_string).collect();
    for name in &names {
        let info = archive.info(name);
        let _ = archive.get(name);
        let tensor = match archive.try_get(name) {
            Ok(tensor) => tensor,
            Err(error) => {
                let _ = error.to_string();
                continue;
            }
        };
        read_tensor(&tensor);
        if let Ok(info) = info {
            report(archive.tensor(name, info.dtype, &info.shape));
            if info.dtype.is_castable_float() {
                report(archive.float(name, DType::F32, &info.shape));
            }
        }
    }
    report(archive.to_flat_state_dict());
}

/// Reads a tensor's bytes and, for dtypes with a Rust element type, its elements.
pub fn read_tensor(tensor: &Tensor) {
    let _ = format!("{tensor:?}");
    report(tensor.to_bytes().map(|bytes| bytes.len()));
    let _ = tensor.contiguous();
    match tensor.dtype() {
        DType::Bool => elements::<bool>(tensor),
        DType::U8 => elements::<u8>(tensor),
        DType::I8 => elements::<i8>(tensor),
        DType::U16 => elements::<u16>(tensor),
        DType::I16 => elements::<i16>(tensor),
        DType::U32 => elements::<u32>(tensor),
        DType::I32 => elements::<i32>(tensor),
        DType::U64 => elements::<u64>(tensor),
        DType::I64 => elements::<i64>(tensor),
        DType::F16 => elements::<f16>(tensor),
        DType::BF16 => elements::<bf16>(tensor),
        DType::F32 => elements::<f32>(tensor),
        DType::F64 => elements::<f64>(tensor),
        _ => {}
    }
    if tensor.dtype().is_castable_float() {
        report(tensor.to_dtype(DType::F32).and_then(|cast| cast.to_vec::<f32>()));
    }
}

fn elements<T: nnx::Element>(tensor: &Tensor) {
    report(tensor.to_vec::<T>());
    report(tensor.as_slice::<T>().map(|slice| slice.map(<[T]>::len)));
}

/// Formats an error, as a program reporting it would.
pub fn report<T, E: std::fmt::Display>(result: Result<T, E>) {
    if let Err(error) = result {
        let _ = error.to_string();
    }
}

/// A SafeTensors file of `entries` (name, dtype as spelled in headers, shape, bytes), laid out
/// back to back in the given order.
pub fn safetensors(entries: &[(&str, &str, &[usize], &[u8])]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in entries {
        let begin = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            (*name).to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [begin, data.len()]}),
        );
    }
    let mut header = serde_json::Value::Object(header).to_string();
    // Pad the header so that the data section starts 8-aligned, as writers do.
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&data);
    file
}
