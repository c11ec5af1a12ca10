//! Fetching byte ranges: cached ranges first, then the others sorted per file, neighbours
//! closer than the coalescing gap merged, long spans cut to the request limit, and the
//! requests run a bounded number at a time.

use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;

use super::{Client, RemoteFile};
use crate::error::Result;

/// Ranges of one file to fetch.
pub(crate) struct Request {
    pub(crate) file: Arc<RemoteFile>,
    pub(crate) ranges: Vec<Range<u64>>,
}

/// One request sent to the store: `range` of file `file` (an index into the batch's files).
struct Chunk {
    file: usize,
    range: Range<u64>,
}

/// The bytes of every range of every request, in the order asked.
pub(crate) fn fetch(requests: &[Request]) -> Result<Vec<Vec<Bytes>>> {
    let mut out: Vec<Vec<Option<Bytes>>> = requests.iter().map(|request| vec![None; request.ranges.len()]).collect();
    // Requests to different stores (an archive joined from two locations) are fetched apart.
    let mut clients: Vec<Arc<Client>> = Vec::new();
    for request in requests {
        if !clients.iter().any(|client| Arc::ptr_eq(client, &request.file.client)) {
            clients.push(request.file.client.clone());
        }
    }
    for client in &clients {
        fetch_from(client, requests, &mut out)?;
    }
    Ok(out.into_iter().map(|ranges| ranges.into_iter().map(Option::unwrap_or_default).collect()).collect())
}

fn fetch_from(client: &Arc<Client>, requests: &[Request], out: &mut [Vec<Option<Bytes>>]) -> Result<()> {
    let options = &client.options;
    // The files of this client, and every wanted range not in the cache: (file, range,
    // request, position).
    let mut files: Vec<Arc<RemoteFile>> = Vec::new();
    // What the cache holds of each file, listed once.
    let mut listings = Vec::new();
    let mut wanted: Vec<(usize, Range<u64>, usize, usize)> = Vec::new();
    for (at, request) in requests.iter().enumerate() {
        if !Arc::ptr_eq(&request.file.client, client) {
            continue;
        }
        let file = match files.iter().position(|file| Arc::ptr_eq(file, &request.file)) {
            Some(file) => file,
            None => {
                files.push(request.file.clone());
                listings.push(options.cache.as_ref().map(|cache| cache.listing(&request.file)));
                files.len() - 1
            }
        };
        for (position, range) in request.ranges.iter().enumerate() {
            if range.is_empty() {
                out[at][position] = Some(Bytes::new());
                continue;
            }
            if let Some(cached) = listings[file].as_ref().and_then(|listing| listing.get(range)) {
                client.cached_bytes.fetch_add(cached.len() as u64, std::sync::atomic::Ordering::Relaxed);
                out[at][position] = Some(cached);
                continue;
            }
            wanted.push((file, range.clone(), at, position));
        }
    }
    if wanted.is_empty() {
        return Ok(());
    }
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
            cache.put(&files[chunk.file], &chunk.range, &bytes);
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
