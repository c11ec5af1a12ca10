//! A scriptable HTTP/1.1 server on `127.0.0.1` for the hostile-input tests: each request's head
//! is parsed and handed to the test's handler, which writes whatever answer it likes (a lie, a
//! flood, a trickle) straight to the connection. Every loop is bounded: a connection answers at
//! most [`MAX_REQUESTS`] requests, and the server stops accepting when dropped or after
//! [`LIFETIME`].

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a server accepts connections and a connection is served.
pub const LIFETIME: Duration = Duration::from_secs(120);
/// The most requests one connection is answered.
const MAX_REQUESTS: usize = 100;
/// The longest request head read.
const MAX_HEAD_BYTES: usize = 64 << 10;

/// A request's method, path and headers as the server saw them.
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl Request {
    /// The value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }

    /// The `Range: bytes=START-END` asked for, as `(START, END + 1)`.
    pub fn range(&self) -> Option<(u64, u64)> {
        let (start, end) = self.header("range")?.trim().strip_prefix("bytes=")?.split_once('-')?;
        Some((start.parse().ok()?, end.parse::<u64>().ok()? + 1))
    }
}

/// What answers one request: it writes to the connection, and an error closes it.
type Handler = dyn Fn(&Request, &mut TcpStream) -> std::io::Result<()> + Send + Sync;

/// A server on a free loopback port, each connection on a thread of its own.
pub struct Server {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl Server {
    pub fn start(handler: impl Fn(&Request, &mut TcpStream) -> std::io::Result<()> + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Arc<Handler> = Arc::new(handler);
        let stopped = stop.clone();
        std::thread::spawn(move || {
            let until = Instant::now() + LIFETIME;
            while !stopped.load(Ordering::Relaxed) && Instant::now() < until {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (handler, stopped) = (handler.clone(), stopped.clone());
                        std::thread::spawn(move || serve(stream, &*handler, &stopped, until));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Server { port, stop }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `http://127.0.0.1:PORT/path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.endpoint())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Answers the requests of one connection until it closes, fails or outlives the server.
fn serve(mut stream: TcpStream, handler: &Handler, stop: &AtomicBool, until: Instant) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(30)));
    for _ in 0..MAX_REQUESTS {
        if stop.load(Ordering::Relaxed) || Instant::now() > until {
            return;
        }
        let Some(request) = read_request(&mut stream) else { return };
        if handler(&request, &mut stream).and_then(|()| stream.flush()).is_err() {
            return;
        }
    }
}

/// Reads one request's head.
fn read_request(stream: &mut TcpStream) -> Option<Request> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > MAX_HEAD_BYTES || stream.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head);
    let mut lines = text.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, path) = (first.next()?.to_string(), first.next()?.to_string());
    let headers = lines
        .take_while(|line| !line.is_empty())
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_string(), value.trim().to_string()))
        .collect();
    Some(Request { method, path, headers })
}
