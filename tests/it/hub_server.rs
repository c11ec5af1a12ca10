//! A fake Hugging Face Hub on loopback for the integration tests. The API origin answers repo
//! info, tree listings, `resolve` downloads, repo creation and commits (preupload, git-lfs batch,
//! NDJSON commit); a second origin plays the CDN that LFS downloads are redirected to and that LFS
//! uploads are `PUT` on. HTTP/1.1 is written by hand on `std::net` so that nothing can reach the
//! internet and faults (a dropped connection, flipped bytes, an error status) are byte-exact.
//!
//! The protocol follows what `huggingface_hub` 2.4 expects, and `hub_python.rs` checks it
//! with that client.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use sha1::Sha1;
use sha2::{Digest, Sha256};

use crate::http_support::{ReadError, Request, percent_decode, read_request};

/// The one token allowed to write (create repos, upload, commit): it stands for the owner of
/// every repository.
pub const WRITE_TOKEN: &str = "hf_test_write";

/// Files at least this big are LFS unless [`FakeHub::set_lfs_threshold`] says otherwise.
const DEFAULT_LFS_THRESHOLD: usize = 1024;
// Bounds on what a client can make the server do, so that every loop ends (those on reading a
// request are `http_support`'s).
const MAX_REQUESTS_PER_CONNECTION: usize = 10_000;
const MAX_CONNECTIONS: usize = 100_000;
/// An idle keep-alive connection is closed after this long.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Every commit is dated from here on, one minute apart, so that answers are reproducible.
const EPOCH_MONTH: &str = "2024-01";

/// Who may read a repository.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    /// Anyone.
    Public,
    /// Only requests with `Authorization: Bearer <token>`; others get the Hub's 401
    /// `RepoNotFound`, which does not tell that the repository exists.
    Private {
        /// The token that reads it.
        token: String,
    },
    /// Metadata is public (as on the Hub); file contents need the token: 401 `GatedRepo` without
    /// one, 403 `GatedRepo` with another.
    Gated {
        /// The token of a user whose access request was accepted.
        token: String,
    },
}

/// A failure injected once into the next `GET` of a file's content (a regular file on `resolve`,
/// or an LFS object on the CDN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Send the headers with the full `Content-Length`, then this many bytes, then close.
    DropAfter(usize),
    /// Send the announced length with bytes flipped.
    Corrupt,
    /// Answer this status (with a JSON error body) instead.
    Status(u16),
}

/// One request as the server received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    /// `GET`, `HEAD`, `POST`, `PUT`, ...
    pub method: String,
    /// The request target as sent: path and query, still percent-encoded.
    pub path: String,
    /// The `Range` header.
    pub range: Option<String>,
    /// The `Authorization` header.
    pub authorization: Option<String>,
    /// The port of the listener that took it: [`FakeHub::api_port`] or [`FakeHub::cdn_port`].
    pub host_port: u16,
}

/// A fake Hub: an API origin and a CDN origin on two loopback ports, sharing one state. Dropping
/// it stops both listeners and closes every connection.
pub struct FakeHub {
    shared: Arc<Shared>,
    acceptors: Vec<JoinHandle<()>>,
}

impl FakeHub {
    /// Starts both listeners on `127.0.0.1`, each on a port the system picks.
    ///
    /// # Panics
    ///
    /// When a loopback port cannot be bound or a thread cannot be started.
    pub fn start() -> FakeHub {
        let api = TcpListener::bind("127.0.0.1:0").expect("a loopback port for the API origin");
        let cdn = TcpListener::bind("127.0.0.1:0").expect("a loopback port for the CDN origin");
        let api_port = api.local_addr().expect("the API listener has an address").port();
        let cdn_port = cdn.local_addr().expect("the CDN listener has an address").port();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(api_port, cdn_port)),
            stopping: AtomicBool::new(false),
            connections: Mutex::new(Vec::new()),
        });
        let acceptors = [(api, Origin::Api), (cdn, Origin::Cdn)]
            .into_iter()
            .map(|(listener, origin)| {
                let shared = Arc::clone(&shared);
                thread::Builder::new()
                    .name(format!("fake-hub-{origin:?}"))
                    .spawn(move || accept_loop(&shared, &listener, origin))
                    .expect("the fake hub's accept thread starts")
            })
            .collect();
        FakeHub { shared, acceptors }
    }

    /// `http://127.0.0.1:PORT`, the API origin: what `HF_ENDPOINT` is set to.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.api_port())
    }

    /// The port of the API origin.
    pub fn api_port(&self) -> u16 {
        self.state().api_port
    }

    /// The port of the CDN origin that LFS downloads are redirected to.
    pub fn cdn_port(&self) -> u16 {
        self.state().cdn_port
    }

    /// Creates an empty model repository `org/name` (no commit, no branch yet).
    ///
    /// # Panics
    ///
    /// When `repo` already exists or is not `org/name`.
    pub fn create_repo(&self, repo: &str, access: Access) {
        assert!(valid_repo_id(repo), "`{repo}` is not a repository id `org/name`");
        let mut state = self.state();
        assert!(!state.repos.contains_key(repo), "repository `{repo}` already exists");
        state.renamed.remove(repo);
        state.repos.insert(repo.to_owned(), Repo::new(access));
    }

    /// Commits `files` (added or replaced) on `branch` of `repo`, whose parent is the branch's
    /// head; a missing branch is created as an orphan holding only `files`. Files at least the
    /// LFS threshold big, and every `*.safetensors` and `*.bin`, are stored as LFS. Returns the
    /// commit's sha.
    ///
    /// # Panics
    ///
    /// When `repo` does not exist.
    pub fn commit(&self, repo: &str, branch: &str, files: &[(&str, &[u8])]) -> String {
        let mut state = self.state();
        let State { repos, objects, lfs_threshold, .. } = &mut *state;
        let entry = repos.get_mut(repo).unwrap_or_else(|| panic!("no repository `{repo}`: create it first"));
        let mut tree = entry.branch_head(branch).map(|commit| commit.tree.clone()).unwrap_or_default();
        for (path, bytes) in files {
            let blob = Blob::new(Arc::new(bytes.to_vec()), is_lfs(path, bytes.len(), *lfs_threshold));
            if blob.lfs {
                objects.insert(blob.sha256.clone(), Arc::clone(&blob.data));
                entry.lfs_objects.insert(blob.sha256.clone());
            }
            tree.insert((*path).to_owned(), blob);
        }
        let names: Vec<&str> = files.iter().map(|(path, _)| *path).collect();
        entry.push_commit(repo, branch, format!("Upload {}", names.join(", ")), tree)
    }

    /// Points tag `tag` of `repo` at `commit` (a sha, or a branch or tag to take the commit of).
    ///
    /// # Panics
    ///
    /// When the repository or the commit does not exist.
    pub fn tag(&self, repo: &str, tag: &str, commit: &str) {
        let mut state = self.state();
        let entry = state.repos.get_mut(repo).unwrap_or_else(|| panic!("no repository `{repo}`"));
        let sha = entry.resolve(commit).unwrap_or_else(|| panic!("no commit `{commit}` in `{repo}`")).sha.clone();
        entry.tags.insert(tag.to_owned(), sha);
    }

    /// Renames `old` to `new`: requests naming `old` get a relative 307 to the same path under
    /// `new`, as the Hub answers for a moved repository.
    ///
    /// # Panics
    ///
    /// When `old` does not exist or `new` does.
    pub fn rename(&self, old: &str, new: &str) {
        assert!(valid_repo_id(new), "`{new}` is not a repository id `org/name`");
        let mut state = self.state();
        assert!(!state.repos.contains_key(new), "repository `{new}` already exists");
        let repo = state.repos.remove(old).unwrap_or_else(|| panic!("no repository `{old}`"));
        state.repos.insert(new.to_owned(), repo);
        for target in state.renamed.values_mut() {
            if *target == old {
                new.clone_into(target);
            }
        }
        state.renamed.insert(old.to_owned(), new.to_owned());
    }

    /// Injects `fault` into the next `GET` of the content of a file at `path_in_repo` (in any
    /// repository): on `resolve` for a regular file, on the CDN for an LFS one.
    pub fn fail_next(&self, path_in_repo: &str, fault: Fault) {
        self.state().faults.push((path_in_repo.to_owned(), fault));
    }

    /// Files at least `bytes` big are stored as LFS by later commits and announced as LFS by
    /// `preupload`; `*.safetensors` and `*.bin` always are.
    pub fn set_lfs_threshold(&self, bytes: usize) {
        self.state().lfs_threshold = bytes;
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<Logged> {
        self.state().log.clone()
    }

    /// Forgets the requests received so far.
    pub fn clear_requests(&self) {
        self.state().log.clear();
    }

    /// The files of `repo` at `revision` (a branch, a tag or a commit sha), with their bytes.
    ///
    /// # Panics
    ///
    /// When the repository or the revision does not exist.
    pub fn files(&self, repo: &str, revision: &str) -> BTreeMap<String, Vec<u8>> {
        let state = self.state();
        let entry = state.repos.get(repo).unwrap_or_else(|| panic!("no repository `{repo}`"));
        let commit = entry.resolve(revision).unwrap_or_else(|| panic!("no revision `{revision}` in `{repo}`"));
        commit.tree.iter().map(|(path, blob)| (path.clone(), blob.data.to_vec())).collect()
    }

    /// The commit `branch` of `repo` points at; `None` for a missing repository or branch.
    pub fn head(&self, repo: &str, branch: &str) -> Option<String> {
        self.state().repos.get(repo)?.branches.get(branch).cloned()
    }

    /// Every commit of `repo`, oldest first, as `(sha, summary)`; empty for a missing one.
    pub fn commits(&self, repo: &str) -> Vec<(String, String)> {
        let state = self.state();
        let Some(entry) = state.repos.get(repo) else { return Vec::new() };
        entry.commits.iter().map(|commit| (commit.sha.clone(), commit.summary.clone())).collect()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.shared.state)
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let ports = {
            let state = self.state();
            [state.api_port, state.cdn_port]
        };
        // A blocked `accept` only returns for a connection: make one so it sees the flag.
        for port in ports {
            let _ = TcpStream::connect(("127.0.0.1", port));
        }
        for acceptor in self.acceptors.drain(..) {
            let _ = acceptor.join();
        }
        // No acceptor is left to register a connection: close them all, which ends their reads.
        let connections = std::mem::take(&mut *lock(&self.shared.connections));
        for (stream, _) in &connections {
            let _ = stream.shutdown(Shutdown::Both);
        }
        for (_, worker) in connections {
            let _ = worker.join();
        }
    }
}

/// Which listener a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    Api,
    Cdn,
}

/// What the listeners and the connection threads share.
struct Shared {
    state: Mutex<State>,
    stopping: AtomicBool,
    /// Each open connection (a handle to close it by) and its thread.
    connections: Mutex<Vec<(TcpStream, JoinHandle<()>)>>,
}

/// A lock that survives a panicking holder: the state stays usable for the test's assertions.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener, origin: Origin) {
    for _ in 0..MAX_CONNECTIONS {
        let Ok((stream, _)) = listener.accept() else { continue };
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let Ok(handle) = stream.try_clone() else { continue };
        let worker_shared = Arc::clone(shared);
        let Ok(worker) = thread::Builder::new()
            .name(format!("fake-hub-{origin:?}-connection"))
            .spawn(move || serve_connection(&worker_shared, stream, origin))
        else {
            continue;
        };
        let mut connections = lock(&shared.connections);
        connections.retain(|(_, worker)| !worker.is_finished());
        connections.push((handle, worker));
    }
}

/// Serves requests on one connection until the client or an error closes it.
fn serve_connection(shared: &Shared, stream: TcpStream, origin: Origin) {
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_nodelay(true);
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    for _ in 0..MAX_REQUESTS_PER_CONNECTION {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let request = match read_request(&mut reader, &mut writer) {
            Ok(Some(request)) => request,
            Ok(None) | Err(ReadError::Closed) => break,
            Err(ReadError::Malformed(why)) => {
                let _ = write_response(&mut writer, "GET", Response::error(400, None, why), false);
                break;
            }
        };
        let keep_alive = request.keep_alive();
        let response = lock(&shared.state).handle(&request, origin);
        match write_response(&mut writer, &request.method, response, keep_alive) {
            Ok(true) => {}
            Ok(false) | Err(_) => break,
        }
    }
    let _ = writer.shutdown(Shutdown::Both);
}

// ---------------------------------------------------------------------------------------------
// HTTP/1.1 responses (requests are read by `http_support`)

/// A response body: owned, or a range of a stored file shared with the state.
enum Body {
    Owned(Vec<u8>),
    Shared(Arc<Vec<u8>>, Range<usize>),
}

impl Body {
    fn bytes(&self) -> &[u8] {
        match self {
            Body::Owned(bytes) => bytes,
            Body::Shared(data, range) => &data[range.clone()],
        }
    }
}

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Body,
    /// Close the connection after this many body bytes ([`Fault::DropAfter`]).
    drop_after: Option<usize>,
}

impl Response {
    fn new(status: u16) -> Response {
        Response { status, headers: Vec::new(), body: Body::Owned(Vec::new()), drop_after: None }
    }

    fn json(status: u16, value: &Value) -> Response {
        Response::new(status)
            .header("Content-Type", "application/json; charset=utf-8")
            .body(serde_json::to_vec(value).expect("a JSON value serializes"))
    }

    /// An error as the Hub words it: `X-Error-Code` (which `huggingface_hub` maps to its error
    /// classes), `X-Error-Message` and a JSON `{"error": ...}` body.
    fn error(status: u16, code: Option<&str>, message: impl Into<String>) -> Response {
        let message = message.into();
        let mut response = Response::json(status, &json!({ "error": message }));
        if let Some(code) = code {
            response = response.header("X-Error-Code", code);
        }
        response.header("X-Error-Message", &message)
    }

    fn header(mut self, name: &str, value: &str) -> Response {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    fn body(mut self, bytes: Vec<u8>) -> Response {
        self.body = Body::Owned(bytes);
        self
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        307 => "Temporary Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        412 => "Precondition Failed",
        416 => "Range Not Satisfiable",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

/// Writes `response`; `Ok(true)` when the connection may serve another request.
fn write_response(writer: &mut TcpStream, method: &str, response: Response, keep_alive: bool) -> io::Result<bool> {
    let body = response.body.bytes();
    let mut head = format!("HTTP/1.1 {} {}\r\n", response.status, reason(response.status));
    for (name, value) in &response.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    let keep_alive = keep_alive && response.drop_after.is_none();
    head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    head.push_str(if keep_alive { "Connection: keep-alive\r\n" } else { "Connection: close\r\n" });
    head.push_str("Server: nnx-fake-hub\r\n\r\n");
    writer.write_all(head.as_bytes())?;
    if method != "HEAD" {
        match response.drop_after {
            Some(sent) => {
                writer.write_all(&body[..sent.min(body.len())])?;
                writer.flush()?;
                writer.shutdown(Shutdown::Both)?;
                return Ok(false);
            }
            None => writer.write_all(body)?,
        }
    }
    writer.flush()?;
    Ok(keep_alive)
}

// ---------------------------------------------------------------------------------------------
// Repositories

/// A file's content, with the digests the Hub announces for it.
#[derive(Clone)]
struct Blob {
    data: Arc<Vec<u8>>,
    lfs: bool,
    /// The git blob sha1: of the content for a regular file, of the pointer file for LFS.
    git_oid: String,
    sha256: String,
}

impl Blob {
    fn new(data: Arc<Vec<u8>>, lfs: bool) -> Blob {
        let sha256 = sha256_hex(&data);
        let git_oid = if lfs { git_blob_oid(lfs_pointer(&sha256, data.len()).as_bytes()) } else { git_blob_oid(&data) };
        Blob { data, lfs, git_oid, sha256 }
    }

    /// What the Hub sends as `ETag` (or `X-Linked-Etag`), which names the blob in the cache.
    fn etag(&self) -> &str {
        if self.lfs { &self.sha256 } else { &self.git_oid }
    }

    /// The oid `preupload` reports for an existing file: what the client computes to skip it.
    fn upload_oid(&self) -> &str {
        self.etag()
    }

    fn tree_entry(&self, path: &str) -> Value {
        let mut entry = json!({ "type": "file", "oid": self.git_oid, "size": self.data.len(), "path": path });
        if self.lfs {
            entry["lfs"] = json!({
                "oid": self.sha256,
                "size": self.data.len(),
                "pointerSize": lfs_pointer(&self.sha256, self.data.len()).len(),
            });
        }
        entry
    }
}

struct Commit {
    sha: String,
    summary: String,
    /// Its position in the repository's history, which dates it.
    sequence: usize,
    tree: BTreeMap<String, Blob>,
}

struct Repo {
    access: Access,
    /// Oldest first.
    commits: Vec<Commit>,
    branches: BTreeMap<String, String>,
    tags: BTreeMap<String, String>,
    /// The LFS objects uploaded to or committed in this repository, by sha256.
    lfs_objects: BTreeSet<String>,
}

impl Repo {
    fn new(access: Access) -> Repo {
        Repo {
            access,
            commits: Vec::new(),
            branches: BTreeMap::new(),
            tags: BTreeMap::new(),
            lfs_objects: BTreeSet::new(),
        }
    }

    fn commit(&self, sha: &str) -> Option<&Commit> {
        self.commits.iter().find(|commit| commit.sha == sha)
    }

    fn branch_head(&self, branch: &str) -> Option<&Commit> {
        self.commit(self.branches.get(branch)?)
    }

    /// A branch, a tag (also as `refs/heads/...`, `refs/tags/...`) or a full commit sha.
    fn resolve(&self, revision: &str) -> Option<&Commit> {
        let sha = if let Some(branch) = revision.strip_prefix("refs/heads/") {
            self.branches.get(branch)?
        } else if let Some(tag) = revision.strip_prefix("refs/tags/") {
            self.tags.get(tag)?
        } else if let Some(sha) = self.branches.get(revision).or_else(|| self.tags.get(revision)) {
            sha
        } else {
            revision
        };
        self.commit(sha)
    }

    fn push_commit(&mut self, id: &str, branch: &str, summary: String, tree: BTreeMap<String, Blob>) -> String {
        let parent = self.branches.get(branch).cloned().unwrap_or_default();
        let sequence = self.commits.len();
        let mut hasher = Sha1::new();
        hasher.update(format!("commit\0{id}\0{sequence}\0{parent}\0{summary}\0").as_bytes());
        for (path, blob) in &tree {
            hasher.update(format!("{path}\0{}\n", blob.git_oid).as_bytes());
        }
        let sha = hex(&hasher.finalize());
        self.commits.push(Commit { sha: sha.clone(), summary, sequence, tree });
        self.branches.insert(branch.to_owned(), sha.clone());
        sha
    }
}

/// Which check a route makes on the caller.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// Repo info and tree listings: private repositories need their token, gated ones do not.
    Metadata,
    /// File contents: private and gated repositories need their token.
    Content,
    /// Uploads and commits: [`WRITE_TOKEN`].
    Write,
}

/// Where the repository id sits in a route, to rewrite it in a redirect.
#[derive(Clone, Copy)]
struct RepoAt {
    /// The index of the `org` segment in the decoded path segments.
    segment: usize,
    /// Whether the name segment carries git's `.git` suffix.
    git: bool,
}

struct State {
    api_port: u16,
    cdn_port: u16,
    repos: BTreeMap<String, Repo>,
    /// Old id to new id.
    renamed: BTreeMap<String, String>,
    /// LFS contents by sha256, shared by all repositories (as the CDN is).
    objects: HashMap<String, Arc<Vec<u8>>>,
    faults: Vec<(String, Fault)>,
    log: Vec<Logged>,
    lfs_threshold: usize,
}

impl State {
    fn new(api_port: u16, cdn_port: u16) -> State {
        State {
            api_port,
            cdn_port,
            repos: BTreeMap::new(),
            renamed: BTreeMap::new(),
            objects: HashMap::new(),
            faults: Vec::new(),
            log: Vec::new(),
            lfs_threshold: DEFAULT_LFS_THRESHOLD,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.api_port)
    }

    fn handle(&mut self, request: &Request, origin: Origin) -> Response {
        self.log.push(Logged {
            method: request.method.clone(),
            path: request.path.clone(),
            range: request.header("range").map(str::to_owned),
            authorization: request.header("authorization").map(str::to_owned),
            host_port: match origin {
                Origin::Api => self.api_port,
                Origin::Cdn => self.cdn_port,
            },
        });
        let decoded = request.path_only().strip_prefix('/').unwrap_or("").split('/').map(percent_decode);
        let Some(segments) = decoded.collect::<Option<Vec<String>>>() else {
            return Response::error(400, None, "malformed percent-encoding in the path");
        };
        let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
        match origin {
            Origin::Api => self.api(request, &segments),
            Origin::Cdn => self.cdn(request, &segments),
        }
    }

    fn api(&mut self, request: &Request, segments: &[&str]) -> Response {
        let method = request.method.as_str();
        let at = RepoAt { segment: 2, git: false };
        match (method, segments) {
            ("GET" | "HEAD", ["api", "models", org, name]) => self.repo_info(request, &format!("{org}/{name}"), "main"),
            ("GET" | "HEAD", ["api", "models", org, name, "revision", revision @ ..]) if !revision.is_empty() => {
                self.repo_info(request, &format!("{org}/{name}"), &revision.join("/"))
            }
            ("GET", ["api", "models", org, name, "tree", revision, path @ ..]) => {
                self.tree(request, &format!("{org}/{name}"), revision, &path.join("/"))
            }
            ("POST", ["api", "models", org, name, "preupload", revision @ ..]) if !revision.is_empty() => {
                let id = format!("{org}/{name}");
                self.open(request, &id, at, Gate::Write)
                    .and_then(|()| self.preupload(request, &id, &revision.join("/")))
            }
            ("POST", ["api", "models", org, name, "commit", revision @ ..]) if !revision.is_empty() => {
                let id = format!("{org}/{name}");
                self.open(request, &id, at, Gate::Write)
                    .and_then(|()| self.commit_endpoint(request, &id, &revision.join("/")))
            }
            ("POST", ["api", "repos", "create"]) => self.create_repo(request),
            ("POST", [org, git, "info", "lfs", "objects", action @ ("batch" | "verify")])
                if let Some(name) = git.strip_suffix(".git") =>
            {
                let id = format!("{org}/{name}");
                let at = RepoAt { segment: 0, git: true };
                if *action == "batch" { self.lfs_batch(request, &id, at) } else { self.lfs_verify(request, &id, at) }
            }
            ("GET" | "HEAD", [org, name, "resolve", revision, path @ ..]) if !path.is_empty() => {
                let id = format!("{org}/{name}");
                let at = RepoAt { segment: 0, git: false };
                self.open(request, &id, at, Gate::Content)
                    .and_then(|()| self.resolve(request, &id, revision, &path.join("/")))
            }
            _ => Err(Response::error(404, None, "Not Found")),
        }
        .unwrap_or_else(|response| response)
    }

    fn cdn(&mut self, request: &Request, segments: &[&str]) -> Response {
        let signature = request.param("X-Amz-Signature").unwrap_or_default();
        match (request.method.as_str(), segments) {
            ("GET" | "HEAD", ["lfs", oid]) => {
                if signature != sign("download", oid, "") {
                    return Response::error(403, None, "AccessDenied: the signature does not match");
                }
                let Some(data) = self.objects.get(*oid).cloned() else {
                    return Response::error(404, None, "NoSuchKey");
                };
                let paths: BTreeSet<String> = self
                    .repos
                    .values()
                    .flat_map(|repo| &repo.commits)
                    .flat_map(|commit| &commit.tree)
                    .filter(|(_, blob)| blob.lfs && blob.sha256 == *oid)
                    .map(|(path, _)| path.clone())
                    .collect();
                self.serve_content(request, data, oid, |path| paths.contains(path))
            }
            ("PUT", ["lfs", oid]) => {
                let repo = request.param("repo").unwrap_or_default();
                if signature != sign("upload", oid, &repo) {
                    return Response::error(403, None, "AccessDenied: the signature does not match");
                }
                let actual = sha256_hex(&request.body);
                if actual != *oid {
                    return Response::error(400, None, format!("the body's sha256 is {actual}, not the oid {oid}"));
                }
                self.objects.insert(actual.clone(), Arc::new(request.body.clone()));
                if let Some(repo) = self.repos.get_mut(&repo) {
                    repo.lfs_objects.insert(actual);
                }
                Response::new(200).header("ETag", &format!("\"{oid}\""))
            }
            _ => Response::error(404, None, "NoSuchKey"),
        }
    }

    /// Checks that repository `id` exists (else a 307 when it was renamed, or a 404) and that the
    /// caller passes `gate`.
    fn open(&self, request: &Request, id: &str, at: RepoAt, gate: Gate) -> Result<(), Response> {
        if gate == Gate::Write {
            self.check_write(request)?;
        }
        let Some(repo) = self.repos.get(id) else {
            return Err(match self.renamed.get(id) {
                Some(new) => moved(request, at, new),
                None => Response::error(404, Some("RepoNotFound"), format!("Repository {id} not found")),
            });
        };
        let token = request.bearer();
        match (&repo.access, gate) {
            (_, Gate::Write) | (Access::Public, _) | (Access::Gated { .. }, Gate::Metadata) => Ok(()),
            (Access::Private { token: expected }, _) if token == Some(expected.as_str()) => Ok(()),
            (Access::Gated { token: expected }, _) if token == Some(expected.as_str()) => Ok(()),
            (Access::Private { .. }, _) => Err(Response::error(
                401,
                Some("RepoNotFound"),
                "Repository not found: it is private and the request's token does not read it",
            )),
            (Access::Gated { .. }, _) if token.is_none() => Err(Response::error(
                401,
                Some("GatedRepo"),
                format!("Access to model {id} is restricted. You must be authenticated to access it."),
            )),
            (Access::Gated { .. }, _) => Err(Response::error(
                403,
                Some("GatedRepo"),
                format!("Access to model {id} is restricted and you are not in the authorized list."),
            )),
        }
    }

    fn check_write(&self, request: &Request) -> Result<(), Response> {
        match request.bearer() {
            Some(WRITE_TOKEN) => Ok(()),
            None => Err(Response::error(401, None, "Invalid username or password.")),
            Some(token) if self.repos.values().any(|repo| reads_with(&repo.access, token)) => {
                Err(Response::error(403, None, "You don't have the rights to write to this namespace"))
            }
            Some(_) => Err(Response::error(401, None, "Invalid credentials in Authorization header")),
        }
    }

    fn revision<'a>(repo: &'a Repo, revision: &str) -> Result<&'a Commit, Response> {
        repo.resolve(revision)
            .ok_or_else(|| Response::error(404, Some("RevisionNotFound"), format!("Invalid rev id: {revision}")))
    }

    /// `GET /api/models/{id}[/revision/{rev}]`: what `HfApi.model_info` parses.
    fn repo_info(&self, request: &Request, id: &str, revision: &str) -> Result<Response, Response> {
        self.open(request, id, RepoAt { segment: 2, git: false }, Gate::Metadata)?;
        let repo = &self.repos[id];
        let commit = Self::revision(repo, revision)?;
        let with_blobs = request.flag("blobs");
        let siblings: Vec<Value> = commit
            .tree
            .iter()
            .map(|(path, blob)| {
                if !with_blobs {
                    return json!({ "rfilename": path });
                }
                let mut sibling = json!({ "rfilename": path, "size": blob.data.len(), "blobId": blob.git_oid });
                if blob.lfs {
                    sibling["lfs"] = json!({
                        "size": blob.data.len(),
                        "sha256": blob.sha256,
                        "pointerSize": lfs_pointer(&blob.sha256, blob.data.len()).len(),
                    });
                }
                sibling
            })
            .collect();
        let (author, _) = id.split_once('/').unwrap_or(("", id));
        let gated = match repo.access {
            Access::Gated { .. } => json!("manual"),
            _ => json!(false),
        };
        Ok(Response::json(
            200,
            &json!({
                "_id": &sha256_hex(id.as_bytes())[..24],
                "id": id,
                "modelId": id,
                "author": author,
                "sha": commit.sha,
                "lastModified": timestamp(commit.sequence),
                "createdAt": timestamp(0),
                "private": matches!(repo.access, Access::Private { .. }),
                "gated": gated,
                "disabled": false,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "siblings": siblings,
                "spaces": [],
                "usedStorage": commit.tree.values().map(|blob| blob.data.len()).sum::<usize>(),
            }),
        ))
    }

    /// `GET /api/models/{id}/tree/{rev}[/{path}]`: the children of `path`, or with `recursive`
    /// everything under it, folders included, in path order and in one page.
    fn tree(&self, request: &Request, id: &str, revision: &str, path: &str) -> Result<Response, Response> {
        self.open(request, id, RepoAt { segment: 2, git: false }, Gate::Metadata)?;
        let commit = Self::revision(&self.repos[id], revision)?;
        let path = path.trim_matches('/');
        let prefix = if path.is_empty() { String::new() } else { format!("{path}/") };
        let recursive = request.flag("recursive");
        let mut entries = BTreeMap::new();
        for (file, blob) in commit.tree.range(prefix.clone()..).take_while(|(file, _)| file.starts_with(&prefix)) {
            let rest = &file[prefix.len()..];
            let depth = rest.matches('/').count();
            let shown_folders = if recursive { depth } else { depth.min(1) };
            for folder in rest.split('/').take(shown_folders).scan(prefix.clone(), |above, name| {
                above.push_str(name);
                let folder = above.clone();
                above.push('/');
                Some(folder)
            }) {
                entries.entry(folder.clone()).or_insert_with(|| {
                    json!({ "type": "directory", "oid": folder_oid(&commit.tree, &folder), "size": 0, "path": folder })
                });
            }
            if recursive || depth == 0 {
                entries.insert(file.clone(), blob.tree_entry(file));
            }
        }
        if entries.is_empty() && !path.is_empty() {
            return Err(Response::error(
                404,
                Some("EntryNotFound"),
                format!("{path} does not exist on \"{revision}\""),
            ));
        }
        Ok(Response::json(200, &Value::Array(entries.into_values().collect())))
    }

    /// `HEAD`/`GET /{id}/resolve/{rev}/{path}`: a regular file's bytes, or a 302 to the CDN for
    /// an LFS file with its sha256 and size in `X-Linked-*`.
    fn resolve(&mut self, request: &Request, id: &str, revision: &str, path: &str) -> Result<Response, Response> {
        let commit = Self::revision(&self.repos[id], revision)?;
        let Some(blob) = commit.tree.get(path) else {
            return Err(Response::error(404, Some("EntryNotFound"), format!("Entry not found: {path}"))
                .header("X-Repo-Commit", &commit.sha));
        };
        let (sha, blob) = (commit.sha.clone(), blob.clone());
        let etag = format!("\"{}\"", blob.etag());
        if blob.lfs {
            return Ok(Response::new(302)
                .header("Location", &self.download_url(&blob.sha256))
                .header("ETag", &etag)
                .header("X-Linked-Etag", &etag)
                .header("X-Linked-Size", &blob.data.len().to_string())
                .header("X-Repo-Commit", &sha));
        }
        Ok(self.serve_content(request, blob.data, &blob.git_oid, |file| file == path).header("X-Repo-Commit", &sha))
    }

    /// A file's bytes with `Range` support, after the first pending fault whose path
    /// `matches` (only a `GET` takes one).
    fn serve_content(
        &mut self,
        request: &Request,
        data: Arc<Vec<u8>>,
        etag: &str,
        matches: impl Fn(&str) -> bool,
    ) -> Response {
        let fault = if request.method == "GET" {
            self.faults.iter().position(|(path, _)| matches(path)).map(|index| self.faults.remove(index).1)
        } else {
            None
        };
        if let Some(Fault::Status(status)) = fault {
            return Response::error(status, None, format!("injected fault: status {status}"));
        }
        let length = data.len();
        let mut response = Response::new(200)
            .header("Content-Type", "application/octet-stream")
            .header("Accept-Ranges", "bytes")
            .header("ETag", &format!("\"{etag}\""));
        let range = match byte_range(request.header("range"), length) {
            ByteRange::Whole => 0..length,
            ByteRange::Part(range) => {
                response.status = 206;
                response =
                    response.header("Content-Range", &format!("bytes {}-{}/{length}", range.start, range.end - 1));
                range
            }
            ByteRange::Unsatisfiable => {
                return Response::error(416, None, "Requested range not satisfiable")
                    .header("Content-Range", &format!("bytes */{length}"));
            }
        };
        response.body = match fault {
            Some(Fault::Corrupt) => {
                let mut bytes = data[range].to_vec();
                let middle = bytes.len() / 2;
                for index in [0, middle] {
                    if let Some(byte) = bytes.get_mut(index) {
                        *byte ^= 0xff;
                    }
                }
                Body::Owned(bytes)
            }
            _ => Body::Shared(data, range),
        };
        if let Some(Fault::DropAfter(sent)) = fault {
            response.drop_after = Some(sent);
        }
        response
    }

    fn download_url(&self, oid: &str) -> String {
        format!(
            "http://127.0.0.1:{}/lfs/{oid}?X-Amz-Expires=3600&X-Amz-Signature={}",
            self.cdn_port,
            sign("download", oid, "")
        )
    }

    fn upload_url(&self, oid: &str, id: &str) -> String {
        format!(
            "http://127.0.0.1:{}/lfs/{oid}?repo={}&X-Amz-Expires=900&X-Amz-Signature={}",
            self.cdn_port,
            percent_encode(id),
            sign("upload", oid, id)
        )
    }

    /// `POST /api/repos/create` with `{"name", "organization"?, "type"?, "private"?,
    /// "visibility"?}`; a 409 with the repo's `url` when it exists (`exist_ok` reads the status).
    fn create_repo(&mut self, request: &Request) -> Result<Response, Response> {
        self.check_write(request)?;
        let body = json_body(request)?;
        let name = body["name"].as_str().ok_or_else(|| Response::error(400, None, "`name` is required"))?;
        let organization = body["organization"].as_str().unwrap_or("user");
        if !matches!(body["type"].as_str(), None | Some("model")) {
            return Err(Response::error(400, None, "the fake hub serves model repositories only"));
        }
        let id = format!("{organization}/{name}");
        if !valid_repo_id(&id) {
            return Err(Response::error(400, None, format!("invalid repository id `{id}`")));
        }
        let url = format!("{}/{id}", self.endpoint());
        if self.repos.contains_key(&id) {
            return Err(Response::json(409, &json!({ "error": "You already created this model repo", "url": url })));
        }
        let private = body["private"].as_bool() == Some(true) || body["visibility"].as_str() == Some("private");
        let access = if private { Access::Private { token: WRITE_TOKEN.to_owned() } } else { Access::Public };
        self.renamed.remove(&id);
        self.repos.insert(id.clone(), Repo::new(access));
        Ok(Response::json(200, &json!({ "url": url, "name": id, "id": id })))
    }

    /// The commit a write to `revision` starts from: `Ok(None)` for the first commit of an
    /// empty repository's `main`.
    fn write_base<'a>(repo: &'a Repo, revision: &str) -> Result<Option<&'a Commit>, Response> {
        let branch = revision.strip_prefix("refs/heads/").unwrap_or(revision);
        if let Some(head) = repo.branch_head(branch) {
            return Ok(Some(head));
        }
        if repo.commits.is_empty() && branch == "main" {
            return Ok(None);
        }
        if repo.resolve(revision).is_some() {
            return Err(Response::error(400, None, format!("Invalid rev id: {revision} is not a branch")));
        }
        Err(Response::error(404, Some("RevisionNotFound"), format!("Invalid rev id: {revision}")))
    }

    /// `POST /api/models/{id}/preupload/{rev}`: the upload mode of each file, and the oid of
    /// the file already at its path so that the client can skip unchanged files.
    fn preupload(&self, request: &Request, id: &str, revision: &str) -> Result<Response, Response> {
        let repo = &self.repos[id];
        let base = Self::write_base(repo, revision)?;
        let body = json_body(request)?;
        let files = body["files"].as_array().ok_or_else(|| Response::error(400, None, "`files` must be a list"))?;
        let mut answers = Vec::with_capacity(files.len());
        for file in files {
            let (Some(path), Some(size)) = (file["path"].as_str(), file["size"].as_u64()) else {
                return Err(Response::error(400, None, "each file needs a `path` and a `size`"));
            };
            let size = usize::try_from(size).unwrap_or(usize::MAX);
            let mode = if is_lfs(path, size, self.lfs_threshold) { "lfs" } else { "regular" };
            let mut answer = json!({ "path": path, "uploadMode": mode, "shouldIgnore": false });
            if let Some(existing) = base.and_then(|commit| commit.tree.get(path)) {
                answer["oid"] = json!(existing.upload_oid());
            }
            answers.push(answer);
        }
        Ok(Response::json(200, &json!({ "files": answers, "commitOid": base.map(|commit| &commit.sha) })))
    }

    /// `POST /{id}.git/info/lfs/objects/batch` (git-lfs batch API, basic transfer): upload
    /// actions on the CDN for objects the repository lacks, with a verify action.
    fn lfs_batch(&self, request: &Request, id: &str, at: RepoAt) -> Result<Response, Response> {
        let body = json_body(request)?;
        let download = body["operation"].as_str() == Some("download");
        self.open(request, id, at, if download { Gate::Content } else { Gate::Write })?;
        let objects =
            body["objects"].as_array().ok_or_else(|| Response::error(422, None, "`objects` must be a list"))?;
        let repo = &self.repos[id];
        let answers: Vec<Value> = objects
            .iter()
            .map(|object| {
                let (oid, size) = (object["oid"].as_str().unwrap_or(""), object["size"].as_u64().unwrap_or(0));
                let stored = repo.lfs_objects.contains(oid) && self.objects.contains_key(oid);
                if !is_sha256_hex(oid) {
                    json!({ "oid": oid, "size": size, "error": { "code": 422, "message": "oid is not a sha256" } })
                } else if download && stored {
                    let href = self.download_url(oid);
                    json!({ "oid": oid, "size": size, "actions": { "download": { "href": href, "expires_in": 3600 } } })
                } else if download {
                    json!({ "oid": oid, "size": size, "error": { "code": 404, "message": "Object does not exist" } })
                } else if stored {
                    json!({ "oid": oid, "size": size })
                } else {
                    json!({
                        "oid": oid,
                        "size": size,
                        "authenticated": true,
                        "actions": {
                            "upload": { "href": self.upload_url(oid, id), "expires_in": 900 },
                            "verify": {
                                "href": format!("{}/{id}.git/info/lfs/objects/verify", self.endpoint()),
                                "expires_in": 900,
                            },
                        },
                    })
                }
            })
            .collect();
        let value = json!({ "transfer": "basic", "objects": answers, "hash_algo": "sha256" });
        Ok(Response::new(200)
            .header("Content-Type", "application/vnd.git-lfs+json")
            .body(serde_json::to_vec(&value).expect("a JSON value serializes")))
    }

    /// `POST /{id}.git/info/lfs/objects/verify` with `{"oid", "size"}`: whether the upload landed.
    fn lfs_verify(&self, request: &Request, id: &str, at: RepoAt) -> Result<Response, Response> {
        self.open(request, id, at, Gate::Write)?;
        let body = json_body(request)?;
        let (oid, size) = (body["oid"].as_str().unwrap_or(""), body["size"].as_u64());
        let stored = self.objects.get(oid).filter(|_| self.repos[id].lfs_objects.contains(oid));
        match stored {
            Some(data) if size == Some(data.len() as u64) => Ok(Response::json(200, &json!({}))),
            Some(_) => Err(Response::error(422, None, format!("object {oid} has another size"))),
            None => Err(Response::error(404, None, format!("object {oid} was not uploaded"))),
        }
    }

    /// `POST /api/models/{id}/commit/{rev}`: an NDJSON header line (`summary`, `description`,
    /// optional `parentCommit`) then one line per `file` (base64 or text), `lfsFile` (an
    /// uploaded oid), `deletedFile` or `deletedFolder`.
    fn commit_endpoint(&mut self, request: &Request, id: &str, revision: &str) -> Result<Response, Response> {
        if request.flag("create_pr") {
            return Err(Response::error(400, None, "the fake hub does not open pull requests"));
        }
        let repo = &self.repos[id];
        let base = Self::write_base(repo, revision)?;
        let mut lines = std::str::from_utf8(&request.body)
            .map_err(|_| Response::error(400, None, "the commit payload is not UTF-8"))?
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| {
                serde_json::from_str::<Value>(line).map_err(|_| Response::error(400, None, "malformed NDJSON line"))
            });
        let header = lines.next().transpose()?.filter(|line| line["key"] == "header");
        let header = header.ok_or_else(|| Response::error(400, None, "the first line must be the `header`"))?;
        let summary = header["value"]["summary"]
            .as_str()
            .filter(|summary| !summary.is_empty())
            .ok_or_else(|| Response::error(400, None, "the header needs a `summary`"))?
            .to_owned();
        if let Some(parent) = header["value"]["parentCommit"].as_str()
            && base.map(|commit| commit.sha.as_str()) != Some(parent)
        {
            return Err(Response::error(412, None, "A commit has happened since. Please refresh and try again."));
        }
        let mut tree = base.map(|commit| commit.tree.clone()).unwrap_or_default();
        for line in lines {
            let line = line?;
            let value = &line["value"];
            let path = value["path"].as_str().unwrap_or("").trim_end_matches('/');
            if !valid_path(path) {
                return Err(Response::error(400, None, format!("invalid path `{path}`")));
            }
            match line["key"].as_str() {
                Some("file") => {
                    let content = value["content"].as_str().unwrap_or("");
                    let bytes = if value["encoding"].as_str() == Some("base64") {
                        base64::engine::general_purpose::STANDARD
                            .decode(content)
                            .map_err(|_| Response::error(400, None, format!("`{path}`: malformed base64")))?
                    } else {
                        content.as_bytes().to_vec()
                    };
                    tree.insert(path.to_owned(), Blob::new(Arc::new(bytes), false));
                }
                Some("lfsFile") => {
                    let oid = value["oid"].as_str().unwrap_or("");
                    let data = self.objects.get(oid).filter(|_| repo.lfs_objects.contains(oid)).ok_or_else(|| {
                        Response::error(422, None, format!("`{path}`: LFS object {oid} was never uploaded"))
                    })?;
                    if value["size"].as_u64().is_some_and(|size| size != data.len() as u64) {
                        return Err(Response::error(422, None, format!("`{path}`: LFS object {oid} has another size")));
                    }
                    tree.insert(path.to_owned(), Blob::new(Arc::clone(data), true));
                }
                Some("deletedFile") => {
                    if tree.remove(path).is_none() {
                        return Err(Response::error(
                            404,
                            Some("EntryNotFound"),
                            format!("A file with this name doesn't exist: {path}"),
                        ));
                    }
                }
                Some("deletedFolder") => {
                    let prefix = format!("{path}/");
                    let before = tree.len();
                    tree.retain(|file, _| !file.starts_with(&prefix));
                    if tree.len() == before {
                        return Err(Response::error(
                            404,
                            Some("EntryNotFound"),
                            format!("A folder with this name doesn't exist: {path}"),
                        ));
                    }
                }
                other => return Err(Response::error(400, None, format!("unknown commit operation {other:?}"))),
            }
        }
        let branch = revision.strip_prefix("refs/heads/").unwrap_or(revision).to_owned();
        let endpoint = self.endpoint();
        let repo = self.repos.get_mut(id).expect("the repository was opened above");
        let sha = repo.push_commit(id, &branch, summary, tree);
        Ok(Response::json(
            200,
            &json!({
                "success": true,
                "commitOid": sha,
                "commitUrl": format!("{endpoint}/{id}/commit/{sha}"),
                "hookOutput": "",
                "pullRequestUrl": null,
            }),
        ))
    }
}

/// A relative 307 to the same path and query with the repository id replaced by `new`.
fn moved(request: &Request, at: RepoAt, new: &str) -> Response {
    let mut segments: Vec<String> = request.path_only().split('/').skip(1).map(str::to_owned).collect();
    let (org, name) = new.split_once('/').unwrap_or(("", new));
    let suffix = if at.git { ".git" } else { "" };
    segments[at.segment] = percent_encode(org);
    segments[at.segment + 1] = format!("{}{suffix}", percent_encode(name));
    let mut location = format!("/{}", segments.join("/"));
    if !request.query().is_empty() {
        location.push('?');
        location.push_str(request.query());
    }
    Response::error(307, None, format!("Repository moved to {new}")).header("Location", &location)
}

fn reads_with(access: &Access, token: &str) -> bool {
    match access {
        Access::Public => false,
        Access::Private { token: expected } | Access::Gated { token: expected } => expected == token,
    }
}

fn json_body(request: &Request) -> Result<Value, Response> {
    serde_json::from_slice(&request.body).map_err(|_| Response::error(400, None, "the body is not JSON"))
}

fn is_lfs(path: &str, size: usize, threshold: usize) -> bool {
    size >= threshold || path.ends_with(".safetensors") || path.ends_with(".bin")
}

fn valid_repo_id(id: &str) -> bool {
    let valid_part = |part: &str| {
        !part.is_empty()
            && !part.starts_with('.')
            && part.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"-_.".contains(&byte))
    };
    id.split_once('/').is_some_and(|(org, name)| valid_part(org) && valid_part(name))
}

fn valid_path(path: &str) -> bool {
    !path.is_empty() && !path.starts_with('/') && path.split('/').all(|part| !matches!(part, "" | "." | ".."))
}

fn is_sha256_hex(oid: &str) -> bool {
    oid.len() == 64 && oid.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
}

/// The git-lfs pointer file that git stores in place of an LFS file.
fn lfs_pointer(sha256: &str, size: usize) -> String {
    format!("version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n")
}

/// A stand-in for a git tree id: a digest of the paths and blob ids under `folder`.
fn folder_oid(tree: &BTreeMap<String, Blob>, folder: &str) -> String {
    let prefix = format!("{folder}/");
    let mut hasher = Sha1::new();
    for (path, blob) in tree.range(prefix.clone()..).take_while(|(path, _)| path.starts_with(&prefix)) {
        hasher.update(format!("{path}\0{}\n", blob.git_oid).as_bytes());
    }
    hex(&hasher.finalize())
}

/// What a `Range` header asks of a `length`-byte file; several ranges and malformed ones are
/// ignored (the whole file is sent), as RFC 9110 allows.
enum ByteRange {
    Whole,
    Part(Range<usize>),
    Unsatisfiable,
}

fn byte_range(header: Option<&str>, length: usize) -> ByteRange {
    let Some(spec) = header.and_then(|header| header.trim().strip_prefix("bytes=")) else {
        return ByteRange::Whole;
    };
    let Some((first, last)) = spec.split_once('-').filter(|_| !spec.contains(',')) else {
        return ByteRange::Whole;
    };
    let (first, last) = (first.trim(), last.trim());
    let parse = |text: &str| text.parse::<usize>().ok();
    let range = match (first.is_empty(), last.is_empty()) {
        (true, false) => match parse(last) {
            Some(0) => return ByteRange::Unsatisfiable,
            Some(suffix) => length.saturating_sub(suffix)..length,
            None => return ByteRange::Whole,
        },
        (false, true) => match parse(first) {
            Some(start) => start..length,
            None => return ByteRange::Whole,
        },
        (false, false) => match (parse(first), parse(last)) {
            (Some(start), Some(end)) if start <= end => start..length.min(end.saturating_add(1)),
            _ => return ByteRange::Whole,
        },
        (true, true) => return ByteRange::Whole,
    };
    if range.start >= length { ByteRange::Unsatisfiable } else { ByteRange::Part(range) }
}

/// The signature that stands in for a signed S3 URL: the CDN refuses URLs the API did not issue.
fn sign(purpose: &str, oid: &str, repo: &str) -> String {
    sha256_hex(format!("nnx-fake-hub\0{purpose}\0{oid}\0{repo}").as_bytes())[..32].to_owned()
}

/// `2024-01-DDTHH:MM:00.000Z`, `sequence` minutes into January 2024 (capped at its end).
fn timestamp(sequence: usize) -> String {
    let minutes = sequence.min(31 * 24 * 60 - 1);
    format!("{EPOCH_MONTH}-{:02}T{:02}:{:02}:00.000Z", minutes / (24 * 60) + 1, minutes / 60 % 24, minutes % 60)
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => char::from(byte).to_string(),
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Git's id of a blob: `sha1("blob {len}\0" + bytes)`.
fn git_blob_oid(bytes: &[u8]) -> String {
    let mut hasher = Sha1::new();
    hasher.update(format!("blob {}\0", bytes.len()).as_bytes());
    hasher.update(bytes);
    hex(&hasher.finalize())
}

/// The framing `huggingface_hub` does not exercise, checked on raw sockets.
mod tests {
    use std::io::{BufRead, Read};

    use super::*;
    use crate::http_support::{MAX_HEAD_BYTES, read_line};

    /// Reads one response: status, headers and a `Content-Length` body.
    fn response(reader: &mut impl BufRead) -> (u16, Vec<(String, String)>, Vec<u8>) {
        let mut budget = MAX_HEAD_BYTES;
        let mut line = || read_line(reader, &mut budget).ok().flatten().expect("a response line");
        let status = line().split(' ').nth(1).and_then(|code| code.parse().ok()).expect("a status code");
        let headers: Vec<(String, String)> = std::iter::from_fn(|| {
            let header = line();
            let (name, value) = header.split_once(':')?;
            Some((name.to_ascii_lowercase(), value.trim().to_owned()))
        })
        .collect();
        let length = headers
            .iter()
            .find(|(name, _)| name == "content-length")
            .map_or(0, |(_, value)| value.parse().expect("a numeric Content-Length"));
        let mut body = vec![0; length];
        reader.read_exact(&mut body).expect("the announced body");
        (status, headers, body)
    }

    fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
        headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }

    #[test]
    fn hub_server_reads_chunked_bodies_after_100_continue_and_serves_ranges_on_one_connection() {
        let hub = FakeHub::start();
        hub.create_repo("org/up", Access::Public);
        let mut stream = TcpStream::connect(("127.0.0.1", hub.api_port())).expect("the API origin listens");
        let mut reader = BufReader::new(stream.try_clone().expect("a second handle"));
        let payload = concat!(
            r#"{"key":"header","value":{"summary":"by hand"}}"#,
            "\n",
            r#"{"key":"file","value":{"path":"a.txt","content":"0123456789","encoding":"utf-8"}}"#,
            "\n"
        );
        let (first, second) = payload.split_at(20);
        write!(
            stream,
            "POST /api/models/org/up/commit/main HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {WRITE_TOKEN}\r\n\
             Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"
        )
        .expect("the request head is sent");
        let mut interim = String::new();
        reader.read_line(&mut interim).expect("an interim response");
        assert_eq!(interim, "HTTP/1.1 100 Continue\r\n");
        reader.read_line(&mut interim).expect("the end of the interim response");
        write!(
            stream,
            "{:x};ext=1\r\n{first}\r\n{:x}\r\n{second}\r\n0\r\nTrailer: yes\r\n\r\n",
            first.len(),
            second.len()
        )
        .expect("the chunks are sent");
        let (status, _, body) = response(&mut reader);
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let answer: Value = serde_json::from_slice(&body).expect("a JSON answer");
        assert_eq!(answer["commitOid"].as_str(), hub.head("org/up", "main").as_deref());
        assert_eq!(hub.files("org/up", "main")["a.txt"], b"0123456789");

        // The same connection goes on serving: byte ranges of the file just committed.
        for (range, status, content_range, bytes) in [
            ("bytes=1-3", 206, Some("bytes 1-3/10"), &b"123"[..]),
            ("bytes=7-", 206, Some("bytes 7-9/10"), b"789"),
            ("bytes=-2", 206, Some("bytes 8-9/10"), b"89"),
            ("bytes=10-", 416, Some("bytes */10"), br#"{"error":"Requested range not satisfiable"}"#),
            ("bytes=0-1,4-5", 200, None, b"0123456789"),
        ] {
            write!(stream, "GET /org/up/resolve/main/a.txt HTTP/1.1\r\nHost: x\r\nRange: {range}\r\n\r\n")
                .expect("a range request is sent");
            let (got, headers, body) = response(&mut reader);
            assert_eq!((got, header(&headers, "content-range"), &body[..]), (status, content_range, bytes), "{range}");
        }
        write!(stream, "HEAD /org/up/resolve/main/a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .expect("a HEAD request is sent");
        let mut rest = String::new();
        reader.read_to_string(&mut rest).expect("the server closes after `Connection: close`");
        assert!(rest.starts_with("HTTP/1.1 200 OK\r\n") && rest.contains("Content-Length: 10\r\n"), "{rest}");
        assert!(rest.ends_with("\r\n\r\n"), "a HEAD answer has no body: {rest}");
        assert_eq!(hub.requests().len(), 7);
    }

    #[test]
    fn hub_server_closes_idle_connections_and_listeners_when_dropped() {
        let hub = FakeHub::start();
        let ports = [hub.api_port(), hub.cdn_port()];
        let mut idle = TcpStream::connect(("127.0.0.1", ports[0])).expect("the API origin listens");
        write!(idle, "GET /api/models/org/none HTTP/1.1\r\nHost: x\r\n\r\n").expect("a request is sent");
        let mut reader = BufReader::new(idle.try_clone().expect("a second handle"));
        let (status, headers, _) = response(&mut reader);
        assert_eq!((status, header(&headers, "x-error-code")), (404, Some("RepoNotFound")));
        drop(hub);
        let mut rest = Vec::new();
        let closed = reader.read_to_end(&mut rest).map(|_| rest.is_empty()).unwrap_or(true);
        assert!(closed, "the kept-alive connection is closed");
        for port in ports {
            assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "port {port} no longer listens");
        }
    }
}
