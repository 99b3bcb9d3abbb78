//! Images over SSH: byte ranges through SFTP (protocol version 3) spoken to
//! the user's own OpenSSH client (`ssh -s HOST sftp`), so `~/.ssh/config`,
//! the agent, `known_hosts`, ProxyJump and ControlMaster apply exactly as
//! for `ssh` and `rsync`.
//!
//! * URL: `ssh://[USER@]HOST[:PORT]/PATH` (absolute) or `.../~/PATH`
//!   (relative to the login directory). `$SHEAF_SSH` replaces the `ssh`
//!   command (split on whitespace, like rsync's `-e`).
//! * Many requests in flight: a range is cut at the server's maximum read
//!   size (`limits@openssh.com`, else 32 KiB) and up to [`IN_FLIGHT`] reads
//!   are outstanding per caller; concurrent callers share the connection.
//!   There is no reader thread: whichever caller waits reads replies for
//!   everyone (leader/follower), so the connection survives the mount's
//!   `fork` into the background and a user namespace can still be entered.
//! * Failures: a dead connection (ssh exited, a reply overdue past the
//!   request timeout) is dropped and a new one made, with the HTTP client's
//!   rule: retries with capped backoff until the deadline, so an outage
//!   shorter than `--timeout` is only a wait. The first connection may
//!   prompt on the terminal; later ones run with `BatchMode=yes`. After a
//!   reconnect the image's length and header (which holds its root digest)
//!   must be what they were, or reads fail.
//! * Errors that waiting cannot fix (host key, authentication, no such
//!   file) fail at once, with ssh's own last line of stderr.

use crate::http::{Backoff, HttpOptions, NetStats, Want};
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const FXP_INIT: u8 = 1;
const FXP_VERSION: u8 = 2;
const FXP_OPEN: u8 = 3;
const FXP_CLOSE: u8 = 4;
const FXP_READ: u8 = 5;
const FXP_FSTAT: u8 = 8;
const FXP_STATUS: u8 = 101;
const FXP_HANDLE: u8 = 102;
const FXP_DATA: u8 = 103;
const FXP_ATTRS: u8 = 105;
const FXP_EXTENDED: u8 = 200;
const FXP_EXTENDED_REPLY: u8 = 201;
const FX_EOF: u32 = 1;
const FX_NO_SUCH_FILE: u32 = 2;
const FX_PERMISSION_DENIED: u32 = 3;
const FXF_READ: u32 = 1;
const ATTR_SIZE: u32 = 1;

/// Reads outstanding per caller (OpenSSH's `sftp` uses 64).
pub const IN_FLIGHT: usize = 64;
/// The read size every server accepts (the draft's minimum packet).
const DEFAULT_MAX_READ: u32 = 32 * 1024;
/// Largest read asked for even if the server allows more.
const MAX_READ_CAP: u32 = 1 << 20;
/// Largest reply accepted: a hostile server cannot make us allocate more.
const MAX_PACKET: usize = (MAX_READ_CAP as usize) + 1024;
/// Bytes of the image compared after a reconnect (the header: magic,
/// version, root digest).
const HEADER_CHECK: usize = sheaf_format::HEADER_LEN;

/// Where an `ssh://` URL points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshTarget {
    /// Login name, if given.
    pub user: Option<String>,
    /// Host name or address (as ssh resolves it: `~/.ssh/config` aliases
    /// work).
    pub host: String,
    /// Port, if given.
    pub port: Option<u16>,
    /// Path on the server (relative paths are from the login directory).
    pub path: String,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Parse `ssh://[USER@]HOST[:PORT]/PATH`.
pub fn parse_url(url: &str) -> io::Result<SshTarget> {
    let rest = url
        .strip_prefix("ssh://")
        .ok_or_else(|| invalid(format!("'{url}' is not an ssh:// URL")))?;
    let (auth, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => return Err(invalid(format!("'{url}': no path after the host"))),
    };
    let (user, hostport) = match auth.rsplit_once('@') {
        Some((u, h)) => (Some(u.to_string()), h),
        None => (None, auth),
    };
    let (host, port) = if let Some(r) = hostport.strip_prefix('[') {
        let (h, after) = r
            .split_once(']')
            .ok_or_else(|| invalid(format!("'{url}': unclosed '[' in the host")))?;
        (h.to_string(), after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (hostport.to_string(), None),
        }
    };
    let port = match port {
        Some(p) => Some(
            p.parse::<u16>()
                .map_err(|_| invalid(format!("'{url}': bad port '{p}'")))?,
        ),
        None => None,
    };
    if host.is_empty()
        || host.starts_with('-')
        || user
            .as_deref()
            .is_some_and(|u| u.is_empty() || u.starts_with('-'))
    {
        return Err(invalid(format!("'{url}': bad user or host")));
    }
    let path = match path.strip_prefix("/~/") {
        Some(rel) => rel.to_string(),
        None => path.to_string(),
    };
    if path.is_empty() || path.ends_with('/') {
        return Err(invalid(format!("'{url}': the path must name a file")));
    }
    Ok(SshTarget {
        user,
        host,
        port,
        path,
    })
}

/// The `ssh` command line for `t` (without the subsystem arguments).
fn ssh_command(t: &SshTarget, batch: bool, connect_timeout: Duration) -> Command {
    let custom = std::env::var("SHEAF_SSH")
        .ok()
        .filter(|s| !s.trim().is_empty());
    let words: Vec<String> = match &custom {
        Some(s) => s.split_whitespace().map(String::from).collect(),
        None => vec!["ssh".into()],
    };
    let mut c = Command::new(&words[0]);
    c.args(&words[1..]);
    // A dead server is noticed within about 30 s even with no request
    // outstanding; reads have their own, shorter, timeout.
    c.args([
        "-o",
        "ServerAliveInterval=10",
        "-o",
        "ServerAliveCountMax=3",
    ]);
    c.arg("-o").arg(format!(
        "ConnectTimeout={}",
        connect_timeout.as_secs().max(1)
    ));
    if batch {
        c.args(["-o", "BatchMode=yes"]);
    }
    if let Some(p) = t.port {
        c.arg("-p").arg(p.to_string());
    }
    if let Some(u) = &t.user {
        c.arg("-l").arg(u);
    }
    c.arg("-s").arg(&t.host).arg("sftp");
    c
}

/// Whether ssh's last words mean "try again later" rather than "no".
fn transient(ssh_said: &str) -> bool {
    let s = ssh_said.to_ascii_lowercase();
    [
        "connection refused",
        "connection timed out",
        "timed out",
        "no route to host",
        "network is unreachable",
        "connection reset",
        "connection closed",
        "broken pipe",
        "kex_exchange_identification",
        "temporary failure in name resolution",
    ]
    .iter()
    .any(|p| s.contains(p))
}

fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_be_bytes());
}
fn put_str(b: &mut Vec<u8>, s: &[u8]) {
    put_u32(b, s.len() as u32);
    b.extend_from_slice(s);
}

/// A cursor over a reply's bytes; every read is bounds-checked (replies are
/// untrusted).
struct Cur<'a>(&'a [u8]);

impl<'a> Cur<'a> {
    fn bad() -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, "malformed SFTP reply")
    }
    fn u32(&mut self) -> io::Result<u32> {
        let (h, t) = self.0.split_first_chunk::<4>().ok_or_else(Self::bad)?;
        self.0 = t;
        Ok(u32::from_be_bytes(*h))
    }
    fn u64(&mut self) -> io::Result<u64> {
        let (h, t) = self.0.split_first_chunk::<8>().ok_or_else(Self::bad)?;
        self.0 = t;
        Ok(u64::from_be_bytes(*h))
    }
    fn bytes(&mut self) -> io::Result<&'a [u8]> {
        let n = self.u32()? as usize;
        if n > self.0.len() {
            return Err(Self::bad());
        }
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        Ok(h)
    }
}

/// Whether a VERSION reply offers `limits@openssh.com`.
fn offers_limits(payload: &[u8]) -> io::Result<bool> {
    let mut cur = Cur(payload);
    let _version = cur.u32()?;
    let mut limits = false;
    while let (Ok(name), Ok(_data)) = (cur.bytes(), cur.bytes()) {
        limits |= name == b"limits@openssh.com";
    }
    Ok(limits)
}

/// The read size a `limits@openssh.com` reply allows (None: keep the
/// default), capped.
fn max_read(payload: &[u8]) -> io::Result<Option<u32>> {
    let mut r = Cur(payload);
    let (_packet, read) = (r.u64()?, r.u64()?);
    Ok((read >= 1024).then(|| read.min(MAX_READ_CAP as u64) as u32))
}

/// The size in an ATTRS reply, if it has one.
fn attrs_size(payload: &[u8]) -> io::Result<Option<u64>> {
    let mut c = Cur(payload);
    if c.u32()? & ATTR_SIZE == 0 {
        return Ok(None);
    }
    c.u64().map(Some)
}

/// The bytes of a DATA reply to a read of `asked` bytes: 1..=asked of them.
fn data(payload: &[u8], asked: usize) -> io::Result<&[u8]> {
    let d = Cur(payload).bytes()?;
    if d.is_empty() || d.len() > asked {
        return Err(Cur::bad());
    }
    Ok(d)
}

/// Every parser of server replies over `bytes`, for the fuzz target: none
/// may panic or allocate beyond the input.
#[doc(hidden)]
pub fn fuzz_replies(bytes: &[u8]) {
    let _ = offers_limits(bytes);
    let _ = max_read(bytes);
    let _ = attrs_size(bytes);
    let _ = status(bytes, "f");
    if let Some((&n, rest)) = bytes.split_first() {
        if let Ok(d) = data(rest, n as usize * 1024) {
            assert!(!d.is_empty() && d.len() <= n as usize * 1024);
        }
    }
}

/// A STATUS reply as an error (`Ok` for `FX_OK`).
fn status(payload: &[u8], what: &str) -> io::Result<()> {
    let mut c = Cur(payload);
    let code = c.u32()?;
    let msg = c
        .bytes()
        .map(|m| String::from_utf8_lossy(m).into_owned())
        .unwrap_or_default();
    let kind = match code {
        0 => return Ok(()),
        FX_EOF => io::ErrorKind::UnexpectedEof,
        FX_NO_SUCH_FILE => io::ErrorKind::NotFound,
        FX_PERMISSION_DENIED => io::ErrorKind::PermissionDenied,
        _ => io::ErrorKind::Other,
    };
    let msg = if msg.is_empty() {
        format!("SFTP status {code}")
    } else {
        msg
    };
    Err(io::Error::new(kind, format!("{what}: {msg}")))
}

/// Replies that arrived for callers not yet back to collect them.
#[derive(Default)]
struct Inbox {
    done: HashMap<u32, (u8, Vec<u8>)>,
    /// Why the connection is dead (then every wait fails with it).
    dead: Option<String>,
}

/// One `ssh -s HOST sftp` process and the protocol state over it.
struct Conn {
    child: Mutex<Child>,
    /// Our end of the socket pair that is ssh's stdin and stdout (a socket,
    /// not pipes: writes use MSG_NOSIGNAL, so a dead ssh is an error, never
    /// a SIGPIPE, which the CLI leaves fatal for `sheaf cat | head`).
    tx: Mutex<UnixStream>,
    /// Held by the caller reading replies for everyone.
    rx: Mutex<UnixStream>,
    inbox: Mutex<Inbox>,
    arrived: Condvar,
    next_id: AtomicU32,
    max_read: u32,
    /// ssh's stderr (an unlinked file: never fills, never blocks ssh).
    stderr: Mutex<File>,
    /// Longest wait for one reply.
    reply_timeout: Duration,
}

/// Read exactly `buf.len()` bytes from `fd`, polling so that no wait
/// passes `deadline`.
fn read_full(r: &mut UnixStream, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut p = libc::pollfd {
            fd: r.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no reply from the server in time",
            ));
        }
        match r.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the ssh connection closed",
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Write all of `b` to the socket without ever raising SIGPIPE.
fn send_all(s: &UnixStream, mut b: &[u8]) -> io::Result<()> {
    while !b.is_empty() {
        // SAFETY: a valid socket and buffer.
        let n = unsafe {
            libc::send(
                s.as_raw_fd(),
                b.as_ptr().cast(),
                b.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        b = &b[n as usize..];
    }
    Ok(())
}

fn read_packet(r: &mut UnixStream, deadline: Instant) -> io::Result<(u8, Vec<u8>)> {
    let mut len = [0u8; 4];
    read_full(r, &mut len, deadline)?;
    let len = u32::from_be_bytes(len) as usize;
    if len == 0 || len > MAX_PACKET {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("SFTP reply of {len} bytes (not an SFTP server?)"),
        ));
    }
    let mut body = vec![0u8; len];
    read_full(r, &mut body, deadline)?;
    let t = body[0];
    body.remove(0);
    Ok((t, body))
}

impl Conn {
    /// Start ssh and greet the server.
    fn connect(t: &SshTarget, opts: &HttpOptions, batch: bool) -> io::Result<Conn> {
        let err_file = tempfile::tempfile()?;
        let mut cmd = ssh_command(t, batch, opts.connect_timeout);
        let (ours, theirs) = UnixStream::pair()?;
        cmd.stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs.try_clone()?)))
            .stdout(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            .stderr(err_file.try_clone()?);
        let child = cmd.spawn().map_err(|e| {
            io::Error::new(e.kind(), format!("cannot run {:?}: {e}", cmd.get_program()))
        })?;
        // The child's copies were closed by spawn (dropped `cmd` below).
        drop(cmd);
        let tx = ours.try_clone()?;
        let rx = ours;
        let c = Conn {
            child: Mutex::new(child),
            tx: Mutex::new(tx),
            rx: Mutex::new(rx),
            inbox: Mutex::new(Inbox::default()),
            arrived: Condvar::new(),
            next_id: AtomicU32::new(1),
            max_read: DEFAULT_MAX_READ,
            stderr: Mutex::new(err_file),
            reply_timeout: opts.request_timeout,
        };
        // Connecting includes authentication, which may wait for the user.
        let deadline = Instant::now() + opts.connect_timeout + opts.request_timeout;
        let hello = (|| {
            let mut b = Vec::new();
            put_u32(&mut b, 5);
            b.push(FXP_INIT);
            put_u32(&mut b, 3);
            send_all(&c.tx.lock().expect("tx"), &b)?;
            read_packet(&mut c.rx.lock().expect("rx"), deadline)
        })();
        let (t_, payload) = match hello {
            Ok(v) => v,
            Err(e) => return Err(c.failure(e)),
        };
        if t_ != FXP_VERSION {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the server did not answer SFTP's greeting",
            ));
        }
        let limits = offers_limits(&payload)?;
        let mut c = c;
        if limits {
            let mut b = Vec::new();
            put_str(&mut b, b"limits@openssh.com");
            let (rt, rp) = c.call(FXP_EXTENDED, &b)?;
            if rt == FXP_EXTENDED_REPLY {
                if let Some(m) = max_read(&rp)? {
                    c.max_read = m;
                }
            }
        }
        Ok(c)
    }

    /// What ssh said last on stderr (host key, authentication, network).
    fn ssh_said(&self) -> String {
        // Give an exiting ssh a moment to finish writing.
        let mut child = self.child.lock().expect("child");
        for _ in 0..20 {
            if !matches!(child.try_wait(), Ok(None)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut f = self.stderr.lock().expect("stderr");
        let mut s = String::new();
        let _ = f.rewind();
        let _ = f.read_to_string(&mut s);
        s.lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty() && !l.starts_with("Warning: Permanently added"))
            .unwrap_or("")
            .to_string()
    }

    /// The error for a connection that failed with `e`: ssh's own words
    /// when it has any, and a kind saying whether waiting may help.
    fn failure(&self, e: io::Error) -> io::Error {
        let said = self.ssh_said();
        if said.is_empty() {
            return io::Error::new(io::ErrorKind::ConnectionAborted, format!("ssh: {e}"));
        }
        let kind = if transient(&said) {
            io::ErrorKind::ConnectionAborted
        } else {
            io::ErrorKind::PermissionDenied
        };
        io::Error::new(kind, format!("ssh: {said}"))
    }

    fn send(&self, typ: u8, body: &[u8]) -> io::Result<u32> {
        let id = self.next_id.fetch_add(1, Relaxed);
        let mut b = Vec::with_capacity(body.len() + 9);
        put_u32(&mut b, (body.len() + 5) as u32);
        b.push(typ);
        put_u32(&mut b, id);
        b.extend_from_slice(body);
        let r = send_all(&self.tx.lock().expect("tx"), &b);
        if let Err(e) = r {
            return Err(self.kill(e));
        }
        Ok(id)
    }

    /// Mark the connection dead (waking every waiter) and end ssh.
    fn kill(&self, e: io::Error) -> io::Error {
        let e = self.failure(e);
        let mut ib = self.inbox.lock().expect("inbox");
        ib.dead.get_or_insert_with(|| e.to_string());
        drop(ib);
        self.arrived.notify_all();
        let _ = self.child.lock().expect("child").kill();
        io::Error::new(io::ErrorKind::ConnectionAborted, e.to_string())
    }

    /// The reply to request `id`: read by this caller (for everyone) or by
    /// another and found in the inbox.
    fn wait(&self, id: u32) -> io::Result<(u8, Vec<u8>)> {
        let deadline = Instant::now() + self.reply_timeout;
        let mut ib = self.inbox.lock().expect("inbox");
        loop {
            if let Some(p) = ib.done.remove(&id) {
                return Ok(p);
            }
            if let Some(d) = &ib.dead {
                return Err(io::Error::new(io::ErrorKind::ConnectionAborted, d.clone()));
            }
            match self.rx.try_lock() {
                Ok(mut rx) => {
                    drop(ib);
                    let r = read_packet(&mut rx, deadline);
                    drop(rx);
                    match r {
                        Ok((t, body)) => {
                            let mut c = Cur(&body);
                            let rid = c.u32()?;
                            ib = self.inbox.lock().expect("inbox");
                            ib.done.insert(rid, (t, c.0.to_vec()));
                            self.arrived.notify_all();
                        }
                        Err(e) => return Err(self.kill(e)),
                    }
                }
                Err(_) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(self.kill(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "no reply from the server in time",
                        )));
                    }
                    ib = self
                        .arrived
                        .wait_timeout(ib, (deadline - now).min(Duration::from_millis(200)))
                        .expect("inbox")
                        .0;
                }
            }
        }
    }

    fn call(&self, typ: u8, body: &[u8]) -> io::Result<(u8, Vec<u8>)> {
        let id = self.send(typ, body)?;
        self.wait(id)
    }

    fn open(&self, path: &str) -> io::Result<Vec<u8>> {
        let mut b = Vec::new();
        put_str(&mut b, path.as_bytes());
        put_u32(&mut b, FXF_READ);
        put_u32(&mut b, 0);
        let (t, p) = self.call(FXP_OPEN, &b)?;
        match t {
            FXP_HANDLE => Ok(Cur(&p).bytes()?.to_vec()),
            FXP_STATUS => status(&p, path).map(|_| Vec::new()),
            _ => Err(Cur::bad()),
        }
    }

    fn close(&self, handle: &[u8]) {
        let mut b = Vec::new();
        put_str(&mut b, handle);
        let _ = self.call(FXP_CLOSE, &b);
    }

    fn size(&self, handle: &[u8], path: &str) -> io::Result<u64> {
        let mut b = Vec::new();
        put_str(&mut b, handle);
        let (t, p) = self.call(FXP_FSTAT, &b)?;
        match t {
            FXP_ATTRS => attrs_size(&p)?.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{path}: the server gave no size"),
                )
            }),
            FXP_STATUS => status(&p, path).map(|_| 0),
            _ => Err(Cur::bad()),
        }
    }

    /// Fill `out` from `offset` of the open file, [`IN_FLIGHT`] reads of at
    /// most `max_read` outstanding; a short reply is asked again for the
    /// rest.
    fn read_at(&self, handle: &[u8], out: &mut [u8], offset: u64, path: &str) -> io::Result<()> {
        let step = self.max_read as usize;
        let mut todo: std::collections::VecDeque<(usize, usize)> = (0..out.len())
            .step_by(step)
            .map(|s| (s, (out.len() - s).min(step)))
            .collect();
        let mut flying: std::collections::VecDeque<(u32, usize, usize)> = Default::default();
        while !todo.is_empty() || !flying.is_empty() {
            while flying.len() < IN_FLIGHT {
                let Some((s, n)) = todo.pop_front() else {
                    break;
                };
                let mut b = Vec::with_capacity(handle.len() + 16);
                put_str(&mut b, handle);
                b.extend_from_slice(&(offset + s as u64).to_be_bytes());
                put_u32(&mut b, n as u32);
                flying.push_back((self.send(FXP_READ, &b)?, s, n));
            }
            let (id, s, n) = flying.pop_front().expect("one in flight");
            let (t, p) = self.wait(id)?;
            match t {
                FXP_DATA => {
                    let d = data(&p, n)?;
                    out[s..s + d.len()].copy_from_slice(d);
                    if d.len() < n {
                        todo.push_front((s + d.len(), n - d.len()));
                    }
                }
                FXP_STATUS => status(&p, path)?,
                _ => return Err(Cur::bad()),
            }
        }
        Ok(())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // No kill: ssh exits once every copy of its stdin is closed, and a
        // mount's background process shares this connection with the
        // process that forked it, which drops its copy when it exits.
        let _ = self.child.lock().expect("child").try_wait();
    }
}

/// The open image on the current connection.
struct Session {
    conn: Conn,
    handle: Vec<u8>,
}

/// An image read over SSH. See the module documentation.
pub struct Sftp {
    url: String,
    target: SshTarget,
    opts: HttpOptions,
    session: Mutex<Option<Arc<Session>>>,
    /// Length and header seen by the first session, checked on reconnects.
    identity: Mutex<Option<(u64, Vec<u8>)>>,
    connected_once: std::sync::atomic::AtomicBool,
    /// `url`, redacted: who is waited for (`on_server_wait`).
    shown: String,
    stats: NetStats,
    /// New connections after the first.
    reconnects: AtomicU64,
    last_error: Mutex<String>,
}

impl Sftp {
    /// A client for `url`; nothing is connected until the first request.
    pub fn new(url: &str, opts: HttpOptions) -> io::Result<Sftp> {
        if !opts.mirrors.is_empty() {
            return Err(invalid(format!(
                "{url}: mirrors are for http(s):// images (ssh:// reads one server)"
            )));
        }
        Ok(Sftp {
            url: url.to_string(),
            target: parse_url(url)?,
            opts,
            session: Mutex::new(None),
            identity: Mutex::new(None),
            connected_once: Default::default(),
            shown: crate::redact(url),
            stats: NetStats::default(),
            reconnects: AtomicU64::new(0),
            last_error: Mutex::new(String::new()),
        })
    }

    /// The current session, connecting (and checking the image is the one
    /// first seen) if there is none.
    fn session(&self) -> io::Result<Arc<Session>> {
        let mut g = self.session.lock().expect("session");
        if let Some(s) = &*g {
            return Ok(s.clone());
        }
        let again = self.connected_once.load(Relaxed);
        let conn = Conn::connect(&self.target, &self.opts, again)?;
        self.connected_once.store(true, Relaxed);
        if again {
            self.reconnects.fetch_add(1, Relaxed);
        }
        let handle = conn.open(&self.target.path)?;
        let size = conn.size(&handle, &self.target.path)?;
        let mut head = vec![0u8; HEADER_CHECK.min(size as usize)];
        conn.read_at(&handle, &mut head, 0, &self.target.path)?;
        let mut id = self.identity.lock().expect("identity");
        match &*id {
            None => *id = Some((size, head)),
            Some((l, h)) if *l == size && *h == head => {}
            Some(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: the image changed on the server since it was opened \
                         (length or root digest differ)",
                        self.url
                    ),
                ))
            }
        }
        let s = Arc::new(Session { conn, handle });
        *g = Some(s.clone());
        Ok(s)
    }

    /// Forget `s` if it is still the current session.
    fn drop_session(&self, s: &Arc<Session>) {
        let mut g = self.session.lock().expect("session");
        if g.as_ref().is_some_and(|c| Arc::ptr_eq(c, s)) {
            *g = None;
        }
    }

    /// Run `f` on a live session; a dead connection is replaced, with
    /// backoff, until the deadline.
    fn retrying<T>(&self, limit: Duration, f: impl Fn(&Session) -> io::Result<T>) -> io::Result<T> {
        let mut backoff = Backoff::new(&self.opts, limit, &self.stats, &self.target.host)
            .announcing(&self.opts, &self.shown, !self.connected_once.load(Relaxed));
        loop {
            self.stats.requests.fetch_add(1, Relaxed);
            let r = self.session().and_then(|s| {
                let r = f(&s);
                if matches!(&r, Err(e) if e.kind() == io::ErrorKind::ConnectionAborted) {
                    self.drop_session(&s);
                }
                r
            });
            let e = match r {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            self.stats.errors.fetch_add(1, Relaxed);
            *self.last_error.lock().expect("lock") = e.to_string();
            if e.kind() != io::ErrorKind::ConnectionAborted {
                return Err(e);
            }
            backoff.wait(e)?;
        }
    }

    /// The same requests as [`crate::http::Http::get`]: a range of the
    /// image, its first bytes and length, or a whole file beside it.
    pub fn get(&self, want: Want<'_>) -> io::Result<(Vec<u8>, u64)> {
        self.get_within(want, self.opts.deadline)
    }

    /// [`Sftp::get`] with a deadline of its own (at most the configured one).
    pub fn get_within(&self, want: Want<'_>, limit: Duration) -> io::Result<(Vec<u8>, u64)> {
        let path = &self.target.path;
        let r = match want {
            Want::Range(from, to) => self.retrying(limit, |s| {
                let mut b = vec![0u8; (to - from + 1) as usize];
                s.conn.read_at(&s.handle, &mut b, from, path)?;
                Ok((b, 0))
            }),
            Want::Probe(n) => self.retrying(limit, |s| {
                let size = s.conn.size(&s.handle, path)?;
                let mut b = vec![0u8; n.min(size) as usize];
                s.conn.read_at(&s.handle, &mut b, 0, path)?;
                Ok((b, size))
            }),
            Want::Object(rel, max) => {
                let file = match path.rfind('/') {
                    Some(i) => format!("{}/{rel}", &path[..i]),
                    None => rel.to_string(),
                };
                self.retrying(limit, |s| {
                    let h = s.conn.open(&file)?;
                    let r = s.conn.size(&h, &file).and_then(|size| {
                        if size > max {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!("{file}: {size} bytes, more than the {max} expected"),
                            ));
                        }
                        let mut b = vec![0u8; size as usize];
                        s.conn.read_at(&h, &mut b, 0, &file)?;
                        Ok((b, size))
                    });
                    s.conn.close(&h);
                    r
                })
            }
        };
        if let Ok((b, _)) = &r {
            self.stats.bytes.fetch_add(b.len() as u64, Relaxed);
        }
        r
    }

    /// The URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Counters for `sheaf stats`.
    pub fn stats(&self) -> sheaf_read::SshStats {
        let s = &self.stats;
        sheaf_read::SshStats {
            requests: s.requests.load(Relaxed),
            bytes: s.bytes.load(Relaxed),
            reconnects: self.reconnects.load(Relaxed),
            retries: s.retries.load(Relaxed),
            wait_ms: s.wait_ms.load(Relaxed),
            errors: s.errors.load(Relaxed),
            url: self.url.clone(),
            last_error: self.last_error.lock().expect("lock").clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = parse_url("ssh://alice@host.example:2222/data/img.sheaf").unwrap();
        assert_eq!(t.user.as_deref(), Some("alice"));
        assert_eq!(t.host, "host.example");
        assert_eq!(t.port, Some(2222));
        assert_eq!(t.path, "/data/img.sheaf");
        let t = parse_url("ssh://cluster/~/imgs/a.sheaf").unwrap();
        assert_eq!(
            (t.user, t.port, t.path.as_str()),
            (None, None, "imgs/a.sheaf")
        );
        let t = parse_url("ssh://[::1]:22/x.sheaf").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", Some(22)));
        for bad in [
            "ssh://host",
            "ssh://host/",
            "ssh://-oProxyCommand=x/a",
            "ssh://-l@h/a",
            "ssh://h:99999/a",
            "ssh://[::1/a",
            "http://h/a",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn replies_are_bounds_checked() {
        let mut c = Cur(&[0, 0, 0, 9, 1, 2]);
        assert!(c.bytes().is_err());
        let mut c = Cur(&[0, 0]);
        assert!(c.u32().is_err());
        assert_eq!(
            status(&[0, 0, 0, 2, 0, 0, 0, 2, b'n', b'o'], "f")
                .unwrap_err()
                .kind(),
            io::ErrorKind::NotFound
        );
        assert!(status(&[0, 0, 0, 0], "f").is_ok());
    }

    #[test]
    fn transient_failures_are_told_from_refusals() {
        assert!(transient(
            "ssh: connect to host 127.0.0.1 port 2: Connection refused"
        ));
        assert!(!transient("Host key verification failed."));
        assert!(!transient("alice@h: Permission denied (publickey)."));
    }
}
