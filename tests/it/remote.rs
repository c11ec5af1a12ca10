//! Remote archives against a real S3-compatible server: `moto` in server mode (installed by
//! `scripts/setup.sh`), started by each test on loopback, behind a counting proxy that can
//! also cut the connection mid-transfer. Opening fetches headers only; imports equal the local
//! ones; a tensor-parallel rank fetches its share of the bytes; the CLI reads URLs; errors
//! name the URL, never the secret; a server that stops mid-read gives an error.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nnx::error::RemoteProblem;
use nnx::models::gpt2::{Gpt2, Gpt2Config};
use nnx::models::llama::{Llama, LlamaConfig};
use nnx::nn::Init;
use nnx::remote::{RangeCache, RemoteOptions};
use nnx::{Archive, DType, Error, ImportOptions, Module, SaveOptions};

use crate::util::{cache_dir, fixtures, nnx_binary, scratch};

/// The secret the tests give the store: no error may print it.
const SECRET: &str = "never-printed-s3cr3t";

/// `moto_server` on a free loopback port with the bucket `models`, killed when dropped.
struct S3Server {
    child: Child,
    port: u16,
}

impl S3Server {
    fn start() -> S3Server {
        let python = std::env::var("NNX_PYTHON")
            .map(PathBuf::from)
            .unwrap_or_else(|_| cache_dir().join("venv").join("bin").join("python"));
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(&python)
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "`{}` cannot be run ({error}): run `scripts/setup.sh` (it installs moto[server])",
                    python.display()
                )
            });
        let mut server = S3Server { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("moto exited ({status}): run `scripts/setup.sh`, which installs moto[server]");
            }
            assert!(Instant::now() < deadline, "moto did not listen on 127.0.0.1:{port} within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        server.create_bucket("models");
        server
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates `bucket` with an unsigned `PUT`, which moto accepts.
    fn create_bucket(&self, bucket: &str) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            stream,
            "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "bucket not created: {response}");
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback proxy in front of the server that counts the bytes the server sends and, once
/// `cut_after` of them have passed, drops every connection.
struct Proxy {
    port: u16,
    sent: Arc<AtomicU64>,
    cut_after: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (sent, cut_after, stop) =
            (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(u64::MAX)), Arc::new(AtomicBool::new(false)));
        let (counter, limit, stopped) = (sent.clone(), cut_after.clone(), stop.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                let (client_in, server_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || pump(client_in, server_out, None));
                let (counter, limit) = (counter.clone(), limit.clone());
                std::thread::spawn(move || pump(server, client, Some((counter, limit))));
            }
        });
        Proxy { port, sent, cut_after, stop }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Copies `from` to `to`; counts the bytes when asked, and stops past the limit.
fn pump(mut from: TcpStream, mut to: TcpStream, counted: Option<(Arc<AtomicU64>, Arc<AtomicU64>)>) {
    let mut buffer = [0u8; 16 * 1024];
    loop {
        let read = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        let mut len = read;
        if let Some((sent, limit)) = &counted {
            let before = sent.fetch_add(read as u64, Ordering::Relaxed);
            let limit = limit.load(Ordering::Relaxed);
            if before + read as u64 > limit {
                len = limit.saturating_sub(before) as usize;
                let _ = to.write_all(&buffer[..len]);
                break;
            }
        }
        if to.write_all(&buffer[..len]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

/// Options for the store at `endpoint`, fetching exactly the bytes used.
fn options(endpoint: &str) -> RemoteOptions {
    let mut options = RemoteOptions::default()
        .with("aws_endpoint", endpoint)
        .with("aws_allow_http", "true")
        .with("aws_access_key_id", "testing")
        .with("aws_secret_access_key", SECRET)
        .with("aws_region", "us-east-1")
        .with_coalesce_gap(0);
    options.retries = 1;
    options.timeout = Duration::from_secs(5);
    options
}

/// Uploads every file of `dir` under `url/`.
fn upload_folder(dir: &Path, url: &str, options: &RemoteOptions) {
    for item in std::fs::read_dir(dir).unwrap() {
        let path = item.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        nnx::remote::upload(&path, &format!("{url}/{name}"), options).unwrap();
    }
}

/// Checks that two models hold the same tensors, byte for byte, and returns the bytes of those
/// of `report.imported`: what an import read.
fn same_tensors(ours: &impl Module, theirs: &impl Module, report: &nnx::ImportReport, what: &str) -> u64 {
    let (ours, theirs) = (ours.flat_state_dict(), theirs.flat_state_dict());
    assert_eq!(ours.keys().collect::<Vec<_>>(), theirs.keys().collect::<Vec<_>>(), "{what}");
    let mut read = 0u64;
    for ((name, ours), (_, theirs)) in ours.iter().zip(theirs.iter()) {
        assert_eq!(ours.to_bytes().unwrap(), theirs.to_bytes().unwrap(), "{what}: {name}");
        if report.imported.iter().any(|imported| imported == name) {
            read += theirs.byte_len() as u64;
        }
    }
    read
}

/// Bytes of the 8-byte length and the header of a local SafeTensors file.
fn header_bytes(path: &Path) -> u64 {
    let mut first = [0u8; 8];
    std::fs::File::open(path).unwrap().read_exact(&mut first).unwrap();
    8 + u64::from_le_bytes(first)
}

fn gpt2() -> Gpt2 {
    let config = Gpt2Config::from_file(fixtures().join("gpt2-tiny/config.json")).unwrap();
    Gpt2::new(&config, DType::F32, Init::Meta)
}

/// The llama fixture saved as shards of at most 64 KiB in a scratch folder.
fn sharded_llama(dir: &Path) -> PathBuf {
    let folder = dir.join("llama");
    std::fs::create_dir_all(&folder).unwrap();
    let archive = Archive::open(fixtures().join("llama-tiny/model.safetensors")).unwrap();
    let options = SaveOptions { max_shard_bytes: Some(64 << 10), ..SaveOptions::default() };
    archive.save_with(folder.join("model.safetensors"), &options).unwrap();
    std::fs::copy(fixtures().join("llama-tiny/config.json"), folder.join("config.json")).unwrap();
    folder
}

#[test]
fn opening_fetches_headers_only_and_an_import_equals_the_local_one() {
    let server = S3Server::start();
    let options = options(&server.endpoint());
    let local_path = fixtures().join("gpt2-tiny/model.safetensors");
    nnx::remote::upload(&local_path, "s3://models/gpt2/model.safetensors", &options).unwrap();

    let remote = Archive::open_remote("s3://models/gpt2/model.safetensors", &options).unwrap();
    let local = Archive::open(&local_path).unwrap();
    let header = header_bytes(&local_path);
    let stats = remote.transfer_stats().unwrap();
    assert_eq!((stats.requests, stats.bytes), (2, header), "the length, then the header");
    // Listing, entry information and the import plan come from the header alone.
    assert_eq!(remote.names().collect::<Vec<_>>(), local.names().collect::<Vec<_>>());
    let name = local.names().next().unwrap().to_string();
    let (ours, theirs) = (remote.info(&name).unwrap(), local.info(&name).unwrap());
    assert_eq!((ours.dtype, &ours.shape, ours.bytes), (theirs.dtype, &theirs.shape, theirs.bytes));
    assert_eq!(ours.location.unwrap().path, PathBuf::from("s3://models/gpt2/model.safetensors"));
    assert!(remote.import_plan(&gpt2(), "").unwrap().is_valid());
    assert_eq!(remote.transfer_stats().unwrap().bytes, header, "no data read yet");

    let (mut from_s3, mut from_disk) = (gpt2(), gpt2());
    let report = remote.import_into(&mut from_s3, "").unwrap();
    local.import_into(&mut from_disk, "").unwrap();
    let read = same_tensors(&from_s3, &from_disk, &report, "GPT-2 from S3");
    assert_eq!(remote.transfer_stats().unwrap().bytes, header + read, "each imported byte once, nothing else");
}

#[test]
fn a_sharded_folder_loads_and_each_tensor_parallel_rank_fetches_its_share() {
    let server = S3Server::start();
    let proxy = Proxy::start(server.port);
    let options = options(&proxy.endpoint());
    let dir = scratch();
    let folder = sharded_llama(dir.path());
    upload_folder(&folder, "s3://models/llama", &options);
    let shards: Vec<PathBuf> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|item| item.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "safetensors"))
        .collect();
    assert!(shards.len() >= 3, "the checkpoint is sharded");
    let headers: u64 = shards.iter().map(|shard| header_bytes(shard)).sum();
    let index = std::fs::metadata(folder.join("model.safetensors.index.json")).unwrap().len();
    let total: u64 = shards.iter().map(|shard| std::fs::metadata(shard).unwrap().len()).sum();

    // The folder resolves to its index; a whole strict load equals the local one.
    let config = LlamaConfig::from_file(folder.join("config.json")).unwrap();
    let remote = Archive::open_remote("s3://models/llama/", &options).unwrap();
    let local = Archive::open(&folder).unwrap();
    let (mut whole, mut expected) =
        (Llama::new(&config, DType::BF16, Init::Meta), Llama::new(&config, DType::BF16, Init::Meta));
    let report = remote.import_into(&mut whole, "").unwrap();
    local.import_into(&mut expected, "").unwrap();
    same_tensors(&whole, &expected, &report, "the sharded Llama");
    assert_eq!(remote.transfer_stats().unwrap().bytes, index + total, "the whole checkpoint once");

    for rank in 0..2 {
        let meta = || crate::import::llama_rank(&config, 2);
        let placement = crate::import::llama_placement(2, rank);
        let import = ImportOptions::default().with_placement(placement.clone());
        let sent_before = proxy.sent.load(Ordering::Relaxed);
        let remote = Archive::open_remote("s3://models/llama/", &options).unwrap();
        let (mut ours, mut theirs) = (meta(), meta());
        let report = remote.import_into_with(&mut ours, "", &import).unwrap();
        local.import_into_with(&mut theirs, "", &ImportOptions::default().with_placement(placement)).unwrap();
        let share = same_tensors(&ours, &theirs, &report, &format!("rank {rank}"));
        let stats = remote.transfer_stats().unwrap();
        assert_eq!(stats.bytes, index + headers + share, "rank {rank}: its share plus the headers and the index");
        assert!(share < total * 3 / 4, "rank {rank} reads about half: {share} of {total}");
        // What the server sent: those bytes plus the HTTP headers of each response.
        let sent = proxy.sent.load(Ordering::Relaxed) - sent_before;
        assert!(
            sent >= stats.bytes && sent <= stats.bytes + 2048 * stats.requests,
            "rank {rank}: {sent} bytes sent for {stats:?}"
        );
        println!("rank {rank}: {} bytes in {} requests ({share} of {total} data bytes)", stats.bytes, stats.requests);
    }
}

#[test]
fn a_local_cache_serves_ranges_fetched_before() {
    let server = S3Server::start();
    let dir = scratch();
    let cache = RangeCache::new(dir.path().join("cache"), 64 << 20);
    let options = options(&server.endpoint()).with_cache(cache.clone());
    let local_path = fixtures().join("gpt2-tiny/model.safetensors");
    nnx::remote::upload(&local_path, "s3://models/gpt2.safetensors", &options).unwrap();
    let header = header_bytes(&local_path);
    let first = Archive::open_remote("s3://models/gpt2.safetensors", &options).unwrap();
    first.import_into(&mut gpt2(), "").unwrap();
    let fetched = first.transfer_stats().unwrap().bytes - header;
    assert!(fetched > 0 && cache.size() >= fetched);
    let second = Archive::open_remote("s3://models/gpt2.safetensors", &options).unwrap();
    let mut model = gpt2();
    second.import_into(&mut model, "").unwrap();
    let stats = second.transfer_stats().unwrap();
    assert_eq!((stats.bytes, stats.cached_bytes), (header, fetched), "only the header travels again");
    // A bounded cache keeps no more than its limit.
    let small = RangeCache::new(dir.path().join("small"), 4096);
    let third =
        Archive::open_remote("s3://models/gpt2.safetensors", &options.clone().with_cache(small.clone())).unwrap();
    third.import_into(&mut gpt2(), "").unwrap();
    assert!(small.size() <= 4096);
}

#[test]
fn errors_name_the_url_and_a_server_that_stops_mid_read_fails_in_bounded_time() {
    let server = S3Server::start();
    let proxy = Proxy::start(server.port);
    let options = options(&proxy.endpoint());
    let local_path = fixtures().join("gpt2-tiny/model.safetensors");
    nnx::remote::upload(&local_path, "s3://models/gpt2.safetensors", &options).unwrap();

    let missing = Archive::open_remote("s3://models/absent.safetensors", &options).unwrap_err();
    assert!(matches!(missing, Error::Remote { problem: RemoteProblem::NotFound, .. }), "{missing:?}");
    let message = missing.to_string();
    assert!(message.contains("s3://models/absent.safetensors") && message.contains("404"), "{message}");
    assert!(!format!("{message} {missing:?}").contains(SECRET), "the secret is never printed");
    let folder = Archive::open_remote("s3://models/empty/", &options).unwrap_err();
    assert!(matches!(folder, Error::Remote { problem: RemoteProblem::NoWeights, .. }), "{folder}");
    let bad =
        Archive::open_remote("s3://models/x.safetensors", &options.clone().with("aws_no_such_key", "1")).unwrap_err();
    assert!(matches!(bad, Error::Remote { problem: RemoteProblem::UnknownSetting { .. }, .. }), "{bad}");

    // The server stops answering after the header: reading fails, it does not hang or panic.
    let archive = Archive::open_remote("s3://models/gpt2.safetensors", &options).unwrap();
    proxy.cut_after.store(proxy.sent.load(Ordering::Relaxed) + 1000, Ordering::Relaxed);
    let started = Instant::now();
    let error = archive.import_into(&mut gpt2(), "").unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(60), "bounded by the timeout and retries");
    assert!(matches!(error, Error::Remote { .. }), "{error:?}");
    assert!(error.to_string().contains("s3://models/gpt2.safetensors"), "{error}");
}

#[test]
fn the_command_line_inspects_converts_and_diffs_urls() {
    let server = S3Server::start();
    let options = options(&server.endpoint());
    let local_path = fixtures().join("gpt2-tiny/model.safetensors");
    nnx::remote::upload(&local_path, "s3://models/gpt2/model.safetensors", &options).unwrap();
    let dir = scratch();
    let nnx = |args: &[&str]| {
        let output = Command::new(nnx_binary())
            .args(args)
            .env("AWS_ENDPOINT_URL", server.endpoint())
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .env("AWS_REGION", "us-east-1")
            .output()
            .unwrap();
        let (out, err) = (
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        );
        assert!(!out.contains(SECRET) && !err.contains(SECRET));
        (output.status.code().unwrap_or(-1), out, err)
    };
    let url = "s3://models/gpt2/model.safetensors";
    let (code, out, err) = nnx(&["inspect", url]);
    assert_eq!(code, 0, "{err}");
    let first = Archive::open(&local_path).unwrap().names().next().unwrap().to_string();
    assert!(out.contains(&first), "{out}");
    let converted = dir.path().join("converted.safetensors");
    let (code, _, err) = nnx(&["convert", url, converted.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let (ours, theirs) = (Archive::open(&converted).unwrap(), Archive::open(&local_path).unwrap());
    for name in theirs.names() {
        assert_eq!(ours.try_get(name).unwrap().to_bytes().unwrap(), theirs.try_get(name).unwrap().to_bytes().unwrap());
    }
    let (code, out, err) = nnx(&["diff", url, local_path.to_str().unwrap()]);
    assert_eq!(code, 0, "identical archives: {out} {err}");
    let (code, _, err) = nnx(&["inspect", "s3://models/gpt2/absent.safetensors"]);
    assert_ne!(code, 0);
    assert!(err.contains("s3://models/gpt2/absent.safetensors") && err.contains("404"), "{err}");
}

#[test]
fn hub_repositories_are_read_with_range_requests_on_resolve_urls() {
    use crate::hub_server::{Access, FakeHub};
    let hub = FakeHub::start();
    hub.create_repo("org/private-gpt2", Access::Private { token: "hf_reader".into() });
    let local_path = fixtures().join("gpt2-tiny/model.safetensors");
    let bytes = std::fs::read(&local_path).unwrap();
    hub.commit("org/private-gpt2", "main", &[("model.safetensors", &bytes), ("config.json", b"{}")]);
    let options = RemoteOptions::default().with("hf_endpoint", hub.endpoint()).with("hf_token", "hf_reader");
    hub.clear_requests();
    let archive = Archive::open_remote("hf://org/private-gpt2", &options).unwrap();
    let header = header_bytes(&local_path);
    assert_eq!(archive.transfer_stats().unwrap().bytes, header, "the header only");
    let (mut ours, mut theirs) = (gpt2(), gpt2());
    let report = archive.import_into(&mut ours, "").unwrap();
    Archive::open(&local_path).unwrap().import_into(&mut theirs, "").unwrap();
    same_tensors(&ours, &theirs, &report, "GPT-2 from the Hub");
    // Every read of the weights was a bounded range request, none the whole file.
    let gets: Vec<_> =
        hub.requests().into_iter().filter(|r| r.method == "GET" && r.path.contains("model.safetensors")).collect();
    assert!(
        !gets.is_empty() && gets.iter().all(|r| r.range.as_deref().is_some_and(|range| range.contains('-'))),
        "{gets:?}"
    );
    // Without the token the repository is not found, and the URL is named.
    let error = Archive::open_remote(
        "hf://org/private-gpt2/model.safetensors",
        &RemoteOptions::default().with("hf_endpoint", hub.endpoint()),
    )
    .unwrap_err();
    assert!(error.to_string().contains("hf://org/private-gpt2"), "{error}");
    assert!(!error.to_string().contains("hf_reader"));
}

#[test]
fn the_command_line_reads_hub_paths_with_range_requests_and_no_cache() {
    use crate::hub_server::{Access, FakeHub};
    let hub = FakeHub::start();
    // Served by the API origin itself, so that the proxy in front of it sees every byte.
    hub.set_lfs_threshold(usize::MAX);
    hub.create_repo("org/x", Access::Public);
    let local_path = fixtures().join("gpt2-tiny/model.safetensors");
    let bytes = std::fs::read(&local_path).unwrap();
    let commit = hub.commit("org/x", "main", &[("model.safetensors", &bytes), ("config.json", b"{}")]);
    let proxy = Proxy::start(hub.api_port());
    let dir = scratch();
    let cache = dir.path().join("hub-cache");
    let output = Command::new(nnx_binary())
        .args(["inspect", "hf://org/x/model.safetensors"])
        .env("HF_ENDPOINT", proxy.endpoint())
        .env("HF_HUB_CACHE", &cache)
        .env("HF_HOME", dir.path().join("home"))
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .output()
        .unwrap();
    let (out, err) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{err}");
    let local = Archive::open(&local_path).unwrap();
    assert!(out.contains(&format!("{} entries", local.len())), "{out}");
    assert!(local.names().all(|name| out.contains(name)), "{out}");
    let sent = proxy.sent.load(Ordering::Relaxed);
    assert!(
        sent < bytes.len() as u64 / 4,
        "{sent} of {} bytes sent for a header of {}",
        bytes.len(),
        header_bytes(&local_path)
    );
    let gets: Vec<_> =
        hub.requests().into_iter().filter(|r| r.method == "GET" && r.path.contains("model.safetensors")).collect();
    // Ranges only, all at the commit `main` named when the archive was opened.
    let at_commit = format!("/org/x/resolve/{commit}/model.safetensors");
    assert!(!gets.is_empty() && gets.iter().all(|r| r.range.is_some() && r.path == at_commit), "{gets:?}");
    assert!(!cache.exists() || std::fs::read_dir(&cache).unwrap().next().is_none(), "nothing is written to the cache");
}

#[test]
fn a_download_replaces_the_file_whole_and_a_failed_one_leaves_it_untouched() {
    let server = S3Server::start();
    let options = options(&server.endpoint());
    let local_path = fixtures().join("gpt2-tiny/model.safetensors");
    nnx::remote::upload(&local_path, "s3://models/gpt2/model.safetensors", &options).unwrap();
    let dir = scratch();
    let to = dir.path().join("model.safetensors");
    std::fs::write(&to, b"the previous file").unwrap();

    let written = nnx::remote::download("s3://models/gpt2/model.safetensors", &to, &options).unwrap();
    let expected = std::fs::read(&local_path).unwrap();
    assert_eq!(written, expected.len() as u64);
    assert_eq!(std::fs::read(&to).unwrap(), expected, "the download is the uploaded file");

    // A missing object fails before anything replaces the file, and no temporary is left.
    let missing = nnx::remote::download("s3://models/gpt2/missing.safetensors", &to, &options);
    assert!(matches!(&missing, Err(Error::Remote { problem: RemoteProblem::NotFound, .. })), "{missing:?}");
    assert_eq!(std::fs::read(&to).unwrap(), expected, "the file is untouched");
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|item| item.unwrap().file_name()).collect();
    assert_eq!(names, ["model.safetensors"], "nothing but the file");
}

#[test]
fn a_gguf_file_in_a_store_is_read_with_range_requests() {
    use nnx::Tensor;
    use nnx::gguf::{Array, GgmlTensor, GgufWriter, Value};
    use nnx::quant::ggml::GgmlType;
    let dir = scratch();
    let path = dir.path().join("model.gguf");
    let mut writer = GgufWriter::new();
    // A vocabulary larger than the first read, so the header takes a second, larger one.
    let tokens: Vec<String> = (0..400_000).map(|i| format!("token-{i}")).collect();
    writer.metadata_mut().set("general.architecture", Value::String("llama".into()));
    writer.metadata_mut().set("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    let weight =
        Tensor::from_vec((0..2 * 256).map(|i| (i as f32 - 256.0) / 100.0).collect::<Vec<_>>(), &[2, 256]).unwrap();
    writer.add("blk.0.ffn_up.weight", GgmlTensor::quantize(&weight, GgmlType::Q4_K).unwrap()).unwrap();
    writer.add_tensor("blk.0.attn_norm.weight", &Tensor::from_vec(vec![1.5f32; 8], &[8]).unwrap()).unwrap();
    writer.write(&path).unwrap();

    let server = S3Server::start();
    let options = options(&server.endpoint());
    nnx::remote::upload(&path, "s3://models/llama/model.gguf", &options).unwrap();
    let remote = Archive::open_remote("s3://models/llama/model.gguf", &options).unwrap();
    let local = Archive::open(&path).unwrap();
    assert_eq!(remote.names().collect::<Vec<_>>(), local.names().collect::<Vec<_>>());
    assert_eq!(remote.gguf_metadata(), local.gguf_metadata());
    assert_eq!(remote.ggml_type("blk.0.ffn_up.weight"), Some(GgmlType::Q4_K));
    for name in local.names() {
        let info = local.info(name).unwrap();
        let (ours, theirs) =
            (remote.float(name, DType::F32, &info.shape).unwrap(), local.float(name, DType::F32, &info.shape).unwrap());
        assert_eq!(ours.to_bytes().unwrap(), theirs.to_bytes().unwrap(), "{name}");
        assert_eq!(remote.ggml(name).unwrap().bytes().unwrap(), local.ggml(name).unwrap().bytes().unwrap());
    }
    // A damaged file in the store is named by its URL.
    std::fs::write(&path, b"GGUF\x01\0\0\0").unwrap();
    nnx::remote::upload(&path, "s3://models/llama/old.gguf", &options).unwrap();
    match Archive::open_remote("s3://models/llama/old.gguf", &options) {
        Err(nnx::Error::Gguf { path, .. }) => assert_eq!(path, PathBuf::from("s3://models/llama/old.gguf")),
        other => panic!("expected a GGUF error, got {other:?}"),
    }
}
