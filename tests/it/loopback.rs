//! A scriptable HTTP/1.1 server on `127.0.0.1` for the hostile-input tests: each request is read
//! (by `http_support`) and handed to the test's handler, which writes whatever answer it likes
//! (a lie, a flood, a trickle) straight to the connection. Every loop is bounded: a connection
//! answers at most [`MAX_REQUESTS`] requests, and the server stops accepting when dropped or
//! after [`LIFETIME`].

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use crate::http_support::Request;
use crate::http_support::read_request;

/// How long a server accepts connections and a connection is served.
pub const LIFETIME: Duration = Duration::from_secs(120);
/// The most requests one connection is answered.
const MAX_REQUESTS: usize = 100;

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
fn serve(stream: TcpStream, handler: &Handler, stop: &AtomicBool, until: Instant) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(30)));
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    for _ in 0..MAX_REQUESTS {
        if stop.load(Ordering::Relaxed) || Instant::now() > until {
            return;
        }
        let Ok(Some(request)) = read_request(&mut reader, &mut writer) else { return };
        if handler(&request, &mut writer).and_then(|()| writer.flush()).is_err() {
            return;
        }
    }
}
