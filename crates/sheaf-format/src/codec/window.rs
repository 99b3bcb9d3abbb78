//! Decoding blocks compressed with a dictionary, with the dictionary's bytes
//! right before the output.
//!
//! zstd copies a match that reaches into a dictionary kept apart from the
//! output with one `memmove` call per match: 14% of all CPU time (the
//! server's and the readers') in 5000 random reads of tree K, whose packs
//! lean on their dictionary. A dictionary whose bytes end where the output
//! begins counts as earlier output, and those matches are copied in line.
//! So a decode takes a window, the dictionary's bytes followed by room for
//! a block, decodes into the room and copies the bytes out (a small part of
//! what the calls cost). Windows wait in one pool, the most recently used
//! taken first: the one taken is still in the CPU's cache, where one per
//! thread was mostly not (request threads take turns); 3-7% faster on
//! 5000 random reads through a mount, 4 rounds.

use super::FRAME_HEADER_MAX;
use crate::dict::Dictionary;
use crate::Digest;
use std::sync::Mutex;
use zstd::zstd_safe::{get_error_name, DCtx, DDict, DParameter, InBuffer, OutBuffer, WriteBuf};

/// Windows not in use, the most recently used last.
static POOL: Mutex<Vec<Window>> = Mutex::new(Vec::new());
/// Most windows kept.
const MAX_POOLED: usize = 8;
/// Least room a window is made with (a pack's usual size).
const MIN_ROOM: usize = 256 << 10;

/// One window. Fields drop in order: the context (which may refer
/// to the tables), the tables (which refer to the buffer), the buffer.
struct Window {
    dctx: DCtx<'static>,
    ddict: DDict<'static>,
    /// The dictionary these tables and bytes are of.
    digest: Digest,
    dict_len: usize,
    /// Bytes of room after the dictionary.
    room: usize,
    /// Start of the buffer; both the dictionary's bytes and the room are
    /// reached through this one pointer, never through `_buf`.
    base: *mut u8,
    _buf: Box<[u8]>,
}

// SAFETY: `base` points into `_buf`, which the window owns and moves with
// it; a window is used by one thread at a time (taken out of the pool).
unsafe impl Send for Window {}

impl Window {
    /// A window for `dict` with `room` bytes after it; `None` if zstd
    /// refuses the dictionary (corrupt entropy tables).
    fn new(dict: &Dictionary, room: usize) -> Option<Window> {
        let bytes = dict.bytes();
        let mut buf = vec![0u8; bytes.len() + room].into_boxed_slice();
        buf[..bytes.len()].copy_from_slice(bytes);
        let base = buf.as_mut_ptr();
        // SAFETY: the tables refer to the first `dict_len` bytes of `buf`,
        // a heap allocation owned by the window that never moves or changes
        // while they live (they drop before it, see the struct); the room
        // written later lies after those bytes.
        let dict_bytes: &'static [u8] = unsafe { std::slice::from_raw_parts(base, bytes.len()) };
        let ddict = DDict::try_create_by_reference(dict_bytes)?;
        let mut dctx = DCtx::create();
        // zstd decodes each block of the frame straight into the room.
        dctx.set_parameter(DParameter::StableOutBuffer(true)).ok()?;
        Some(Window {
            dctx,
            ddict,
            digest: *dict.digest(),
            dict_len: bytes.len(),
            room,
            base,
            _buf: buf,
        })
    }

    /// The first `len` bytes of the room (`len <= room`), borrowed apart
    /// from the window so the context can write them.
    fn room<'a>(&self, len: usize) -> &'a mut [u8] {
        assert!(len <= self.room);
        // SAFETY: `base` points to `dict_len + room` bytes owned by `_buf`,
        // reached only through `base`; zstd reads the first `dict_len` while
        // the room is written, and one decode at a time uses the room (the
        // window is taken out of the pool while in use).
        unsafe { std::slice::from_raw_parts_mut(self.base.add(self.dict_len), len) }
    }
}

/// What went wrong, for [`super::Codec::error`].
pub(super) enum Failure {
    /// zstd refused the dictionary.
    Dictionary,
    /// zstd's error name.
    Zstd(&'static str),
    /// The frame decoded to a length outside `[end, ulen]`.
    Length(usize),
    /// Decoding whole, the frame went on after `ulen` bytes.
    Unended,
}

/// Decode `frame` (compressed with `dict`) into `out`: the first `end`
/// bytes at least, stopping after the zstd block that reaches them (all of
/// it when `end >= ulen`); the whole is at most `ulen` bytes, and exactly
/// `ulen` when decoded whole.
pub(super) fn decode(
    dict: &Dictionary,
    frame: &[u8],
    ulen: usize,
    end: usize,
    out: &mut Vec<u8>,
) -> Result<(), Failure> {
    // The most recently used window of this dictionary that fits.
    let taken = {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        let fits = |w: &Window| w.digest == *dict.digest() && w.room >= ulen;
        pool.iter().rposition(fits).map(|i| pool.remove(i))
    };
    let mut w = match taken {
        Some(w) => w,
        None => Window::new(dict, ulen.max(MIN_ROOM)).ok_or(Failure::Dictionary)?,
    };
    let r = decode_in(&mut w, frame, ulen, end, out);
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    pool.push(w);
    if pool.len() > MAX_POOLED {
        pool.remove(0);
    }
    r
}

fn decode_in(
    w: &mut Window,
    frame: &[u8],
    ulen: usize,
    end: usize,
    out: &mut Vec<u8>,
) -> Result<(), Failure> {
    let zerr = |c: usize| Failure::Zstd(get_error_name(c));
    w.dctx
        .reset(zstd::zstd_safe::ResetDirective::SessionOnly)
        .map_err(zerr)?;
    // SAFETY: the tables outlive the context's use of them (same
    // window, dropped after the context); the pointer only lets the
    // context, borrowed mutably, refer to a sibling field.
    let ddict: &'static DDict<'static> = unsafe { &*(&w.ddict as *const DDict<'static>) };
    w.dctx.ref_ddict(ddict).map_err(zerr)?;
    let room = w.room(ulen);
    let mut output = OutBuffer::around(&mut room[..]);
    let whole = end >= ulen;
    let ended = until(&mut w.dctx, frame, &mut output, (!whole).then_some(end)).map_err(zerr)?;
    // At most `ulen`: that is all the room zstd was given (a longer frame
    // fails in zstd for want of room), so whole means exactly `ulen`.
    let got = output.pos();
    if got < end.min(ulen) {
        return Err(Failure::Length(got));
    }
    if whole && !ended {
        return Err(Failure::Unended);
    }
    // Sized to what was decoded, not to the whole block: a cache counts
    // what its values pin, so prefixes that size fit twice as many.
    super::ready_for(out, got);
    out.extend_from_slice(&room[..got]);
    Ok(())
}

/// Feed `frame` to `d` one zstd block at a time (its hint says how many
/// bytes that is: with a stable output zstd decodes all the input it is
/// given) until the output reaches `end` or the frame ends; `None` for
/// `end` decodes to the frame's end. Whether the frame ended.
pub(super) fn until<C: WriteBuf + ?Sized>(
    d: &mut DCtx<'_>,
    frame: &[u8],
    output: &mut OutBuffer<'_, C>,
    end: Option<usize>,
) -> Result<bool, usize> {
    let (mut pos, mut hint) = (0, FRAME_HEADER_MAX);
    while end.is_none_or(|e| output.pos() < e) {
        let upto = frame.len().min(pos + hint.max(1));
        let mut input = InBuffer {
            src: &frame[..upto],
            pos,
        };
        let before = (pos, output.pos());
        hint = d.decompress_stream(output, &mut input)?;
        pos = input.pos();
        if hint == 0 || (pos, output.pos()) == before && upto == frame.len() {
            break; // the frame ended, or its bytes did
        }
    }
    Ok(hint == 0)
}
