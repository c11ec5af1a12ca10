//! Fetching byte ranges: cached ranges first, then the others sorted per file, neighbours
//! closer than the coalescing gap merged, long spans cut to the request limit, and the
//! requests run a bounded number at a time.

use std::ops::Range;
use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use object_store::path::Path as ObjectPath;

use super::Client;
use crate::error::{Error, RemoteProblem, Result};
use crate::source::FetchedObject;

/// One request sent to the store: `range` of file `file` (an index into the batch's files).
struct Chunk {
    file: usize,
    range: Range<u64>,
}

/// One object of a batch: its path in the store, its URL (the cache's key with its version),
/// its version, and what the cache holds of it, listed once.
struct File<'a> {
    path: ObjectPath,
    url: String,
    version: &'a str,
    listing: Option<super::cache::Listing>,
}

/// The bytes of every range of every request (objects of `client`'s store), in the order
/// asked.
pub(crate) fn fetch(client: &Client, requests: &[(&FetchedObject, Vec<Range<u64>>)]) -> Result<Vec<Vec<Bytes>>> {
    let options = &client.options;
    let mut out: Vec<Vec<Option<Bytes>>> = requests.iter().map(|(_, ranges)| vec![None; ranges.len()]).collect();
    // The files of the batch, and every wanted range not in the cache: (file, range,
    // request, position).
    let mut files: Vec<File<'_>> = Vec::new();
    let mut wanted: Vec<(usize, Range<u64>, usize, usize)> = Vec::new();
    for (at, (object, ranges)) in requests.iter().enumerate() {
        let file =
            match files.iter().position(|file| file.path.as_ref() == object.name && file.version == object.version) {
                Some(file) => file,
                None => {
                    let path = ObjectPath::parse(&object.name).map_err(|error| Error::Remote {
                        url: object.name.clone(),
                        problem: RemoteProblem::BadUrl { reason: error.to_string() },
                    })?;
                    let url = client.url(&path);
                    let listing = options.cache.as_ref().map(|cache| cache.listing(&url, &object.version));
                    files.push(File { path, url, version: &object.version, listing });
                    files.len() - 1
                }
            };
        for (position, range) in ranges.iter().enumerate() {
            if range.is_empty() {
                out[at][position] = Some(Bytes::new());
                continue;
            }
            if let Some(cached) = files[file].listing.as_ref().and_then(|listing| listing.get(range)) {
                client.cached_bytes.fetch_add(cached.len() as u64, Ordering::Relaxed);
                out[at][position] = Some(cached);
                continue;
            }
            wanted.push((file, range.clone(), at, position));
        }
    }
    if !wanted.is_empty() {
        fetch_wanted(client, &files, wanted, &mut out)?;
    }
    Ok(out.into_iter().map(|ranges| ranges.into_iter().map(Option::unwrap_or_default).collect()).collect())
}

/// Fetches the `wanted` ranges of `files`, neighbours merged, and puts each into `out`.
fn fetch_wanted(
    client: &Client,
    files: &[File<'_>],
    mut wanted: Vec<(usize, Range<u64>, usize, usize)>,
    out: &mut [Vec<Option<Bytes>>],
) -> Result<()> {
    let options = &client.options;
    wanted.sort_by_key(|(file, range, ..)| (*file, range.start, range.end));
    // Spans: merged neighbours, as (file, range, first wanted, end of wanted).
    let mut spans: Vec<(usize, Range<u64>, usize, usize)> = Vec::new();
    for (index, (file, range, ..)) in wanted.iter().enumerate() {
        match spans.last_mut() {
            Some((last_file, last, _, end))
                if last_file == file && range.start <= last.end.saturating_add(options.coalesce_gap) =>
            {
                last.end = last.end.max(range.end);
                *end = index + 1;
            }
            _ => spans.push((*file, range.clone(), index, index + 1)),
        }
    }
    let limit = options.max_request_bytes.max(1);
    let chunks: Vec<Chunk> = spans
        .iter()
        .flat_map(|(file, range, ..)| {
            let (file, range) = (*file, range.clone());
            (range.start..range.end)
                .step_by(usize::try_from(limit).unwrap_or(usize::MAX))
                .map(move |start| Chunk { file, range: start..(start + limit).min(range.end) })
        })
        .collect();
    // Each answer is checked against its range as it streams in (see `Client::get_range`).
    let fetched: Vec<Result<Bytes>> = client.block_on(
        futures::stream::iter(chunks.iter().map(|chunk| {
            let file = &files[chunk.file];
            async move { client.get_range(&file.path, chunk.range.clone(), false).await.map(|(bytes, _)| bytes) }
        }))
        .buffered(options.concurrency.max(1))
        .collect(),
    );
    let mut pieces: Vec<(usize, Range<u64>, Bytes)> = Vec::with_capacity(chunks.len());
    for (chunk, result) in chunks.iter().zip(fetched) {
        let bytes = result?;
        if let Some(cache) = &options.cache {
            let file = &files[chunk.file];
            cache.put(&file.url, file.version, &chunk.range, &bytes);
        }
        pieces.push((chunk.file, chunk.range.clone(), bytes));
    }
    for (file, range, at, position) in wanted {
        out[at][position] = Some(assemble(&pieces, file, &range));
    }
    Ok(())
}

/// The bytes of `range` of `file` out of the fetched pieces (a view of one piece when it lies
/// in one, as it does unless it was cut at the request limit).
fn assemble(pieces: &[(usize, Range<u64>, Bytes)], file: usize, range: &Range<u64>) -> Bytes {
    let covering =
        pieces.iter().filter(|(of, piece, _)| *of == file && piece.start < range.end && range.start < piece.end);
    let mut parts = covering.map(|(_, piece, bytes)| {
        let start = range.start.max(piece.start) - piece.start;
        let end = range.end.min(piece.end) - piece.start;
        bytes.slice(start as usize..(end as usize).min(bytes.len()))
    });
    let first = parts.next().unwrap_or_default();
    if first.len() as u64 == range.end - range.start {
        return first;
    }
    let mut joined = BytesMut::with_capacity((range.end - range.start) as usize);
    joined.extend_from_slice(&first);
    for part in parts {
        joined.extend_from_slice(&part);
    }
    joined.freeze()
}
