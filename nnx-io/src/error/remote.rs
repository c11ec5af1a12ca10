//! What went wrong reading a remote location, for [`super::Error::Remote`].

use std::fmt;

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
        /// The store's message.
        message: String,
    },
    /// The transfer failed (a dropped connection, a server error), after the retries.
    Transfer {
        /// The store's message.
        message: String,
    },
    /// A folder location with neither `model.safetensors.index.json` nor `model.safetensors`.
    NoWeights,
    /// A PyTorch checkpoint: remote reading covers SafeTensors files.
    NotSafeTensors,
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
                "timed out after the retries ({message}); check the network and the endpoint, or raise RemoteOptions::timeout"
            ),
            RemoteProblem::Transfer { message } => {
                write!(f, "the transfer failed after the retries ({message}); try again, or check the server")
            }
            RemoteProblem::NoWeights => f.write_str(
                "the folder has neither `model.safetensors.index.json` nor `model.safetensors`: name the weights file in the URL",
            ),
            RemoteProblem::NotSafeTensors => f.write_str(
                "a PyTorch checkpoint: remote archives read SafeTensors files with range requests; download it and open the local file",
            ),
        }
    }
}
