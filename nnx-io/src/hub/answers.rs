//! The Hub's JSON answers, read straight into typed structs: fields nnx does not use are
//! skipped without being built, and the one list that grows with a repository (its files) is
//! capped, so a hostile answer costs at most its own size in memory.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, SeqAccess, Visitor};

use super::cache::{is_commit, safe_relative};
use crate::text::printable;

/// The most files a revision listing may name (the Hub's largest repositories hold far fewer).
pub(crate) const MAX_SIBLINGS: usize = 1_000_000;

/// `GET /api/models/{repo}/revision/{revision}`.
#[derive(Deserialize)]
struct RevisionInfo {
    sha: String,
    #[serde(default, deserialize_with = "bounded_siblings")]
    siblings: Vec<Sibling>,
}

#[derive(Deserialize)]
struct Sibling {
    rfilename: String,
}

/// The `siblings` list, refused once it passes [`MAX_SIBLINGS`] entries.
fn bounded_siblings<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Sibling>, D::Error> {
    struct Bounded;
    impl<'de> Visitor<'de> for Bounded {
        type Value = Vec<Sibling>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a list of at most {MAX_SIBLINGS} files")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Sibling>, A::Error> {
            let mut siblings = Vec::new();
            while let Some(sibling) = seq.next_element()? {
                if siblings.len() == MAX_SIBLINGS {
                    return Err(de::Error::custom(format!("`siblings` names more than {MAX_SIBLINGS} files")));
                }
                siblings.push(sibling);
            }
            Ok(siblings)
        }
    }
    deserializer.deserialize_seq(Bounded)
}

/// The commit a revision listing names and its files, each checked to be a relative path that
/// stays in the repository.
///
/// # Errors
/// What is wrong with the answer, for [`crate::error::HubProblem::Protocol`].
pub(crate) fn revision(bytes: &[u8]) -> Result<(String, Vec<String>), String> {
    let info: RevisionInfo = parse(bytes)?;
    if !is_commit(&info.sha) {
        return Err(format!("`sha` is `{}`, not a commit hash", printable(&info.sha)));
    }
    let mut files = Vec::with_capacity(info.siblings.len());
    for sibling in info.siblings {
        if !safe_relative(&sibling.rfilename) {
            return Err(format!(
                "the file name `{}` is not a relative path that stays in the repository",
                printable(&sibling.rfilename)
            ));
        }
        files.push(sibling.rfilename);
    }
    Ok((info.sha, files))
}

/// `POST /api/models/{repo}/preupload/{revision}`: how each file goes up.
#[derive(Deserialize)]
pub(crate) struct Preupload {
    pub(crate) files: Vec<PreuploadFile>,
}

#[derive(Deserialize)]
pub(crate) struct PreuploadFile {
    pub(crate) path: String,
    #[serde(rename = "uploadMode")]
    pub(crate) upload_mode: String,
}

/// The git-LFS batch answer.
#[derive(Deserialize)]
pub(crate) struct LfsBatch {
    pub(crate) objects: Vec<LfsObject>,
}

#[derive(Deserialize)]
pub(crate) struct LfsObject {
    #[serde(default)]
    pub(crate) oid: String,
    pub(crate) actions: Option<LfsActions>,
    pub(crate) error: Option<LfsError>,
}

#[derive(Deserialize)]
pub(crate) struct LfsActions {
    pub(crate) upload: Option<LfsAction>,
    pub(crate) verify: Option<LfsAction>,
}

/// Where to send an object, and the headers to send with it.
#[derive(Deserialize)]
pub(crate) struct LfsAction {
    pub(crate) href: String,
    #[serde(default)]
    pub(crate) header: BTreeMap<String, String>,
}

#[derive(Deserialize)]
pub(crate) struct LfsError {
    #[serde(default)]
    pub(crate) code: u64,
    pub(crate) message: Option<String>,
}

/// `POST /api/models/{repo}/commit/{revision}`.
#[derive(Deserialize)]
pub(crate) struct CommitAnswer {
    #[serde(rename = "commitOid")]
    pub(crate) commit: String,
    #[serde(rename = "commitUrl", default)]
    pub(crate) url: String,
}

/// An error body, `{"error": "..."}`.
#[derive(Deserialize)]
struct ErrorBody {
    error: String,
}

/// The message of an error body, when it is one.
pub(crate) fn error_message(bytes: &[u8]) -> Option<String> {
    serde_json::from_slice::<ErrorBody>(bytes).ok().map(|body| body.error)
}

/// `bytes` as a `T`.
///
/// # Errors
/// serde_json's message (it names the line and column).
pub(crate) fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    serde_json::from_slice(bytes).map_err(|error| format!("the body is not the JSON expected ({error})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listings_are_typed_checked_and_capped() {
        let sha = "a".repeat(40);
        let body = format!(
            r#"{{"sha":"{sha}","extra":{{"deep":[1,2,{{}}]}},"siblings":[{{"rfilename":"a/b.json","size":3}}]}}"#
        );
        assert_eq!(revision(body.as_bytes()), Ok((sha.clone(), vec!["a/b.json".to_string()])));
        assert!(revision(br#"{"sha":"main"}"#).unwrap_err().contains("not a commit"));
        let escape = format!(r#"{{"sha":"{sha}","siblings":[{{"rfilename":"../x"}}]}}"#);
        assert!(revision(escape.as_bytes()).unwrap_err().contains("`../x`"));
        let many =
            format!(r#"{{"sha":"{sha}","siblings":[{}]}}"#, vec![r#"{"rfilename":"f"}"#; MAX_SIBLINGS + 1].join(","));
        assert!(revision(many.as_bytes()).unwrap_err().contains("more than"));
        assert_eq!(error_message(br#"{"error":"no"}"#).as_deref(), Some("no"));
        assert_eq!(error_message(br#"{"error":1}"#), None);
    }
}
