//! HTTP for the Hub client: one agent that never follows redirects by itself (the Hub's
//! protocol reads headers off the redirect), retries with backoff on server errors and
//! timeouts, sends the token to the Hub's own origin only, and turns refusals into errors that
//! say what to do.

use std::time::Duration;

use ureq::http::{HeaderMap, Response};

use super::{RepoId, answers};
use crate::error::{HubProblem, Missing};
use crate::text::{redact_url, redact_urls};
use crate::{Error, Result};

/// The most a JSON answer may hold: the Hub's largest listings are a few MiB.
pub(crate) const MAX_JSON_BYTES: u64 = 64 << 20;

/// The most of an error body that is read for its message.
const MAX_ERROR_BYTES: u64 = 1 << 16;

/// An answer, with the URL that gave it.
pub(crate) struct Reply {
    pub(crate) url: String,
    pub(crate) response: Response<ureq::Body>,
}

impl Reply {
    pub(crate) fn status(&self) -> u16 {
        self.response.status().as_u16()
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        header(self.response.headers(), name)
    }

    /// The body of a JSON answer, at most [`MAX_JSON_BYTES`]: a longer one (announced, or
    /// found while reading) is refused without reading the rest.
    pub(crate) fn json_bytes(mut self, repo: &RepoId) -> Result<(String, Vec<u8>)> {
        let too_long = |url: &str| {
            let message = format!("the answer is longer than the {} MiB nnx reads", MAX_JSON_BYTES >> 20);
            protocol(repo, url, message)
        };
        let announced = self.header("content-length").and_then(|length| length.trim().parse::<u64>().ok());
        if announced.is_some_and(|length| length > MAX_JSON_BYTES) {
            return Err(too_long(&self.url));
        }
        match self.response.body_mut().with_config().limit(MAX_JSON_BYTES).read_to_vec() {
            Ok(bytes) => Ok((self.url, bytes)),
            Err(ureq::Error::BodyExceedsLimit(_)) => Err(too_long(&self.url)),
            Err(error) => Err(Error::Hub {
                repo: repo.to_string(),
                problem: HubProblem::Network { url: redact_url(&self.url), message: transport_message(&error) },
            }),
        }
    }

    /// The body as a `T` (unknown fields skipped, nothing built that `T` does not hold).
    pub(crate) fn json<T: serde::de::DeserializeOwned>(self, repo: &RepoId) -> Result<T> {
        let (url, bytes) = self.json_bytes(repo)?;
        answers::parse(&bytes).map_err(|message| protocol(repo, &url, message))
    }
}

/// What a transport failure was, in words, without the credentials or signed queries of the
/// URLs it names: a refused connection is told from a timeout.
pub(crate) fn transport_message(error: &ureq::Error) -> String {
    match error {
        ureq::Error::ConnectionFailed => "connection refused".to_string(),
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            "connection refused: nothing listens at that address".to_string()
        }
        ureq::Error::Timeout(which) => format!("timed out ({which})"),
        ureq::Error::HostNotFound => "host not found".to_string(),
        other => redact_urls(&other.to_string()),
    }
}

pub(crate) fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

pub(crate) fn protocol(repo: &RepoId, url: &str, message: String) -> Error {
    Error::Hub { repo: repo.to_string(), problem: HubProblem::Protocol { url: redact_url(url), message } }
}

/// A request to send: method, URL, headers and an optional body.
pub(crate) struct Request<'a> {
    pub(crate) method: &'static str,
    pub(crate) url: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Body<'a>,
}

/// What a request carries.
pub(crate) enum Body<'a> {
    None,
    Bytes(&'a [u8]),
    File(&'a std::path::Path),
}

impl<'a> Request<'a> {
    pub(crate) fn new(method: &'static str, url: impl Into<String>) -> Request<'a> {
        Request { method, url: url.into(), headers: Vec::new(), body: Body::None }
    }

    pub(crate) fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Request<'a> {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub(crate) fn body(mut self, body: Body<'a>) -> Request<'a> {
        self.body = body;
        self
    }
}

/// The transport: an agent, the token, and the retry policy.
#[derive(Clone)]
pub(crate) struct Http {
    agent: ureq::Agent,
    /// The Hub's origin (`scheme://host:port`): the token goes there and nowhere else.
    origin: String,
    pub(crate) token: Option<String>,
    /// Tries after the first.
    pub(crate) retries: u32,
    /// The first wait; each retry doubles it.
    pub(crate) backoff: Duration,
}

/// Seconds from an environment variable, else `default`.
fn seconds(name: &str, default: f64) -> Duration {
    let value = std::env::var(name).ok().and_then(|text| text.trim().parse::<f64>().ok());
    Duration::from_secs_f64(value.filter(|v| v.is_finite() && *v > 0.0).unwrap_or(default))
}

pub(crate) fn origin_of(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |at| at + 3);
    let end = url[after_scheme..].find('/').map_or(url.len(), |at| after_scheme + at);
    &url[..end]
}

/// The TLS provider the build has: the system's on Apple platforms, rustls elsewhere.
fn tls() -> ureq::tls::TlsConfig {
    #[cfg(target_vendor = "apple")]
    let provider = ureq::tls::TlsProvider::NativeTls;
    #[cfg(not(target_vendor = "apple"))]
    let provider = ureq::tls::TlsProvider::Rustls;
    ureq::tls::TlsConfig::builder().provider(provider).build()
}

impl Http {
    pub(crate) fn new(endpoint: &str, token: Option<String>) -> Http {
        // `HF_HUB_DOWNLOAD_TIMEOUT` and `HF_HUB_ETAG_TIMEOUT` mean what they mean for
        // `huggingface_hub`: the longest wait for bytes, and for an answer.
        let read = seconds("HF_HUB_DOWNLOAD_TIMEOUT", 10.0);
        let answer = seconds("HF_HUB_ETAG_TIMEOUT", 10.0).max(read);
        let config = ureq::Agent::config_builder()
            .max_redirects(0)
            .http_status_as_error(false)
            .timeout_connect(Some(answer))
            .timeout_recv_response(Some(answer))
            .timeout_per_read(Some(read))
            .timeout_per_write(Some(Duration::from_secs(120)))
            .user_agent(concat!("nnx/", env!("CARGO_PKG_VERSION")))
            .tls_config(tls())
            .build();
        Http {
            agent: ureq::Agent::new_with_config(config),
            origin: origin_of(endpoint).to_string(),
            token,
            retries: 4,
            backoff: Duration::from_millis(250),
        }
    }

    /// The wait before retry number `attempt` (0-based).
    pub(crate) fn wait(&self, attempt: u32) -> Duration {
        self.backoff.saturating_mul(1 << attempt.min(10))
    }

    /// Sends once; a transport failure is the error's text.
    fn send_once(&self, request: &Request<'_>) -> std::result::Result<Response<ureq::Body>, String> {
        let mut builder = ureq::http::Request::builder().method(request.method).uri(&request.url);
        for (name, value) in &request.headers {
            builder = builder.header(name.as_str(), value.as_str());
        }
        if let Some(token) = &self.token
            && origin_of(&request.url) == self.origin
        {
            builder = builder.header("Authorization", format!("Bearer {token}"));
        }
        let result = match request.body {
            Body::None => builder.body(()).map(|request| self.agent.run(request)),
            Body::Bytes(bytes) => builder.body(bytes).map(|request| self.agent.run(request)),
            Body::File(path) => {
                let file =
                    std::fs::File::open(path).map_err(|error| format!("cannot open `{}`: {error}", path.display()))?;
                builder.body(file).map(|request| self.agent.run(request))
            }
        };
        result.map_err(|error| redact_urls(&error.to_string()))?.map_err(|error| transport_message(&error))
    }

    /// Sends, retrying transport failures, 429 and 5xx with backoff. Any other status comes back
    /// as it is, for the caller to read.
    pub(crate) fn send(&self, repo: &RepoId, request: &Request<'_>) -> Result<Reply> {
        let mut attempt = 0;
        loop {
            let outcome = self.send_once(request);
            let retry = match &outcome {
                Ok(response) => matches!(response.status().as_u16(), 429 | 500..=599),
                Err(_) => true,
            };
            if !retry || attempt >= self.retries {
                return match outcome {
                    Ok(response) => Ok(Reply { url: request.url.clone(), response }),
                    Err(message) => Err(Error::Hub {
                        repo: repo.to_string(),
                        problem: HubProblem::Network { url: redact_url(&request.url), message },
                    }),
                };
            }
            std::thread::sleep(self.wait(attempt));
            attempt += 1;
        }
    }

    /// Whether a token is sent to `url`.
    pub(crate) fn has_token_for(&self, url: &str) -> bool {
        self.token.is_some() && origin_of(url) == self.origin
    }
}

/// What a request was about, to name it when the server says 404.
pub(crate) struct About<'a> {
    pub(crate) revision: &'a str,
    pub(crate) file: Option<&'a str>,
}

/// The error for a status that is not success.
pub(crate) fn refused(repo: &RepoId, http: &Http, mut reply: Reply, about: About<'_>) -> Error {
    let status = reply.status();
    let code = reply.header("x-error-code").unwrap_or_default().to_string();
    let message = reply
        .header("x-error-message")
        .map(str::to_string)
        .or_else(|| {
            let bytes = reply.response.body_mut().with_config().limit(MAX_ERROR_BYTES).read_to_vec().ok()?;
            answers::error_message(&bytes)
        })
        .unwrap_or_default();
    let had_token = http.has_token_for(&reply.url);
    let url = redact_url(&reply.url);
    let problem = match status {
        401 | 403 if !(had_token && code == "RepoNotFound") => {
            HubProblem::Unauthorized { url, status, had_token, gated: code == "GatedRepo" }
        }
        401 | 404 => {
            let what = match (code.as_str(), about.file) {
                ("RepoNotFound", _) => Missing::Repo,
                ("RevisionNotFound", _) => Missing::Revision(about.revision.to_string()),
                (_, Some(file)) => Missing::File { file: file.to_string(), revision: about.revision.to_string() },
                (_, None) => Missing::Revision(about.revision.to_string()),
            };
            HubProblem::NotFound { url, what }
        }
        _ => HubProblem::Status { url, status, message },
    };
    Error::Hub { repo: repo.to_string(), problem }
}

/// Percent-encodes one path segment (a revision such as `refs/pr/1` becomes one segment).
pub(crate) fn encode_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Percent-encodes a path in a repository, keeping its `/`.
pub(crate) fn encode_path(path: &str) -> String {
    path.split('/').map(encode_segment).collect::<Vec<_>>().join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_and_encodings() {
        assert_eq!(origin_of("http://127.0.0.1:8080/org/x/resolve/main/a"), "http://127.0.0.1:8080");
        assert_eq!(origin_of("https://huggingface.co"), "https://huggingface.co");
        assert_eq!(encode_segment("refs/pr/1"), "refs%2Fpr%2F1");
        assert_eq!(encode_path("sub dir/a+b.json"), "sub%20dir/a%2Bb.json");
    }
}
