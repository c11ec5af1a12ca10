//! Remote archives served by a hostile HTTP server: the loopback server of the hostile tests,
//! answering `nnx`'s range requests with floods, lies, trickles and poisoned error pages.
//! Each case runs the command line in a child process under an address-space limit and a
//! timeout, and must end with one clear error, in bounded memory and time, with no password
//! or terminal control sequence printed.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::http_support::answer;
use crate::loopback::{LIFETIME, Request, Server};
use crate::util::{Bounded, run_nnx_bounded};

/// The address space each run of `nnx` gets: far less than the floods it is sent.
const MEMORY: u64 = 3 << 30;

/// The wall-clock limit of each run.
const TIMEOUT: Duration = Duration::from_secs(60);

/// The most a refused run may have held: the answers it refuses are far larger.
const PEAK_LIMIT: u64 = 512 << 20;

/// 2^50 bytes: a petabyte, as a `Content-Length`.
const PETABYTE: u64 = 1 << 50;

/// Writes zeros, 64 KiB at a time, until `total` are written or the client hangs up: a flood
/// sent lazily, never held.
fn flood(stream: &mut TcpStream, total: u64) -> std::io::Result<()> {
    let block = vec![0u8; 64 << 10];
    let until = Instant::now() + LIFETIME;
    let mut sent = 0u64;
    while sent < total && Instant::now() < until {
        let len = (total - sent).min(block.len() as u64) as usize;
        stream.write_all(&block[..len])?;
        sent += len as u64;
    }
    Ok(())
}

/// Sends chunks of `chunked` encoding, without end, until the client hangs up.
fn endless_chunks(stream: &mut TcpStream) -> std::io::Result<()> {
    let chunk = format!("{:x}\r\n{}\r\n", 4096, "0".repeat(4096));
    let until = Instant::now() + LIFETIME;
    while Instant::now() < until {
        stream.write_all(chunk.as_bytes())?;
    }
    Ok(())
}

/// A valid SafeTensors file: one `F32` entry `weight` of two values, its header padded with
/// `padding` spaces.
fn safetensors(padding: usize) -> Vec<u8> {
    let mut header = br#"{"weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#.to_vec();
    header.resize((header.len() + padding).next_multiple_of(8), b' ');
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&header);
    file.extend_from_slice(&[0, 0, 128, 63, 0, 0, 0, 64]);
    file
}

/// The honest answer to `request` for the object `file` at `/model.safetensors`: `HEAD`,
/// ranges and whole reads, with an `ETag`; 404 for anything else.
fn honest(file: &[u8], request: &Request, stream: &mut TcpStream) -> std::io::Result<()> {
    if request.path != "/model.safetensors" {
        return answer(stream, "404 Not Found", &["Content-Length: 0".into()], b"");
    }
    let len = file.len() as u64;
    let tag = "ETag: \"v1\"".to_string();
    match (request.method.as_str(), request.range()) {
        ("HEAD", _) => answer(stream, "200 OK", &[format!("Content-Length: {len}"), tag], b""),
        (_, Some((start, end))) if start < len => {
            let end = end.min(len);
            let headers = [
                format!("Content-Range: bytes {start}-{}/{len}", end - 1),
                format!("Content-Length: {}", end - start),
                tag,
            ];
            answer(stream, "206 Partial Content", &headers, &file[start as usize..end as usize])
        }
        (_, Some(_)) => answer(stream, "416 Range Not Satisfiable", &["Content-Length: 0".into()], b""),
        (_, None) => answer(stream, "200 OK", &[format!("Content-Length: {len}"), tag], file),
    }
}

/// Runs `nnx ARGS` against the servers, with short timeouts and one retry, and prints its
/// peak memory under `case`.
fn nnx(case: &str, args: &[&str]) -> Bounded {
    let envs: [(&str, &std::ffi::OsStr); 4] = [
        ("NNX_REMOTE_TIMEOUT", "3".as_ref()),
        ("NNX_REMOTE_RETRIES", "1".as_ref()),
        ("NO_PROXY", "*".as_ref()),
        ("no_proxy", "*".as_ref()),
    ];
    let started = Instant::now();
    let run = run_nnx_bounded(args, &envs, MEMORY, TIMEOUT);
    eprintln!(
        "hostile remote `{case}`: peak memory {:.1} MiB, {:.1} s, exit {:?}; {}",
        run.peak_memory as f64 / f64::from(1 << 20),
        started.elapsed().as_secs_f64(),
        run.code,
        run.stderr.lines().find(|line| line.starts_with("error:")).unwrap_or("no error")
    );
    run
}

/// The outcome every hostile answer must have, in bounded memory, and the error line.
fn refused(run: &Bounded, url: &str) -> String {
    run.assert_refused(url);
    assert!(run.peak_memory < PEAK_LIMIT, "nnx held {} bytes refusing `{url}`:\n{}", run.peak_memory, run.stderr);
    assert!(!run.stderr.contains('\u{1b}'), "a raw escape sequence reached the terminal:\n{}", run.stderr);
    run.stderr.lines().find(|line| line.starts_with("error:")).unwrap_or_default().to_string()
}

#[test]
fn an_honest_server_is_read() {
    let file = safetensors(0);
    let server = Server::start(move |request, stream| honest(&file, request, stream));
    let url = server.url("model.safetensors");
    let run = nnx("honest", &["inspect", &url]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.contains("weight"), "{}", run.stdout);
}

#[test]
fn a_range_answered_with_a_flood_is_cut_off() {
    let file = safetensors(0);
    let server = Server::start(move |request, stream| {
        let Some((start, end)) = request.range().filter(|_| request.method == "GET") else {
            return honest(&file, request, stream);
        };
        // The right Content-Range, then 1.5 GB.
        let headers = [
            format!("Content-Range: bytes {start}-{}/{}", end - 1, file.len()),
            "Content-Length: 1500000000".into(),
            "ETag: \"v1\"".into(),
        ];
        answer(stream, "206 Partial Content", &headers, b"")?;
        flood(stream, 1_500_000_000)
    });
    let url = server.url("model.safetensors");
    let error = refused(&nnx("flood", &["inspect", &url]), &url);
    assert!(error.contains("asked for 8 bytes, the server sent at least"), "{error}");
}

#[test]
fn a_data_range_answered_with_a_flood_is_cut_off() {
    let file = safetensors(0);
    let data_start = file.len() as u64 - 8;
    let server = Server::start(move |request, stream| match request.range() {
        Some((start, end)) if request.method == "GET" && start >= data_start => {
            let headers = [
                format!("Content-Range: bytes {start}-{}/{}", end - 1, file.len()),
                "Content-Length: 1500000000".into(),
                "ETag: \"v1\"".into(),
            ];
            answer(stream, "206 Partial Content", &headers, b"")?;
            flood(stream, 1_500_000_000)
        }
        _ => honest(&file, request, stream),
    });
    let url = server.url("model.safetensors");
    let out = crate::util::scratch();
    let converted = out.path().join("converted.safetensors");
    let error = refused(&nnx("data flood", &["convert", &url, converted.to_str().unwrap()]), &url);
    assert!(error.contains("the server sent at least"), "{error}");
}

#[test]
fn a_petabyte_content_length_does_not_abort() {
    let file = safetensors(0);
    let server = Server::start(move |request, stream| {
        // The folder's index is absent; its weights file announces a petabyte everywhere.
        if request.path != "/model.safetensors" {
            return answer(stream, "404 Not Found", &["Content-Length: 0".into()], b"");
        }
        let mut headers = vec![format!("Content-Length: {PETABYTE}"), "ETag: \"v1\"".into()];
        match request.range() {
            _ if request.method == "HEAD" => answer(stream, "200 OK", &headers, b""),
            Some((start, end)) => {
                headers.push(format!("Content-Range: bytes {start}-{}/{PETABYTE}", end - 1));
                answer(stream, "206 Partial Content", &headers, &file[..8])?;
                flood(stream, PETABYTE)
            }
            None => answer(stream, "200 OK", &headers, b"").and_then(|()| flood(stream, PETABYTE)),
        }
    });
    let url = server.url("");
    let error = refused(&nnx("petabyte", &["inspect", &url]), &server.url("model.safetensors"));
    assert!(error.contains("asked for 8 bytes"), "{error}");
}

#[test]
fn a_petabyte_index_is_refused_before_it_is_read() {
    let server = Server::start(move |request, stream| {
        let headers = [format!("Content-Length: {PETABYTE}"), "ETag: \"v1\"".into()];
        if request.path != "/model.safetensors.index.json" {
            return answer(stream, "404 Not Found", &["Content-Length: 0".into()], b"");
        }
        answer(stream, "200 OK", &headers, b"")?;
        if request.method == "GET" {
            stream.write_all(b"{\"weight_map\": {")?;
            flood(stream, PETABYTE)?;
        }
        Ok(())
    });
    let url = server.url("");
    let error = refused(&nnx("petabyte index", &["inspect", &url]), &server.url("model.safetensors.index.json"));
    assert!(error.contains("shard index") && error.contains(&PETABYTE.to_string()), "{error}");
}

#[test]
fn a_huge_index_is_refused_with_its_size_and_the_limit() {
    const SIZE: u64 = 100 << 20;
    let server = Server::start(move |request, stream| {
        if request.path != "/model.safetensors.index.json" {
            return answer(stream, "404 Not Found", &["Content-Length: 0".into()], b"");
        }
        answer(stream, "200 OK", &[format!("Content-Length: {SIZE}"), "ETag: \"v1\"".into()], b"")?;
        if request.method == "GET" {
            // A valid index, padded with spaces to 100 MiB.
            let index = br#"{"weight_map": {"weight": "model.safetensors"}}"#;
            stream.write_all(index)?;
            let spaces = vec![b' '; 64 << 10];
            let mut sent = index.len() as u64;
            while sent < SIZE {
                let len = (SIZE - sent).min(spaces.len() as u64) as usize;
                stream.write_all(&spaces[..len])?;
                sent += len as u64;
            }
        }
        Ok(())
    });
    let url = server.url("model.safetensors.index.json");
    let error = refused(&nnx("huge index", &["inspect", &url]), &url);
    assert!(
        error.contains(&SIZE.to_string()) && error.contains(&nnx::remote::MAX_INDEX_BYTES.to_string()),
        "the error gives the size and the limit: {error}"
    );
}

#[test]
fn an_endless_body_is_cut_off() {
    let file = safetensors(0);
    let server = Server::start(move |request, stream| match request.range() {
        // An honest-looking Content-Length, and a chunked body that never ends.
        Some((start, end)) if request.method == "GET" => {
            let headers = [
                format!("Content-Range: bytes {start}-{}/{}", end - 1, file.len()),
                format!("Content-Length: {}", end - start),
                "Transfer-Encoding: chunked".into(),
                "ETag: \"v1\"".into(),
            ];
            answer(stream, "206 Partial Content", &headers, b"")?;
            endless_chunks(stream)
        }
        _ => honest(&file, request, stream),
    });
    let url = server.url("model.safetensors");
    let error = refused(&nnx("endless", &["inspect", &url]), &url);
    assert!(error.contains("the server sent at least"), "{error}");
}

#[test]
fn a_trickle_ends_within_the_deadline() {
    // A header of 1000 bytes, sent one byte a second.
    let file = safetensors(1000);
    let server = Server::start(move |request, stream| match request.range() {
        Some((start, end)) if request.method == "GET" && start >= 8 => {
            let headers = [
                format!("Content-Range: bytes {start}-{}/{}", end - 1, file.len()),
                format!("Content-Length: {}", end - start),
                "ETag: \"v1\"".into(),
            ];
            answer(stream, "206 Partial Content", &headers, b"")?;
            for byte in &file[start as usize..end as usize] {
                stream.write_all(std::slice::from_ref(byte))?;
                std::thread::sleep(Duration::from_secs(1));
            }
            Ok(())
        }
        _ => honest(&file, request, stream),
    });
    let url = server.url("model.safetensors");
    let started = Instant::now();
    let error = refused(&nnx("trickle", &["inspect", &url]), &url);
    // 3 s per attempt, one retry: 6 s, and time to start.
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
    assert!(error.contains("timed out"), "{error}");
}

#[test]
fn a_lying_content_range_is_refused() {
    let file = safetensors(1000);
    let len = file.len();
    let server = Server::start(move |request, stream| match request.range() {
        // The header range, answered as if the object ended halfway through it.
        Some((8, _)) if request.method == "GET" => {
            let headers =
                ["Content-Range: bytes 8-507/508".to_string(), "Content-Length: 500".into(), "ETag: \"v1\"".into()];
            answer(stream, "206 Partial Content", &headers, &file[8..508])
        }
        _ => honest(&file, request, stream),
    });
    let url = server.url("model.safetensors");
    let error = refused(&nnx("lying range", &["inspect", &url]), &url);
    let declared = len - 16;
    assert!(error.contains(&format!("asked for bytes 8..{}", 8 + declared)) && error.contains("8..508"), "{error}");
}

#[test]
fn a_password_in_the_url_is_never_printed() {
    const PASSWORD: &str = "pw-n3ver-printed";
    let server = Server::start(|_, stream| {
        answer(stream, "500 Internal Server Error", &["Content-Length: 4".into(), "Connection: close".into()], b"oops")
    });
    let url = format!("http://user:{PASSWORD}@127.0.0.1:{}/model.safetensors", server.port());
    let run = nnx("password", &["inspect", &url]);
    refused(&run, &server.url("model.safetensors"));
    assert!(!run.stderr.contains(PASSWORD) && !run.stdout.contains(PASSWORD), "{}", run.stderr);
}

#[test]
fn a_refused_connection_says_refused() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}/model.safetensors");
    let error = refused(&nnx("refused", &["inspect", &url]), &url);
    assert!(error.contains("refused") && !error.contains("timed out"), "{error}");
}

#[test]
fn an_error_page_cannot_drive_the_terminal() {
    let server = Server::start(|_, stream| {
        let body = b"\x1b[2J\x1b[Hsomething \x1b]0;owned\x07 went wrong";
        answer(
            stream,
            "400 Bad Request",
            &[format!("Content-Length: {}", body.len()), "Connection: close".into()],
            body,
        )
    });
    let url = server.url("model.safetensors");
    let run = nnx("escape", &["inspect", &url]);
    let error = refused(&run, &url);
    assert!(error.contains("\\u{1b}[2J"), "the page is shown, escaped: {error}");
}

#[test]
fn an_error_page_announcing_a_petabyte_is_cut_short() {
    let server = Server::start(|_, stream| {
        answer(stream, "400 Bad Request", &[format!("Content-Length: {PETABYTE}")], b"")?;
        flood(stream, PETABYTE)
    });
    let url = server.url("model.safetensors");
    refused(&nnx("petabyte error page", &["inspect", &url]), &url);
}
