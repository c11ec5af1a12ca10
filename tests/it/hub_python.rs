//! The fake Hub of `hub_server.rs` driven by the real `huggingface_hub` client (2.4, installed by
//! `scripts/setup.sh`): downloads into its cache, auth and error classes, `upload_folder` through
//! preupload, git-lfs and commit, and the injected faults. If the client accepts what the fake
//! serves and the fake stores what the client uploads, tests of nnx's own client against the fake
//! say something about the real Hub.
//!
//! The interpreter is `$NNX_PYTHON`, else the one under the nnx cache; without `huggingface_hub`
//! these tests fail and say how to install it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::hub_server::{Access, FakeHub, Fault, Logged, WRITE_TOKEN, hex};
use crate::util::scratch;

/// Helpers every script starts with: `failure(call)` describes the exception `call` raises
/// (class, class hierarchy, HTTP status), `read(path)` is a file's bytes in hex and `sha256(path)`
/// their digest, `emit(value)` prints the result as JSON.
const PRELUDE: &str = r#"
import hashlib, json, os, sys
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.utils.sha import git_hash

CACHE = os.environ["HF_HUB_CACHE"]
ARGS = sys.argv[1:]

def failure(call):
    try:
        call()
    except Exception as error:
        response = getattr(error, "response", None)
        return {
            "class": type(error).__name__,
            "bases": [cls.__name__ for cls in type(error).__mro__],
            "status": getattr(response, "status_code", None),
        }
    return None

def read(path):
    with open(path, "rb") as fh:
        return fh.read().hex()

def sha256(path):
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()

def emit(value):
    print(json.dumps(value))
"#;

/// The interpreter named by `NNX_PYTHON`, else the one `scripts/setup.sh` installs, else
/// `python3`.
fn interpreter() -> String {
    if let Ok(python) = std::env::var("NNX_PYTHON") {
        return python;
    }
    let python = crate::util::cache_dir().join("venv").join("bin").join("python");
    if python.is_file() { python.display().to_string() } else { "python3".into() }
}

/// Fails (never skips) when the interpreter cannot import `huggingface_hub`.
fn require_huggingface_hub() {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    let checked = CHECKED.get_or_init(|| {
        let python = interpreter();
        match Command::new(&python).args(["-c", "import huggingface_hub"]).output() {
            Ok(output) if output.status.success() => Ok(()),
            Ok(output) => {
                Err(format!("`{python}` cannot import it: {}", String::from_utf8_lossy(&output.stderr).trim()))
            }
            Err(error) => Err(format!("`{python}` cannot be run: {error}")),
        }
    });
    if let Err(why) = checked {
        panic!(
            "the fake Hub tests need Python with `huggingface_hub` 2.4; {why}. Run `scripts/setup.sh`, or \
             `pip install huggingface_hub==2.4.0` and set NNX_PYTHON to that interpreter"
        );
    }
}

/// Runs `script` after [`PRELUDE`] with `args` as `sys.argv[1:]`, pointed at `hub`, with its
/// cache and home under `scratch` and no token, proxy or telemetry from the outer environment;
/// returns the JSON it printed last.
fn python(hub: &FakeHub, scratch: &Path, script: &str, args: &[&str]) -> Value {
    require_huggingface_hub();
    let mut command = Command::new(interpreter());
    command.arg("-c").arg(format!("{PRELUDE}\n{script}")).args(args);
    for name in [
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_TOKEN_PATH",
        "HF_HUB_OFFLINE",
        "HF_HUB_ETAG_TIMEOUT",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        command.env_remove(name);
    }
    let output = command
        .env("HF_ENDPOINT", hub.endpoint())
        .env("HF_HUB_CACHE", scratch.join("hub"))
        .env("HF_HOME", scratch.join("home"))
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_XET", "1")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("the interpreter ran a moment ago");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the Python script failed:\n{stderr}\nstdout:\n{stdout}");
    let last = stdout.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or("");
    serde_json::from_str(last).unwrap_or_else(|error| panic!("the script prints JSON last ({error}):\n{stdout}"))
}

/// `length` bytes that differ from file to file with `seed`.
fn pattern(length: usize, seed: u8) -> Vec<u8> {
    (0..length).map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// The position of the first logged request that `matches`, or a panic that shows the log.
fn position(log: &[Logged], what: &str, matches: impl Fn(&Logged) -> bool) -> usize {
    log.iter().position(matches).unwrap_or_else(|| panic!("no request {what} in the log: {log:#?}"))
}

/// The class `failure()` reported, checking the HTTP status too.
fn failed_with(failure: &Value, class: &str, status: u16) {
    assert_eq!(failure["class"], class, "{failure}");
    assert_eq!(failure["status"], status, "{failure}");
}

#[test]
fn hub_python_snapshot_download_lays_out_the_cache() {
    let hub = FakeHub::start();
    hub.create_repo("org/model", Access::Public);
    let config = br#"{"hidden_size": 8}"#.to_vec();
    let weights = pattern(3000, 7);
    let big_text = "long line\n".repeat(150).into_bytes();
    let files: [(&str, &[u8]); 4] = [
        ("config.json", &config),
        ("model.safetensors", &weights),
        ("sub/x.txt", b"nested"),
        ("notes/big.txt", &big_text),
    ];
    let sha = hub.commit("org/model", "main", &files);
    let scratch = scratch();

    let out = python(
        &hub,
        scratch.path(),
        r#"
folder = snapshot_download("org/model")
files = {}
for root, _, names in os.walk(folder):
    for name in names:
        path = os.path.join(root, name)
        with open(path, "rb") as fh:
            data = fh.read()
        files[os.path.relpath(path, folder).replace(os.sep, "/")] = {
            "hex": data.hex(),
            "link": os.path.islink(path),
            "target": os.path.relpath(os.path.realpath(path), CACHE),
            "sha256": hashlib.sha256(data).hexdigest(),
            "git": git_hash(data),
        }
storage = os.path.join(CACHE, "models--org--model")
with open(os.path.join(storage, "refs", "main")) as fh:
    ref = fh.read()
check = HfApi().verify_repo_checksums("org/model")
emit({
    "folder": os.path.relpath(folder, CACHE),
    "files": files,
    "blobs": sorted(os.listdir(os.path.join(storage, "blobs"))),
    "snapshots": sorted(os.listdir(os.path.join(storage, "snapshots"))),
    "ref": ref,
    "checked": check.checked_count,
    "mismatches": check.mismatches,
    "missing": check.missing_paths,
    "extra": check.extra_paths,
})
"#,
        &[],
    );

    assert_eq!(out["folder"], format!("models--org--model/snapshots/{sha}"));
    assert_eq!(out["snapshots"], json!([sha]));
    assert_eq!(out["ref"], sha);
    let got = out["files"].as_object().expect("files is an object");
    assert_eq!(got.keys().collect::<Vec<_>>(), ["config.json", "model.safetensors", "notes/big.txt", "sub/x.txt"]);
    let mut blobs = Vec::new();
    for (path, bytes) in files {
        let file = &got[path];
        assert_eq!(file["hex"], hex(bytes), "{path}");
        assert_eq!(file["link"], true, "{path} is a symlink into blobs");
        // LFS files (by extension, and by size over the 1024-byte threshold) are named by their
        // sha256, regular ones by their git blob sha1, each computed by Python.
        let lfs = path == "model.safetensors" || path == "notes/big.txt";
        let etag = file[if lfs { "sha256" } else { "git" }].as_str().expect("a digest").to_owned();
        assert_eq!(file["target"], format!("models--org--model/blobs/{etag}"), "{path}");
        blobs.push(etag);
    }
    blobs.sort();
    assert_eq!(out["blobs"], json!(blobs));
    // The oids of the tree listing match what Python computes from the downloaded bytes.
    assert_eq!((out["checked"].as_u64(), &out["mismatches"]), (Some(4), &json!([])));
    assert_eq!((&out["missing"], &out["extra"]), (&json!([]), &json!([])));

    let log = hub.requests();
    position(&log, "for the repo info", |r| r.method == "GET" && r.path == "/api/models/org/model/revision/main");
    position(&log, "for the recursive tree", |r| {
        r.path.starts_with(&format!("/api/models/org/model/tree/{sha}?")) && r.path.contains("recursive=")
    });
    position(&log, "for config.json", |r| {
        r.method == "GET" && r.host_port == hub.api_port() && r.path == format!("/org/model/resolve/{sha}/config.json")
    });
    let weights_sha = got["model.safetensors"]["sha256"].as_str().expect("a digest");
    let cdn = position(&log, "for the weights on the CDN", |r| {
        r.method == "GET" && r.path.starts_with(&format!("/lfs/{weights_sha}?"))
    });
    assert_eq!(log[cdn].host_port, hub.cdn_port());
    assert_eq!(log[cdn].authorization, None, "no token leaves the Hub for the CDN");
    let on_api =
        log.iter().filter(|r| r.method == "GET" && r.path.starts_with("/lfs/")).all(|r| r.host_port != hub.api_port());
    assert!(on_api, "LFS bytes come from the CDN origin only: {log:#?}");
}

#[test]
fn hub_python_downloads_by_tag_commit_and_through_a_rename() {
    let hub = FakeHub::start();
    hub.create_repo("org/old", Access::Public);
    let weights = pattern(2000, 3);
    let first = hub.commit("org/old", "main", &[("config.json", br#"{"v": 1}"#), ("model.safetensors", &weights)]);
    hub.tag("org/old", "v1.0", &first);
    let second = hub.commit("org/old", "main", &[("config.json", br#"{"v": 2}"#)]);
    assert_eq!(hub.head("org/old", "main").as_deref(), Some(second.as_str()));
    hub.rename("org/old", "org/new");
    let scratch = scratch();

    let out = python(
        &hub,
        scratch.path(),
        r#"
first = ARGS[0]
refs = os.path.join(CACHE, "models--org--new", "refs")
tag = read(hf_hub_download("org/new", "config.json", revision="v1.0"))
emit({
    "tag": tag,
    "commit": read(hf_hub_download("org/new", "config.json", revision=first)),
    "main_via_old": read(hf_hub_download("org/old", "config.json")),
    "weights_via_old": read(hf_hub_download("org/old", "model.safetensors")),
    "snapshot_via_old": sorted(os.listdir(snapshot_download("org/old"))),
    "refs": {name: open(os.path.join(refs, name)).read() for name in os.listdir(refs)},
})
"#,
        &[&first],
    );

    assert_eq!(out["tag"], hex(br#"{"v": 1}"#));
    assert_eq!(out["commit"], hex(br#"{"v": 1}"#));
    assert_eq!(out["main_via_old"], hex(br#"{"v": 2}"#));
    assert_eq!(out["weights_via_old"], hex(&weights));
    assert_eq!(out["snapshot_via_old"], json!(["config.json", "model.safetensors"]));
    // Only the tag is a ref: a commit sha is its own name.
    assert_eq!(out["refs"], json!({ "v1.0": first }));
    assert_eq!(hub.files("org/new", "v1.0")["config.json"], br#"{"v": 1}"#);
    assert_eq!(hub.files("org/new", &second)["config.json"], br#"{"v": 2}"#);

    let log = hub.requests();
    let old = position(&log, "on the old id", |r| r.method == "HEAD" && r.path == "/org/old/resolve/main/config.json");
    let new = position(&log, "on the new id", |r| r.method == "HEAD" && r.path == "/org/new/resolve/main/config.json");
    assert!(old < new, "the 307 from the old id is followed to the new one");
    let old = position(&log, "for info on the old id", |r| r.path == "/api/models/org/old/revision/main");
    let new = position(&log, "for info on the new id", |r| r.path == "/api/models/org/new/revision/main");
    assert!(old < new, "the API answers the old id with a 307 too");
}

#[test]
fn hub_python_private_and_gated_repos_need_their_token() {
    let hub = FakeHub::start();
    let weights = pattern(1500, 11);
    for (repo, access) in [
        ("org/private", Access::Private { token: "hf_private_reader".into() }),
        ("org/gated", Access::Gated { token: "hf_gated_reader".into() }),
    ] {
        hub.create_repo(repo, access);
        hub.commit(repo, "main", &[("config.json", b"{}"), ("model.safetensors", &weights)]);
    }
    let scratch = scratch();

    let out = python(
        &hub,
        scratch.path(),
        r#"
emit({
    "private_anonymous": failure(lambda: hf_hub_download("org/private", "config.json")),
    "private_wrong": failure(lambda: hf_hub_download("org/private", "config.json", token="hf_gated_reader")),
    "private_info": failure(lambda: HfApi().model_info("org/private")),
    "private_snapshot": failure(lambda: snapshot_download("org/private")),
    "private_ok": read(hf_hub_download("org/private", "model.safetensors", token="hf_private_reader")),
    "gated_anonymous": failure(lambda: hf_hub_download("org/gated", "config.json")),
    "gated_wrong": failure(lambda: hf_hub_download("org/gated", "config.json", token="hf_private_reader")),
    "gated_info": HfApi().model_info("org/gated").gated,
    "gated_ok": read(hf_hub_download("org/gated", "model.safetensors", token="hf_gated_reader")),
})
"#,
        &[],
    );

    for case in ["private_anonymous", "private_wrong", "private_info", "private_snapshot"] {
        failed_with(&out[case], "RepositoryNotFoundError", 401);
    }
    assert_eq!(out["private_ok"], hex(&weights));
    failed_with(&out["gated_anonymous"], "GatedRepoError", 401);
    failed_with(&out["gated_wrong"], "GatedRepoError", 403);
    assert_eq!(out["gated_info"], "manual", "a gated repo's metadata is public");
    assert_eq!(out["gated_ok"], hex(&weights));

    let log = hub.requests();
    let authorized = |token: &str| {
        let header = format!("Bearer {token}");
        move |r: &Logged| r.authorization.as_deref() == Some(header.as_str())
    };
    position(&log, "with the private token", authorized("hf_private_reader"));
    position(&log, "with the gated token", authorized("hf_gated_reader"));
    let on_cdn: Vec<&Logged> = log.iter().filter(|r| r.host_port == hub.cdn_port()).collect();
    assert_eq!(on_cdn.len(), 2, "one CDN download per repository: {on_cdn:#?}");
    assert!(on_cdn.iter().all(|r| r.authorization.is_none()), "tokens stay on the Hub: {on_cdn:#?}");
}

#[test]
fn hub_python_upload_folder_goes_through_preupload_lfs_and_commit() {
    let hub = FakeHub::start();
    hub.set_lfs_threshold(256);
    let scratch = scratch();
    let folder = scratch.path().join("upload");
    let uploads: BTreeMap<&str, Vec<u8>> = BTreeMap::from([
        ("notes.txt", b"small and regular".to_vec()),
        ("data/big.txt", "over the threshold\n".repeat(20).into_bytes()),
        ("weights.safetensors", pattern(100, 5)),
    ]);
    for (path, bytes) in &uploads {
        let path = folder.join(path);
        std::fs::create_dir_all(path.parent().expect("a parent folder")).expect("the upload folder is writable");
        std::fs::write(path, bytes).expect("the upload folder is writable");
    }
    let folder = folder.display().to_string();

    let out = python(
        &hub,
        scratch.path(),
        r#"
from huggingface_hub.utils import get_session
folder, token = ARGS
api = HfApi(token=token)
url = api.create_repo("org/up")
again = api.create_repo("org/up", exist_ok=True)
conflict = failure(lambda: api.create_repo("org/up"))
info = api.upload_folder(folder_path=folder, repo_id="org/up")
second = api.upload_folder(folder_path=folder, repo_id="org/up")
anonymous = failure(lambda: HfApi(token=False).upload_folder(folder_path=folder, repo_id="org/up"))
intruder = failure(lambda: HfApi(token="hf_nope").upload_folder(folder_path=folder, repo_id="org/up"))
lines = [
    {"key": "header", "value": {"summary": "sneak a file in"}},
    {"key": "lfsFile", "value": {"path": "ghost.bin", "algo": "sha256", "oid": "0" * 64, "size": 1}},
]
ghost = get_session().post(
    os.environ["HF_ENDPOINT"] + "/api/models/org/up/commit/main",
    content="".join(json.dumps(line) + "\n" for line in lines),
    headers={"Authorization": "Bearer " + token, "Content-Type": "application/x-ndjson"},
)
emit({
    "url": str(url),
    "repo_id": url.repo_id,
    "again": str(again),
    "conflict": conflict,
    "oid": info.oid,
    "commit_url": info.commit_url,
    "second_oid": second.oid,
    "anonymous": anonymous,
    "intruder": intruder,
    "ghost": ghost.status_code,
    "downloaded": read(hf_hub_download("org/up", "weights.safetensors")),
})
"#,
        &[&folder, WRITE_TOKEN],
    );

    let endpoint = hub.endpoint();
    assert_eq!(out["url"], format!("{endpoint}/org/up"));
    assert_eq!(out["repo_id"], "org/up");
    assert_eq!(out["again"], format!("{endpoint}/org/up"));
    failed_with(&out["conflict"], "HfHubHTTPError", 409);
    let oid = out["oid"].as_str().expect("a commit oid");
    assert_eq!(out["commit_url"], format!("{endpoint}/org/up/commit/{oid}"));
    assert_eq!(hub.head("org/up", "main").as_deref(), Some(oid));
    let stored = hub.files("org/up", "main");
    let expected: BTreeMap<String, Vec<u8>> =
        uploads.iter().map(|(path, bytes)| ((*path).to_owned(), bytes.clone())).collect();
    assert_eq!(stored, expected);
    // Preupload's oids let the client see that nothing changed: no second commit.
    assert_eq!(out["second_oid"], oid);
    assert_eq!(hub.commits("org/up"), [(oid.to_owned(), "Upload folder using huggingface_hub".to_owned())]);
    failed_with(&out["anonymous"], "HfHubHTTPError", 401);
    failed_with(&out["intruder"], "HfHubHTTPError", 401);
    assert_eq!(out["ghost"], 422, "a commit may not name an LFS object that was never uploaded");
    assert_eq!(out["downloaded"], hex(&uploads["weights.safetensors"]));

    let log = hub.requests();
    let api = hub.api_port();
    let preupload =
        position(&log, "to preupload", |r| r.method == "POST" && r.path == "/api/models/org/up/preupload/main");
    let batch = position(&log, "to the LFS batch API", |r| {
        r.method == "POST" && r.host_port == api && r.path == "/org/up.git/info/lfs/objects/batch"
    });
    let put = position(&log, "to upload", |r| r.method == "PUT" && r.host_port == hub.cdn_port());
    let verify = position(&log, "to verify", |r| r.method == "POST" && r.path == "/org/up.git/info/lfs/objects/verify");
    let commit = position(&log, "to commit", |r| r.method == "POST" && r.path == "/api/models/org/up/commit/main");
    assert!(preupload < batch && batch < put && put < verify && verify < commit, "{log:#?}");
    let puts = log.iter().filter(|r| r.method == "PUT").count();
    assert_eq!(puts, 2, "two LFS files, one by extension and one by size, each uploaded once: {log:#?}");
}

#[test]
fn hub_python_missing_things_raise_the_hub_errors() {
    let hub = FakeHub::start();
    hub.create_repo("org/model", Access::Public);
    let sha = hub.commit("org/model", "main", &[("config.json", b"{}")]);
    let scratch = scratch();

    let out = python(
        &hub,
        scratch.path(),
        r#"
api = HfApi()
emit({
    "entry": failure(lambda: hf_hub_download("org/model", "missing.txt")),
    "revision": failure(lambda: hf_hub_download("org/model", "config.json", revision="nope")),
    "repo": failure(lambda: hf_hub_download("org/missing", "config.json")),
    "info_revision": failure(lambda: api.model_info("org/model", revision="nope")),
    "info_repo": failure(lambda: api.model_info("org/missing")),
    "tree_repo": failure(lambda: list(api.list_repo_tree("org/missing"))),
    "tree_entry": failure(lambda: list(api.list_repo_tree("org/model", path_in_repo="nothing/here"))),
    "snapshot_revision": failure(lambda: snapshot_download("org/model", revision="nope")),
    "no_exist": sorted(os.listdir(os.path.join(CACHE, "models--org--model", ".no_exist", ARGS[0]))),
})
"#,
        &[&sha],
    );

    failed_with(&out["entry"], "RemoteEntryNotFoundError", 404);
    assert!(out["entry"]["bases"].as_array().expect("a list").contains(&json!("EntryNotFoundError")));
    failed_with(&out["tree_entry"], "RemoteEntryNotFoundError", 404);
    for case in ["revision", "info_revision", "snapshot_revision"] {
        failed_with(&out[case], "RevisionNotFoundError", 404);
    }
    for case in ["repo", "info_repo", "tree_repo"] {
        failed_with(&out[case], "RepositoryNotFoundError", 404);
    }
    // The 404 names the commit it looked in, so the client remembers the file is missing there.
    assert_eq!(out["no_exist"], json!(["missing.txt"]));
}

#[test]
fn hub_python_survives_dropped_connections_and_sees_faults() {
    let hub = FakeHub::start();
    hub.create_repo("org/model", Access::Public);
    let config = br#"{"hidden_size": 64, "layers": 2, "name": "a config long enough to flip"}"#.to_vec();
    // `huggingface_hub` writes what it received in 10 MiB chunks and resumes from the last one
    // written, so only a drop past the first chunk shows a `Range` on the retry.
    let chunk = 10 * 1024 * 1024;
    let weights = pattern(chunk + 5000, 1);
    let other = pattern(1200, 9);
    hub.commit(
        "org/model",
        "main",
        &[("config.json", &config), ("model.safetensors", &weights), ("other.bin", &other)],
    );
    hub.fail_next("model.safetensors", Fault::DropAfter(chunk + 1000));
    hub.fail_next("config.json", Fault::Corrupt);
    let scratch = scratch();

    let out = python(
        &hub,
        scratch.path(),
        r#"
weights = sha256(hf_hub_download("org/model", "model.safetensors"))
config = read(hf_hub_download("org/model", "config.json"))
check = HfApi().verify_repo_checksums("org/model")
emit({"weights": weights, "config": config, "mismatches": check.mismatches})
"#,
        &[],
    );

    assert_eq!(out["weights"], hex(&Sha256::digest(&weights)), "the client resumes after the dropped connection");
    let corrupt = out["config"].as_str().expect("hex");
    assert_eq!(corrupt.len(), 2 * config.len(), "a corrupt body keeps its length");
    assert_ne!(corrupt, hex(&config));
    let mismatches = out["mismatches"].as_array().expect("a list");
    assert_eq!(mismatches.len(), 1, "{mismatches:?}");
    assert_eq!((&mismatches[0]["path"], &mismatches[0]["algorithm"]), (&json!("config.json"), &json!("git-sha1")));
    let log = hub.requests();
    let ranges: Vec<Option<&str>> =
        log.iter().filter(|r| r.method == "GET" && r.host_port == hub.cdn_port()).map(|r| r.range.as_deref()).collect();
    assert_eq!(ranges, [None, Some(format!("bytes={chunk}-").as_str())]);

    hub.clear_requests();
    hub.fail_next("other.bin", Fault::Status(500));
    let out = python(
        &hub,
        scratch.path(),
        r#"
emit({
    "first": failure(lambda: hf_hub_download("org/model", "other.bin")),
    "second": read(hf_hub_download("org/model", "other.bin")),
})
"#,
        &[],
    );
    failed_with(&out["first"], "HfHubHTTPError", 500);
    assert_eq!(out["second"], hex(&other), "a fault applies once");
    let log = hub.requests();
    assert!(!log.iter().any(|r| r.path.contains("model.safetensors")), "the log was cleared: {log:#?}");
    let cdn_gets = log.iter().filter(|r| r.method == "GET" && r.host_port == hub.cdn_port()).count();
    assert_eq!(cdn_gets, 2, "{log:#?}");
}

/// The fake Hub with GPT-2 in transformers' layout, sharded, as `tests/it/hub.rs` serves it.
fn gpt2_hub() -> (FakeHub, String, BTreeMap<String, Vec<u8>>) {
    let hub = FakeHub::start();
    hub.create_repo("org/gpt2", Access::Public);
    let files = crate::hub::gpt2_files();
    let list: Vec<(&str, &[u8])> = files.iter().map(|(path, bytes)| (path.as_str(), bytes.as_slice())).collect();
    let sha = hub.commit("org/gpt2", "main", &list);
    (hub, sha, files)
}

#[test]
fn hub_python_downloads_what_nnx_then_loads_offline() {
    let (hub, sha, _) = gpt2_hub();
    let scratch = scratch();
    let out = python(&hub, scratch.path(), r#"emit({"folder": snapshot_download("org/gpt2")})"#, &[]);
    let folder = PathBuf::from(out["folder"].as_str().unwrap());
    let endpoint = hub.endpoint();
    drop(hub);

    // No server any more, and nnx is offline: the snapshot Python wrote is what nnx loads.
    let cache = nnx::hub::Cache::new(scratch.path().join("hub"));
    let id = nnx::hub::RepoId::parse("org/gpt2").unwrap();
    let offline = nnx::hub::Hub::new(&endpoint).with_cache(cache.clone()).with_offline(true);
    assert_eq!(offline.pretrained(&id, "main").unwrap(), folder);
    assert_eq!(offline.pretrained(&id, &sha).unwrap(), folder);
    let model = <nnx::models::gpt2::Gpt2 as nnx::Pretrained>::from_pretrained(&folder).unwrap();
    let reference =
        <nnx::models::gpt2::Gpt2 as nnx::Pretrained>::from_pretrained(crate::util::fixtures().join("gpt2-tiny"))
            .unwrap();
    let logits = |model: &nnx::models::gpt2::Gpt2| model.forward(&[5, 6, 7]).unwrap().to_vec::<f32>().unwrap();
    assert!(logits(&model) == logits(&reference), "the model Python downloaded computes what the fixture does");
    // The weights are the cache's pages, not copies.
    assert!(model.wte.weight.is_mapped());
}

#[test]
fn hub_python_reads_offline_what_nnx_downloaded() {
    let (hub, sha, files) = gpt2_hub();
    let scratch = scratch();
    let cache = nnx::hub::Cache::new(scratch.path().join("hub"));
    let id = nnx::hub::RepoId::parse("org/gpt2").unwrap();
    let client = nnx::hub::Hub::new(&hub.endpoint()).with_cache(cache);
    let folder = client.pretrained(&id, "main").unwrap();
    let mut fetched: Vec<String> = crate::hub::walk(&folder)
        .iter()
        .map(|path| Path::new(path).strip_prefix(&folder).unwrap().to_string_lossy().into_owned())
        .collect();
    fetched.sort();
    drop(hub);

    let script = r#"
os.environ["HF_HUB_OFFLINE"] = "1"
import huggingface_hub.constants as constants
constants.HF_HUB_OFFLINE = True
from huggingface_hub import scan_cache_dir, try_to_load_from_cache
names = json.loads(ARGS[0])
folder = snapshot_download("org/gpt2", allow_patterns=names)
paths = {name: hf_hub_download("org/gpt2", name) for name in names}
report = scan_cache_dir(CACHE)
repos = [
    {"id": repo.repo_id, "size": repo.size_on_disk, "files": repo.nb_files,
     "refs": sorted(ref for revision in repo.revisions for ref in revision.refs),
     "commits": [revision.commit_hash for revision in repo.revisions]}
    for repo in report.repos
]
emit({
    "folder": folder,
    "paths": paths,
    "hex": {name: read(path) for name, path in paths.items()},
    "cached": try_to_load_from_cache("org/gpt2", "config.json"),
    "missing": failure(lambda: hf_hub_download("org/gpt2", "pytorch_model.bin")),
    "repos": repos,
    "warnings": [str(warning) for warning in report.warnings],
})
"#;
    let names = serde_json::to_string(&fetched).unwrap();
    let hub = FakeHub::start();
    let out = python(&hub, scratch.path(), script, &[&names]);
    assert!(hub.requests().is_empty(), "Python stayed offline: {:?}", hub.requests());
    assert_eq!(PathBuf::from(out["folder"].as_str().unwrap()), folder);
    for name in &fetched {
        assert_eq!(PathBuf::from(out["paths"][name].as_str().unwrap()), folder.join(name), "{name}");
        assert_eq!(out["hex"][name].as_str().unwrap(), hex(&files[name]), "{name}");
    }
    assert_eq!(PathBuf::from(out["cached"].as_str().unwrap()), folder.join("config.json"));
    assert!(out["missing"]["class"].as_str().unwrap().contains("LocalEntryNotFound"), "{}", out["missing"]);
    let repos = out["repos"].as_array().unwrap();
    assert_eq!(repos.len(), 1, "{repos:?}");
    assert_eq!(repos[0]["id"], "org/gpt2");
    assert_eq!(repos[0]["refs"], serde_json::json!(["main"]));
    assert_eq!(repos[0]["commits"], serde_json::json!([sha]));
    assert_eq!(repos[0]["files"].as_u64().unwrap() as usize, fetched.len());
    let bytes: usize = fetched.iter().map(|name| files[name].len()).sum();
    assert_eq!(repos[0]["size"].as_u64().unwrap() as usize, bytes);
    assert_eq!(out["warnings"], serde_json::json!([]), "scan_cache_dir finds nothing out of place");
}
