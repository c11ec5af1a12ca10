//! Why a Hub repository or a cached snapshot cannot be used, for [`super::Error::Hub`].

use std::borrow::Cow;
use std::fmt;
use std::path::PathBuf;

use crate::text::{printable, redact_url};

/// Why a file of a Hub repository could not be had.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum HubProblem {
    /// `repo` is not `name` or `org/name` made of letters, digits, `-`, `_` and `.`.
    BadRepoId,
    /// An `hf://` path that does not parse.
    BadUrl {
        /// What was given.
        given: String,
    },
    /// Offline (`HF_HUB_OFFLINE`, or no `hub` feature) and the cache lacks what the load needs.
    NotCached {
        /// The revision asked for.
        revision: String,
        /// The file, or `None` when the revision itself was never cached.
        file: Option<String>,
        /// The cache looked in.
        cache: PathBuf,
        /// Why the network was not asked.
        why: Offline,
    },
    /// The server refused: the repository is private or gated and the token is missing or lacks
    /// access (401, 403).
    Unauthorized {
        /// The URL asked.
        url: String,
        /// The HTTP status.
        status: u16,
        /// Whether a token was sent.
        had_token: bool,
        /// Whether the server said the repository is gated.
        gated: bool,
    },
    /// The repository, revision or file does not exist (404).
    NotFound {
        /// The URL asked.
        url: String,
        /// What is missing.
        what: Missing,
    },
    /// Any other HTTP status, after the retries for server errors.
    Status {
        /// The URL asked.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The server's message, if any.
        message: String,
    },
    /// The server could not be reached, or the connection broke, after the retries.
    Network {
        /// The URL asked.
        url: String,
        /// The transport's message.
        message: String,
    },
    /// A downloaded file is not what the server said it is.
    Corrupt {
        /// The file in the repository.
        file: String,
        /// What the server announced (a sha256 or a size).
        expected: String,
        /// What arrived.
        found: String,
    },
    /// The server's answer lacks what the protocol requires (a header, a JSON field).
    Protocol {
        /// The URL asked.
        url: String,
        /// What is missing or malformed.
        message: String,
    },
    /// The server sent more bytes than it announced for a file; the download was stopped at
    /// the announced size and discarded.
    Oversized {
        /// The file in the repository.
        file: String,
        /// The URL asked.
        url: String,
        /// The size the server announced, in bytes.
        announced: u64,
    },
    /// A download fell below the minimum transfer rate (`NNX_HUB_MIN_RATE`) and was stopped.
    TooSlow {
        /// The file in the repository.
        file: String,
        /// The URL asked.
        url: String,
        /// The bytes that came in the last window.
        received: u64,
        /// The window, in seconds.
        window_seconds: u64,
        /// The minimum rate, in bytes per second.
        minimum: u64,
    },
    /// A symbolic link in the cache where a real folder or file belongs: written through, it
    /// would put the download (or a lock, a ref) wherever it points.
    Link {
        /// The link.
        path: PathBuf,
        /// What the cache needs there: `folder` or `file`.
        expected: &'static str,
    },
    /// A file in the cache or a folder to upload cannot be used.
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The system's message.
        message: String,
    },
}

/// What a 404 was about, from the Hub's `X-Error-Code` header.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Missing {
    /// The repository.
    Repo,
    /// The revision (branch, tag or commit).
    Revision(String),
    /// A file at a revision.
    File {
        /// The path in the repository.
        file: String,
        /// The revision.
        revision: String,
    },
}

/// Why the network was not asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Offline {
    /// `HF_HUB_OFFLINE` is set.
    Environment,
    /// nnx was built without its `hub` feature.
    NoHubFeature,
    /// The server could not be reached, and the cache was tried instead.
    Unreachable,
}

impl fmt::Display for HubProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HubProblem::BadRepoId => f.write_str(
                "not a repository id: write `name` or `org/name` (letters, digits, `-`, `_`, `.`), or give a folder that exists",
            ),
            HubProblem::BadUrl { given } => {
                let given = text(given);
                write!(f, "`{given}` is not a Hub path: write `hf://org/name`, `hf://org/name@revision` or `hf://org/name@revision/path/in/repo`")
            }
            HubProblem::NotCached { revision, file, cache, why } => {
                let revision = text(revision);
                match file {
                    Some(file) => {
                        let file = text(file);
                        write!(f, "`{file}` at revision `{revision}` is not in the cache `{}`", cache.display())?
                    }
                    None => write!(f, "revision `{revision}` was never downloaded into the cache `{}`", cache.display())?,
                }
                match why {
                    Offline::Environment => f.write_str(
                        " and HF_HUB_OFFLINE is set: unset it to download, or run `nnx download` where the Hub is reachable",
                    ),
                    Offline::NoHubFeature => f.write_str(
                        " and nnx was built without its `hub` feature: enable it to download, or fill the cache with `huggingface-cli download`",
                    ),
                    Offline::Unreachable => f.write_str(
                        " and the Hub cannot be reached: check the network or HF_ENDPOINT, or download it where the Hub is reachable",
                    ),
                }
            }
            HubProblem::Unauthorized { url, status, had_token, gated } => {
                let kind = if *gated { "gated" } else { "private or gated" };
                let url = shown_url(url);
                write!(f, "{url} answered {status}: the repository is {kind}; ")?;
                if *had_token {
                    f.write_str("the token sent has no access: request access on the repository's page, or set HF_TOKEN to a token that has it")
                } else {
                    f.write_str("set HF_TOKEN (or log in so that the token file exists) to a token with access")
                }
            }
            HubProblem::NotFound { url, what } => match (shown_url(url), what) {
                (url, Missing::Repo) => write!(f, "{url} answered 404: no such repository (or it is private: set HF_TOKEN); check the id"),
                (url, Missing::Revision(revision)) => {
                    let revision = text(revision);
                    write!(f, "{url} answered 404: the repository has no revision `{revision}`; name a branch, tag or commit it has")
                }
                (url, Missing::File { file, revision }) => {
                    let (file, revision) = (text(file), text(revision));
                    write!(f, "{url} answered 404: the repository has no file `{file}` at revision `{revision}`")
                }
            },
            HubProblem::Status { url, status, message } => {
                write!(f, "{} answered {status}", shown_url(url))?;
                if !message.is_empty() {
                    write!(f, " ({})", text(message))?;
                }
                if *status == 429 || *status >= 500 {
                    f.write_str(" after retries; try again later")
                } else {
                    f.write_str("; check the repository, the revision and HF_ENDPOINT")
                }
            }
            HubProblem::Network { url, message } => write!(
                f,
                "cannot reach {}: {}; check the network and HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use what is cached",
                shown_url(url),
                text(message)
            ),
            HubProblem::Corrupt { file, expected, found } => write!(
                f,
                "the download of `{}` is damaged: expected {}, found {}; it was discarded, download it again",
                text(file),
                text(expected),
                text(found)
            ),
            HubProblem::Protocol { url, message } => write!(
                f,
                "{} gave an answer the Hub protocol does not allow: {}; check HF_ENDPOINT",
                shown_url(url),
                text(message)
            ),
            HubProblem::Oversized { file, url, announced } => write!(
                f,
                "{} sent more than the {announced} bytes it announced for `{}`; the download was stopped and discarded: check HF_ENDPOINT",
                shown_url(url),
                text(file)
            ),
            HubProblem::TooSlow { file, url, received, window_seconds, minimum } => write!(
                f,
                "the download of `{}` from {} was stopped: {received} bytes in {window_seconds} s is below the minimum of {minimum} bytes/s; try again later, or lower NNX_HUB_MIN_RATE (0 turns the check off)",
                text(file),
                shown_url(url)
            ),
            HubProblem::Link { path, expected } => write!(
                f,
                "`{}` is a symbolic link where the cache needs a real {expected}; delete it and try again",
                text(&path.to_string_lossy())
            ),
            HubProblem::Io { action, path, message } => {
                write!(f, "cannot {action} `{}`: {}", path.display(), text(message))
            }
        }
    }
}

/// Text from a server or a user, with its control characters escaped.
fn text(text: &str) -> Cow<'_, str> {
    printable(text)
}

/// A URL without its userinfo and query, with its control characters escaped.
fn shown_url(url: &str) -> String {
    printable(&redact_url(url)).into_owned()
}
