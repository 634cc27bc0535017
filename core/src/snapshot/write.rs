//! Writes a snapshot as `torch.cuda.memory._dump_snapshot` does: `pickle.dump` of the
//! snapshot dict with `CPython`'s protocol 4 (`pickle.dumps(pickle.loads(f), 4)` gives back
//! every real file of ../shared/traces byte for byte). So this is `CPython`'s pickler over
//! the object graph PyTorch builds:
//!
//! - framing: the opcodes after `PROTO` go in frames, each committed (`FRAME` + 8-byte
//!   length) when it has reached 64 KiB at the start of saving an object, and at the end
//!   (a frame under 4 bytes goes without a header);
//! - every string, list, dict and tuple is memoised (`MEMOIZE`) when first written, and an
//!   object written again is a `BINGET`/`LONG_BINGET` of its slot; lists and dicts go by
//!   1000 items (`MARK … APPENDS`/`SETITEMS`, one item: `APPEND`/`SETITEM`);
//! - the key order PyTorch's dicts get: a segment's `frames` before `blocks` when it has
//!   no stack, after them when it has one;
//! - the objects PyTorch shares: each key string, each action, segment type and block state
//!   string, the empty string and one-character strings (`CPython`'s singletons); one list per
//!   stack (empty stacks too) and one dict per frame, whose `name` and `filename` strings are
//!   its own; and fresh ones it does not: `compile_context`'s `"N/A"`, a non-empty
//!   `user_metadata`, `segment_pool_id` tuples.
//!
//! Key orders are PyTorch 2.11's: top level `segments`, `device_traces`,
//! `allocator_settings`, `external_annotations` (written empty: not read back).

use std::collections::HashMap;
use std::io::{self, Write};

use super::frames::{FrameId, StackId};
use super::{Action, BlockState, RawBlock, RawEvent, RawSegment, RawSettings, RawSnapshot};
use super::{OtherAction, SegmentType};

const FRAME_SIZE_TARGET: usize = 64 * 1024;
const FRAME_SIZE_MIN: usize = 4;
const BATCH: usize = 1000;

/// Writes `snap` as a PyTorch snapshot pickle into `out` (frames are handed to `out` as
/// they are committed, so a gigabyte file never sits in memory).
///
/// # Errors
/// Those of `out`.
pub fn write_snapshot(snap: &RawSnapshot, out: &mut dyn Write) -> io::Result<()> {
    let traces = snap
        .device_traces
        .iter()
        .map(|t| {
            let it: Box<dyn Iterator<Item = RawEvent> + '_> = Box::new(t.iter().copied());
            (t.len(), it)
        })
        .collect();
    write_snapshot_streamed(snap, traces, out)
}

/// [`write_snapshot`] with the device traces given as (length, entries) instead of
/// `snap.device_traces` (a generator's millions of entries need not sit in memory).
///
/// # Errors
/// Those of `out`, and an iterator that yields another count than its length.
pub fn write_snapshot_streamed(
    snap: &RawSnapshot,
    traces: Vec<(usize, Box<dyn Iterator<Item = RawEvent> + '_>)>,
    out: &mut dyn Write,
) -> io::Result<()> {
    let mut p = Pickler::new(out);
    // A recording without stacks (`_record_memory_history(stacks=None)`-like: no stack in
    // the whole file) has trace entries without a `frames` key.
    p.entry_frames =
        (0..snap.frames.stack_count()).any(|i| !snap.frames.stack(StackId(i as u32)).is_empty());
    p.raw(&[0x80, 4])?;
    p.dict_begin(4)?;
    p.key("segments")?;
    p.list_begin(snap.segments.len())?;
    for (i, s) in snap.segments.iter().enumerate() {
        p.item(i, snap.segments.len());
        p.segment(snap, s)?;
    }
    p.list_end(snap.segments.len());
    p.item_done(0, 4);
    p.key("device_traces")?;
    let devices = traces.len();
    p.list_begin(devices)?;
    for (d, (len, trace)) in traces.into_iter().enumerate() {
        p.item(d, devices);
        p.list_begin(len)?;
        let mut written = 0usize;
        for e in trace {
            if written >= len {
                return Err(io::Error::other("a device trace longer than its length"));
            }
            p.item(written, len);
            p.event(snap, &e)?;
            written += 1;
        }
        if written != len {
            return Err(io::Error::other("a device trace shorter than its length"));
        }
        p.list_end(len);
    }
    p.list_end(devices);
    p.item_done(1, 4);
    p.key("allocator_settings")?;
    p.settings(&snap.settings)?;
    p.item_done(2, 4);
    p.key("external_annotations")?;
    p.list_begin(0)?;
    p.list_end(0);
    p.item_done(3, 4);
    p.dict_end(4);
    p.finish()
}

/// Writes `snap` into a new buffer.
#[must_use]
pub fn snapshot_bytes(snap: &RawSnapshot) -> Vec<u8> {
    let mut v = Vec::new();
    write_snapshot(snap, &mut v).expect("a Vec takes every write");
    v
}

/// Memo slots of the shared objects.
#[derive(Default)]
struct Shared {
    /// Keys and the other shared strings, by text.
    strings: HashMap<&'static str, u32>,
    /// Singletons of `CPython`: "" and one-character strings below U+0100.
    singletons: HashMap<String, u32>,
    stacks: HashMap<StackId, u32>,
    frames: HashMap<FrameId, u32>,
}

struct Pickler<'a> {
    out: &'a mut dyn Write,
    frame: Vec<u8>,
    framing: bool,
    next_memo: u32,
    shared: Shared,
    /// Whether trace entries carry `frames`.
    entry_frames: bool,
}

impl<'a> Pickler<'a> {
    fn new(out: &'a mut dyn Write) -> Pickler<'a> {
        Pickler {
            out,
            frame: Vec::with_capacity(FRAME_SIZE_TARGET + 4096),
            framing: false,
            next_memo: 0,
            shared: Shared::default(),
            entry_frames: true,
        }
    }

    /// Bytes outside any frame (`PROTO`), then framing starts.
    fn raw(&mut self, b: &[u8]) -> io::Result<()> {
        self.out.write_all(b)?;
        self.framing = true;
        Ok(())
    }

    fn commit(&mut self, force: bool) -> io::Result<()> {
        if !self.frame.is_empty() && (force || self.frame.len() >= FRAME_SIZE_TARGET) {
            if self.frame.len() >= FRAME_SIZE_MIN {
                let mut h = [0u8; 9];
                h[0] = 0x95;
                h[1..].copy_from_slice(&(self.frame.len() as u64).to_le_bytes());
                self.out.write_all(&h)?;
            }
            self.out.write_all(&self.frame)?;
            self.frame.clear();
        }
        Ok(())
    }

    fn finish(mut self) -> io::Result<()> {
        self.frame.push(b'.');
        self.commit(true)?;
        self.out.flush()
    }

    /// The start of saving one object (where `pickle` commits a full frame).
    fn save(&mut self) -> io::Result<()> {
        debug_assert!(self.framing);
        self.commit(false)
    }

    fn op(&mut self, b: &[u8]) {
        self.frame.extend_from_slice(b);
    }

    fn memoize(&mut self) -> u32 {
        self.op(&[0x94]);
        self.next_memo += 1;
        self.next_memo - 1
    }

    fn get(&mut self, slot: u32) {
        if let Ok(s) = u8::try_from(slot) {
            self.op(&[b'h', s]);
        } else {
            self.op(b"j");
            self.op(&slot.to_le_bytes());
        }
    }

    fn int(&mut self, v: i128) -> io::Result<()> {
        self.save()?;
        if (0..256).contains(&v) {
            self.op(&[b'K', v as u8]);
        } else if (0..65536).contains(&v) {
            self.op(b"M");
            self.op(&(v as u16).to_le_bytes());
        } else if (-(1i128 << 31)..(1i128 << 31)).contains(&v) {
            self.op(b"J");
            self.op(&(v as i32).to_le_bytes());
        } else {
            // LONG1: little-endian two's complement, as short as keeps the sign.
            let bytes = v.to_le_bytes();
            let mut n = 16;
            while n > 1 {
                let (last, prev) = (bytes[n - 1], bytes[n - 2]);
                if (last == 0 && prev & 0x80 == 0) || (last == 0xff && prev & 0x80 != 0) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.op(&[0x8a, n as u8]);
            self.op(&bytes[..n]);
        }
        Ok(())
    }

    fn float(&mut self, v: f64) -> io::Result<()> {
        self.save()?;
        self.op(b"G");
        self.op(&v.to_be_bytes());
        Ok(())
    }

    fn bool(&mut self, v: bool) -> io::Result<()> {
        self.save()?;
        self.op(&[if v { 0x88 } else { 0x89 }]);
        Ok(())
    }

    /// A string object written for the first time (memoised).
    fn fresh_str(&mut self, s: &str) -> io::Result<u32> {
        self.save()?;
        let b = s.as_bytes();
        if b.len() < 256 {
            self.op(&[0x8c, b.len() as u8]);
            self.op(b);
        } else {
            let len = u32::try_from(b.len())
                .map_err(|_| io::Error::other("a string of 4 GiB or more"))?;
            if b.len() >= FRAME_SIZE_TARGET {
                // `pickle` writes a large payload outside the frames.
                self.op(b"X");
                self.op(&len.to_le_bytes());
                self.commit(true)?;
                self.out.write_all(b)?;
            } else {
                self.op(b"X");
                self.op(&len.to_le_bytes());
                self.op(b);
            }
        }
        Ok(self.memoize())
    }

    /// A string: `CPython`'s singletons shared, others fresh.
    fn str(&mut self, s: &str) -> io::Result<()> {
        let mut chars = s.chars();
        let singleton = match (chars.next(), chars.next()) {
            (None, _) => true,
            (Some(c), None) => (c as u32) < 256,
            _ => false,
        };
        if !singleton {
            return self.fresh_str(s).map(|_| ());
        }
        if let Some(&slot) = self.shared.singletons.get(s) {
            self.save()?;
            self.get(slot);
            return Ok(());
        }
        let slot = self.fresh_str(s)?;
        self.shared.singletons.insert(s.to_owned(), slot);
        Ok(())
    }

    /// A string PyTorch makes once and shares (keys, actions, states).
    fn key(&mut self, s: &'static str) -> io::Result<()> {
        if let Some(&slot) = self.shared.strings.get(s) {
            self.save()?;
            self.get(slot);
            return Ok(());
        }
        if s.is_empty() || s.chars().count() == 1 {
            return self.str(s);
        }
        let slot = self.fresh_str(s)?;
        self.shared.strings.insert(s, slot);
        Ok(())
    }

    fn list_begin(&mut self, n: usize) -> io::Result<()> {
        self.save()?;
        self.op(b"]");
        self.memoize();
        if n > 1 {
            self.op(b"(");
        }
        Ok(())
    }

    /// Before item `i` of a list of `n` (opens a new batch).
    fn item(&mut self, i: usize, n: usize) {
        if n > 1 && i > 0 && i.is_multiple_of(BATCH) {
            self.op(b"e(");
        }
    }

    fn list_end(&mut self, n: usize) {
        match n {
            0 => {}
            1 => self.op(b"a"),
            _ => self.op(b"e"),
        }
    }

    fn dict_begin(&mut self, n: usize) -> io::Result<()> {
        self.save()?;
        self.op(b"}");
        self.memoize();
        if n > 1 {
            self.op(b"(");
        }
        Ok(())
    }

    /// After key-value pair `i` of a dict of `n` (closes a batch).
    fn item_done(&mut self, i: usize, n: usize) {
        if n > 1 && (i + 1).is_multiple_of(BATCH) && i + 1 < n {
            self.op(b"u(");
        }
    }

    fn dict_end(&mut self, n: usize) {
        match n {
            0 => {}
            1 => self.op(b"s"),
            _ => self.op(b"u"),
        }
    }

    /// A dict of the given (key, writer) pairs, in order.
    fn fields(
        &mut self,
        n: usize,
        mut each: impl FnMut(&mut Self, usize) -> io::Result<()>,
    ) -> io::Result<()> {
        self.dict_begin(n)?;
        for i in 0..n {
            each(self, i)?;
            self.item_done(i, n);
        }
        self.dict_end(n);
        Ok(())
    }

    fn stack(&mut self, snap: &RawSnapshot, id: StackId) -> io::Result<()> {
        if let Some(&slot) = self.shared.stacks.get(&id) {
            self.save()?;
            self.get(slot);
            return Ok(());
        }
        let frames = snap.frames.stack(id);
        self.save()?;
        self.op(b"]");
        let slot = self.memoize();
        self.shared.stacks.insert(id, slot);
        if frames.len() > 1 {
            self.op(b"(");
        }
        for (i, &f) in frames.iter().enumerate() {
            self.item(i, frames.len());
            self.frame_dict(snap, f)?;
        }
        self.list_end(frames.len());
        Ok(())
    }

    fn frame_dict(&mut self, snap: &RawSnapshot, id: FrameId) -> io::Result<()> {
        if let Some(&slot) = self.shared.frames.get(&id) {
            self.save()?;
            self.get(slot);
            return Ok(());
        }
        let Some(f) = snap.frames.frame(id).copied() else {
            return self.fields(0, |_, _| Ok(()));
        };
        self.save()?;
        self.op(b"}");
        let slot = self.memoize();
        self.shared.frames.insert(id, slot);
        self.op(b"(");
        self.key("name")?;
        self.str(snap.frames.str(f.name))?;
        self.key("filename")?;
        self.str(snap.frames.str(f.filename))?;
        self.key("line")?;
        match f.line_text {
            None => self.int(i128::from(f.line))?,
            Some(t) => {
                let t = snap.frames.str(t);
                match t.parse::<i128>() {
                    Ok(v) => self.int(v)?,
                    Err(_) => self.str(t)?,
                }
            }
        }
        self.dict_end(3);
        Ok(())
    }

    fn segment(&mut self, snap: &RawSnapshot, s: &RawSegment) -> io::Result<()> {
        self.fields(12, |p, i| match i {
            0 => {
                p.key("device")?;
                p.int(i128::from(s.device))
            }
            1 => {
                p.key("address")?;
                p.int(i128::from(s.address))
            }
            2 => {
                p.key("total_size")?;
                p.int(i128::from(s.total_size))
            }
            3 => {
                p.key("allocated_size")?;
                p.int(i128::from(s.allocated_size))
            }
            4 => {
                p.key("active_size")?;
                p.int(i128::from(s.active_size))
            }
            5 => {
                p.key("requested_size")?;
                p.int(i128::from(s.requested_size))
            }
            6 => {
                p.key("stream")?;
                p.int(i128::from(s.stream))
            }
            7 => {
                p.key("segment_type")?;
                p.key(match s.segment_type {
                    SegmentType::Large => "large",
                    SegmentType::Small => "small",
                })
            }
            8 => {
                p.key("segment_pool_id")?;
                p.int(i128::from(s.segment_pool_id.0))?;
                p.int(i128::from(s.segment_pool_id.1))?;
                p.op(&[0x86]);
                p.memoize();
                Ok(())
            }
            9 => {
                p.key("is_expandable")?;
                p.bool(s.is_expandable)
            }
            // PyTorch sets `frames` at once when the segment has no context (the shared
            // empty list), and after `blocks` when it gathers the context's frames.
            10 | 11 if (i == 10) == (s.stack != StackId::EMPTY) => {
                p.key("blocks")?;
                p.list_begin(s.blocks.len())?;
                for (j, b) in s.blocks.iter().enumerate() {
                    p.item(j, s.blocks.len());
                    p.block(snap, b)?;
                }
                p.list_end(s.blocks.len());
                Ok(())
            }
            _ => {
                p.key("frames")?;
                p.stack(snap, s.stack)
            }
        })
    }

    fn block(&mut self, snap: &RawSnapshot, b: &RawBlock) -> io::Result<()> {
        self.fields(5, |p, i| match i {
            0 => {
                p.key("address")?;
                p.int(i128::from(b.address))
            }
            1 => {
                p.key("size")?;
                p.int(i128::from(b.size))
            }
            2 => {
                p.key("requested_size")?;
                p.int(i128::from(b.requested_size))
            }
            3 => {
                p.key("state")?;
                p.key(match b.state {
                    BlockState::ActiveAllocated => "active_allocated",
                    BlockState::ActivePendingFree => "active_pending_free",
                    BlockState::Inactive => "inactive",
                })
            }
            _ => {
                p.key("frames")?;
                p.stack(snap, b.stack)
            }
        })
    }

    fn event(&mut self, snap: &RawSnapshot, e: &RawEvent) -> io::Result<()> {
        let pool = snap.pool_id(e);
        let n = 7 + usize::from(self.entry_frames) + usize::from(pool.is_some());
        let frames = self.entry_frames;
        self.fields(n, |p, i| match i {
            0 => {
                p.key("action")?;
                p.key(match (e.action, e.other) {
                    (Action::Other, OtherAction::Annotate) => "annotate",
                    (Action::Other, OtherAction::UserDefined) => "user_defined",
                    (a, _) => a.as_str(),
                })
            }
            1 => {
                p.key(if e.action == Action::Oom {
                    "device_free"
                } else {
                    "addr"
                })?;
                p.int(i128::from(e.addr))
            }
            2 => {
                p.key("size")?;
                p.int(i128::from(e.size))
            }
            3 => {
                p.key("stream")?;
                p.int(i128::from(e.stream))
            }
            4 => {
                p.key("time_us")?;
                p.int(i128::from(e.time_us))
            }
            5 => {
                p.key("compile_context")?;
                p.fresh_str("N/A").map(|_| ())
            }
            6 => {
                p.key("user_metadata")?;
                p.str(snap.frames.str(e.user_metadata))
            }
            7 if frames => {
                p.key("frames")?;
                p.stack(snap, e.stack)
            }
            _ => {
                let (a, b) = pool.unwrap_or_default();
                p.key("pool_id")?;
                p.int(i128::from(a))?;
                p.int(i128::from(b))?;
                p.op(&[0x86]);
                p.memoize();
                Ok(())
            }
        })
    }

    /// `allocator_settings` with 2.11's keys (those this decoder does not read at their
    /// defaults).
    fn settings(&mut self, s: &RawSettings) -> io::Result<()> {
        let table = s.roundup_power2_divisions.unwrap_or_default();
        self.fields(9, |p, i| match i {
            0 => {
                p.key("PYTORCH_CUDA_ALLOC_CONF")?;
                p.str(&s.conf)
            }
            1 => {
                p.key("max_split_size")?;
                p.int(s.max_split_size_bytes.map_or(-1, i128::from))
            }
            2 => {
                p.key("garbage_collection_threshold")?;
                p.float(s.garbage_collection_threshold)
            }
            3 => {
                p.key("expandable_segments")?;
                p.bool(s.expandable_segments)
            }
            4 => {
                p.key("pinned_num_register_threads")?;
                p.int(1)
            }
            5 => {
                p.key("release_lock_on_cudamalloc")?;
                p.bool(false)
            }
            6 => {
                p.key("pinned_use_cuda_host_register")?;
                p.bool(false)
            }
            7 => {
                p.key("graph_capture_record_stream_reuse")?;
                p.bool(false)
            }
            _ => {
                p.key("roundup_power2_divisions")?;
                p.fields(16, |p, j| {
                    p.str(&(1u32 << j).to_string())?;
                    p.int(i128::from(table[j]))
                })
            }
        })
    }
}
