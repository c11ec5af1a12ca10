//! Writing archives: deterministic SafeTensors files, written atomically (through
//! [`crate::fs`]), optionally page-aligned or sharded (new shards beside the old ones, the index
//! replaced last as the commit point, then the old shards removed).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::index::{ShardIndex, shard_file_name, shard_stem};
use crate::archive::{Archive, WriteItem};
use crate::error::{Error, Result};
use crate::fs::{StagedFile, folder_of, sync_folder, temporary_target, write_atomic, write_atomic_with};

/// The page of page-aligned files: 16 KiB, the page size of Apple silicon GPUs.
pub const PAGE_BYTES: usize = 16 * 1024;

/// Options of [`Archive::save_with`].
#[derive(Clone, Debug, Default)]
pub struct SaveOptions {
    /// Extra `__metadata__` strings (over the archive's own); store configs as JSON strings.
    pub metadata: BTreeMap<String, String>,
    /// Pad the header so data starts on a 16 KiB page and put entries whose size is a multiple
    /// of the page first, so each of them starts on a page boundary.
    pub page_align: bool,
    /// Split into shards of at most this many data bytes (an entry larger than the limit gets
    /// a shard of its own): `dir/model.safetensors` becomes `dir/model-00001-of-0000N.safetensors`
    /// and `dir/model.safetensors.index.json`.
    ///
    /// A sharded save replaces the checkpoint as a whole. The new shards are written, each
    /// atomically, under names the current index does not use (the standard names above when
    /// they are free, else variants such as `model-00001-of-0000N-v2.safetensors`; readers
    /// follow `weight_map`, so the names carry no meaning). The index is then replaced
    /// atomically: that rename is the commit point, so a crash or a kill at any moment leaves
    /// the old checkpoint or the new one, never a mix. Last, the shards the new index does not
    /// name are removed: those of the old index, and shard files of the same stem left by an
    /// interrupted save, with their temporary files.
    ///
    /// One writer at a time is assumed per checkpoint. Tensors already taken from the old
    /// shards keep their pages after the old shards are removed; an archive opened from the
    /// old index that had not yet opened a shard must be opened again.
    pub max_shard_bytes: Option<u64>,
    /// When sharding, keep the entries of one logical weight together: entries whose names are
    /// equal up to the last `.` (`x.weight`, `x.scales`, `x.biases`) go to the same shard, in
    /// the order their group first appears. Without it, entries are placed in entry order.
    pub group_streams: bool,
}

impl Archive {
    /// Writes the archive to `path` atomically: a crash leaves the old file or the new one.
    /// Saving over the file that live tensors were mapped from is safe: they keep the old
    /// file's pages.
    ///
    /// # Errors
    /// [`Error::Unsavable`] for meta tensors (checked before anything is written),
    /// [`Error::Data`] for an entry whose values cannot be materialized (a view past its
    /// expansion limit), [`Error::Io`] when writing fails (the target is then untouched).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        self.save_with(path, &SaveOptions::default())
    }

    /// [`Archive::save`] with [`SaveOptions`].
    ///
    /// Every layout is replaced atomically: a single file (page-aligned or not) by a rename
    /// over the old one, a sharded checkpoint by writing its new shards beside the old ones and
    /// then replacing the index, which commits the new set (see
    /// [`SaveOptions::max_shard_bytes`]). A crash at any moment leaves the complete old
    /// checkpoint or the complete new one, and readers that open it during the save see one of
    /// the two. One writer at a time is assumed per target; two processes saving to the same
    /// target at once may remove each other's shards.
    ///
    /// # Errors
    /// As [`Archive::save`]. When a sharded save fails, the shards it wrote are removed and the
    /// old checkpoint is left as it was.
    pub fn save_with(&self, path: impl AsRef<Path>, options: &SaveOptions) -> Result<()> {
        let path = path.as_ref();
        let items = self.write_items()?;
        let mut metadata = self.metadata().clone();
        metadata.extend(options.metadata.iter().map(|(key, value)| (key.clone(), value.clone())));
        match options.max_shard_bytes {
            None => {
                let items: Vec<&WriteItem<'_>> = items.iter().collect();
                write_atomic_with(path, |out| write_safetensors(out, &items, &metadata, options.page_align)).map(drop)
            }
            Some(limit) => write_shards(path, &items, &metadata, options.page_align, limit, options.group_streams),
        }
    }
}

/// Where each item's bytes go: returns the items' data offsets in item order and the order in
/// which to write them.
fn layout(items: &[&WriteItem<'_>], page_align: bool) -> (Vec<(usize, usize)>, Vec<usize>) {
    let mut order: Vec<usize> = (0..items.len()).collect();
    // Larger alignments first keeps every entry aligned for its dtype (data starts 8-aligned)
    // without holes; the sort is stable, so entries of one dtype keep their order.
    order.sort_by_key(|&at| {
        let item = &items[at];
        let on_page = page_align && item.bytes > 0 && item.bytes.is_multiple_of(PAGE_BYTES);
        (!on_page, std::cmp::Reverse(item.dtype.alignment()))
    });
    let mut offsets = vec![(0, 0); items.len()];
    let mut cursor = 0;
    for &at in &order {
        offsets[at] = (cursor, cursor + items[at].bytes);
        cursor += items[at].bytes;
    }
    (offsets, order)
}

fn header_json(items: &[&WriteItem<'_>], offsets: &[(usize, usize)], metadata: &BTreeMap<String, String>) -> String {
    let mut json = String::from("{");
    if !metadata.is_empty() {
        json.push_str("\"__metadata__\":{");
        let fields: Vec<String> =
            metadata.iter().map(|(key, value)| format!("{}:{}", json_string(key), json_string(value))).collect();
        json.push_str(&fields.join(","));
        json.push('}');
    }
    for (item, (begin, end)) in items.iter().zip(offsets) {
        if json.len() > 1 {
            json.push(',');
        }
        let shape: Vec<String> = item.shape.iter().map(usize::to_string).collect();
        json.push_str(&format!(
            "{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{begin},{end}]}}",
            json_string(item.name),
            item.dtype,
            shape.join(",")
        ));
    }
    json.push('}');
    json
}

/// Writes one SafeTensors file: header padded with spaces to 8 bytes (or to a page), then the
/// data in layout order.
fn write_safetensors(
    out: &mut dyn Write,
    items: &[&WriteItem<'_>],
    metadata: &BTreeMap<String, String>,
    page_align: bool,
) -> Result<u64> {
    let (offsets, order) = layout(items, page_align);
    let mut header = header_json(items, &offsets, metadata);
    let unit = if page_align { PAGE_BYTES } else { 8 };
    let padded = (8 + header.len()).next_multiple_of(unit) - 8;
    header.extend(std::iter::repeat_n(' ', padded - header.len()));
    let io = |error: std::io::Error| Error::Io { action: "write", path: PathBuf::new(), source: error };
    out.write_all(&(header.len() as u64).to_le_bytes()).map_err(io)?;
    out.write_all(header.as_bytes()).map_err(io)?;
    let mut written = 8 + header.len() as u64;
    for &at in &order {
        // An entry made when read is written from the tensor made, not from a copy of it.
        let made = items[at].made().transpose()?;
        let data = match &made {
            Some(tensor) => tensor.to_bytes().map_err(|source| Error::Data {
                path: PathBuf::new(),
                name: items[at].name.to_string(),
                source: Box::new(source),
            })?,
            None => items[at].data()?,
        };
        if data.len() >= PREFAULT_BYTES && matches!(data, Cow::Borrowed(_)) {
            // Borrowed bytes are usually pages of a mapped file that this process has not
            // touched yet: a second thread maps them in ahead of the write, which would
            // otherwise take each page fault itself. Without that thread the write just
            // takes the faults.
            std::thread::scope(|scope| {
                let _ = std::thread::Builder::new().spawn_scoped(scope, || touch_pages(&data));
                out.write_all(&data)
            })
            .map_err(io)?;
        } else {
            out.write_all(&data).map_err(io)?;
        }
        if data.len() != items[at].bytes {
            // An entry made when read whose data is not the size its header announced.
            return Err(Error::Data {
                path: PathBuf::new(),
                name: items[at].name.to_string(),
                source: Box::new(Error::ByteLength {
                    dtype: items[at].dtype,
                    shape: items[at].shape.clone(),
                    expected: items[at].bytes as u64,
                    found: data.len() as u64,
                }),
            });
        }
        written += data.len() as u64;
        drop(data);
        drop(made);
        // Done with the entry: a save from mapped files keeps resident only what it writes.
        items[at].release();
    }
    Ok(written)
}

/// Entries from this size on are written while another thread maps their pages in.
const PREFAULT_BYTES: usize = 1 << 20;

/// Reads one byte of every 4 KiB page of `bytes`, so that pages of a file mapping are mapped
/// in before they are needed.
fn touch_pages(bytes: &[u8]) {
    for byte in bytes.iter().step_by(4096) {
        std::hint::black_box(*byte);
    }
}

/// Greedy in entry order: a shard is closed when the next entry would pass the limit; an
/// entry larger than the limit is alone in its shard. With `group_streams`, the unit placed is
/// a group of entries sharing a name up to the last `.` (in order of first appearance), so a
/// group is never split; a group larger than the limit is alone in its shard.
fn plan_shards(items: &[WriteItem<'_>], limit: u64, group_streams: bool) -> Vec<Vec<usize>> {
    let units: Vec<Vec<usize>> = if group_streams {
        let mut order: Vec<&str> = Vec::new();
        let mut members: std::collections::HashMap<&str, Vec<usize>> = std::collections::HashMap::new();
        for (at, item) in items.iter().enumerate() {
            let group = item.name.rsplit_once('.').map_or(item.name, |(stem, _)| stem);
            members
                .entry(group)
                .or_insert_with(|| {
                    order.push(group);
                    Vec::new()
                })
                .push(at);
        }
        order.into_iter().map(|group| members.remove(group).unwrap_or_default()).collect()
    } else {
        (0..items.len()).map(|at| vec![at]).collect()
    };
    let mut shards: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut size = 0u64;
    for unit in units {
        let bytes: u64 = unit.iter().map(|&at| items[at].bytes as u64).sum();
        if !current.is_empty() && size + bytes > limit {
            shards.push(std::mem::take(&mut current));
            size = 0;
        }
        current.extend(unit);
        size += bytes;
    }
    if !current.is_empty() || shards.is_empty() {
        shards.push(current);
    }
    shards
}

/// The shard file names the index at `index_path` names: the files readers of the current
/// checkpoint use. Empty when there is no index, or one no reader can use.
fn shards_in_use(index_path: &Path) -> HashSet<String> {
    let Ok(index) = ShardIndex::read(index_path) else {
        return HashSet::new();
    };
    index.shards.iter().filter_map(|shard| shard.file_name().and_then(|name| name.to_str()).map(String::from)).collect()
}

/// Names for `count` shards of `stem` that none of `in_use` has: the standard names when they
/// are free, else the first free variant.
fn fresh_shard_names(stem: &str, count: usize, in_use: &HashSet<String>) -> Vec<String> {
    let free = |generation: usize| {
        let names: Vec<String> = (1..=count).map(|number| shard_file_name(stem, number, count, generation)).collect();
        names.iter().all(|name| !in_use.contains(name)).then_some(names)
    };
    // `in_use` is finite, so some generation is free.
    (1..).find_map(free).unwrap_or_default()
}

/// Writes a sharded checkpoint for `path` (`dir/STEM.safetensors`): see
/// [`SaveOptions::max_shard_bytes`] for the order of the steps and what a crash leaves.
fn write_shards(
    path: &Path,
    items: &[WriteItem<'_>],
    metadata: &BTreeMap<String, String>,
    page_align: bool,
    limit: u64,
    group_streams: bool,
) -> Result<()> {
    let dir = folder_of(path);
    let file_name = path.file_name().and_then(|name| name.to_str()).unwrap_or("model.safetensors");
    let stem = file_name.strip_suffix(".safetensors").unwrap_or(file_name);
    let index_path = dir.join(format!("{stem}.safetensors.index.json"));
    let plan = plan_shards(items, limit, group_streams);
    let in_use = shards_in_use(&index_path);
    let shard_names = fresh_shard_names(stem, plan.len(), &in_use);

    let mut written: Vec<PathBuf> = Vec::with_capacity(plan.len());
    let result = (|| {
        let mut weight_map = Vec::with_capacity(items.len());
        for (members, shard_name) in plan.iter().zip(&shard_names) {
            let shard_items: Vec<&WriteItem<'_>> = members.iter().map(|&at| &items[at]).collect();
            let shard_path = dir.join(shard_name);
            written.push(shard_path.clone());
            let mut shard = StagedFile::create(&shard_path)?;
            shard.write_with(|out| write_safetensors(out, &shard_items, metadata, page_align))?;
            shard.rename()?;
            weight_map.extend(members.iter().map(|&at| (items[at].name, shard_name.as_str())));
        }
        // Every shard must be on disk under its name before the index that names them is.
        sync_folder(&dir)?;
        write_atomic(&index_path, index_json(items, metadata, &weight_map).as_bytes())
    })();
    if result.is_err() {
        // The old index is untouched and names none of these files.
        for shard_path in &written {
            let _ = std::fs::remove_file(shard_path);
        }
        return result;
    }
    let keep: HashSet<&str> = shard_names.iter().map(String::as_str).collect();
    remove_unused_shards(&dir, stem, &keep, &in_use);
    Ok(())
}

/// The index text: `metadata.total_size` (the data bytes), the other metadata, `weight_map`.
fn index_json(items: &[WriteItem<'_>], metadata: &BTreeMap<String, String>, weight_map: &[(&str, &str)]) -> String {
    let total: u64 = items.iter().map(|item| item.bytes as u64).sum();
    let mut json = format!("{{\n  \"metadata\": {{\n    \"total_size\": {total}");
    for (key, value) in metadata {
        if key != "total_size" {
            json.push_str(&format!(",\n    {}: {}", json_string(key), json_string(value)));
        }
    }
    json.push_str("\n  },\n  \"weight_map\": {");
    let lines: Vec<String> =
        weight_map.iter().map(|(name, shard)| format!("\n    {}: {}", json_string(name), json_string(shard))).collect();
    json.push_str(&lines.join(","));
    json.push_str("\n  }\n}\n");
    json
}

/// After a sharded save of `stem` has committed: removes from `dir` every file the new index
/// does not name (`keep`) that was a shard of the old index (`old`) or is a shard file of the
/// same stem (left by an interrupted save), and the temporary files of interrupted saves of
/// such shards, of the index and of `STEM.safetensors`. Failures are ignored: the new
/// checkpoint is complete, and what is left is never read (no index names it) and is removed by
/// the next save.
fn remove_unused_shards(dir: &Path, stem: &str, keep: &HashSet<&str>, old: &HashSet<String>) {
    let index_name = format!("{stem}.safetensors.index.json");
    let Ok(listing) = std::fs::read_dir(dir) else {
        return;
    };
    for item in listing.flatten() {
        let name = item.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        let unused = if let Some(target) = temporary_target(name) {
            target == index_name || target == format!("{stem}.safetensors") || shard_stem(target) == Some(stem)
        } else {
            !keep.contains(name) && (old.contains(name) || shard_stem(name) == Some(stem))
        };
        if unused && item.file_type().is_ok_and(|kind| kind.is_file()) {
            let _ = std::fs::remove_file(item.path());
        }
    }
}

/// `text` as a JSON string literal, quoted and escaped.
fn json_string(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}
