//! Writing a distributed checkpoint as `torch.distributed.checkpoint.save` does from `ranks`
//! processes whose tensors are cut along their first axis (DTensor's `Shard(0)`): one
//! `__R_0.distcp` file per rank holding that rank's chunks, each a `torch.save` zip, and
//! `.metadata` written last, as the commit point: a folder without it is no checkpoint.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use nnx_core::DType;
use nnx_core::error::DcpProblem;

use super::METADATA;
use crate::archive::Archive;
use crate::error::{Error, Result};
use crate::torch::write::{Pickle, save_tensor, saves};

const MODULE: &str = "torch.distributed.checkpoint.metadata";

/// One chunk written: its tensor, where it lands and where its bytes went.
struct Written {
    name: String,
    offsets: Vec<usize>,
    sizes: Vec<usize>,
    rank: usize,
    offset: u64,
    length: u64,
}

/// The rows of a first axis of `rows` that rank `rank` of `ranks` holds, as `torch.chunk`
/// (and so `Shard(0)`) cuts it: pieces of `ceil(rows / ranks)`, the last ones shorter or empty.
fn rows_of(rows: usize, ranks: usize, rank: usize) -> (usize, usize) {
    let piece = rows.div_ceil(ranks);
    let start = (piece * rank).min(rows);
    (start, (start + piece).min(rows))
}

impl Archive {
    /// Saves the entries into the folder `dir` as a PyTorch distributed checkpoint (DCP) of
    /// `ranks` ranks, as `torch.distributed.checkpoint.save` writes tensors cut along their
    /// first axis (`Shard(0)`, pieces as `torch.chunk` cuts them) from `ranks` processes:
    /// `__R_0.distcp` per rank and `.metadata`, written last. `torch.distributed.checkpoint.load`
    /// reads it into tensors of any sharding; [`Archive::open`] reads it back. Metadata is not
    /// written (DCP keeps non-tensor items as pickles, which nnx does not make).
    ///
    /// ```
    /// use nnx_core::Tensor;
    /// use nnx_io::Archive;
    ///
    /// let dir = std::env::temp_dir().join(format!("nnx-doc-dcp-{}", std::process::id()));
    /// let mut archive = Archive::new();
    /// archive.insert("w", Tensor::from_vec((0..12).map(|i| i as f32).collect(), &[6, 2])?);
    /// archive.save_dcp(&dir, 4)?;
    /// let back = Archive::open(&dir)?;
    /// assert_eq!(back.try_get("w")?.to_vec::<f32>()?, (0..12).map(|i| i as f32).collect::<Vec<_>>());
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Io`], the errors of reading the entries, and [`Error::Dcp`] for an entry whose
    /// dtype torch has no storage class for (FP8, ggml blocks: cast or decode first).
    pub fn save_dcp(&self, dir: impl AsRef<Path>, ranks: usize) -> Result<()> {
        save(self, dir.as_ref(), ranks)
    }
}

/// Writes every tensor of `archive` into the folder `dir` as a checkpoint of `ranks` ranks:
/// tensors of one axis or more cut along their first axis, scalars written by rank 0. Memory
/// holds one tensor at a time. A `.metadata` already in `dir` is removed first, so that a
/// write cut short never leaves a checkpoint that mixes two.
///
/// # Errors
/// [`Error::Io`], the errors of reading the entries, and [`Error::Dcp`] for an entry whose
/// dtype torch has no storage for.
fn save(archive: &Archive, dir: &Path, ranks: usize) -> Result<()> {
    let ranks = ranks.max(1);
    std::fs::create_dir_all(dir).map_err(Error::io("create", dir))?;
    let metadata = dir.join(METADATA);
    match std::fs::remove_file(&metadata) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(Error::io("remove", &metadata)(error)),
    }
    let paths: Vec<PathBuf> = (0..ranks).map(|rank| dir.join(format!("__{rank}_0.distcp"))).collect();
    let mut files = Vec::with_capacity(ranks);
    for path in &paths {
        let file = File::create(path).map_err(Error::io("create", path))?;
        files.push((BufWriter::new(file), 0u64));
    }
    let mut written = Vec::new();
    let mut specs = Vec::new();
    for name in archive.names() {
        let tensor = archive.try_get(name)?;
        let (dtype, shape) = (tensor.dtype(), tensor.shape().to_vec());
        if !saves(dtype) {
            return Err(Error::Dcp {
                path: dir.to_path_buf(),
                problem: DcpProblem::Metadata {
                    at: format!("entry `{name}`"),
                    expected: "a dtype torch stores (float, integer or bool)",
                    found: dtype.to_string(),
                },
            });
        }
        let bytes = tensor.to_bytes().map_err(|error| Error::Data {
            path: dir.to_path_buf(),
            name: name.to_string(),
            source: Box::new(error),
        })?;
        let row: usize =
            shape.iter().skip(1).product::<usize>() * dtype.size_in_bytes().expect("torch dtypes are whole bytes");
        let pieces: Vec<(usize, usize, usize)> = match shape.first() {
            None => vec![(0, 0, 1)],
            Some(&rows) => (0..ranks)
                .map(|rank| (rank, rows_of(rows, ranks, rank)))
                .filter(|(rank, (start, end))| end > start || rows == 0 && *rank == 0)
                .map(|(rank, (start, end))| (rank, start, end))
                .collect(),
        };
        for (rank, start, end) in pieces {
            let (mut offsets, mut sizes) = (vec![0; shape.len()], shape.clone());
            let data = if shape.is_empty() {
                &bytes[..]
            } else {
                offsets[0] = start;
                sizes[0] = end - start;
                &bytes[start * row..end * row]
            };
            let item = save_tensor(dtype, &sizes, data).map_err(Error::io("write", &paths[rank]))?;
            let (file, at) = &mut files[rank];
            file.write_all(&item).map_err(Error::io("write", &paths[rank]))?;
            written.push(Written {
                name: name.to_string(),
                offsets,
                sizes,
                rank,
                offset: *at,
                length: item.len() as u64,
            });
            *at += item.len() as u64;
        }
        specs.push((name.to_string(), dtype, shape));
        archive.release(name);
    }
    for ((file, _), path) in files.into_iter().zip(&paths) {
        let file = file.into_inner().map_err(|error| Error::io("write", path)(error.into_error()))?;
        file.sync_all().map_err(Error::io("sync", path))?;
    }
    let pickle = metadata_pickle(&specs, &written);
    crate::fs::write_atomic(&metadata, &pickle)?;
    Ok(())
}

/// The `.metadata` pickle of tensors `specs` whose chunks are `written`, as torch pickles its
/// `Metadata` dataclass: each object made by `NEWOBJ` and given its fields by `BUILD`.
fn metadata_pickle(specs: &[(String, DType, Vec<usize>)], written: &[Written]) -> Vec<u8> {
    let mut p = Pickle::new();
    object(&mut p, MODULE, "Metadata");
    p.dict().mark();
    p.text("state_dict_metadata").dict().mark();
    for (name, dtype, shape) in specs {
        p.text(name);
        object(&mut p, MODULE, "TensorStorageMetadata");
        p.dict().mark();
        p.text("properties");
        object(&mut p, MODULE, "TensorProperties");
        // TensorProperties's own state: (dtype, layout, requires_grad, memory format code,
        // pin_memory, strides).
        p.mark().global("torch", dtype.numpy_name().expect("torch stores only dtypes it names"));
        p.global("torch.serialization", "_get_layout").mark().text("torch.strided").tuple().reduce().bool(false);
        p.global(MODULE, "_MEM_FORMAT_ENCODING").mark().int(0).tuple().reduce();
        p.bool(false).none().tuple().build();
        p.text("size");
        size(&mut p, shape);
        p.text("chunks").list().mark();
        for chunk in written.iter().filter(|chunk| &chunk.name == name) {
            object(&mut p, MODULE, "ChunkStorageMetadata");
            p.dict().mark().text("offsets");
            size(&mut p, &chunk.offsets);
            p.text("sizes");
            size(&mut p, &chunk.sizes);
            p.set_items().build();
        }
        p.appends();
        p.set_items().build();
    }
    p.set_items();
    p.text("planner_data").dict().mark();
    for (name, _, _) in specs {
        p.text(name).mark().text(name).tuple();
    }
    p.set_items();
    p.text("storage_data").dict().mark();
    for chunk in written {
        object(&mut p, MODULE, "MetadataIndex");
        p.dict().mark().text("fqn").text(&chunk.name).text("offset");
        size(&mut p, &chunk.offsets);
        p.text("index").none().set_items().build();
        object(&mut p, "torch.distributed.checkpoint.filesystem", "_StorageInfo");
        p.dict().mark().text("relative_path").text(&format!("__{}_0.distcp", chunk.rank));
        p.text("offset").int(chunk.offset as i64).text("length").int(chunk.length as i64);
        p.set_items().build();
    }
    p.set_items();
    p.text("storage_meta").none();
    p.text("version").text("1.0.0");
    p.set_items().build();
    p.finish()
}

/// Pushes a new object of `module.name`, its fields to follow.
fn object(p: &mut Pickle, module: &str, name: &str) {
    p.global(module, name).mark().tuple().new_object();
}

/// Pushes `torch.Size(values)`.
fn size(p: &mut Pickle, values: &[usize]) {
    p.global("torch", "Size").mark().ints(values).tuple().reduce();
}

#[cfg(test)]
mod tests {
    use super::rows_of;

    #[test]
    fn first_axes_are_cut_as_torch_chunk_cuts_them() {
        let cut = |rows, ranks| (0..ranks).map(|rank| rows_of(rows, ranks, rank)).collect::<Vec<_>>();
        assert_eq!(cut(10, 4), [(0, 3), (3, 6), (6, 9), (9, 10)]);
        assert_eq!(cut(5, 4), [(0, 2), (2, 4), (4, 5), (5, 5)]);
        assert_eq!(cut(8, 2), [(0, 4), (4, 8)]);
    }
}
