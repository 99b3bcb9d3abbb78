//! A hostile HTTP server for the trust tests: it answers each request as
//! the test says (per request, so it can serve one image to the first open
//! and another to the next), can claim any length, stall, or drop the
//! connection. One request per connection (`Connection: close`), on
//! loopback, stopped when dropped.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Request {
    /// The path (with its query).
    pub path: String,
    /// The asked range (`Range: bytes=A-B`), inclusive.
    pub range: Option<(u64, u64)>,
    /// Whether this request asked for an image's first bytes (a probe:
    /// the first request of every open).
    pub probe: bool,
    /// The request's headers, lower-cased names.
    pub headers: Vec<(String, String)>,
}

/// What to answer.
pub enum Reply {
    /// These bytes as the file at the path (206 for a range, 200 whole).
    File(Arc<Vec<u8>>),
    /// A 206 reply carrying `head` and claiming the file is `total` bytes.
    Claim { head: Vec<u8>, total: u64 },
    /// 404.
    Missing,
    /// Any status line, extra header lines (each ending in CRLF) and body.
    Raw {
        status: String,
        headers: String,
        body: Vec<u8>,
    },
    /// A 200 reply of `len` zero bytes, sent as long as the client reads.
    Flood { len: u64 },
    /// Accept, then say nothing for this long before closing.
    Stall(Duration),
    /// Close without a reply.
    Drop,
}

type Handler = dyn Fn(usize, &Request) -> Reply + Send + Sync;

/// The running server.
pub struct Hostile {
    pub port: u16,
    stop: Arc<AtomicBool>,
    pub seen: Arc<Mutex<Vec<Request>>>,
}

impl Hostile {
    /// Start answering with `f(n, request)`, `n` counting requests from 0.
    pub fn start(f: impl Fn(usize, &Request) -> Reply + Send + Sync + 'static) -> Hostile {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let seen: Arc<Mutex<Vec<Request>>> = Arc::default();
        let f: Arc<Handler> = Arc::new(f);
        let (st, sn) = (stop.clone(), seen.clone());
        std::thread::spawn(move || {
            for c in l.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(c) = c else { continue };
                let (f, sn, st) = (f.clone(), sn.clone(), st.clone());
                std::thread::spawn(move || serve(c, &*f, &sn, &st));
            }
        });
        Hostile { port, stop, seen }
    }

    /// The URL of `path` (starting with '/').
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// How many probes (opens) were answered.
    pub fn probes(&self) -> usize {
        self.seen.lock().unwrap().iter().filter(|r| r.probe).count()
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(mut c: TcpStream, f: &Handler, seen: &Mutex<Vec<Request>>, stop: &AtomicBool) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match c.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => return,
        }
        if head.len() > 64 << 10 {
            return;
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or("");
    let path = first.split(' ').nth(1).unwrap_or("/").to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let range = headers
        .iter()
        .find(|(k, _)| k == "range")
        .and_then(|(_, v)| v.strip_prefix("bytes="))
        .and_then(|v| v.split_once('-'))
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
    let req = Request {
        probe: range.is_some_and(|(a, _)| a == 0),
        path,
        range,
        headers,
    };
    let n = {
        let mut s = seen.lock().unwrap();
        s.push(req.clone());
        s.len() - 1
    };
    let reply = |c: &mut TcpStream, status: &str, extra: &str, body: &[u8]| {
        let h = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
            body.len()
        );
        let _ = c.write_all(h.as_bytes());
        let _ = c.write_all(body);
    };
    match f(n, &req) {
        Reply::File(data) => match req.range {
            Some((a, _)) if a >= data.len() as u64 => reply(
                &mut c,
                "416 Range Not Satisfiable",
                &format!("Content-Range: bytes */{}\r\n", data.len()),
                b"",
            ),
            Some((a, b)) => {
                let e = b.min(data.len() as u64 - 1);
                reply(
                    &mut c,
                    "206 Partial Content",
                    &format!("Content-Range: bytes {a}-{e}/{}\r\n", data.len()),
                    &data[a as usize..=e as usize],
                )
            }
            None => reply(&mut c, "200 OK", "", &data),
        },
        Reply::Claim { head, total } => {
            let (a, _) = req.range.unwrap_or((0, 0));
            let e = a + head.len() as u64 - 1;
            reply(
                &mut c,
                "206 Partial Content",
                &format!("Content-Range: bytes {a}-{e}/{total}\r\n"),
                &head,
            )
        }
        Reply::Missing => reply(&mut c, "404 Not Found", "", b""),
        Reply::Flood { len } => {
            let h =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n");
            let _ = c.write_all(h.as_bytes());
            let zeros = vec![0u8; 64 << 10];
            let mut left = len;
            while left > 0 && !stop.load(Ordering::SeqCst) {
                let n = left.min(zeros.len() as u64) as usize;
                if c.write_all(&zeros[..n]).is_err() {
                    break;
                }
                left -= n as u64;
            }
        }
        Reply::Raw {
            status,
            headers,
            body,
        } => reply(&mut c, &status, &headers, &body),
        Reply::Stall(d) => {
            let until = std::time::Instant::now() + d;
            while std::time::Instant::now() < until && !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Reply::Drop => {}
    }
}
