//! Uploads through the Hub's HTTP API, the way `huggingface_hub.upload_folder` does: create the
//! repository if needed, ask `preupload` which files go to LFS, upload those through the git-LFS
//! batch API, then commit every file in one commit.

use std::io::Read;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::RepoId;
use super::answers::{CommitAnswer, LfsAction, LfsBatch, Preupload};
use super::client::{Hub, sha256_file, walk};
use super::http::{About, Body, Reply, Request, encode_segment, protocol, refused};
use crate::error::HubProblem;
use crate::{Error, Result};

/// The media type of git-LFS batch requests and answers.
const LFS_JSON: &str = "application/vnd.git-lfs+json";

/// Files per `preupload` request, as `huggingface_hub` sends them.
const PREUPLOAD_CHUNK: usize = 256;

/// What a commit made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitInfo {
    /// The repository.
    pub repo: RepoId,
    /// The new commit.
    pub commit: String,
    /// Its page on the Hub.
    pub url: String,
    /// The files committed as regular git blobs.
    pub regular: Vec<String>,
    /// The files committed through LFS.
    pub lfs: Vec<String>,
}

/// One file on its way up.
struct Upload {
    path: String,
    local: PathBuf,
    size: u64,
    sha256: String,
    sample: Vec<u8>,
}

impl Hub {
    /// Creates the model repository `repo`; one that exists already is fine.
    ///
    /// # Errors
    /// [`Error::Hub`]: no token, a token without write access, or the server's refusal.
    pub fn create_repo(&self, repo: &RepoId, private: bool) -> Result<()> {
        let (organization, name) = match repo.as_str().split_once('/') {
            Some((organization, name)) => (Some(organization), name),
            None => (None, repo.as_str()),
        };
        let mut payload = json!({ "name": name, "private": private });
        if let Some(organization) = organization {
            payload["organization"] = json!(organization);
        }
        let body = payload.to_string();
        let request = Request::new("POST", format!("{}/api/repos/create", self.endpoint()))
            .header("Content-Type", "application/json")
            .body(Body::Bytes(body.as_bytes()));
        let reply = self.http.send(repo, &request)?;
        match reply.status() {
            200..=299 | 409 => Ok(()),
            _ => Err(refused(repo, &self.http, reply, About { revision: "main", file: None })),
        }
    }

    /// Commits every file under `folder` (hidden files and folders aside) to `revision` of
    /// `repo`, creating the repository first if needed: small text files as regular blobs, the
    /// rest through LFS, as the server's `preupload` answer decides.
    ///
    /// # Errors
    /// [`Error::Io`] reading the folder; [`Error::Hub`]: no token, refusals, or broken answers.
    pub fn upload_folder(&self, repo: &RepoId, folder: &Path, revision: &str, message: &str) -> Result<CommitInfo> {
        let uploads = self.describe(repo, folder)?;
        self.create_repo(repo, false)?;
        let modes = self.preupload(repo, revision, &uploads)?;
        let (lfs, regular): (Vec<&Upload>, Vec<&Upload>) =
            uploads.iter().partition(|upload| modes.iter().any(|(path, lfs)| *lfs && *path == upload.path));
        self.upload_lfs(repo, revision, &lfs)?;
        self.commit(repo, revision, message, &regular, &lfs)
    }

    /// Size, sha256 and first 512 bytes of every file to upload.
    fn describe(&self, repo: &RepoId, folder: &Path) -> Result<Vec<Upload>> {
        if !folder.is_dir() {
            return Err(Error::Hub {
                repo: repo.to_string(),
                problem: HubProblem::Io {
                    action: "upload",
                    path: folder.to_path_buf(),
                    message: "not a folder".to_string(),
                },
            });
        }
        let mut uploads = Vec::new();
        for path in walk(folder) {
            if path.split('/').any(|part| part.starts_with('.')) {
                continue;
            }
            let local = folder.join(&path);
            let size = std::fs::metadata(&local).map_err(Error::io("read", &local))?.len();
            let mut sample = Vec::with_capacity(512);
            std::fs::File::open(&local)
                .and_then(|file| file.take(512).read_to_end(&mut sample))
                .map_err(Error::io("read", &local))?;
            let sha256 = sha256_file(&local)?;
            uploads.push(Upload { path, local, size, sha256, sample });
        }
        Ok(uploads)
    }

    /// Which files the server wants through LFS: `(path, lfs)` for every file.
    fn preupload(&self, repo: &RepoId, revision: &str, uploads: &[Upload]) -> Result<Vec<(String, bool)>> {
        let url = format!("{}/api/models/{}/preupload/{}", self.endpoint(), repo, encode_segment(revision));
        let mut modes = Vec::with_capacity(uploads.len());
        for chunk in uploads.chunks(PREUPLOAD_CHUNK) {
            let files: Vec<Value> = chunk
                .iter()
                .map(|upload| json!({ "path": upload.path, "size": upload.size, "sample": BASE64.encode(&upload.sample) }))
                .collect();
            let body = json!({ "files": files }).to_string();
            let request = Request::new("POST", url.clone())
                .header("Content-Type", "application/json")
                .body(Body::Bytes(body.as_bytes()));
            let answer: Preupload = self.expect_json(repo, revision, self.http.send(repo, &request)?)?;
            for upload in chunk {
                let mode =
                    answer.files.iter().find(|file| file.path == upload.path).map(|file| file.upload_mode.as_str());
                match mode {
                    Some("lfs") => modes.push((upload.path.clone(), true)),
                    Some("regular") => modes.push((upload.path.clone(), false)),
                    _ => return Err(protocol(repo, &url, format!("no upload mode for `{}`", upload.path))),
                }
            }
        }
        Ok(modes)
    }

    /// Uploads the LFS files the server does not have yet, through the git-LFS batch API.
    fn upload_lfs(&self, repo: &RepoId, revision: &str, lfs: &[&Upload]) -> Result<()> {
        if lfs.is_empty() {
            return Ok(());
        }
        let url = format!("{}/{}.git/info/lfs/objects/batch", self.endpoint(), repo);
        let objects: Vec<Value> =
            lfs.iter().map(|upload| json!({ "oid": upload.sha256, "size": upload.size })).collect();
        let body = json!({
            "operation": "upload",
            "transfers": ["basic"],
            "objects": objects,
            "hash_algo": "sha256",
            "ref": { "name": revision },
        })
        .to_string();
        let request = Request::new("POST", url.clone())
            .header("Accept", LFS_JSON)
            .header("Content-Type", LFS_JSON)
            .body(Body::Bytes(body.as_bytes()));
        let answer: LfsBatch = self.expect_json(repo, revision, self.http.send(repo, &request)?)?;
        for object in answer.objects {
            let oid = object.oid;
            let upload = lfs.iter().find(|upload| upload.sha256 == oid);
            let upload =
                upload.ok_or_else(|| protocol(repo, &url, format!("an object `{oid}` that was not asked for")))?;
            if let Some(error) = object.error {
                return Err(Error::Hub {
                    repo: repo.to_string(),
                    problem: HubProblem::Status {
                        url: url.clone(),
                        status: u16::try_from(error.code).unwrap_or(0),
                        message: format!("`{}`: {}", upload.path, error.message.as_deref().unwrap_or("refused")),
                    },
                });
            }
            let Some(actions) = object.actions else { continue };
            if let Some(action) = actions.upload {
                let (href, headers) = lfs_action(action);
                let mut request = Request::new("PUT", href).body(Body::File(&upload.local));
                for (name, value) in headers {
                    request = request.header(name, value);
                }
                let reply = self.http.send(repo, &request)?;
                if !(200..300).contains(&reply.status()) {
                    return Err(refused(repo, &self.http, reply, About { revision, file: Some(&upload.path) }));
                }
            }
            if let Some(action) = actions.verify {
                let (href, headers) = lfs_action(action);
                let body = json!({ "oid": upload.sha256, "size": upload.size }).to_string();
                let mut request = Request::new("POST", href)
                    .header("Content-Type", LFS_JSON)
                    .header("Accept", LFS_JSON)
                    .body(Body::Bytes(body.as_bytes()));
                for (name, value) in headers {
                    request = request.header(name, value);
                }
                let reply = self.http.send(repo, &request)?;
                if !(200..300).contains(&reply.status()) {
                    return Err(refused(repo, &self.http, reply, About { revision, file: Some(&upload.path) }));
                }
            }
        }
        Ok(())
    }

    /// One commit of every file: regular ones inline, LFS ones by their pointer.
    fn commit(
        &self,
        repo: &RepoId,
        revision: &str,
        message: &str,
        regular: &[&Upload],
        lfs: &[&Upload],
    ) -> Result<CommitInfo> {
        let url = format!("{}/api/models/{}/commit/{}", self.endpoint(), repo, encode_segment(revision));
        let mut lines =
            vec![json!({ "key": "header", "value": { "summary": message, "description": "" } }).to_string()];
        for upload in regular {
            let content = std::fs::read(&upload.local).map_err(Error::io("read", &upload.local))?;
            let value = json!({ "content": BASE64.encode(content), "path": upload.path, "encoding": "base64" });
            lines.push(json!({ "key": "file", "value": value }).to_string());
        }
        for upload in lfs {
            let value = json!({ "path": upload.path, "algo": "sha256", "oid": upload.sha256, "size": upload.size });
            lines.push(json!({ "key": "lfsFile", "value": value }).to_string());
        }
        let mut body = lines.join("\n");
        body.push('\n');
        let request = Request::new("POST", url.clone())
            .header("Content-Type", "application/x-ndjson")
            .body(Body::Bytes(body.as_bytes()));
        let answer: CommitAnswer = self.expect_json(repo, revision, self.http.send(repo, &request)?)?;
        Ok(CommitInfo {
            repo: repo.clone(),
            commit: answer.commit,
            url: answer.url,
            regular: regular.iter().map(|upload| upload.path.clone()).collect(),
            lfs: lfs.iter().map(|upload| upload.path.clone()).collect(),
        })
    }

    /// A success's body as a `T` (at most [`super::http::MAX_JSON_BYTES`]), else the refusal.
    fn expect_json<T: DeserializeOwned>(&self, repo: &RepoId, revision: &str, reply: Reply) -> Result<T> {
        if (200..300).contains(&reply.status()) {
            reply.json(repo)
        } else {
            Err(refused(repo, &self.http, reply, About { revision, file: None }))
        }
    }
}

/// An LFS action's `href` and headers.
fn lfs_action(action: LfsAction) -> (String, Vec<(String, String)>) {
    (action.href, action.header.into_iter().collect())
}
