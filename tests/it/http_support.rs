//! HTTP/1.1 requests read by hand from a connection, for the servers the tests run on loopback
//! (the fake Hub of `hub_server.rs`, the scriptable server of `loopback.rs`): the request line,
//! the headers and a `Content-Length` or chunked body, every read bounded so that a client
//! cannot make a server loop or allocate without end.

use std::io::{self, BufRead, Read, Write};

// Bounds on what a client can make a server read, so that every loop ends.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
const MAX_HEADERS: usize = 128;
const MAX_BODY_BYTES: usize = 256 * 1024 * 1024;
const MAX_CHUNKS: usize = 1 << 20;

/// One request as the server read it.
pub struct Request {
    /// `GET`, `HEAD`, `POST`, `PUT`, ...
    pub method: String,
    /// The request target as sent: the path and any `?query`, still percent-encoded.
    pub path: String,
    /// `HTTP/1.1` or `HTTP/1.0`.
    pub version: String,
    /// The header fields in the order sent, values trimmed.
    pub headers: Vec<(String, String)>,
    /// The body, its chunks joined when it was sent chunked.
    pub body: Vec<u8>,
}

impl Request {
    /// The value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }

    /// The path without the query.
    pub fn path_only(&self) -> &str {
        self.path.split_once('?').map_or(self.path.as_str(), |(path, _)| path)
    }

    /// The query, without its `?`.
    pub fn query(&self) -> &str {
        self.path.split_once('?').map_or("", |(_, query)| query)
    }

    /// The decoded value of query parameter `name`.
    pub fn param(&self, name: &str) -> Option<String> {
        self.query().split('&').find_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(&key.replace('+', " ")).as_deref() == Some(name))
                .then(|| percent_decode(&value.replace('+', " ")))
                .flatten()
        })
    }

    /// Whether query parameter `name` is set to a truthy value, as Python's `True` is sent.
    pub fn flag(&self, name: &str) -> bool {
        self.param(name).is_some_and(|value| matches!(value.to_ascii_lowercase().as_str(), "1" | "true"))
    }

    /// The token of `Authorization: Bearer <token>`.
    pub fn bearer(&self) -> Option<&str> {
        let value = self.header("authorization")?.trim();
        let (scheme, token) = value.split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
    }

    /// Whether the connection stays open after the answer, as the version and `Connection` say.
    pub fn keep_alive(&self) -> bool {
        let tokens = self.header("connection").unwrap_or("").to_ascii_lowercase();
        let has = |word: &str| tokens.split(',').any(|token| token.trim() == word);
        if self.version == "HTTP/1.0" { has("keep-alive") } else { !has("close") }
    }

    /// The `Range: bytes=START-END` asked for, as `(START, END + 1)`.
    pub fn range(&self) -> Option<(u64, u64)> {
        let (start, end) = self.header("range")?.trim().strip_prefix("bytes=")?.split_once('-')?;
        Some((start.parse().ok()?, end.parse::<u64>().ok()? + 1))
    }
}

/// Why no request could be read: the connection ended (or failed), or the bytes are not HTTP.
pub enum ReadError {
    Closed,
    Malformed(&'static str),
}

impl From<io::Error> for ReadError {
    fn from(_: io::Error) -> Self {
        ReadError::Closed
    }
}

/// Writes a response: the status line, `headers` (each `Name: value`) and `body`.
pub fn answer(stream: &mut impl Write, status: &str, headers: &[String], body: &[u8]) -> io::Result<()> {
    let mut head = format!("HTTP/1.1 {status}\r\n");
    for header in headers {
        head.push_str(header);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}

/// Reads one line of at most `budget` bytes (which it decreases), without its line ending.
/// `Ok(None)` on end of stream before any byte.
pub fn read_line(reader: &mut impl BufRead, budget: &mut usize) -> Result<Option<String>, ReadError> {
    let mut line = Vec::new();
    let read = reader.by_ref().take(*budget as u64 + 1).read_until(b'\n', &mut line)?;
    if read == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        return Err(if read > *budget { ReadError::Malformed("request head too large") } else { ReadError::Closed });
    }
    *budget -= read;
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    String::from_utf8(line).map(Some).map_err(|_| ReadError::Malformed("request head is not UTF-8"))
}

/// Reads one request, answering `Expect: 100-continue` before its body. `Ok(None)` when the
/// client closed the connection between requests.
pub fn read_request(reader: &mut impl BufRead, writer: &mut impl Write) -> Result<Option<Request>, ReadError> {
    let mut budget = MAX_HEAD_BYTES;
    let mut request_line = None;
    // Tolerate the empty lines RFC 9112 lets a server skip before a request line.
    for _ in 0..4 {
        match read_line(reader, &mut budget)? {
            None => return Ok(None),
            Some(line) if line.is_empty() => continue,
            Some(line) => {
                request_line = Some(line);
                break;
            }
        }
    }
    let request_line = request_line.ok_or(ReadError::Malformed("no request line"))?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ReadError::Malformed("malformed request line"));
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Err(ReadError::Malformed("only HTTP/1.x origin-form requests are served"));
    }
    let mut headers = Vec::new();
    loop {
        let line = read_line(reader, &mut budget)?.ok_or(ReadError::Closed)?;
        if line.is_empty() {
            break;
        }
        if headers.len() == MAX_HEADERS {
            return Err(ReadError::Malformed("too many headers"));
        }
        let (name, value) = line.split_once(':').ok_or(ReadError::Malformed("malformed header line"))?;
        if name.is_empty() || name.ends_with(' ') || name.starts_with([' ', '\t']) {
            return Err(ReadError::Malformed("malformed header name"));
        }
        headers.push((name.to_owned(), value.trim().to_owned()));
    }
    let mut request = Request {
        method: method.to_owned(),
        path: target.to_owned(),
        version: version.to_owned(),
        headers,
        body: Vec::new(),
    };
    let chunked = match request.header("transfer-encoding") {
        Some(codings) if codings.rsplit(',').next().is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked")) => {
            true
        }
        Some(_) => return Err(ReadError::Malformed("unsupported transfer coding")),
        None => false,
    };
    let length = match (chunked, request.header("content-length")) {
        (false, Some(length)) => {
            length.parse::<usize>().map_err(|_| ReadError::Malformed("malformed Content-Length"))?
        }
        _ => 0,
    };
    if length > MAX_BODY_BYTES {
        return Err(ReadError::Malformed("request body too large"));
    }
    let expects_continue = request.header("expect").is_some_and(|value| value.eq_ignore_ascii_case("100-continue"));
    if expects_continue && request.version == "HTTP/1.1" && (chunked || length > 0) {
        writer.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
        writer.flush()?;
    }
    request.body = if chunked {
        read_chunked(reader)?
    } else {
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        body
    };
    Ok(Some(request))
}

fn read_chunked(reader: &mut impl BufRead) -> Result<Vec<u8>, ReadError> {
    let mut body = Vec::new();
    for _ in 0..MAX_CHUNKS {
        let mut budget = 1024;
        let line = read_line(reader, &mut budget)?.ok_or(ReadError::Closed)?;
        let size = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16).map_err(|_| ReadError::Malformed("malformed chunk size"))?;
        if size == 0 {
            // Trailer fields, up to the empty line that ends the message; they are not kept.
            let mut budget = MAX_HEAD_BYTES;
            while !read_line(reader, &mut budget)?.ok_or(ReadError::Closed)?.is_empty() {}
            return Ok(body);
        }
        if body.len().saturating_add(size) > MAX_BODY_BYTES {
            return Err(ReadError::Malformed("request body too large"));
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..])?;
        let mut budget = 2;
        if read_line(reader, &mut budget)?.is_none_or(|rest| !rest.is_empty()) {
            return Err(ReadError::Malformed("chunk not followed by CRLF"));
        }
    }
    Err(ReadError::Malformed("too many chunks"))
}

/// `text` with its `%XX` escapes decoded, `None` for a broken escape or bytes that are not UTF-8.
pub fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let digits = bytes.get(index + 1..index + 3).filter(|digits| digits.iter().all(u8::is_ascii_hexdigit))?;
            decoded.push(u8::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()?);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(decoded).ok()
}
