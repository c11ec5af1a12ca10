//! GGUF files read where they are, over HTTP (the loopback server of the hostile tests, here
//! answering honestly and counting what it sends) and on the Hub (the fake Hub): opening and
//! `nnx inspect` fetch the header alone, whatever the file's size, ggml types included;
//! tensors are fetched when read, through the range cache, and equal the local file's; a split
//! set is found beside the shard named.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use nnx::error::GgufProblem;
use nnx::gguf::GgufWriter;
use nnx::remote::{RangeCache, RemoteOptions};
use nnx::{Archive, DType, Error, Tensor};

use crate::http_support::answer;
use crate::hub_server::{Access, FakeHub};
use crate::loopback::{Request, Server};
use crate::util::{fixtures, run_nnx, scratch};

/// The size of the served file: the header is a small part of it.
const FILE_BYTES: usize = 128 << 20;

/// The most of the file that opening or inspecting it may transfer: 5 %.
const MOST_FETCHED: u64 = FILE_BYTES as u64 / 20;

/// The GGUF fixture the files are made of: llama.cpp's Q8_0 conversion of the small Llama 3.
fn fixture() -> Archive {
    Archive::open(fixtures().join("models/llama3/model-q8_0.gguf")).unwrap()
}

/// A writer holding the fixture's metadata and tensors, as stored.
fn fixture_writer(fixture: &Archive) -> GgufWriter {
    let mut writer = GgufWriter::new();
    for (key, value) in fixture.gguf_metadata().unwrap().iter() {
        writer.metadata_mut().set(key, value.clone());
    }
    for name in fixture.names() {
        writer.add(name, fixture.ggml(name).unwrap()).unwrap();
    }
    writer
}

/// Writes to `path` a GGUF of [`FILE_BYTES`] and a little more: the fixture's metadata and
/// tensors, then one F32 tensor `filler.weight` of 128 MiB.
fn large_gguf(path: &Path) {
    let mut writer = fixture_writer(&fixture());
    let columns = 4096;
    let rows = FILE_BYTES / (columns * 4);
    let values: Vec<f32> = (0..rows * columns).map(|i| (i % 997) as f32 / 997.0).collect();
    writer.add_tensor("filler.weight", &Tensor::from_vec(values, &[rows, columns]).unwrap()).unwrap();
    writer.write(path).unwrap();
}

/// Serves `files` (by path, without the leading `/`) as a static file server does: `HEAD`,
/// ranges and whole reads, with an `ETag`; 404 for other paths. Counts the body bytes it
/// sends in `sent`.
fn static_server(files: HashMap<String, Vec<u8>>, sent: Arc<AtomicU64>) -> Server {
    Server::start(move |request: &Request, stream| {
        let Some(file) = files.get(request.path.trim_start_matches('/')) else {
            return answer(stream, "404 Not Found", &["Content-Length: 0".into()], b"");
        };
        let len = file.len() as u64;
        let tag = "ETag: \"v1\"".to_string();
        let body: &[u8] = match (request.method.as_str(), request.range()) {
            ("HEAD", _) => return answer(stream, "200 OK", &[format!("Content-Length: {len}"), tag], b""),
            (_, Some((start, end))) if start < len => {
                let end = end.min(len);
                let body = &file[start as usize..end as usize];
                let headers = [
                    format!("Content-Range: bytes {start}-{}/{len}", end - 1),
                    format!("Content-Length: {}", body.len()),
                    tag,
                ];
                sent.fetch_add(body.len() as u64, Ordering::Relaxed);
                return answer(stream, "206 Partial Content", &headers, body);
            }
            (_, Some(_)) => return answer(stream, "416 Range Not Satisfiable", &["Content-Length: 0".into()], b""),
            (_, None) => file,
        };
        sent.fetch_add(body.len() as u64, Ordering::Relaxed);
        answer(stream, "200 OK", &[format!("Content-Length: {len}"), tag], body)
    })
}

#[test]
fn remote_gguf_inspect_over_http_fetches_the_header_only() {
    let dir = scratch();
    let path = dir.path().join("model.gguf");
    large_gguf(&path);
    let bytes = std::fs::read(&path).unwrap();
    let size = bytes.len() as u64;
    assert!(size >= FILE_BYTES as u64, "the file is 128 MiB: {size}");
    let sent = Arc::new(AtomicU64::new(0));
    let server = static_server(HashMap::from([("model.gguf".to_string(), bytes)]), sent.clone());
    let url = server.url("model.gguf");
    let local = Archive::open(&path).unwrap();

    // The command line lists every tensor with its ggml type from the header.
    let (code, out, err) = run_nnx(&["inspect", &url]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("{} entries", local.len())), "{out}");
    assert!(local.names().all(|name| out.contains(name)), "{out}");
    assert!(out.contains("Q8_0") && out.contains("F32"), "{out}");
    let inspected = sent.swap(0, Ordering::Relaxed);
    println!("nnx inspect {url}: {inspected} bytes sent of a file of {size}");
    assert!(inspected <= MOST_FETCHED, "`nnx inspect` transferred {inspected} bytes of {size}");

    // The same in-process, with the library's own count.
    let remote = Archive::open(&url).unwrap();
    let header = remote.transfer_stats().unwrap().bytes;
    assert!(header <= MOST_FETCHED, "opening transferred {header} bytes of {size}");
    assert_eq!(remote.names().collect::<Vec<_>>(), local.names().collect::<Vec<_>>());
    assert_eq!(remote.gguf_metadata(), local.gguf_metadata());
    for name in local.names() {
        assert_eq!(remote.ggml_type(name), local.ggml_type(name), "{name}");
        assert_eq!(remote.info(name).unwrap().shape, local.info(name).unwrap().shape, "{name}");
    }
    assert_eq!(remote.transfer_stats().unwrap().bytes, header, "types and shapes come from the header");

    // A tensor read remotely equals the local one, and costs its own bytes.
    let name = "blk.0.ffn_down.weight";
    let stored = local.info(name).unwrap().bytes as u64;
    assert_eq!(remote.ggml(name).unwrap().bytes().unwrap(), local.ggml(name).unwrap().bytes().unwrap());
    let shape = local.info(name).unwrap().shape;
    let (ours, theirs) =
        (remote.float(name, DType::F32, &shape).unwrap(), local.float(name, DType::F32, &shape).unwrap());
    assert_eq!(ours.to_bytes().unwrap(), theirs.to_bytes().unwrap());
    assert_eq!(remote.transfer_stats().unwrap().bytes, header + 2 * stored, "each read fetched the tensor once");
    assert_eq!(sent.load(Ordering::Relaxed), header + 2 * stored, "the server sent what the library counted");
}

#[test]
fn remote_gguf_tensors_are_kept_in_the_range_cache() {
    let dir = scratch();
    let path = fixtures().join("models/llama3/model-q8_0.gguf");
    let sent = Arc::new(AtomicU64::new(0));
    let server = static_server(HashMap::from([("model.gguf".to_string(), std::fs::read(&path).unwrap())]), sent);
    let cache = RangeCache::new(dir.path().join("cache"), 64 << 20);
    let options = RemoteOptions::default().with_cache(cache.clone());
    let local = Archive::open(&path).unwrap();
    let name = "blk.1.attn_q.weight";
    let shape = local.info(name).unwrap().shape;
    let stored = local.info(name).unwrap().bytes as u64;

    let first = Archive::open_remote(&server.url("model.gguf"), &options).unwrap();
    let header = first.transfer_stats().unwrap().bytes;
    first.float(name, DType::F32, &shape).unwrap();
    assert_eq!(first.transfer_stats().unwrap().bytes, header + stored);
    assert!(cache.size() >= stored);

    let second = Archive::open_remote(&server.url("model.gguf"), &options).unwrap();
    let tensor = second.float(name, DType::F32, &shape).unwrap();
    assert_eq!(tensor.to_bytes().unwrap(), local.float(name, DType::F32, &shape).unwrap().to_bytes().unwrap());
    let stats = second.transfer_stats().unwrap();
    assert_eq!((stats.bytes, stats.cached_bytes), (header, stored), "only the header travels again");
}

#[test]
fn remote_gguf_split_set_on_the_hub_opens_with_every_shard() {
    let dir = scratch();
    let fixture = fixture();
    let paths: Vec<PathBuf> = fixture_writer(&fixture).write_split(dir.path(), "model", 4, u64::MAX).unwrap();
    assert!(paths.len() >= 3, "the fixture is split in {} shards", paths.len());
    let names: Vec<String> =
        paths.iter().map(|path| path.file_name().unwrap().to_string_lossy().into_owned()).collect();
    let contents: Vec<Vec<u8>> = paths.iter().map(|path| std::fs::read(path).unwrap()).collect();
    let hub = FakeHub::start();
    hub.create_repo("org/split", Access::Public);
    let files: Vec<(&str, &[u8])> = names.iter().map(String::as_str).zip(contents.iter().map(Vec::as_slice)).collect();
    hub.commit("org/split", "main", &files);
    let options = RemoteOptions::default().with("hf_endpoint", hub.endpoint());

    // Any shard names the set: every shard's tensors, the first shard's metadata.
    let local = Archive::open(&paths[0]).unwrap();
    let remote = Archive::open_remote(&format!("hf://org/split/{}", names[1]), &options).unwrap();
    assert_eq!(remote.names().collect::<Vec<_>>(), local.names().collect::<Vec<_>>());
    assert_eq!(remote.len(), fixture.len());
    assert_eq!(remote.gguf_metadata(), local.gguf_metadata());
    for name in fixture.names() {
        assert_eq!(remote.ggml_type(name), fixture.ggml_type(name), "{name}");
        assert_eq!(remote.ggml(name).unwrap().bytes().unwrap(), fixture.ggml(name).unwrap().bytes().unwrap(), "{name}");
    }

    // A set with a shard missing is refused, naming the first one missing.
    hub.create_repo("org/partial", Access::Public);
    hub.commit("org/partial", "main", &[files[0], files[1]]);
    let missing = &names[2];
    match Archive::open_remote(&format!("hf://org/partial/{}", names[0]), &options) {
        Err(Error::Gguf { problem: GgufProblem::Split { shard, .. }, .. }) => assert_eq!(&shard, missing),
        other => panic!("expected the missing shard `{missing}` named, got {other:?}"),
    }
}
