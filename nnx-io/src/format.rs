//! The one place that knows formats: magic bytes, file names and folder conventions.
//! [`detect`] says what a local path holds and [`build`] hands it to the format that opens it;
//! [`open`] (what `Archive::open` does) sends locations in stores to the remote reader, which
//! asks [`open_object`] the same of an object's name; [`sniff`] names what a file that is not
//! SafeTensors is, so its error can say what to do. A new format is one more arm of [`Holds`]
//! here and one folder beside `safetensors/`.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::archive::Archive;
use crate::error::{Error, FileKind, Result};
use crate::safetensors::header::MAX_HEADER_BYTES;
use crate::safetensors::index::shard_stem;

/// The names of a model's weights in a pretrained folder, in the order a load looks for them.
pub(crate) const SAFETENSORS: &str = "model.safetensors";
pub(crate) const SAFETENSORS_INDEX: &str = "model.safetensors.index.json";
pub(crate) const TORCH: &str = "pytorch_model.bin";
pub(crate) const TORCH_INDEX: &str = "pytorch_model.bin.index.json";

/// The overlay file of extra entries a NanoSeedLM folder may hold (per-layer MLA tensors).
pub const OVERLAY_FILE: &str = "model-mla-delta.safetensors";

/// The first pickle of every legacy PyTorch file (before PyTorch 1.6): protocol 2, the magic
/// number 0x1950a86a20f9469cfc6c as a 10-byte `LONG1`, `STOP`.
pub(crate) const TORCH_LEGACY_MAGIC: &[u8] = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19\x2e";

/// Opens what `path` holds: with the `remote` feature, a location in a store (`s3://`,
/// `http(s)://`, `hf://`, ...) read with range requests; else what [`detect`] finds.
///
/// # Errors
/// The errors of [`detect`] and of the format's reader; [`Error::Remote`] for a location in a
/// store when the `remote` feature is not built.
pub(crate) fn open(path: &Path) -> Result<Archive> {
    #[cfg(feature = "remote")]
    if let Some(url) = path.to_str().filter(|text| crate::remote::is_remote(text)) {
        return Archive::open_remote(url, &crate::remote::RemoteOptions::default());
    }
    #[cfg(not(feature = "remote"))]
    if let Some(text) = path.to_str()
        && text.split_once("://").is_some_and(|(scheme, _)| {
            ["s3", "gs", "gcs", "az", "azure", "http", "https"].contains(&scheme.to_ascii_lowercase().as_str())
        })
    {
        // Without the feature, `s3://...` would be looked for as a local folder named `s3:`.
        // The location is named without credentials or a query (a presigned URL's signature).
        let url = nnx_core::text::redact_url(text);
        return Err(Error::Remote { url, problem: nnx_core::error::RemoteProblem::NotBuilt });
    }
    build(detect(path)?)
}

/// The archive of what [`detect`] found, opened by the format that reads it.
///
/// # Errors
/// The errors of the format's reader.
pub(crate) fn build(holds: Holds) -> Result<Archive> {
    match holds {
        Holds::SafeTensors(path) => crate::safetensors::open(&path),
        Holds::ShardIndex(path) => crate::safetensors::open_index(&path),
        Holds::Torch(path) => crate::torch::open(&path),
        Holds::TorchIndex(path) => crate::torch::open_index(&path),
        Holds::Gguf(paths) => crate::gguf::open(&paths),
        Holds::Files { dir, files } => crate::safetensors::open_files(&dir, &files),
        Holds::Dcp(dir) => crate::dcp::open(&dir),
        Holds::DcpHf(dir) => crate::dcp::open_hf(&dir),
        Holds::Orbax(dir) => crate::orbax::open(&dir),
    }
}

/// Opens the object at `path` in `client`'s store by what its name says it holds (its first
/// bytes would cost a request): a shard index (`*.json`), a GGUF file (with every shard of a
/// split one), else a SafeTensors file. A PyTorch checkpoint is refused: it is read from a
/// download.
///
/// # Errors
/// [`Error::Remote`] for a PyTorch checkpoint and failed transfers, and the errors of the
/// format's reader.
#[cfg(feature = "remote")]
pub(crate) fn open_object(
    client: std::sync::Arc<crate::remote::Client>,
    path: object_store::path::Path,
) -> Result<Archive> {
    let name = path.filename().unwrap_or_default().to_string();
    if name.ends_with(".json") {
        return crate::safetensors::remote::open_index(client, path);
    }
    if name.ends_with(".gguf") {
        return crate::gguf::remote::open(client, path);
    }
    if [".bin", ".pt", ".pth"].iter().any(|end| name.ends_with(end)) {
        let url = client.url(&path);
        return Err(Error::Remote { url, problem: nnx_core::error::RemoteProblem::NotSafeTensors });
    }
    crate::safetensors::remote::open(client, path)
}

/// What a local path holds, as far as its name, its first bytes and a folder's listing tell.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Holds {
    /// A SafeTensors file, or a file that is nothing else nnx reads: parsing its header says
    /// what is wrong with it.
    SafeTensors(PathBuf),
    /// A shard index of SafeTensors files (`model.safetensors.index.json`).
    ShardIndex(PathBuf),
    /// A PyTorch checkpoint: a zip or a pickle not named `.safetensors`.
    Torch(PathBuf),
    /// A shard index of PyTorch checkpoints (`pytorch_model.bin.index.json`).
    TorchIndex(PathBuf),
    /// A GGUF file, or every shard of a split one (`NAME-00001-of-00003.gguf`), in order.
    Gguf(Vec<PathBuf>),
    /// A folder without a model file or index: the union of its SafeTensors files, in name
    /// order.
    Files { dir: PathBuf, files: Vec<PathBuf> },
    /// A PyTorch distributed checkpoint: a folder with `.metadata` and its `.distcp` files.
    Dcp(PathBuf),
    /// An Orbax checkpoint: a folder with `_METADATA` (or `_CHECKPOINT_METADATA`, or an OCDBT
    /// `manifest.ocdbt`) and its zarr arrays.
    Orbax(PathBuf),
    /// A PyTorch distributed checkpoint in the HF storage layout: a folder of
    /// `shard-0000R-model-0000I-of-0000N.safetensors` files without an index.
    DcpHf(PathBuf),
}

/// What `path` holds. A folder holds the first of `model.safetensors.index.json`,
/// `model.safetensors`, `pytorch_model.bin.index.json`, `pytorch_model.bin`, its only
/// `*.safetensors.index.json`, then every `*.safetensors` file.
///
/// # Errors
/// [`Error::Io`] when the path cannot be opened or a folder listed, [`Error::EmptyFolder`],
/// and [`Error::ShardWithoutIndex`] (see [`files`]).
pub(crate) fn detect(path: &Path) -> Result<Holds> {
    let meta = std::fs::metadata(path).map_err(Error::io("open", path))?;
    if !meta.is_dir() {
        return detect_file(path);
    }
    let dir = path;
    if crate::dcp::is_checkpoint(dir) {
        return Ok(Holds::Dcp(dir.to_path_buf()));
    }
    if crate::dcp::is_hf_checkpoint(dir) {
        return Ok(Holds::DcpHf(dir.to_path_buf()));
    }
    if crate::orbax::is_orbax(dir) {
        return Ok(Holds::Orbax(dir.to_path_buf()));
    }
    if let Some(holds) = model_file(dir) {
        return Ok(holds);
    }
    for name in [TORCH_INDEX, TORCH] {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return detect_file(&candidate);
        }
    }
    let mut indexes = Vec::new();
    for item in std::fs::read_dir(dir).map_err(Error::io("list", dir))? {
        let path = item.map_err(Error::io("list", dir))?.path();
        if file_name(&path).ends_with(".safetensors.index.json") && path.is_file() {
            indexes.push(path);
        }
    }
    if let [index] = &mut indexes[..] {
        return Ok(Holds::ShardIndex(std::mem::take(index)));
    }
    if let Some(holds) = files(dir, |_| true)? {
        return Ok(holds);
    }
    gguf_files(dir)?.ok_or_else(|| Error::EmptyFolder { path: dir.to_path_buf() })
}

/// The GGUF model of a folder without SafeTensors files: its only `*.gguf` file, or the
/// shards of its only split file.
fn gguf_files(dir: &Path) -> Result<Option<Holds>> {
    let mut found = Vec::new();
    for item in std::fs::read_dir(dir).map_err(Error::io("list", dir))? {
        let path = item.map_err(Error::io("list", dir))?.path();
        if file_name(&path).ends_with(".gguf") && path.is_file() {
            found.push(path);
        }
    }
    found.sort();
    let Some(first) = found.first() else { return Ok(None) };
    let set = crate::gguf::split_siblings(first).unwrap_or_else(|| vec![first.clone()]);
    Ok((set == found).then_some(Holds::Gguf(set)))
}

/// What the model files of a quantized folder are, leaving out [`OVERLAY_FILE`]: the shard
/// index or `model.safetensors` when there is one, else every `model*.safetensors`, else what
/// [`detect`] finds.
///
/// # Errors
/// As [`detect`].
pub(crate) fn detect_quantized(dir: &Path) -> Result<Holds> {
    if let Some(holds) = model_file(dir) {
        return Ok(holds);
    }
    match files(dir, |name| name.starts_with("model") && name != OVERLAY_FILE)? {
        Some(holds) => Ok(holds),
        None => detect(dir),
    }
}

/// `dir/model.safetensors.index.json`, else `dir/model.safetensors`, when one exists.
fn model_file(dir: &Path) -> Option<Holds> {
    let index = dir.join(SAFETENSORS_INDEX);
    if index.is_file() {
        return Some(Holds::ShardIndex(index));
    }
    let single = dir.join(SAFETENSORS);
    single.is_file().then_some(Holds::SafeTensors(single))
}

/// The `*.safetensors` files in `dir` whose names `accept` takes, in name order; `None` when
/// there are none.
///
/// # Errors
/// [`Error::ShardWithoutIndex`] when one of them is named as a shard: without the index that
/// lists them, shards may be a partial or stale set.
fn files(dir: &Path, accept: impl Fn(&str) -> bool) -> Result<Option<Holds>> {
    let mut files = Vec::new();
    for item in std::fs::read_dir(dir).map_err(Error::io("list", dir))? {
        let path = item.map_err(Error::io("list", dir))?.path();
        let name = file_name(&path);
        if name.ends_with(".safetensors") && accept(name) && path.is_file() {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Ok(None);
    }
    files.sort();
    if let Some(shard) = files.iter().find(|path| shard_stem(file_name(path)).is_some()) {
        return Err(Error::ShardWithoutIndex { dir: dir.to_path_buf(), shard: shard.clone() });
    }
    Ok(Some(Holds::Files { dir: dir.to_path_buf(), files }))
}

/// What the file at `path` holds, from its name and, unless it is named `.safetensors`, its
/// first bytes.
fn detect_file(path: &Path) -> Result<Holds> {
    let path_buf = path.to_path_buf();
    match path.extension() {
        Some(ext) if ext == "json" => {
            Ok(if is_torch_index(file_name(path)) { Holds::TorchIndex(path_buf) } else { Holds::ShardIndex(path_buf) })
        }
        Some(ext) if ext == "safetensors" => Ok(Holds::SafeTensors(path_buf)),
        _ if path.extension().is_some_and(|ext| ext == "gguf") || starts_with(path, MAGIC_GGUF)? => {
            Ok(Holds::Gguf(crate::gguf::split_siblings(path).unwrap_or_else(|| vec![path_buf])))
        }
        _ if is_torch_checkpoint(path)? => Ok(Holds::Torch(path_buf)),
        _ => Ok(Holds::SafeTensors(path_buf)),
    }
}

/// The file name of `path` as text; empty when it has none or it is not UTF-8.
fn file_name(path: &Path) -> &str {
    path.file_name().and_then(|name| name.to_str()).unwrap_or_default()
}

/// Whether a shard index names PyTorch checkpoints (`pytorch_model.bin.index.json`).
fn is_torch_index(file_name: &str) -> bool {
    [".bin.index.json", ".pt.index.json", ".pth.index.json"].iter().any(|end| file_name.ends_with(end))
}

/// The first bytes of every GGUF file.
const MAGIC_GGUF: &[u8] = b"GGUF";

/// Whether the file at `path` starts with `magic`.
fn starts_with(path: &Path, magic: &[u8]) -> Result<bool> {
    let mut head = Vec::with_capacity(magic.len());
    File::open(path)
        .map_err(Error::io("open", path))?
        .take(magic.len() as u64)
        .read_to_end(&mut head)
        .map_err(Error::io("read", path))?;
    Ok(head == magic)
}

/// Whether the file at `path` starts as a PyTorch checkpoint does (a zip, or a pickle) and not
/// as SafeTensors does.
fn is_torch_checkpoint(path: &Path) -> Result<bool> {
    let mut head = Vec::with_capacity(16);
    File::open(path)
        .map_err(Error::io("open", path))?
        .take(16)
        .read_to_end(&mut head)
        .map_err(Error::io("read", path))?;
    Ok(torch_container(&head).is_some() && !looks_like_safetensors(&head))
}

/// How a PyTorch checkpoint's first bytes say it was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TorchContainer {
    /// `torch.save` since PyTorch 1.6: a zip of `data.pkl` and one record per storage.
    Zip,
    /// `torch.save` before PyTorch 1.6: pickles in a row, then the storages' bytes.
    Legacy,
    /// A bare pickle, its storages pickled inside it.
    Pickle,
}

/// The container of a PyTorch checkpoint starting with `head`; `None` when it starts as none.
pub(crate) fn torch_container(head: &[u8]) -> Option<TorchContainer> {
    if is_zip(head) {
        Some(TorchContainer::Zip)
    } else if head.starts_with(TORCH_LEGACY_MAGIC) {
        Some(TorchContainer::Legacy)
    } else if is_pickle(head) {
        Some(TorchContainer::Pickle)
    } else {
        None
    }
}

fn is_zip(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06")
}

/// Pickle protocol 2 and up starts with `PROTO` (0x80) and the protocol number.
fn is_pickle(bytes: &[u8]) -> bool {
    bytes.len() >= 2 && bytes[0] == 0x80 && (2..=5).contains(&bytes[1])
}

/// Whether the file starts as SafeTensors does: a plausible header length, then `{`. Such a file
/// is a damaged SafeTensors file whatever its first bytes resemble (a header of 640 bytes starts
/// with `80 02`, the start of a pickle).
pub(crate) fn looks_like_safetensors(bytes: &[u8]) -> bool {
    match (bytes.first_chunk::<8>(), bytes.get(8)) {
        (Some(prefix), Some(b'{')) => u64::from_le_bytes(*prefix) <= MAX_HEADER_BYTES,
        _ => false,
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle)
}

/// Recognises a few formats from their first and last bytes; `None` when the file looks like
/// none of them (a damaged SafeTensors file, most likely).
pub(crate) fn sniff(bytes: &[u8]) -> Option<FileKind> {
    if looks_like_safetensors(bytes) {
        return None;
    }
    if is_zip(bytes) {
        // The central directory at the end names the members.
        let tail = &bytes[bytes.len().saturating_sub(64 * 1024)..];
        return Some(if contains(tail, b"data.pkl") {
            FileKind::PyTorchZip
        } else if contains(tail, b".npy") {
            FileKind::Npz
        } else {
            FileKind::Zip
        });
    }
    if bytes.starts_with(b"GGUF") {
        return Some(FileKind::Gguf);
    }
    if bytes.starts_with(b"\x93NUMPY") {
        return Some(FileKind::Npy);
    }
    if bytes.starts_with(b"\x89HDF\r\n\x1a\n") {
        return Some(FileKind::Hdf5);
    }
    if is_pickle(bytes) {
        return Some(FileKind::Pickle);
    }
    let head = &bytes[..bytes.len().min(512)];
    let printable = head.iter().all(|&b| b.is_ascii_graphic() || b.is_ascii_whitespace());
    if !head.is_empty() && printable {
        return Some(FileKind::Text);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_common_formats() {
        assert_eq!(sniff(b"GGUF\x03\x00\x00\x00"), Some(FileKind::Gguf));
        assert_eq!(sniff(b"\x93NUMPY\x01\x00"), Some(FileKind::Npy));
        assert_eq!(sniff(b"\x80\x02\x8a\x0alo"), Some(FileKind::Pickle));
        assert_eq!(sniff(b"version https://git-lfs.github.com/spec/v1\n"), Some(FileKind::Text));
        assert_eq!(sniff(b"PK\x03\x04....archive/data.pkl...."), Some(FileKind::PyTorchZip));
        assert_eq!(sniff(b"\x10\x00\x00\x00\x00\x00\x00\x00{\x00"), None);
        // A SafeTensors header of 0x280 bytes starts with the bytes of a pickle's PROTO 2.
        assert_eq!(sniff(b"\x80\x02\x00\x00\x00\x00\x00\x00{\"a\""), None);
    }

    #[test]
    fn tells_torch_containers_apart() {
        assert_eq!(torch_container(b"PK\x03\x04rest"), Some(TorchContainer::Zip));
        assert_eq!(torch_container(TORCH_LEGACY_MAGIC), Some(TorchContainer::Legacy));
        assert_eq!(torch_container(b"\x80\x04\x95"), Some(TorchContainer::Pickle));
        assert_eq!(torch_container(b"\x10\x00\x00\x00\x00\x00\x00\x00{"), None);
    }

    #[test]
    fn names_index_kinds() {
        assert!(is_torch_index("pytorch_model.bin.index.json"));
        assert!(is_torch_index("model.pth.index.json"));
        assert!(!is_torch_index("model.safetensors.index.json"));
    }

    #[test]
    fn detects_folder_conventions() {
        let dir = std::env::temp_dir().join(format!("nnx-format-detect-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let touch = |name: &str| std::fs::write(dir.join(name), b"").unwrap();
        assert!(matches!(detect(&dir), Err(Error::EmptyFolder { .. })));
        touch("b.safetensors");
        touch("a.safetensors");
        let files = vec![dir.join("a.safetensors"), dir.join("b.safetensors")];
        assert_eq!(detect(&dir).unwrap(), Holds::Files { dir: dir.clone(), files });
        touch("other.safetensors.index.json");
        assert_eq!(detect(&dir).unwrap(), Holds::ShardIndex(dir.join("other.safetensors.index.json")));
        touch(TORCH_INDEX);
        assert_eq!(detect(&dir).unwrap(), Holds::TorchIndex(dir.join(TORCH_INDEX)));
        touch(SAFETENSORS);
        assert_eq!(detect(&dir).unwrap(), Holds::SafeTensors(dir.join(SAFETENSORS)));
        touch(SAFETENSORS_INDEX);
        assert_eq!(detect(&dir).unwrap(), Holds::ShardIndex(dir.join(SAFETENSORS_INDEX)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
