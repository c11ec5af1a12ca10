//! Read plans: which bytes of which files each of `N` ranks reads to hold its slice of every
//! tensor, computed from headers alone. A tensor's slice is its piece of a split axis, cut as
//! `torch.chunk` cuts it (pieces of `ceil(n / N)`), or the whole tensor when it is replicated.
//! Stored values laid row-major are read exactly (one range per run of the slice); compressed
//! or packed ones are read whole, which the plan counts as read amplification.

use std::ops::Range;
use std::path::PathBuf;

use crate::archive::Archive;
use crate::error::Result;
use crate::source::box_ranges;

/// One stored piece of an entry: the box of the entry it holds and how its bytes lie.
#[derive(Clone, Debug)]
pub(crate) struct StoredPiece {
    pub(crate) file: PathBuf,
    /// Where the piece starts in the entry, one offset per axis.
    pub(crate) offsets: Vec<usize>,
    /// Its extent, one size per axis.
    pub(crate) sizes: Vec<usize>,
    pub(crate) layout: PieceLayout,
}

/// How a stored piece's bytes lie in its file.
#[derive(Clone, Debug)]
pub(crate) enum PieceLayout {
    /// Values row-major from `start`, `element` bytes each: any box of them is read exactly.
    RowMajor { start: u64, element: usize },
    /// Bytes that must be read whole to get any of the values (compressed, packed in blocks,
    /// or laid out in another order).
    Whole { start: u64, len: u64 },
    /// Bytes kept inside another structure of the file (a node of an OCDBT B+tree), read with
    /// it: counted at their size, with no range of their own.
    Inline { len: u64 },
}

/// The reads of one piece for one rank.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PlannedRead {
    /// The entry.
    pub entry: String,
    /// The file read.
    pub file: PathBuf,
    /// The byte ranges read from it, in order.
    pub ranges: Vec<Range<u64>>,
    /// Where the values land: the box of the entry (a `(start, len)` per axis) they fill.
    pub lands: Vec<(usize, usize)>,
}

/// What one rank reads.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RankPlan {
    /// The rank, from 0.
    pub rank: usize,
    /// Its reads, entry by entry.
    pub reads: Vec<PlannedRead>,
    /// The bytes it reads.
    pub bytes_read: u64,
    /// The bytes its slices hold: what it reads with no amplification.
    pub bytes_needed: u64,
}

impl RankPlan {
    /// Bytes read per byte needed: 1 where every read is exact.
    pub fn amplification(&self) -> f64 {
        if self.bytes_needed == 0 { 1.0 } else { self.bytes_read as f64 / self.bytes_needed as f64 }
    }
}

/// Every rank's reads.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ReadPlan {
    /// The ranks, in order.
    pub ranks: Vec<RankPlan>,
    /// Entries held in memory, with no file to read (none for archives of files).
    pub in_memory: Vec<String>,
}

/// The rows `[start, end)` of an axis of `len` that rank `rank` of `ranks` holds, as
/// `torch.chunk` (and so DTensor's `Shard`) cuts it: pieces of `ceil(len / ranks)`, the last
/// ones shorter or empty.
pub fn rank_rows(len: usize, ranks: usize, rank: usize) -> (usize, usize) {
    let piece = len.div_ceil(ranks.max(1));
    let start = (piece * rank).min(len);
    (start, (start + piece).min(len))
}

impl Archive {
    /// The plan of reads for `ranks` ranks, each holding its slice of every entry: the piece of
    /// the axis `split(name, shape)` names, cut as [`rank_rows`] says, or the whole entry where
    /// it names none (replicated). Computed from headers (for a distributed checkpoint, each
    /// chunk's zip directory); nothing is read from the tensors' data.
    ///
    /// # Errors
    /// The errors of reading the headers that place each entry's pieces.
    pub fn read_plan(&self, ranks: usize, split: impl Fn(&str, &[usize]) -> Option<usize>) -> Result<ReadPlan> {
        let ranks = ranks.max(1);
        let mut plans: Vec<RankPlan> =
            (0..ranks).map(|rank| RankPlan { rank, reads: Vec::new(), bytes_read: 0, bytes_needed: 0 }).collect();
        let mut in_memory = Vec::new();
        for name in self.names() {
            let (dtype, shape) = self.entry_spec(name)?.expect("a listed entry has a spec");
            let pieces = self.stored_pieces(name)?;
            if pieces.is_empty() {
                in_memory.push(name.to_string());
                continue;
            }
            let axis = split(name, &shape).filter(|&axis| axis < shape.len());
            for plan in &mut plans {
                let mut slice: Vec<(usize, usize)> = shape.iter().map(|&len| (0, len)).collect();
                if let Some(axis) = axis {
                    let (start, end) = rank_rows(shape[axis], ranks, plan.rank);
                    slice[axis] = (start, end - start);
                }
                let count: u64 = slice.iter().map(|&(_, len)| len as u64).product();
                plan.bytes_needed += dtype.storage_bytes(count).unwrap_or(0);
                for piece in &pieces {
                    let Some(lands) = intersect(&slice, &piece.offsets, &piece.sizes) else { continue };
                    let ranges = match piece.layout {
                        PieceLayout::RowMajor { start, element } => {
                            let local: Vec<(usize, usize)> = lands
                                .iter()
                                .zip(&piece.offsets)
                                .map(|(&(at, len), &offset)| (at - offset, len))
                                .collect();
                            merge(box_ranges(&piece.sizes, &local, element, start))
                        }
                        PieceLayout::Whole { start, len } => std::iter::once(start..start + len).collect(),
                        PieceLayout::Inline { len } => {
                            plan.bytes_read += len;
                            Vec::new()
                        }
                    };
                    plan.bytes_read += ranges.iter().map(|range| range.end - range.start).sum::<u64>();
                    plan.reads.push(PlannedRead { entry: name.to_string(), file: piece.file.clone(), ranges, lands });
                }
            }
        }
        Ok(ReadPlan { ranks: plans, in_memory })
    }

    /// The stored pieces of entry `name`; none for an entry held in memory.
    fn stored_pieces(&self, name: &str) -> Result<Vec<StoredPiece>> {
        let slot = self.slots.get(name).expect("a listed entry has a slot");
        let (source, at) = slot.store.open(name, slot.at)?;
        source.stored_pieces(at)
    }
}

/// The box where `slice` and the piece at `offsets` of `sizes` meet, in entry coordinates;
/// `None` where they do not (or the piece is empty).
fn intersect(slice: &[(usize, usize)], offsets: &[usize], sizes: &[usize]) -> Option<Vec<(usize, usize)>> {
    let mut lands = Vec::with_capacity(slice.len());
    for ((&(start, len), &offset), &size) in slice.iter().zip(offsets).zip(sizes) {
        let (from, to) = (start.max(offset), (start + len).min(offset + size));
        if from >= to {
            return None;
        }
        lands.push((from, to - from));
    }
    Some(lands)
}

/// Joins ranges that follow each other.
fn merge(ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match merged.last_mut() {
            Some(last) if last.end == range.start => last.end = range.end,
            _ => merged.push(range),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::{intersect, merge, rank_rows};

    #[test]
    fn slices_meet_pieces_where_both_hold_values() {
        assert_eq!(intersect(&[(3, 3), (0, 6)], &[2, 0], &[2, 6]), Some(vec![(3, 1), (0, 6)]));
        assert_eq!(intersect(&[(0, 2)], &[2], &[2]), None);
        assert_eq!(intersect(&[(0, 5)], &[5], &[0]), None);
        assert_eq!(intersect(&[], &[], &[]), Some(vec![]));
        assert_eq!(merge(vec![0..4, 4..8, 10..12]), vec![0..8, 10..12]);
        assert_eq!((0..4).map(|rank| rank_rows(10, 4, rank)).collect::<Vec<_>>(), [(0, 3), (3, 6), (6, 9), (9, 10)]);
    }
}
