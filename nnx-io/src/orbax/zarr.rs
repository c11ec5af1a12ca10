//! Zarr arrays as orbax-checkpoint writes them through tensorstore: zarr v2 (`.zarray`, chunks
//! `0.1` each one zstd frame) and zarr3 (`zarr.json`, chunks `c/0/1` each a `sharding_indexed`
//! shard: zstd inner chunks and an index checked by crc32c). Metadata is parsed into
//! [`ArrayMeta`]; a stored chunk is decoded and copied into the global array where it belongs,
//! and chunks that are not stored leave the fill value. Codecs orbax does not write are refused
//! by name.

use nnx_core::DType;
use serde_json::Value as Json;

use super::{Parse, Value, problem};
use crate::error::{OrbaxProblem, Result};

/// The most bytes one chunk may decode to beyond the array's own bytes: chunks larger than the
/// array they hold would let a small file claim a huge buffer.
const CHUNK_SLACK: u64 = 64 << 20;

/// Where an array's chunks lie and how each is encoded.
#[derive(Debug)]
pub(crate) struct ArrayMeta {
    /// The global shape.
    pub(crate) shape: Vec<usize>,
    /// The element type.
    pub(crate) dtype: DType,
    /// The shape of a chunk of the grid (a shard for zarr3 with `sharding_indexed`).
    chunk: Vec<usize>,
    /// One element of the fill value, little-endian.
    fill: Vec<u8>,
    keys: Keys,
    layout: Layout,
}

/// How chunk coordinates are spelled in keys.
#[derive(Debug, Clone, Copy)]
enum Keys {
    /// zarr3's `default`: `c`, then each coordinate after the separator.
    Default(char),
    /// zarr v2 (and zarr3's `v2`): the coordinates joined by the separator, `0` for rank 0.
    V2(char),
}

/// Decoding a chunk's bytes: the bytes→bytes codecs, in the order they were applied, then the
/// byte order and element order of the values.
#[derive(Debug, Clone)]
struct Chain {
    codecs: Vec<BytesCodec>,
    big_endian: bool,
    /// Column-major (zarr v2's `order: "F"`).
    fortran: bool,
}

#[derive(Debug, Clone, Copy)]
enum BytesCodec {
    Zstd,
    Crc32c,
}

#[derive(Debug)]
enum Layout {
    /// Each chunk is one stored value.
    Chunks(Chain),
    /// Each chunk is a shard of inner chunks, with an index of `(offset, length)` pairs.
    Shards { inner: Vec<usize>, chain: Chain, index_big_endian: bool, index_crc32c: bool, index_at_end: bool },
}

impl ArrayMeta {
    /// The metadata of a zarr v2 array (`.zarray`).
    pub(crate) fn parse_v2(bytes: &[u8]) -> Parse<ArrayMeta> {
        let what = "`.zarray`";
        let doc: Json = serde_json::from_slice(bytes).map_err(|error| json(what, error.to_string()))?;
        if doc.get("zarr_format").and_then(Json::as_u64) != Some(2) {
            return Err(json(what, "`zarr_format` is not 2".into()));
        }
        let shape = dims(field(&doc, "shape", what)?, "shape", what)?;
        let chunk = dims(field(&doc, "chunks", what)?, "chunks", what)?;
        let stored = field(&doc, "dtype", what)?;
        let Some(stored) = stored.as_str() else {
            return Err(unsupported("data type", stored.to_string(), V2_DTYPES));
        };
        let (dtype, big_endian) = dtype_v2(stored)?;
        let fortran = match doc.get("order").and_then(Json::as_str) {
            None | Some("C") => false,
            Some("F") => true,
            Some(other) => return Err(unsupported("order", format!("`{other}`"), "`C` or `F`")),
        };
        match doc.get("filters") {
            None | Some(Json::Null) => {}
            Some(Json::Array(filters)) if filters.is_empty() => {}
            Some(filters) => return Err(unsupported("filters", filters.to_string(), "none")),
        }
        let codecs = match doc.get("compressor") {
            None | Some(Json::Null) => Vec::new(),
            Some(compressor) => match compressor.get("id").and_then(Json::as_str) {
                Some("zstd") => vec![BytesCodec::Zstd],
                _ => return Err(unsupported("compressor", compressor.to_string(), "`zstd` or none")),
            },
        };
        let separator = match doc.get("dimension_separator").and_then(Json::as_str) {
            None | Some(".") => '.',
            Some("/") => '/',
            Some(other) => return Err(unsupported("dimension separator", format!("`{other}`"), "`.` or `/`")),
        };
        let fill = match doc.get("fill_value") {
            None | Some(Json::Null) => vec![0; element(dtype)],
            Some(value) => fill_value(value, dtype)?,
        };
        let layout = Layout::Chunks(Chain { codecs, big_endian, fortran });
        ArrayMeta { shape, dtype, chunk, fill, keys: Keys::V2(separator), layout }.checked(stored)
    }

    /// The metadata of a zarr3 array (`zarr.json`).
    pub(crate) fn parse_v3(bytes: &[u8]) -> Parse<ArrayMeta> {
        let what = "`zarr.json`";
        let doc: Json = serde_json::from_slice(bytes).map_err(|error| json(what, error.to_string()))?;
        if doc.get("zarr_format").and_then(Json::as_u64) != Some(3) {
            return Err(json(what, "`zarr_format` is not 3".into()));
        }
        if doc.get("node_type").and_then(Json::as_str).is_some_and(|kind| kind != "array") {
            return Err(json(what, "`node_type` is not `array`".into()));
        }
        let shape = dims(field(&doc, "shape", what)?, "shape", what)?;
        let grid = field(&doc, "chunk_grid", what)?;
        if grid.get("name").and_then(Json::as_str) != Some("regular") {
            return Err(unsupported("chunk grid", grid.to_string(), "`regular`"));
        }
        let chunk =
            dims(field(grid, "configuration", what)?.get("chunk_shape").unwrap_or(&Json::Null), "chunk_shape", what)?;
        let stored = field(&doc, "data_type", what)?;
        let Some(stored) = stored.as_str() else {
            return Err(unsupported("data type", stored.to_string(), V3_DTYPES));
        };
        let dtype = dtype_v3(stored)?;
        let keys = match doc.get("chunk_key_encoding") {
            None => Keys::Default('/'),
            Some(encoding) => {
                let separator = encoding.get("configuration").and_then(|config| config.get("separator"));
                let separator = |default: char| match separator.and_then(Json::as_str) {
                    None => Ok(default),
                    Some("/") => Ok('/'),
                    Some(".") => Ok('.'),
                    Some(other) => Err(unsupported("chunk key separator", format!("`{other}`"), "`/` or `.`")),
                };
                match encoding.get("name").and_then(Json::as_str) {
                    Some("default") => Keys::Default(separator('/')?),
                    Some("v2") => Keys::V2(separator('.')?),
                    _ => return Err(unsupported("chunk key encoding", encoding.to_string(), "`default` or `v2`")),
                }
            }
        };
        let codecs = field(&doc, "codecs", what)?;
        let layout = match parse_codecs(codecs, true)? {
            Codecs::Plain(chain) => Layout::Chunks(chain),
            Codecs::Sharded { inner, chain, index_big_endian, index_crc32c, index_at_end } => {
                if inner.len() != chunk.len()
                    || inner.iter().zip(&chunk).any(|(&inner, &outer)| inner == 0 || outer % inner != 0)
                {
                    return Err(OrbaxProblem::Shape {
                        what: "inner chunk shape",
                        found: inner.iter().map(|&size| size as u64).collect(),
                        expected: format!("one size per axis dividing the shard shape {chunk:?}"),
                    });
                }
                Layout::Shards { inner, chain, index_big_endian, index_crc32c, index_at_end }
            }
        };
        let fill = fill_value(field(&doc, "fill_value", what)?, dtype)?;
        ArrayMeta { shape, dtype, chunk, fill, keys, layout }.checked(stored)
    }

    /// The metadata, once its shapes are checked: ranks agree, no chunk axis is empty, and the
    /// array and its chunks can be addressed and held.
    fn checked(self, stored: &str) -> Parse<ArrayMeta> {
        let size = element(self.dtype) as u64;
        let bytes = |shape: &[usize]| shape.iter().try_fold(size, |total, &axis| total.checked_mul(axis as u64));
        // As a tensor counts it: its bits fit in 64, its bytes in `isize`.
        let array_bytes = bytes(&self.shape)
            .filter(|&total| {
                total.checked_mul(8).is_some() && usize::try_from(total).is_ok_and(|total| total <= isize::MAX as usize)
            })
            .ok_or_else(|| OrbaxProblem::Enormous {
                shape: self.shape.iter().map(|&axis| axis as u64).collect(),
                dtype: stored.to_string(),
            })?;
        let decoded = match &self.layout {
            Layout::Chunks(_) => &self.chunk,
            Layout::Shards { inner, .. } => inner,
        };
        let limit = array_bytes.max(CHUNK_SLACK);
        let fits = self.chunk.len() == self.shape.len()
            && self.chunk.iter().all(|&axis| axis > 0)
            && bytes(decoded).is_some_and(|total| total <= limit)
            && self.chunk.iter().try_fold(1u64, |total, &axis| total.checked_mul(axis as u64)).is_some();
        if !fits {
            return Err(OrbaxProblem::Shape {
                what: "chunk shape",
                found: self.chunk.iter().map(|&axis| axis as u64).collect(),
                expected: format!(
                    "one size above 0 per axis of the shape {:?}, each chunk decoding to at most {limit} bytes",
                    self.shape
                ),
            });
        }
        Ok(self)
    }

    /// The box of the array (offsets and sizes per axis) that the chunk key `key` (relative to
    /// the array) holds, or `None` for keys that are not chunks of the grid.
    pub(crate) fn chunk_box(&self, key: &str) -> Option<(Vec<usize>, Vec<usize>)> {
        let coordinates = self.coordinates(key)?;
        let offsets: Vec<usize> = coordinates.iter().zip(&self.chunk).map(|(&index, &chunk)| index * chunk).collect();
        let sizes =
            offsets.iter().zip(&self.chunk).zip(&self.shape).map(|((&at, &chunk), &len)| chunk.min(len - at)).collect();
        Some((offsets, sizes))
    }

    /// The grid coordinates the chunk key `key` (relative to the array) names, or `None` for
    /// keys that are not chunks of the grid (metadata, stale chunks past the shape).
    fn coordinates(&self, key: &str) -> Option<Vec<usize>> {
        let (rest, separator) = match self.keys {
            Keys::Default(separator) => {
                let rest = key.strip_prefix('c')?;
                if self.shape.is_empty() {
                    return rest.is_empty().then(Vec::new);
                }
                (rest.strip_prefix(separator)?, separator)
            }
            Keys::V2(separator) => {
                if self.shape.is_empty() {
                    return (key == "0").then(Vec::new);
                }
                (key, separator)
            }
        };
        let mut coordinates = Vec::with_capacity(self.shape.len());
        for (axis, part) in rest.split(separator).enumerate() {
            let index: usize = part.parse().ok().filter(|_| part.bytes().all(|byte| byte.is_ascii_digit()))?;
            let count = self.shape.get(axis)?.div_ceil(self.chunk[axis]);
            if index >= count {
                return None;
            }
            coordinates.push(index);
        }
        (coordinates.len() == self.shape.len()).then_some(coordinates)
    }

    /// Writes the fill value over `out` (the global array's bytes, zeroed), then every stored
    /// chunk of `chunks` (keys relative to the array `key`) where it belongs.
    ///
    /// # Errors
    /// [`crate::Error::Orbax`] naming the file and key of a chunk that cannot be read or
    /// decoded; [`crate::Error::Io`] when its file cannot be read.
    pub(crate) fn assemble(&self, out: &mut [u8], key: &str, chunks: Vec<(String, Value)>) -> Result<()> {
        if self.fill.iter().any(|&byte| byte != 0) {
            for slot in out.chunks_exact_mut(self.fill.len()) {
                slot.copy_from_slice(&self.fill);
            }
        }
        for (name, value) in chunks {
            let Some(coordinates) = self.coordinates(&name) else { continue };
            let chunk_key = format!("{key}/{name}");
            let origin: Vec<usize> = coordinates.iter().zip(&self.chunk).map(|(&index, &size)| index * size).collect();
            match &self.layout {
                Layout::Chunks(chain) => {
                    let data = self.decode(chain, &self.chunk, &value, 0, value.len(), &chunk_key)?;
                    self.place(out, &data, &self.chunk, &origin, chain.fortran);
                }
                Layout::Shards { inner, chain, index_big_endian, index_crc32c, index_at_end } => {
                    let shard = Shard {
                        inner,
                        chain,
                        big_endian: *index_big_endian,
                        crc32c: *index_crc32c,
                        at_end: *index_at_end,
                    };
                    self.assemble_shard(out, &shard, &value, &origin, &chunk_key)?;
                }
            }
        }
        Ok(())
    }

    /// Copies the inner chunks of the shard `value`, whose first element is at `origin`.
    fn assemble_shard(
        &self,
        out: &mut [u8],
        shard: &Shard<'_>,
        value: &Value,
        origin: &[usize],
        key: &str,
    ) -> Result<()> {
        let fail = |problem_found| problem(value.path(), key, problem_found);
        let grid: Vec<usize> = self.chunk.iter().zip(shard.inner).map(|(&outer, &inner)| outer / inner).collect();
        let count = grid.iter().try_fold(1u64, |total, &axis| total.checked_mul(axis as u64)).unwrap_or(u64::MAX);
        let index_len = count.checked_mul(16).and_then(|len| len.checked_add(if shard.crc32c { 4 } else { 0 }));
        let len = value.len();
        let Some(index_len) = index_len.filter(|&index_len| index_len <= len) else {
            return Err(fail(OrbaxProblem::Truncated {
                what: format!("the shard index of {count} inner chunks"),
                needed: index_len.unwrap_or(u64::MAX),
                available: len,
            }));
        };
        let start = if shard.at_end { len - index_len } else { 0 };
        let index = value.read(key, start, index_len)?;
        let entries = if shard.crc32c {
            let (entries, stored) = index.split_at(index.len() - 4);
            let stored = u32::from_le_bytes(stored.try_into().expect("four bytes"));
            let computed = crc32c::crc32c(entries);
            if stored != computed {
                return Err(fail(OrbaxProblem::Checksum { what: "the shard index", stored, computed }));
            }
            entries
        } else {
            &index[..]
        };
        let word = |bytes: &[u8]| {
            let bytes: [u8; 8] = bytes.try_into().expect("eight bytes");
            if shard.big_endian { u64::from_be_bytes(bytes) } else { u64::from_le_bytes(bytes) }
        };
        let mut position = vec![0usize; grid.len()];
        for pair in entries.chunks_exact(16) {
            let (offset, length) = (word(&pair[..8]), word(&pair[8..]));
            let inner_origin: Vec<usize> =
                origin.iter().zip(&position).zip(shard.inner).map(|((&base, &at), &size)| base + at * size).collect();
            // The next inner chunk, last axis fastest.
            for axis in (0..grid.len()).rev() {
                position[axis] += 1;
                if position[axis] < grid[axis] {
                    break;
                }
                position[axis] = 0;
            }
            if offset == u64::MAX && length == u64::MAX {
                continue;
            }
            let end = offset.checked_add(length).filter(|&end| end <= len);
            if end.is_none() {
                let end = offset.saturating_add(length);
                return Err(fail(OrbaxProblem::PastEnd { what: "the shard", offset, end, len }));
            }
            if inner_origin.iter().zip(&self.shape).any(|(&at, &size)| at >= size) {
                continue;
            }
            let data = self.decode(shard.chain, shard.inner, value, offset, length, key)?;
            self.place(out, &data, shard.inner, &inner_origin, shard.chain.fortran);
        }
        Ok(())
    }

    /// The values of a chunk of `shape`: bytes `offset..offset + length` of `value`, decoded
    /// by `chain` into little-endian elements.
    fn decode(
        &self,
        chain: &Chain,
        shape: &[usize],
        value: &Value,
        offset: u64,
        length: u64,
        key: &str,
    ) -> Result<Vec<u8>> {
        let size = element(self.dtype);
        let expected = shape.iter().product::<usize>() * size;
        // A stored chunk is at most its values, the framing of its compression and checksums.
        let most = expected as u64 + expected as u64 / 64 + (64 << 10) + 4 * chain.codecs.len() as u64;
        if length > most {
            return Err(problem(value.path(), key, OrbaxProblem::TooLarge { what: "a stored chunk", limit: most }));
        }
        let raw = value.read(key, offset, length)?;
        let mut data = decode_chain(&chain.codecs, raw, expected).map_err(|found| problem(value.path(), key, found))?;
        if data.len() != expected {
            let found =
                OrbaxProblem::ChunkSize { shape: shape.to_vec(), expected: expected as u64, found: data.len() as u64 };
            return Err(problem(value.path(), key, found));
        }
        if chain.big_endian && size > 1 {
            // Complex numbers swap each of their two parts.
            let part = if self.dtype == DType::C64 { 4 } else { size };
            for element in data.chunks_exact_mut(part) {
                element.reverse();
            }
        }
        Ok(data)
    }

    /// Copies the chunk `data` of `shape` (row-major, or column-major when `fortran`), whose
    /// first element is at `origin`, into `out`, leaving out what lies past the array's edge.
    fn place(&self, out: &mut [u8], data: &[u8], shape: &[usize], origin: &[usize], fortran: bool) {
        let size = element(self.dtype);
        let rank = self.shape.len();
        if rank == 0 {
            out[..size].copy_from_slice(&data[..size]);
            return;
        }
        if origin.iter().zip(&self.shape).any(|(&at, &axis)| at >= axis) {
            return;
        }
        let extent: Vec<usize> = (0..rank).map(|axis| shape[axis].min(self.shape[axis] - origin[axis])).collect();
        let global = row_major_strides(&self.shape);
        let local = if fortran { column_major_strides(shape) } else { row_major_strides(shape) };
        let last = rank - 1;
        let mut index = vec![0usize; last];
        loop {
            let source: usize = (0..last).map(|axis| index[axis] * local[axis]).sum();
            let target: usize =
                (0..last).map(|axis| (origin[axis] + index[axis]) * global[axis]).sum::<usize>() + origin[last];
            if local[last] == 1 {
                let run = extent[last] * size;
                out[target * size..target * size + run].copy_from_slice(&data[source * size..source * size + run]);
            } else {
                for step in 0..extent[last] {
                    let from = (source + step * local[last]) * size;
                    let to = (target + step) * size;
                    out[to..to + size].copy_from_slice(&data[from..from + size]);
                }
            }
            // The next row of the outer axes, last fastest.
            let mut axis = last;
            loop {
                if axis == 0 {
                    return;
                }
                axis -= 1;
                index[axis] += 1;
                if index[axis] < extent[axis] {
                    break;
                }
                index[axis] = 0;
            }
        }
    }
}

/// The index and inner chunks of a zarr3 shard.
struct Shard<'a> {
    inner: &'a [usize],
    chain: &'a Chain,
    big_endian: bool,
    crc32c: bool,
    at_end: bool,
}

/// What a zarr3 codec list makes of a chunk.
enum Codecs {
    Plain(Chain),
    Sharded { inner: Vec<usize>, chain: Chain, index_big_endian: bool, index_crc32c: bool, index_at_end: bool },
}

/// The codecs orbax writes: `bytes` or `sharding_indexed` (outermost only), then `zstd` and
/// `crc32c`.
const CODECS: &str = "`bytes`, `sharding_indexed`, `zstd` and `crc32c`";

/// A zarr3 codec list; `outer` allows `sharding_indexed` (not inside a shard).
fn parse_codecs(codecs: &Json, outer: bool) -> Parse<Codecs> {
    let what = "`zarr.json`";
    let Some(list) = codecs.as_array() else { return Err(json(what, "`codecs` is not a list".into())) };
    let mut array_to_bytes: Option<Codecs> = None;
    let mut after = Vec::new();
    for codec in list {
        let name = codec.get("name").and_then(Json::as_str).unwrap_or_default();
        let config = codec.get("configuration").unwrap_or(&Json::Null);
        match name {
            "bytes" if array_to_bytes.is_none() => {
                let chain = Chain { codecs: Vec::new(), big_endian: big_endian(config)?, fortran: false };
                array_to_bytes = Some(Codecs::Plain(chain));
            }
            "sharding_indexed" if outer && array_to_bytes.is_none() => {
                let inner = dims(field(config, "chunk_shape", what)?, "chunk_shape", what)?;
                let chain = match parse_codecs(field(config, "codecs", what)?, false)? {
                    Codecs::Plain(chain) => chain,
                    Codecs::Sharded { .. } => unreachable!("inner codecs refuse sharding"),
                };
                let index = field(config, "index_codecs", what)?.as_array().cloned().unwrap_or_default();
                let (mut index_big_endian, mut index_crc32c) = (None, false);
                for codec in &index {
                    match codec.get("name").and_then(Json::as_str) {
                        Some("bytes") if index_big_endian.is_none() => {
                            index_big_endian = Some(big_endian(codec.get("configuration").unwrap_or(&Json::Null))?);
                        }
                        Some("crc32c") if index_big_endian.is_some() && !index_crc32c => index_crc32c = true,
                        _ => return Err(unsupported("shard index codec", codec.to_string(), "`bytes` then `crc32c`")),
                    }
                }
                let Some(index_big_endian) = index_big_endian else {
                    return Err(unsupported(
                        "shard index codecs",
                        Json::Array(index).to_string(),
                        "`bytes` then `crc32c`",
                    ));
                };
                let index_at_end = match config.get("index_location").and_then(Json::as_str) {
                    None | Some("end") => true,
                    Some("start") => false,
                    Some(other) => {
                        return Err(unsupported("shard index location", format!("`{other}`"), "`start` or `end`"));
                    }
                };
                array_to_bytes = Some(Codecs::Sharded { inner, chain, index_big_endian, index_crc32c, index_at_end });
            }
            "zstd" if array_to_bytes.is_some() => after.push(BytesCodec::Zstd),
            "crc32c" if array_to_bytes.is_some() => after.push(BytesCodec::Crc32c),
            _ => {
                let found = if name.is_empty() { codec.to_string() } else { format!("`{name}`") };
                return Err(unsupported("codec", found, CODECS));
            }
        }
    }
    match array_to_bytes {
        Some(Codecs::Plain(mut chain)) => {
            chain.codecs = after;
            Ok(Codecs::Plain(chain))
        }
        Some(sharded @ Codecs::Sharded { .. }) if after.is_empty() => Ok(sharded),
        Some(Codecs::Sharded { .. }) => Err(unsupported(
            "codec after `sharding_indexed`",
            format!("{after:?}"),
            "none (compression inside the shard)",
        )),
        None => Err(unsupported("codec list", codecs.to_string(), "one `bytes` or `sharding_indexed` codec")),
    }
}

/// Whether a `bytes` codec's configuration says big-endian (`little` when it says nothing, as
/// for one-byte types).
fn big_endian(config: &Json) -> Parse<bool> {
    match config.get("endian").and_then(Json::as_str) {
        None | Some("little") => Ok(false),
        Some("big") => Ok(true),
        Some(other) => Err(unsupported("byte order", format!("`{other}`"), "`little` or `big`")),
    }
}

/// Undoes `codecs` (applied in this order when the chunk was written) on `raw`; `expected` is
/// the size of the values, which bounds every decompression.
fn decode_chain(codecs: &[BytesCodec], raw: Vec<u8>, expected: usize) -> Parse<Vec<u8>> {
    // The size that goes into each codec when writing: known up to the first compression.
    let mut sizes = Vec::with_capacity(codecs.len());
    let mut size = Some(expected);
    for codec in codecs {
        sizes.push(size);
        size = match codec {
            BytesCodec::Zstd => None,
            BytesCodec::Crc32c => size.map(|size| size + 4),
        };
    }
    let mut data = raw;
    for (codec, size) in codecs.iter().zip(sizes).rev() {
        data = match codec {
            BytesCodec::Zstd => {
                // A compressed stage inside another is at most a little larger than what it holds.
                // One byte past it is enough to tell a chunk too long, whose size is then refused.
                let limit = size.unwrap_or(expected + expected / 64 + (64 << 10));
                super::zstd_decode_capped(&data, limit as u64, "a chunk")?
            }
            BytesCodec::Crc32c => {
                let Some(split) = data.len().checked_sub(4) else {
                    return Err(OrbaxProblem::Truncated {
                        what: "a chunk's crc32c checksum".into(),
                        needed: 4,
                        available: data.len() as u64,
                    });
                };
                let stored = u32::from_le_bytes(data[split..].try_into().expect("four bytes"));
                let computed = crc32c::crc32c(&data[..split]);
                if stored != computed {
                    return Err(OrbaxProblem::Checksum { what: "a chunk", stored, computed });
                }
                data.truncate(split);
                data
            }
        };
    }
    Ok(data)
}

fn row_major_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for axis in (0..shape.len().saturating_sub(1)).rev() {
        strides[axis] = strides[axis + 1] * shape[axis + 1];
    }
    strides
}

fn column_major_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for axis in 1..shape.len() {
        strides[axis] = strides[axis - 1] * shape[axis - 1];
    }
    strides
}

/// The bytes of one element (every zarr data type nnx reads is whole bytes).
fn element(dtype: DType) -> usize {
    dtype.size_in_bytes().expect("zarr data types are whole bytes")
}

fn json(what: &'static str, message: String) -> OrbaxProblem {
    OrbaxProblem::Json { what, message }
}

fn unsupported(field: &'static str, found: String, expected: &'static str) -> OrbaxProblem {
    OrbaxProblem::Unsupported { field, found, expected }
}

fn field<'a>(doc: &'a Json, name: &str, what: &'static str) -> Parse<&'a Json> {
    doc.get(name).ok_or_else(|| json(what, format!("the field `{name}` is missing")))
}

/// A list of axis sizes.
fn dims(value: &Json, name: &str, what: &'static str) -> Parse<Vec<usize>> {
    let list = value.as_array().ok_or_else(|| json(what, format!("`{name}` is not a list of sizes")))?;
    // No array has more axes than this; a longer list is not a shape.
    if list.len() > 64 {
        return Err(json(what, format!("`{name}` has {} axes", list.len())));
    }
    list.iter()
        .map(|size| {
            size.as_u64()
                .and_then(|size| usize::try_from(size).ok())
                .ok_or_else(|| json(what, format!("`{name}` holds {size}, not a size")))
        })
        .collect()
}

const V2_DTYPES: &str = "`|b1`, `|i1`, `|u1`, `<i2`..`<i8`, `<u2`..`<u8`, `<f2`, `<f4`, `<f8`, `<c8` (or big-endian `>`), `bfloat16` and the `float8_*` types";
const V3_DTYPES: &str = "`bool`, `int8`..`int64`, `uint8`..`uint64`, `float16`, `bfloat16`, `float32`, `float64`, `complex64` and the `float8_*` types";

/// The types named the same in both versions (those of `ml_dtypes`).
fn named_dtype(text: &str) -> Option<DType> {
    Some(match text {
        "bfloat16" => DType::BF16,
        "float8_e4m3fn" => DType::F8E4M3,
        "float8_e5m2" => DType::F8E5M2,
        "float8_e4m3fnuz" => DType::F8E4M3Fnuz,
        "float8_e5m2fnuz" => DType::F8E5M2Fnuz,
        "float8_e8m0fnu" => DType::F8E8M0,
        _ => return None,
    })
}

/// A zarr v2 (numpy) type string and whether it is big-endian.
fn dtype_v2(text: &str) -> Parse<(DType, bool)> {
    if let Some(dtype) = named_dtype(text) {
        return Ok((dtype, false));
    }
    let refused = || unsupported("data type", format!("`{text}`"), V2_DTYPES);
    let (order, code) = text.split_at_checked(1).ok_or_else(refused)?;
    let big_endian = match order {
        "<" | "|" | "=" => false,
        ">" => true,
        _ => return Err(refused()),
    };
    let dtype = match code {
        "b1" => DType::Bool,
        "i1" => DType::I8,
        "u1" => DType::U8,
        "i2" => DType::I16,
        "u2" => DType::U16,
        "i4" => DType::I32,
        "u4" => DType::U32,
        "i8" => DType::I64,
        "u8" => DType::U64,
        "f2" => DType::F16,
        "f4" => DType::F32,
        "f8" => DType::F64,
        "c8" => DType::C64,
        _ => return Err(refused()),
    };
    Ok((dtype, big_endian))
}

/// A zarr3 data type name: numpy's (and `ml_dtypes`') names.
fn dtype_v3(text: &str) -> Parse<DType> {
    DType::from_numpy_name(text).ok_or_else(|| unsupported("data type", format!("`{text}`"), V3_DTYPES))
}

/// One element of the fill value, little-endian whatever the chunks' byte order: a number,
/// `NaN`, `Infinity`, `-Infinity`, a `0x...` bit pattern, a boolean, or `[real, imaginary]` for
/// complex numbers.
fn fill_value(value: &Json, dtype: DType) -> Parse<Vec<u8>> {
    let size = element(dtype);
    let refused = || {
        unsupported(
            "fill value",
            value.to_string(),
            "a number of the array's type, `NaN`, `Infinity`, `-Infinity` or `0x` and its bits",
        )
    };
    if dtype == DType::C64 {
        let parts = value.as_array().filter(|parts| parts.len() == 2).ok_or_else(refused)?;
        let mut bytes = fill_value(&parts[0], DType::F32)?;
        bytes.extend(fill_value(&parts[1], DType::F32)?);
        return Ok(bytes);
    }
    if let Some(hex) = value.as_str().and_then(|text| text.strip_prefix("0x")) {
        let bits = u64::from_str_radix(hex, 16).map_err(|_| refused())?;
        if hex.len() > 2 * size {
            return Err(refused());
        }
        return Ok(bits.to_le_bytes()[..size].to_vec());
    }
    let float = match value {
        Json::Bool(flag) if dtype == DType::Bool => return Ok(vec![u8::from(*flag)]),
        Json::Number(number) if !dtype.is_float() => {
            let bytes = if let Some(integer) = number.as_i64() {
                integer.to_le_bytes()
            } else {
                number.as_u64().ok_or_else(refused)?.to_le_bytes()
            };
            let fits = match dtype {
                DType::Bool => number.as_u64().is_some_and(|flag| flag <= 1),
                DType::I8 => number.as_i64().is_some_and(|n| i8::try_from(n).is_ok()),
                DType::U8 => number.as_u64().is_some_and(|n| u8::try_from(n).is_ok()),
                DType::I16 => number.as_i64().is_some_and(|n| i16::try_from(n).is_ok()),
                DType::U16 => number.as_u64().is_some_and(|n| u16::try_from(n).is_ok()),
                DType::I32 => number.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
                DType::U32 => number.as_u64().is_some_and(|n| u32::try_from(n).is_ok()),
                DType::I64 => number.as_i64().is_some(),
                DType::U64 => number.as_u64().is_some(),
                _ => false,
            };
            if !fits {
                return Err(refused());
            }
            return Ok(bytes[..size].to_vec());
        }
        Json::Number(number) => number.as_f64().ok_or_else(refused)?,
        Json::String(text) if dtype.is_float() => match text.as_str() {
            "NaN" => f64::NAN,
            "Infinity" => f64::INFINITY,
            "-Infinity" => f64::NEG_INFINITY,
            _ => return Err(refused()),
        },
        _ => return Err(refused()),
    };
    Ok(match dtype {
        DType::F16 => half::f16::from_f64(float).to_le_bytes().to_vec(),
        DType::BF16 => half::bf16::from_f64(float).to_le_bytes().to_vec(),
        DType::F32 => (float as f32).to_le_bytes().to_vec(),
        DType::F64 => float.to_le_bytes().to_vec(),
        // The eight-bit floats take only zero as a number; other values are given as bits.
        _ if float == 0.0 && float.is_sign_positive() => vec![0; size],
        _ => return Err(refused()),
    })
}

/// Reads the zarr metadata of the array `key` from `get`: `zarr.json`, else `.zarray`; `None`
/// when neither is there.
///
/// # Errors
/// The errors of `get`, and [`crate::Error::Orbax`] naming the metadata's file and key when it
/// cannot be used.
pub(crate) fn metadata(
    key: &str,
    get: impl Fn(&str) -> Result<Option<Value>>,
) -> Result<Option<(ArrayMeta, std::path::PathBuf)>> {
    for (name, parse) in
        [("zarr.json", ArrayMeta::parse_v3 as fn(&[u8]) -> Parse<ArrayMeta>), (".zarray", ArrayMeta::parse_v2)]
    {
        let full = format!("{key}/{name}");
        let Some(value) = get(&full)? else { continue };
        // Metadata is a small JSON document.
        const MOST: u64 = 16 << 20;
        if value.len() > MOST {
            return Err(problem(
                value.path(),
                &full,
                OrbaxProblem::TooLarge { what: "the zarr metadata", limit: MOST },
            ));
        }
        let bytes = value.read(&full, 0, value.len())?;
        let meta = parse(&bytes).map_err(|found| problem(value.path(), &full, found))?;
        return Ok(Some((meta, value.path().to_path_buf())));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v3(codecs: &str, shape: &str, chunk: &str, dtype: &str, fill: &str) -> Parse<ArrayMeta> {
        let doc = format!(
            r#"{{"zarr_format":3,"node_type":"array","shape":{shape},"data_type":"{dtype}","fill_value":{fill},
            "chunk_grid":{{"name":"regular","configuration":{{"chunk_shape":{chunk}}}}},
            "chunk_key_encoding":{{"name":"default"}},"codecs":{codecs}}}"#
        );
        ArrayMeta::parse_v3(doc.as_bytes())
    }

    const PLAIN: &str =
        r#"[{"name":"bytes","configuration":{"endian":"little"}},{"name":"zstd","configuration":{"level":3}}]"#;

    #[test]
    fn chunk_keys_name_grid_coordinates() {
        let meta = v3(PLAIN, "[10, 6]", "[5, 3]", "float32", "0.0").unwrap();
        assert_eq!(meta.coordinates("c/1/0"), Some(vec![1, 0]));
        assert_eq!(meta.coordinates("c/2/0"), None, "past the grid");
        assert_eq!(meta.coordinates("c/1"), None);
        assert_eq!(meta.coordinates("zarr.json"), None);
        assert_eq!(meta.coordinates("c/+1/0"), None);
        let scalar = v3(PLAIN, "[]", "[]", "float64", "\"NaN\"").unwrap();
        assert_eq!(scalar.coordinates("c"), Some(vec![]));
        assert!(f64::from_le_bytes(scalar.fill.clone().try_into().unwrap()).is_nan());
        let v2 = br#"{"zarr_format":2,"shape":[4,3],"chunks":[2,3],"dtype":">i4","order":"F","fill_value":-2,
            "compressor":null,"filters":null}"#;
        let meta = ArrayMeta::parse_v2(v2).unwrap();
        assert_eq!(meta.coordinates("1.0"), Some(vec![1, 0]));
        assert_eq!(meta.fill, (-2i32).to_le_bytes());
    }

    #[test]
    fn unsupported_codecs_and_types_are_refused_by_name() {
        let gzip = r#"[{"name":"bytes"},{"name":"gzip","configuration":{"level":1}}]"#;
        let error = v3(gzip, "[4]", "[4]", "float32", "0").unwrap_err();
        assert!(error.to_string().contains("`gzip`"), "{error}");
        let error = v3(PLAIN, "[4]", "[4]", "string", "0").unwrap_err();
        assert!(error.to_string().contains("`string`"), "{error}");
        let blosc = br#"{"zarr_format":2,"shape":[4],"chunks":[4],"dtype":"<f4","compressor":{"id":"blosc"}}"#;
        let error = ArrayMeta::parse_v2(blosc).unwrap_err();
        assert!(error.to_string().contains("blosc"), "{error}");
    }

    #[test]
    fn shapes_that_cannot_be_held_are_refused() {
        let error = v3(PLAIN, "[18446744073709551615, 4]", "[1, 4]", "float32", "0").unwrap_err();
        assert!(matches!(error, OrbaxProblem::Enormous { .. }), "{error}");
        let error = v3(PLAIN, "[4]", "[1099511627776]", "float32", "0").unwrap_err();
        assert!(matches!(error, OrbaxProblem::Shape { .. }), "{error}");
        let error = v3(PLAIN, "[4]", "[0]", "float32", "0").unwrap_err();
        assert!(matches!(error, OrbaxProblem::Shape { .. }), "{error}");
    }

    #[test]
    fn column_major_chunks_are_placed_transposed() {
        let v2 = br#"{"zarr_format":2,"shape":[3,2],"chunks":[2,2],"dtype":"|u1","order":"F","compressor":null}"#;
        let meta = ArrayMeta::parse_v2(v2).unwrap();
        let mut out = vec![0u8; 6];
        // Chunk (0, 0) holds rows 0..2, stored column by column; chunk (1, 0) reaches past the
        // last row.
        meta.place(&mut out, &[1, 3, 2, 4], &[2, 2], &[0, 0], true);
        meta.place(&mut out, &[5, 9, 6, 9], &[2, 2], &[2, 0], true);
        assert_eq!(out, [1, 2, 3, 4, 5, 6]);
    }
}
