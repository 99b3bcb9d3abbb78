//! FUSE over io_uring (sheaf patch, see PATCHED.md).
//!
//! Since Linux 6.14 a FUSE server can take requests from io_uring instead of
//! `read(2)`ing `/dev/fuse`, when the `fuse` module's `enable_uring`
//! parameter is on and the server sets `FUSE_OVER_IO_URING` in its INIT
//! reply. The kernel keeps one queue per possible CPU and puts a request on
//! the queue of the CPU its caller runs on, so a server thread pinned to
//! that CPU is woken there: no wake-up crosses CPUs, and one
//! `io_uring_enter` both commits a reply and fetches the next request.
//!
//! The protocol (`include/uapi/linux/fuse.h`, `fs/fuse/dev_uring.c`): every
//! ring entry is a pair of user buffers registered with an
//! `IORING_OP_URING_CMD` SQE (`FUSE_IO_URING_CMD_REGISTER`, `addr` pointing
//! at two iovecs, `len` 2, the 128-byte SQE carrying `fuse_uring_cmd_req`).
//! The first buffer is `fuse_uring_req_header`: 128 bytes for the
//! `fuse_in_header` (and later the `fuse_out_header`), 128 bytes for the
//! operation's own header, then `fuse_uring_ent_in_out` (flags, commit id,
//! payload size). The second holds the rest of the request (names, written
//! data) and, on the way back, the whole reply after the out header. The
//! CQE of a registered entry completes when a request is in it; the
//! server answers with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, naming the
//! commit id, which also re-arms the entry. At unmount the kernel completes
//! every armed entry with an error, which ends the threads.
//!
//! Here each thread owns one ring with one entry, so a request that blocks
//! (a disk or network read) holds up only its own thread; the kernel hands
//! a new request to the entry that was re-armed last. A request is rebuilt
//! into the `/dev/fuse` layout and dispatched through the same code as the
//! `/dev/fuse` loop; the reply is collected in a [`ReplySlot`] and copied
//! into the entry's buffers.

use std::io;
use std::io::IoSlice;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::Condvar;
use std::sync::Mutex;
use std::thread::JoinHandle;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::warn;
use nix::unistd::Uid;

use crate::Filesystem;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::request::RequestWithSender;
use crate::session::FilesystemHolder;
use crate::session::SessionACL;
use crate::session::SessionEventLoop;

/// `FUSE_IO_URING_CMD_REGISTER`.
const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`.
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// Offset of the operation's header in `fuse_uring_req_header`.
const OP_IN: usize = 128;
/// Offset of `fuse_uring_ent_in_out` (its commit id at +8, payload size at +16).
const ENT_IN_OUT: usize = 256;
/// Size of `fuse_uring_req_header`.
const HEADER_LEN: usize = ENT_IN_OUT + 32;
/// Size of `fuse_in_header`.
const IN_HEADER_LEN: usize = 40;
/// Size of `fuse_out_header`.
const OUT_HEADER_LEN: usize = 16;

/// Requests this process has served through io_uring rings (a process
/// serves one mount in sheaf, so this is that mount's count).
static SERVED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Requests served through FUSE over io_uring by this process so far.
pub fn requests_served() -> u64 {
    SERVED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether the fallback to `/dev/fuse` has been logged (every ring thread
/// meets the same refusal; one line says it).
static FELL_BACK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn fall_back(why: std::fmt::Arguments<'_>) {
    if !FELL_BACK.swap(true, std::sync::atomic::Ordering::Relaxed) {
        warn!("FUSE over io_uring {why}; serving through /dev/fuse");
    }
}

/// Where the reply to a ring request is left for the ring thread.
pub(crate) struct ReplySlot {
    reply: Mutex<Option<Vec<u8>>>,
    ready: Condvar,
    /// For what a reply needs besides its bytes (passthrough backing ids).
    pub(crate) channel: ChannelSender,
}

impl std::fmt::Debug for ReplySlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplySlot")
    }
}

impl ReplySlot {
    fn new(channel: ChannelSender) -> Self {
        ReplySlot {
            reply: Mutex::new(None),
            ready: Condvar::new(),
            channel,
        }
    }

    /// Keep a reply (out header and arguments, as written to `/dev/fuse`).
    pub(crate) fn put(&self, data: &[IoSlice<'_>]) {
        let mut v = Vec::with_capacity(data.iter().map(|d| d.len()).sum());
        for d in data {
            v.extend_from_slice(d);
        }
        *self.reply.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
        self.ready.notify_one();
    }

    /// The reply, waiting for it if the filesystem answers from another thread.
    fn take(&self) -> Vec<u8> {
        let mut g = self.reply.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(v) = g.take() {
                return v;
            }
            g = self.ready.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Number of queues the kernel keeps: one per possible CPU
/// (`/sys/devices/system/cpu/possible`, e.g. "0-127" or "0,2-5").
pub(crate) fn queue_count() -> usize {
    let parsed = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            s.trim()
                .split(',')
                .map(|r| r.rsplit('-').next().and_then(|n| n.parse::<usize>().ok()))
                .try_fold(0usize, |m, n| n.map(|n| m.max(n + 1)))
        });
    match parsed {
        Some(n) if n > 0 => n,
        _ => std::thread::available_parallelism().map_or(1, usize::from),
    }
}

/// The type of every ring here: 128-byte SQEs (`IORING_SETUP_SQE128`), as
/// FUSE's commands need.
type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// A ring for one entry: one command in flight at a time.
fn new_ring() -> io::Result<Ring> {
    IoUring::builder().build(2)
}

/// `struct fuse_uring_cmd_req` (flags 0, the commit id, the queue), in the
/// SQE's 80 bytes of command.
fn cmd_req(qid: u16, commit_id: u64) -> [u8; 80] {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    cmd
}

/// A ring made before FUSE over io_uring is negotiated. Once negotiated,
/// the kernel holds every request until all CPU queues are registered, so
/// a server that cannot make rings (`kernel.io_uring_disabled`, a seccomp
/// policy such as a container runtime's default) must not ask for it; and
/// if a queue fails later, this ring tells the kernel to give up on rings
/// for the connection ([`Probe::abandon`]).
pub(crate) struct Probe(Ring);

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Probe")
    }
}

impl Probe {
    /// A ring, or why none can be made (logged once).
    pub(crate) fn new() -> Option<Probe> {
        match new_ring() {
            Ok(r) => Some(Probe(r)),
            Err(e) => {
                fall_back(format_args!("unavailable ({e})"));
                None
            }
        }
    }

    /// Make the kernel stop waiting for rings on this connection: a
    /// registration it must refuse (a queue that does not exist) turns
    /// io_uring off for the connection and releases the requests held for
    /// it, which `/dev/fuse` then serves.
    fn abandon(mut self, fd: i32) {
        let sqe = opcode::UringCmd80::new(types::Fd(fd), CMD_REGISTER)
            .cmd(cmd_req(u16::MAX, 0))
            .build();
        // SAFETY: the command points at no buffer.
        let pushed = unsafe { self.0.submission().push(&sqe) }.is_ok();
        if pushed {
            let _ = self.0.submit_and_wait(1);
        }
    }
}

/// What a ring thread needs of its session.
pub(crate) struct RingParams<FS: Filesystem> {
    pub(crate) ch: Channel,
    pub(crate) filesystem: Arc<FilesystemHolder<FS>>,
    pub(crate) allowed: SessionACL,
    pub(crate) session_owner: Uid,
    /// Size of each entry's payload buffer (at least the kernel's largest
    /// request or reply argument).
    pub(crate) payload: usize,
    pub(crate) per_queue: usize,
    /// The ring made before negotiating, to abandon rings with.
    pub(crate) probe: Probe,
}

/// Start `per_queue` ring threads for every CPU queue.
pub(crate) fn spawn<FS: Filesystem + 'static>(
    p: RingParams<FS>,
) -> io::Result<Vec<JoinHandle<io::Result<()>>>> {
    let queues = queue_count();
    debug!(
        "FUSE over io_uring: {queues} queues x {} threads",
        p.per_queue
    );
    let mut threads = Vec::with_capacity(queues * p.per_queue);
    // Each thread says whether it made its ring; one that could not (or a
    // thread that could not start) would leave its queue unregistered and
    // every request held, so then rings are abandoned altogether.
    let (tx, rx) = std::sync::mpsc::channel::<bool>();
    let mut started = 0;
    let mut complete = true;
    'spawn: for qid in 0..queues {
        for t in 0..p.per_queue {
            let name = format!("fuser-ring-{qid}");
            let event_loop = SessionEventLoop {
                thread_name: format!("{name}.{t}"),
                filesystem: p.filesystem.clone(),
                ch: p.ch.clone(),
                allowed: p.allowed,
                session_owner: p.session_owner,
            };
            let payload = p.payload;
            let tx = tx.clone();
            let spawned = std::thread::Builder::new()
                .name(name)
                .spawn(move || serve_queue(&event_loop, qid as u16, payload, tx));
            match spawned {
                Ok(h) => {
                    threads.push(h);
                    started += 1;
                }
                Err(e) => {
                    fall_back(format_args!("not started ({e})"));
                    complete = false;
                    break 'spawn;
                }
            }
        }
    }
    drop(tx);
    let made = rx.iter().take(started).filter(|ok| *ok).count();
    if !complete || made < started {
        p.probe.abandon(p.ch.as_fd().as_raw_fd());
    }
    Ok(threads)
}

/// Pin the calling thread to `cpu` (the queue's requests come from there);
/// a CPU outside this process's set is left alone.
fn pin(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; the calls only read it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            debug!("ring thread not pinned to CPU {cpu}");
        }
    }
}

/// One ring entry's buffers (their addresses are registered with the kernel,
/// so they live, unmoved, as long as the ring).
struct Entry {
    /// `fuse_uring_req_header`, 8-byte aligned.
    header: Box<[u64; HEADER_LEN / 8]>,
    payload: Vec<u8>,
    iov: Box<[libc::iovec; 2]>,
}

impl Entry {
    fn new(payload: usize) -> Self {
        let mut e = Entry {
            header: Box::new([0; HEADER_LEN / 8]),
            payload: vec![0; payload],
            iov: Box::new(
                [libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                }; 2],
            ),
        };
        e.iov[0] = libc::iovec {
            iov_base: e.header.as_mut_ptr().cast(),
            iov_len: HEADER_LEN,
        };
        e.iov[1] = libc::iovec {
            iov_base: e.payload.as_mut_ptr().cast(),
            iov_len: payload,
        };
        e
    }

    fn header(&self) -> &[u8] {
        // SAFETY: a [u64] viewed as the bytes it holds.
        unsafe { std::slice::from_raw_parts(self.header.as_ptr().cast(), HEADER_LEN) }
    }

    fn header_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.header.as_mut_ptr().cast(), HEADER_LEN) }
    }

    fn u32_at(&self, off: usize) -> u32 {
        u32::from_ne_bytes(self.header()[off..off + 4].try_into().expect("4 bytes"))
    }

    fn u64_at(&self, off: usize) -> u64 {
        u64::from_ne_bytes(self.header()[off..off + 8].try_into().expect("8 bytes"))
    }

    /// The request in the `/dev/fuse` layout (in header, the operation's
    /// header, the payload), in 8-byte aligned storage; None if the sizes
    /// the kernel wrote do not add up.
    fn request(&self) -> Option<Vec<u64>> {
        let total = self.u32_at(0) as usize;
        let payload = self.u32_at(ENT_IN_OUT + 16) as usize;
        let op = total.checked_sub(IN_HEADER_LEN + payload)?;
        if op > ENT_IN_OUT - OP_IN || payload > self.payload.len() {
            return None;
        }
        let mut buf = vec![0u64; total.div_ceil(8)];
        // SAFETY: a [u64] viewed as bytes.
        let b: &mut [u8] =
            unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast(), buf.len() * 8) };
        b[..IN_HEADER_LEN].copy_from_slice(&self.header()[..IN_HEADER_LEN]);
        b[IN_HEADER_LEN..IN_HEADER_LEN + op].copy_from_slice(&self.header()[OP_IN..OP_IN + op]);
        b[IN_HEADER_LEN + op..total].copy_from_slice(&self.payload[..payload]);
        Some(buf)
    }

    /// Put `reply` (out header, then arguments) where the kernel reads it.
    fn set_reply(&mut self, reply: &[u8]) {
        let (head, args) = reply.split_at(OUT_HEADER_LEN.min(reply.len()));
        let args = &args[..args.len().min(self.payload.len())];
        self.payload[..args.len()].copy_from_slice(args);
        let h = self.header_mut();
        h[..head.len()].copy_from_slice(head);
        h[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&(args.len() as u32).to_ne_bytes());
    }

    /// An error reply to the request now in the entry.
    fn set_error(&mut self, errno: i32) {
        let unique = self.u64_at(8);
        let mut r = Vec::with_capacity(OUT_HEADER_LEN);
        r.extend_from_slice(&(OUT_HEADER_LEN as u32).to_ne_bytes());
        r.extend_from_slice(&(-errno).to_ne_bytes());
        r.extend_from_slice(&unique.to_ne_bytes());
        self.set_reply(&r);
    }
}

/// The SQE of a command on queue `qid` (`commit_id` 0 for a registration).
fn command(fd: i32, op: u32, qid: u16, commit_id: u64, entry: &Entry) -> squeue::Entry128 {
    let mut b = opcode::UringCmd80::new(types::Fd(fd), op).cmd(cmd_req(qid, commit_id));
    if op == CMD_REGISTER {
        b = b.addr(Some(entry.iov.as_ptr() as u64));
    }
    let sqe = b.build().user_data(op as u64);
    if op != CMD_REGISTER {
        return sqe;
    }
    // The registration's `len` (the iovec count, 2) has no setter in the
    // io-uring crate; it is the u32 at byte 24 of `struct io_uring_sqe`.
    // SAFETY: Entry128 is repr(C): the 64-byte SQE then 64 bytes of command.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: the same bytes with one plain-data field changed.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// Errors that mean the connection is gone (unmounted, aborted).
fn is_gone(errno: i32) -> bool {
    matches!(
        errno,
        libc::ENOTCONN | libc::ECANCELED | libc::ENODEV | libc::ECONNABORTED
    )
}

/// Serve queue `qid` until the filesystem is unmounted.
fn serve_queue<FS: Filesystem>(
    se: &SessionEventLoop<FS>,
    qid: u16,
    payload: usize,
    made: std::sync::mpsc::Sender<bool>,
) -> io::Result<()> {
    pin(qid as usize);
    // Before the ring, so that it is dropped after it: the kernel may write
    // into an armed entry until the ring is closed.
    let mut entry = Entry::new(payload);
    let mut ring = match new_ring() {
        Ok(r) => {
            let _ = made.send(true);
            r
        }
        Err(e) => {
            // The probe worked, so this is rare (memory); `spawn` abandons
            // rings and the /dev/fuse threads serve everything.
            fall_back(format_args!("unavailable ({e})"));
            let _ = made.send(false);
            return Ok(());
        }
    };
    let fd = se.ch.as_fd().as_raw_fd();
    let mut last = command(fd, CMD_REGISTER, qid, 0, &entry);
    let mut registered = false;
    // One slot for the thread's requests: each reply is taken before the
    // next request is read.
    let slot = Arc::new(ReplySlot::new(se.ch.sender()));
    loop {
        // SAFETY: the entry's buffers outlive the ring (declared before it).
        unsafe { ring.submission().push(&last) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        let res = loop {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            if let Some(cqe) = ring.completion().next() {
                break cqe.result();
            }
        };
        if res == -libc::EINTR || res == -libc::EAGAIN {
            continue; // submit the same command again
        }
        if res < 0 {
            drop(ring);
            if is_gone(-res) {
                return Ok(());
            }
            if !registered {
                // The kernel refused the ring and keeps using /dev/fuse.
                fall_back(format_args!(
                    "refused: {}",
                    io::Error::from_raw_os_error(-res)
                ));
                return Ok(());
            }
            return Err(io::Error::from_raw_os_error(-res));
        }
        registered = true;
        SERVED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let commit_id = entry.u64_at(ENT_IN_OUT + 8);
        match entry.request() {
            Some(buf) => {
                // SAFETY: a [u64] viewed as the bytes it holds.
                let bytes: &[u8] =
                    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast(), buf.len() * 8) };
                match RequestWithSender::from_uring(se.ch.sender(), bytes, slot.clone()) {
                    Some(req) => {
                        if let Ok(crate::ll::Operation::Destroy(_)) = req.request.operation() {
                            req.reply::<crate::ReplyEmpty>().ok();
                        } else {
                            req.dispatch(se);
                        }
                        let reply = slot.take();
                        entry.set_reply(&reply);
                    }
                    None => entry.set_error(libc::EIO),
                }
            }
            None => {
                warn!("malformed io_uring request ({} bytes)", entry.u32_at(0));
                entry.set_error(libc::EIO);
            }
        }
        last = command(fd, CMD_COMMIT_AND_FETCH, qid, commit_id, &entry);
    }
}
