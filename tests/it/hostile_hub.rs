//! `nnx download` against a hostile Hub on loopback and a tampered shared cache: every case
//! ends in bounded time, memory and disk, writes nothing outside the cache, and prints one
//! `error:` line with the server's text escaped and the endpoint's credentials left out.
//!
//! The server is the loopback server of the hostile tests with one answer per connection, each
//! answer a small script (bodies longer than announced, endless, trickled, lying ranges) that
//! stops when the client hangs up, when it has sent its bound, or when the test ends.

#![cfg(unix)]

use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha1::{Digest, Sha1};

use crate::loopback::{Request, Server};
use crate::util::{Bounded, run_nnx_bounded, scratch};

/// The address space each run of `nnx` gets.
const MEMORY: u64 = 3 << 30;
/// The wall clock each run gets.
const TIMEOUT: Duration = Duration::from_secs(60);
/// The commit every fake revision resolves to.
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
/// The most bytes one answer of the server sends.
const MAX_SENT: u64 = 256 << 20;

/// What an answer sees of the server: whether the test is over, and a count of body bytes sent.
struct Link<'a> {
    stream: &'a mut TcpStream,
    stopping: &'a AtomicBool,
    sent: &'a AtomicU64,
}

impl Link<'_> {
    fn head(&mut self, status: &str, headers: &[(&str, String)]) -> bool {
        let mut text = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
        for (name, value) in headers {
            text.push_str(&format!("{name}: {value}\r\n"));
        }
        text.push_str("\r\n");
        self.stream.write_all(text.as_bytes()).is_ok()
    }

    /// Sends `bytes`, counted; false once the client is gone or the test is over.
    fn body(&mut self, bytes: &[u8]) -> bool {
        if self.stopping.load(Ordering::SeqCst) || self.sent.load(Ordering::SeqCst) >= MAX_SENT {
            return false;
        }
        let ok = self.stream.write_all(bytes).is_ok();
        if ok {
            self.sent.fetch_add(bytes.len() as u64, Ordering::SeqCst);
        }
        ok
    }

    /// A whole answer with its `Content-Length`.
    fn answer(&mut self, status: &str, headers: &[(&str, String)], body: &[u8]) {
        let mut headers = headers.to_vec();
        headers.push(("Content-Length", body.len().to_string()));
        if self.head(status, &headers) {
            self.body(body);
        }
    }

    /// `length` bytes of `fill`, in chunks, until the client stops reading.
    fn stream_fill(&mut self, length: u64, fill: u8) {
        let chunk = vec![fill; 1 << 16];
        let mut left = length;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            if !self.body(&chunk[..n]) {
                return;
            }
            left -= n as u64;
        }
    }
}

/// A hostile Hub on `127.0.0.1`: each connection's one request is answered by the script.
struct Hostile {
    server: Server,
    stopping: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Hostile {
    fn start(script: impl Fn(&Request, &mut Link<'_>) + Send + Sync + 'static) -> Hostile {
        let stopping = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (stop, count, log) = (Arc::clone(&stopping), Arc::clone(&sent), Arc::clone(&requests));
        let server = Server::start(move |request, stream| {
            log.lock().unwrap().push(format!("{} {}", request.method, request.path));
            script(request, &mut Link { stream: &mut *stream, stopping: &stop, sent: &count });
            // One answer per connection: the client sees the end of what the script sent.
            let _ = stream.shutdown(Shutdown::Both);
            Ok(())
        });
        Hostile { server, stopping, sent, requests }
    }

    fn endpoint(&self) -> String {
        self.server.endpoint()
    }

    fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    /// `METHOD PATH` of every request so far.
    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        // Scripts still sending stop at their next write.
        self.stopping.store(true, Ordering::SeqCst);
    }
}

/// The git blob sha1 of `bytes`: the etag the Hub gives a regular file.
fn git_sha1(bytes: &[u8]) -> String {
    let mut hasher = Sha1::new();
    hasher.update(format!("blob {}\0", bytes.len()).as_bytes());
    hasher.update(bytes);
    hasher.finalize().iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A 1,000-byte `config.json`.
fn config() -> Vec<u8> {
    let mut bytes = b"{\"n\": \"".to_vec();
    bytes.extend((0..1000 - 9).map(|i| b'a' + (i % 26) as u8));
    bytes.extend_from_slice(b"\"}");
    assert_eq!(bytes.len(), 1000);
    bytes
}

/// The listing of `org/x` at [`COMMIT`], holding `config.json`.
fn listing() -> String {
    format!(r#"{{"sha":"{COMMIT}","siblings":[{{"rfilename":"config.json"}}]}}"#)
}

/// The honest answers for `org/x`: its listing, and `config.json` with `etag` on `HEAD` and
/// ranges honoured on `GET`. Returns false for a request it does not know.
fn honest(head: &Request, link: &mut Link<'_>, etag: &str, content: &[u8]) -> bool {
    if head.path == "/api/models/org/x/revision/main" {
        link.answer("200 OK", &[("Content-Type", "application/json".into())], listing().as_bytes());
    } else if head.path.ends_with("/resolve/main/config.json") || head.path.ends_with(&format!("/{COMMIT}/config.json"))
    {
        if head.method == "HEAD" {
            link.head(
                "200 OK",
                &[
                    ("X-Repo-Commit", COMMIT.into()),
                    ("ETag", format!("\"{etag}\"")),
                    ("Content-Length", content.len().to_string()),
                ],
            );
        } else {
            let from = head
                .header("range")
                .and_then(|range| range.strip_prefix("bytes="))
                .and_then(|range| range.trim_end_matches('-').parse::<usize>().ok());
            match from {
                Some(from) if from < content.len() => {
                    let range = format!("bytes {from}-{}/{}", content.len() - 1, content.len());
                    link.answer("206 Partial Content", &[("Content-Range", range)], &content[from..]);
                }
                _ => link.answer("200 OK", &[], content),
            }
        }
    } else {
        return false;
    }
    true
}

/// The environment of a run against `endpoint` with `cache`.
fn env(endpoint: &str, cache: &Path) -> Vec<(&'static str, std::ffi::OsString)> {
    vec![
        ("HF_ENDPOINT", endpoint.into()),
        ("HF_HUB_CACHE", cache.into()),
        ("HF_HOME", cache.join("home").into()),
        ("HF_TOKEN", "".into()),
        ("HF_HUB_OFFLINE", "0".into()),
        ("HF_HUB_DISABLE_PROGRESS_BARS", "1".into()),
        ("HF_HUB_DISABLE_TELEMETRY", "1".into()),
        ("NNX_HUB_MIN_RATE", "1024".into()),
        ("NNX_HUB_MIN_RATE_WINDOW", "30".into()),
    ]
}

/// `nnx download ARGS` under [`MEMORY`] and [`TIMEOUT`], its figures printed for the record.
fn download(case: &str, args: &[&str], env: &[(&'static str, std::ffi::OsString)], cache: &Path) -> Bounded {
    let envs: Vec<(&str, &std::ffi::OsStr)> = env.iter().map(|(name, value)| (*name, value.as_os_str())).collect();
    let mut all = vec!["download"];
    all.extend_from_slice(args);
    let start = Instant::now();
    let run = run_nnx_bounded(&all, &envs, MEMORY, TIMEOUT);
    eprintln!(
        "hostile_hub {case}: peak memory {} MiB, disk {} bytes, {:.1} s, exit {:?}, {}",
        run.peak_memory >> 20,
        disk_used(cache),
        start.elapsed().as_secs_f64(),
        run.code,
        run.stderr.lines().find(|line| line.starts_with("error:")).unwrap_or("no error")
    );
    run
}

/// The bytes of the files under `dir` (links not followed).
fn disk_used(dir: &Path) -> u64 {
    files_under(dir).iter().map(|path| std::fs::symlink_metadata(path).map_or(0, |m| m.len())).sum()
}

/// Every file and link under `dir`, links not followed.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => pending.push(entry.path()),
                Ok(_) => out.push(entry.path()),
                Err(_) => {}
            }
        }
    }
    out
}

fn blobs(cache: &Path) -> PathBuf {
    cache.join("models--org--x").join("blobs")
}

fn include_config() -> [&'static str; 3] {
    ["org/x", "--include", "config.json"]
}

#[test]
fn a_body_longer_than_announced_is_cut_at_the_announced_size() {
    let content = config();
    let etag = git_sha1(&content);
    let server = Hostile::start(move |head, link| {
        if head.method == "GET" && head.path.ends_with("config.json") {
            // 1,000 bytes announced by `HEAD`, 80 MiB sent without a length.
            if link.head("200 OK", &[]) {
                link.stream_fill(80 << 20, b'x');
            }
        } else if !honest(head, link, &etag, &content) {
            link.answer("404 Not Found", &[], b"");
        }
    });
    let cache = scratch();
    let run = download("oversized", &include_config(), &env(&server.endpoint(), cache.path()), cache.path());
    run.assert_refused("config.json");
    assert!(run.stderr.contains("more than the 1000 bytes"), "{}", run.stderr);
    assert!(server.sent() < 32 << 20, "nnx kept reading: {} bytes sent", server.sent());
    assert!(files_under(&blobs(cache.path())).is_empty(), "{:?}", files_under(&blobs(cache.path())));
    eprintln!("hostile_hub oversized: the server got {} bytes out", server.sent());
}

#[test]
fn a_file_without_a_size_is_refused_before_its_endless_body() {
    let server = Hostile::start(move |head, link| {
        if head.path == "/api/models/org/x/revision/main" {
            link.answer("200 OK", &[], listing().as_bytes());
        } else if head.method == "HEAD" {
            link.head("200 OK", &[("X-Repo-Commit", COMMIT.into()), ("ETag", "\"e\"".into())]);
        } else if link.head("200 OK", &[]) {
            link.stream_fill(MAX_SENT, b'x');
        }
    });
    let cache = scratch();
    let run = download("endless", &include_config(), &env(&server.endpoint(), cache.path()), cache.path());
    run.assert_refused("config.json");
    assert!(run.stderr.contains("size"), "{}", run.stderr);
    assert!(disk_used(cache.path()) < 1 << 20, "{} bytes on disk", disk_used(cache.path()));
    assert!(server.sent() < 1 << 20, "{} bytes sent", server.sent());
}

#[test]
fn a_trickling_download_is_stopped_by_the_minimum_rate() {
    let content = config();
    let etag = git_sha1(&content);
    let server = Hostile::start(move |head, link| {
        if head.method == "GET" && head.path.ends_with("config.json") {
            if link.head("200 OK", &[("Content-Length", "1000".into())]) {
                for byte in content.iter().take(900) {
                    if !link.body(&[*byte]) {
                        return;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        } else if !honest(head, link, &etag, &content) {
            link.answer("404 Not Found", &[], b"");
        }
    });
    let cache = scratch();
    let mut env = env(&server.endpoint(), cache.path());
    env.retain(|(name, _)| !name.starts_with("NNX_HUB_MIN_RATE"));
    env.push(("NNX_HUB_MIN_RATE", "100".into()));
    env.push(("NNX_HUB_MIN_RATE_WINDOW", "3".into()));
    let start = Instant::now();
    let run = download("trickle", &include_config(), &env, cache.path());
    run.assert_refused("config.json");
    assert!(run.stderr.contains("NNX_HUB_MIN_RATE"), "{}", run.stderr);
    assert!(start.elapsed() < Duration::from_secs(20), "stopped after {:?}", start.elapsed());
    let left = files_under(&blobs(cache.path()));
    assert!(left.is_empty(), "a stopped download is discarded: {left:?}");
}

#[test]
fn a_resume_answered_from_another_offset_starts_over() {
    let content = config();
    let etag = git_sha1(&content);
    let lying = content.clone();
    let server = Hostile::start(move |head, link| {
        if head.method == "GET" && head.path.ends_with("config.json") && head.header("range").is_some() {
            // Asked for the bytes from 500 on, the whole file is sent as a 206.
            link.answer("206 Partial Content", &[("Content-Range", "bytes 0-999/1000".into())], &lying);
        } else if !honest(head, link, &etag, &lying) {
            link.answer("404 Not Found", &[], b"");
        }
    });
    let cache = scratch();
    std::fs::create_dir_all(blobs(cache.path())).unwrap();
    let etag = git_sha1(&content);
    std::fs::write(blobs(cache.path()).join(format!("{etag}.incomplete")), &content[..500]).unwrap();
    let run = download("lying-range", &include_config(), &env(&server.endpoint(), cache.path()), cache.path());
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let folder = PathBuf::from(run.stdout.lines().last().unwrap());
    assert_eq!(std::fs::read(folder.join("config.json")).unwrap(), content);
    let ranged = server.requests().iter().filter(|r| r.starts_with("GET") && r.ends_with("config.json")).count();
    assert_eq!(ranged, 2, "one ranged request, then one from the start: {:?}", server.requests());
}

#[test]
fn a_foreign_prefix_of_a_regular_file_fails_its_git_hash() {
    let content = config();
    let etag = git_sha1(&content);
    let served = content.clone();
    let server = Hostile::start(move |head, link| {
        if !honest(head, link, &etag, &served) {
            link.answer("404 Not Found", &[], b"");
        }
    });
    let cache = scratch();
    std::fs::create_dir_all(blobs(cache.path())).unwrap();
    let etag = git_sha1(&content);
    let incomplete = blobs(cache.path()).join(format!("{etag}.incomplete"));
    std::fs::write(&incomplete, [b'X'; 500]).unwrap();
    let env = env(&server.endpoint(), cache.path());
    let run = download("foreign-prefix", &include_config(), &env, cache.path());
    run.assert_refused("config.json");
    assert!(run.stderr.contains("git blob sha1"), "{}", run.stderr);
    assert!(!incomplete.exists(), "the damaged download is discarded");
    assert!(!cache.path().join("models--org--x/snapshots").join(COMMIT).join("config.json").exists());
    // The next try starts clean and gets the file.
    let run = download("foreign-prefix-again", &include_config(), &env, cache.path());
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let folder = PathBuf::from(run.stdout.lines().last().unwrap());
    assert_eq!(std::fs::read(folder.join("config.json")).unwrap(), content);
}

#[test]
fn a_huge_revision_listing_stays_small_in_memory() {
    // About 40 MB: 1,300,000 siblings, past the cap of a million.
    let mut body = format!(r#"{{"sha":"{COMMIT}","siblings":["#).into_bytes();
    for i in 0..1_300_000 {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(format!(r#"{{"rfilename":"w/{i:09}.bin"}}"#).as_bytes());
    }
    body.extend_from_slice(b"]}");
    eprintln!("hostile_hub huge-listing: {} bytes of listing", body.len());
    let body = Arc::new(body);
    let server = Hostile::start(move |_, link| link.answer("200 OK", &[], &body));
    let cache = scratch();
    let run = download("huge-listing", &include_config(), &env(&server.endpoint(), cache.path()), cache.path());
    run.assert_refused("org/x");
    assert!(run.stderr.contains("more than 1000000 files"), "{}", run.stderr);
    assert!(run.peak_memory < 1 << 30, "peak memory {} MiB", run.peak_memory >> 20);
}

#[test]
fn an_announced_petabyte_json_answer_is_refused_unread() {
    let server = Hostile::start(move |_, link| {
        if link.head("200 OK", &[("Content-Length", (1u64 << 50).to_string())]) {
            link.stream_fill(80 << 20, b' ');
        }
    });
    let cache = scratch();
    let run = download("petabyte-json", &include_config(), &env(&server.endpoint(), cache.path()), cache.path());
    run.assert_refused("org/x");
    assert!(run.stderr.contains("longer than the 64 MiB"), "{}", run.stderr);
    assert_eq!(server.requests().len(), 1, "an answer too long is not asked again: {:?}", server.requests());
    assert!(server.sent() < 32 << 20, "{} bytes sent", server.sent());
}

/// A server that serves `org/x` honestly.
fn honest_server() -> (Hostile, Vec<u8>, String) {
    let content = config();
    let etag = git_sha1(&content);
    let (served, tag) = (content.clone(), etag.clone());
    let server = Hostile::start(move |head, link| {
        if !honest(head, link, &tag, &served) {
            link.answer("404 Not Found", &[], b"");
        }
    });
    (server, content, etag)
}

#[test]
fn a_planted_incomplete_link_never_touches_its_target() {
    let (server, _, etag) = honest_server();
    let cache = scratch();
    let outside = scratch();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    std::fs::create_dir_all(blobs(cache.path())).unwrap();
    std::os::unix::fs::symlink(&victim, blobs(cache.path()).join(format!("{etag}.incomplete"))).unwrap();
    let run = download("incomplete-link", &include_config(), &env(&server.endpoint(), cache.path()), cache.path());
    run.assert_refused(&format!("{etag}.incomplete"));
    assert!(run.stderr.contains("symbolic link"), "{}", run.stderr);
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "the victim is untouched");
    assert!(std::fs::symlink_metadata(&victim).unwrap().is_file());
}

#[test]
fn linked_refs_and_locks_folders_are_refused() {
    let (server, _, _) = honest_server();
    for (case, planted) in [("refs-link", "models--org--x/refs"), ("locks-link", ".locks")] {
        let cache = scratch();
        let outside = scratch();
        let link = cache.path().join(planted);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(outside.path(), &link).unwrap();
        let run = download(case, &include_config(), &env(&server.endpoint(), cache.path()), cache.path());
        run.assert_refused(planted);
        assert!(run.stderr.contains("symbolic link") && run.stderr.contains("delete it"), "{}", run.stderr);
        let written = files_under(outside.path());
        assert!(written.is_empty(), "{case}: written outside the cache: {written:?}");
    }
}

#[test]
fn links_to_dot_in_a_snapshot_do_not_hang_an_offline_listing() {
    let cache = scratch();
    let repo = cache.path().join("models--org--x");
    let snapshot = repo.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), COMMIT).unwrap();
    std::fs::write(snapshot.join("config.json"), b"{}").unwrap();
    std::os::unix::fs::symlink(".", snapshot.join("a")).unwrap();
    std::os::unix::fs::symlink(".", snapshot.join("b")).unwrap();
    let mut env = env("http://127.0.0.1:9", cache.path());
    env.retain(|(name, _)| *name != "HF_HUB_OFFLINE");
    env.push(("HF_HUB_OFFLINE", "1".into()));
    let run = download("dot-links", &["org/x", "--include", "*.json"], &env, cache.path());
    assert!(!run.timed_out, "the offline listing hangs");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout.lines().last(), snapshot.to_str());
}

#[test]
fn a_windows_drive_etag_is_refused() {
    let content = config();
    let server = Hostile::start(move |head, link| {
        if !honest(head, link, "C:evil.dll", &content) {
            link.answer("404 Not Found", &[], b"");
        }
    });
    let cache = scratch();
    let run = download("drive-etag", &include_config(), &env(&server.endpoint(), cache.path()), cache.path());
    run.assert_refused("config.json");
    assert!(run.stderr.contains("ETag"), "{}", run.stderr);
    let evil: Vec<_> = files_under(cache.path()).into_iter().filter(|p| p.to_string_lossy().contains("evil")).collect();
    assert!(evil.is_empty(), "{evil:?}");
}

#[test]
fn control_sequences_from_the_server_are_escaped() {
    let server = Hostile::start(move |_, link| {
        link.answer("400 Bad Request", &[], br#"{"error":"\u001b[2J\u001b[1;1Hall good\nerror: forged"}"#);
    });
    let cache = scratch();
    let run = download("control-sequences", &include_config(), &env(&server.endpoint(), cache.path()), cache.path());
    run.assert_refused("org/x");
    assert!(!run.stderr.contains('\u{1b}'), "raw escape in {:?}", run.stderr);
    assert!(run.stderr.contains("\\u{1b}[2J"), "{}", run.stderr);
}

#[test]
fn credentials_in_the_endpoint_never_reach_stderr() {
    let server = Hostile::start(move |_, link| {
        link.answer("404 Not Found", &[("X-Error-Code", "RepoNotFound".into())], br#"{"error":"no"}"#);
    });
    let cache = scratch();
    let endpoint = format!("http://user:hunter2secret@127.0.0.1:{}", server.server.port());
    let run = download("userinfo", &include_config(), &env(&endpoint, cache.path()), cache.path());
    run.assert_refused("org/x");
    assert!(!run.stderr.contains("hunter2secret"), "{}", run.stderr);

    // Nothing listens on a port just freed: refused, not timed out, and still no password.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("http://user:hunter2secret@127.0.0.1:{closed}");
    let run = download("refused", &include_config(), &env(&endpoint, cache.path()), cache.path());
    run.assert_refused("org/x");
    assert!(run.stderr.contains("refused") && !run.stderr.contains("timed out"), "{}", run.stderr);
    assert!(!run.stderr.contains("hunter2secret"), "{}", run.stderr);
}
