//! What went wrong reading a remote location, for [`super::Error::Remote`].

use std::fmt;
use std::ops::Range;

use crate::text::printable;

/// Why a remote location could not be read. Messages never include credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RemoteProblem {
    /// The location is not a URL nnx reads.
    BadUrl {
        /// What is wrong with it.
        reason: String,
    },
    /// A store setting `object_store` does not know.
    UnknownSetting {
        /// The key.
        key: String,
    },
    /// No object there (HTTP 404).
    NotFound,
    /// The credentials are not allowed to read it (HTTP 403).
    Denied,
    /// No valid credentials (HTTP 401).
    Unauthenticated,
    /// The server did not answer in time, after the retries.
    Timeout {
        /// What took too long (the store's message, credentials removed).
        message: String,
    },
    /// Nothing listens at the endpoint: the connection was refused, after the retries.
    Refused {
        /// The host (and port) that refused.
        host: String,
    },
    /// The transfer failed (a dropped connection, a server error), after the retries.
    Transfer {
        /// The store's message, credentials removed (it may quote the server's answer).
        message: String,
    },
    /// The server sent more bytes than were asked for: nnx stopped reading at the first
    /// byte too many.
    TooLong {
        /// Bytes asked for.
        asked: u64,
        /// Bytes the server had sent when nnx stopped reading.
        sent_at_least: u64,
    },
    /// The server ended its answer before sending all the bytes asked for.
    ShortRead {
        /// Bytes asked for.
        asked: u64,
        /// Bytes received.
        received: u64,
    },
    /// The server answered a range request with other bytes than those asked for.
    WrongRange {
        /// The byte range asked for.
        asked: Range<u64>,
        /// The byte range the server said it sent.
        sent: Range<u64>,
    },
    /// An object larger than nnx reads whole (a shard index, which is small).
    TooLarge {
        /// What the object is (`shard index`).
        what: &'static str,
        /// Its size as the server announced it.
        size: u64,
        /// The largest accepted.
        limit: u64,
    },
    /// The memory for an answer could not be reserved.
    NoMemory {
        /// Bytes asked for.
        bytes: u64,
    },
    /// A folder location with neither `model.safetensors.index.json` nor `model.safetensors`.
    NoWeights,
    /// A PyTorch checkpoint: remote reading covers SafeTensors files.
    NotSafeTensors,
    /// An object-store URL given to an nnx built without its `remote` feature.
    NotBuilt,
}

impl fmt::Display for RemoteProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RemoteProblem::BadUrl { reason } => write!(
                f,
                "not a remote location nnx reads ({reason}); use s3://bucket/key, gs://bucket/key, az://container/key, https://host/path or hf://org/name[@revision][/file]"
            ),
            RemoteProblem::UnknownSetting { key } => write!(
                f,
                "`{key}` is not a setting of this store; see object_store's configuration keys (for S3: aws_endpoint, aws_region, aws_allow_http, ...)"
            ),
            RemoteProblem::NotFound => {
                f.write_str("not found (404): check the bucket, the key and, on the Hub, the repository and revision")
            }
            RemoteProblem::Denied => f.write_str(
                "access denied (403): the credentials may not read this object; check them (AWS_ACCESS_KEY_ID, GOOGLE_SERVICE_ACCOUNT, AZURE_STORAGE_ACCOUNT_KEY, HF_TOKEN) and the object's permissions",
            ),
            RemoteProblem::Unauthenticated => f.write_str(
                "not authenticated (401): set the store's credentials in the environment (or HF_TOKEN for a gated Hub repository)",
            ),
            RemoteProblem::Timeout { message } => write!(
                f,
                "timed out after the retries ({}); check the network and the endpoint, or raise RemoteOptions::timeout (NNX_REMOTE_TIMEOUT)",
                printable(message)
            ),
            RemoteProblem::Refused { host } => write!(
                f,
                "connection refused by {}: check the endpoint and that the server runs",
                printable(host)
            ),
            RemoteProblem::Transfer { message } => {
                write!(f, "the transfer failed after the retries ({}); try again, or check the server", printable(message))
            }
            RemoteProblem::TooLong { asked, sent_at_least } => write!(
                f,
                "asked for {asked} bytes, the server sent at least {sent_at_least}; nnx stopped reading: the server is broken or hostile, check the endpoint"
            ),
            RemoteProblem::ShortRead { asked, received } => write!(
                f,
                "asked for {asked} bytes, the server sent {received} and ended its answer; try again, or check the server"
            ),
            RemoteProblem::WrongRange { asked, sent } => write!(
                f,
                "asked for bytes {}..{}, the server answered with bytes {}..{}; the object may have changed while it was read, try again, or check the server",
                asked.start, asked.end, sent.start, sent.end
            ),
            RemoteProblem::TooLarge { what, size, limit } => write!(
                f,
                "the {what} is {size} bytes, over the limit of {limit} bytes nnx reads whole; check that the URL names the right object"
            ),
            RemoteProblem::NoMemory { bytes } => {
                write!(f, "cannot reserve {bytes} bytes of memory for the answer; free memory, or lower RemoteOptions::max_request_bytes")
            }
            RemoteProblem::NotBuilt => f.write_str(
                "this nnx was built without its `remote` feature, which reads object stores: rebuild with it (`cargo install --path nnx-cli --features remote`), or download the file and give its local path",
            ),
            RemoteProblem::NoWeights => f.write_str(
                "the folder has neither `model.safetensors.index.json` nor `model.safetensors`: name the weights file in the URL",
            ),
            RemoteProblem::NotSafeTensors => f.write_str(
                "a PyTorch checkpoint: remote archives read SafeTensors files with range requests; download it and open the local file",
            ),
        }
    }
}
