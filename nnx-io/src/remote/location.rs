//! Parsing locations into a store and an object path, and opening what they name.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};

use super::transport::BoundedConnector;
use super::{Client, RemoteOptions, remote_error};
use crate::archive::Archive;
use crate::error::{Error, RemoteProblem, Result};
use crate::format;
use crate::hub::{self, HubPath};
use crate::text::redact_url;

/// The schemes read as remote locations.
const SCHEMES: [&str; 8] = ["s3", "gs", "gcs", "az", "azure", "http", "https", "hf"];

/// Whether `location` is a URL of a store nnx reads remotely (`s3://`, `gs://`, `az://`,
/// `http(s)://`, `hf://`) rather than a local path.
pub fn is_remote(location: &str) -> bool {
    location.split_once("://").is_some_and(|(scheme, _)| SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()))
}

fn bad(url: &str, problem: RemoteProblem) -> Error {
    Error::Remote { url: redact_url(url), problem }
}

/// The store `url` lives in, and the object's path in it.
pub(crate) fn client(url: &str, options: &RemoteOptions) -> Result<(Arc<Client>, ObjectPath)> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad(url, RemoteProblem::BadUrl { reason: "no scheme".into() }));
    };
    let scheme = scheme.to_ascii_lowercase();
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (authority, key) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.is_empty() {
        return Err(bad(url, RemoteProblem::BadUrl { reason: "no bucket, container or host".into() }));
    }
    let retry = RetryConfig {
        backoff: BackoffConfig::default(),
        max_retries: options.retries,
        retry_timeout: options.deadline(),
    };
    let timeout = format!("{}ms", options.timeout.as_millis());
    let settings = || {
        [("timeout", timeout.as_str()), ("connect_timeout", timeout.as_str())]
            .into_iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .chain(options.config.iter().filter(|(key, _)| !key.starts_with("hf_")).cloned())
    };
    let unknown = |key: &str| bad(url, RemoteProblem::UnknownSetting { key: key.to_string() });
    let built = |result: object_store::Result<Arc<dyn ObjectStore>>| result.map_err(|error| remote_error(url, error));
    // The three cloud stores take the same steps through builders of different types.
    macro_rules! cloud {
        ($builder:expr, $scheme:literal) => {{
            let mut builder = $builder;
            for (key, value) in settings() {
                builder = builder.with_config(key.parse().map_err(|_| unknown(&key))?, value);
            }
            let builder = builder.with_retry(retry).with_http_connector(BoundedConnector);
            let store = built(builder.build().map(|store| Arc::new(store) as _))?;
            (store, format!(concat!($scheme, "://{}"), authority), key.to_string())
        }};
    }
    let (store, root, path): (Arc<dyn ObjectStore>, String, String) = match scheme.as_str() {
        "s3" => cloud!(object_store::aws::AmazonS3Builder::from_env().with_bucket_name(authority), "s3"),
        "gs" | "gcs" => {
            cloud!(object_store::gcp::GoogleCloudStorageBuilder::from_env().with_bucket_name(authority), "gs")
        }
        "az" | "azure" => {
            cloud!(object_store::azure::MicrosoftAzureBuilder::from_env().with_container_name(authority), "az")
        }
        "http" | "https" => {
            let base = format!("{scheme}://{authority}");
            let store = http_store(&base, &scheme, options, retry, None, url)?;
            (store, base, key.to_string())
        }
        "hf" => {
            // The Hub's own grammar, endpoint and token, unless the options name others.
            let hub_path = HubPath::parse(&format!("{}{rest}", HubPath::SCHEME)).map_err(|_| {
                bad(url, RemoteProblem::BadUrl { reason: "expected hf://org/name[@revision][/file]".into() })
            })?;
            let setting =
                |key: &str| options.config.iter().rev().find(|(name, _)| name == key).map(|(_, value)| value.clone());
            let endpoint = setting("hf_endpoint").unwrap_or_else(hub::endpoint);
            let endpoint_scheme = endpoint.split_once("://").map_or("https", |(scheme, _)| scheme).to_string();
            let token = setting("hf_token").or_else(hub::token);
            // Messages name the revision as given; the reads go to the commit it names now.
            let root = hub_path.root().to_string();
            let pinned = pin(hub_path, &endpoint, token.clone(), options, url)?;
            let store = http_store(&pinned.resolve_base(&endpoint), &endpoint_scheme, options, retry, token, url)?;
            (store, root, pinned.path)
        }
        other => {
            return Err(bad(url, RemoteProblem::BadUrl { reason: format!("unsupported scheme `{other}`") }));
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|error| {
        bad(url, RemoteProblem::Transfer { message: format!("cannot start the I/O runtime: {error}") })
    })?;
    let path = ObjectPath::parse(path.trim_end_matches('/'))
        .map_err(|error| bad(url, RemoteProblem::BadUrl { reason: error.to_string() }))?;
    let client = Client {
        store,
        runtime,
        options: options.clone(),
        // Messages and listings name files by this root: it must not carry a password.
        root: redact_url(&root),
        requests: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        cached_bytes: AtomicU64::new(0),
    };
    Ok((Arc::new(client), path))
}

/// `path` at the commit its branch or tag names now, asked of the Hub client as a download
/// asks it: every read of one archive (its header, the shards of an index, the data later)
/// then sees the same files, even when the branch moves in between.
#[cfg(feature = "hub")]
fn pin(path: HubPath, endpoint: &str, token: Option<String>, options: &RemoteOptions, url: &str) -> Result<HubPath> {
    if hub::is_commit(&path.revision) {
        return Ok(path);
    }
    let client = hub::Hub::new(endpoint)
        .with_token(token)
        .with_retries(u32::try_from(options.retries).unwrap_or(u32::MAX), std::time::Duration::from_millis(200));
    let (commit, _) = client.revision(&path.repo, &path.revision).map_err(|error| match error {
        Error::Hub { problem, .. } => bad(url, hub_problem(problem)),
        other => other,
    })?;
    Ok(HubPath { revision: commit, ..path })
}

/// Without the Hub client, each read asks for the revision as given.
#[cfg(not(feature = "hub"))]
fn pin(path: HubPath, _: &str, _: Option<String>, _: &RemoteOptions, _: &str) -> Result<HubPath> {
    Ok(path)
}

/// What the Hub client's refusal means for a remote read, worded as the store's would be.
#[cfg(feature = "hub")]
fn hub_problem(problem: crate::HubProblem) -> RemoteProblem {
    use crate::HubProblem;
    match problem {
        HubProblem::Unauthorized { status: 403, had_token: true, gated: false, .. } => RemoteProblem::Denied,
        HubProblem::Unauthorized { gated: false, .. } => RemoteProblem::Unauthenticated,
        HubProblem::NotFound { .. } => RemoteProblem::NotFound,
        HubProblem::Network { message, .. } => RemoteProblem::Transfer { message },
        // The Hub's own words carry what to do (accept a gated model's terms, for one).
        other => RemoteProblem::Transfer { message: other.to_string() },
    }
}

/// An HTTP store rooted at `base`, sending `token` as a bearer token when given.
fn http_store(
    base: &str,
    scheme: &str,
    options: &RemoteOptions,
    retry: RetryConfig,
    token: Option<String>,
    url: &str,
) -> Result<Arc<dyn ObjectStore>> {
    let mut client = ClientOptions::new()
        .with_timeout(options.timeout)
        .with_connect_timeout(options.timeout)
        .with_allow_http(scheme == "http");
    if let Some(token) = token {
        let mut headers = http::HeaderMap::new();
        let value = format!("Bearer {token}").parse().map_err(|_| {
            bad(url, RemoteProblem::BadUrl { reason: "the Hub token is not a valid header value".into() })
        })?;
        headers.insert("authorization", value);
        client = client.with_default_headers(headers);
    }
    object_store::http::HttpBuilder::new()
        .with_url(base)
        .with_client_options(client)
        .with_retry(retry)
        .with_http_connector(BoundedConnector)
        .build()
        .map(|store| Arc::new(store) as Arc<dyn ObjectStore>)
        .map_err(|error| remote_error(url, error))
}

/// Opens `url`: a file (as [`format::open_object`] reads its name), or a folder holding a
/// SafeTensors shard index or file.
pub(crate) fn open(url: &str, options: &RemoteOptions) -> Result<Archive> {
    let (client, path) = client(url, options)?;
    let name = path.filename().unwrap_or_default().to_string();
    let folder = url.ends_with('/') || name.is_empty() || url.starts_with("hf://") && !name.contains('.');
    if folder {
        for candidate in [format::SAFETENSORS_INDEX, format::SAFETENSORS] {
            let file = path.child(candidate);
            if client.exists(&file)? {
                return format::open_object(client, file);
            }
        }
        return Err(bad(url, RemoteProblem::NoWeights));
    }
    format::open_object(client, path)
}
