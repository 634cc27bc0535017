//! The second pass on several threads, for a whole input in memory (large plain files).
//!
//! The pre-pass ([`Notes`]) notes batch starts (`MARK`s) inside the long lists' runs of
//! `APPENDS` batches, with the memo's length there, and which memo slots hold which
//! strings (a `MEMOIZE` directly after a string opcode). The input between two noted
//! batch starts of one run is a chunk: a machine of its own runs it from a list of its
//! own, with a memo whose slot 0 is the chunk's first `MEMOIZE` ([`super::memo::Memo`]'s
//! `floor`). A slot put before the chunk reads as its string when the notes know it, else
//! as a stand-in frame (a [`FrameId`] counted down from `u32::MAX`). Each chunk interns
//! its strings, frames, stacks and pools in tables of its own.
//!
//! The merge, in file order, runs the serial machine up to each chunk, checks that it
//! stands where the chunk's machine assumed (the list on top, the memo's length, every
//! stand-in slot a frame dict already converted), interns the chunk's tables into the
//! serial ones in their first-seen order (each table in order of its local ids, which
//! keeps the serial decode's first-seen order), renumbers the chunk's entries, appends
//! them, and puts the chunk's memo slots that later `GET`s read. Anything else (an error
//! anywhere, a chunk that ends elsewhere, a slot that is not what it was taken for) drops
//! it all and decodes serially from the start, which reports exactly as ever.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::machine::{Res, Vm, malformed};
use super::memo::{IndexSet, Memo};
use super::prepass::{Notes, Scanner};
use super::value::{Kind, SCRATCH, Seal, Value};
use crate::snapshot::error::ImportError;
use crate::snapshot::schema::Builder;
use crate::snapshot::{Frame, FrameId, FxInfo, RawEvent, RawSnapshot, StackId, StrId};

/// Inputs at least this large are decoded on several threads.
pub(crate) const PARALLEL_MIN_BYTES: usize = 64 << 20;

/// How a parallel decode cuts its input.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    pub(crate) threads: usize,
    /// A chunk spans at least this many bytes.
    pub(crate) chunk_bytes: u64,
    /// The pre-pass notes a batch start at most once per this many bytes.
    pub(crate) batch_step: u64,
}

impl Plan {
    /// For an input of `len` bytes: the machine's threads (16 at most), about four chunks
    /// a thread.
    pub(crate) fn for_input(len: usize) -> Plan {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(16));
        Plan {
            threads,
            chunk_bytes: (len as u64 / (4 * threads as u64)).max(1 << 20),
            batch_step: 64 << 10,
        }
    }
}

/// How a chunk's machine reads memo slots put before its chunk.
pub(super) struct Outer<'a> {
    strings: &'a [(u32, u32, u64)],
    /// Where the strings' bytes are when the input is not all there (streamed: the
    /// notes' copies, [`Notes::string_bytes`]); they are then copied to the scratch.
    bytes: Option<&'a [u8]>,
    /// The serial memo's directory (which slots are read back), shared: a slot's place
    /// among them indexes `seen`.
    global: &'a Memo,
    /// Per slot read back: 1 + its index in `values` once read, else 0.
    seen: Vec<u32>,
    values: Vec<Value>,
    /// Slots beyond the dense ones.
    sparse: HashMap<u32, Value>,
    /// The slots read as stand-in frames, by stand-in number, and whether each was
    /// taken for a list of frames (the value of a `frames` key).
    stand_ins: Vec<(u32, bool)>,
}

impl Outer<'_> {
    /// What slot `i` (put before the chunk) reads as: its string, else a stand-in.
    fn resolve(&mut self, i: u32) -> Value {
        if let Ok(j) = self.strings.binary_search_by_key(&i, |&(k, _, _)| k) {
            let (_, len, off) = self.strings.get(j).copied().unwrap_or((0, 0, 0));
            Value::Str { len, off }
        } else {
            let k = u32::try_from(self.stand_ins.len()).unwrap_or(u32::MAX);
            self.stand_ins.push((i, false));
            Value::Frame(FrameId(u32::MAX - k))
        }
    }
}

/// The stand-in frame `k` is `FrameId(u32::MAX - k)`, its stack `StackId(u32::MAX - k)`.
fn stand_in(id: u32, count: usize) -> Option<usize> {
    let k = (u32::MAX - id) as usize;
    (k < count).then_some(k)
}

impl Vm<'_> {
    /// `GET` of a slot below the memo's floor: a chunk's machine reads a slot put before
    /// its chunk.
    #[inline(never)]
    pub(super) fn get_outer(&mut self, i: u32, at: usize) -> Res<()> {
        let Some(outer) = self.outer.as_deref_mut() else {
            return Err(malformed(at, format!("memo index {i} was never stored")));
        };
        let v = if let Some(slot) = outer.global.dense_slot(i)
            && let Some(&seen) = outer.seen.get(slot)
        {
            if let Some(&v) = seen
                .checked_sub(1)
                .and_then(|k| outer.values.get(k as usize))
            {
                v
            } else {
                let v = copy_in(outer.resolve(i), outer.bytes, &mut self.scratch);
                outer.values.push(v);
                if let Some(s) = outer.seen.get_mut(slot) {
                    *s = u32::try_from(outer.values.len()).unwrap_or(0);
                }
                v
            }
        } else if let Some(&v) = outer.sparse.get(&i) {
            v
        } else {
            let v = copy_in(outer.resolve(i), outer.bytes, &mut self.scratch);
            outer.sparse.insert(i, v);
            v
        };
        self.stack.push(v);
        Ok(())
    }

    /// A stand-in frame under a `frames` key: a list of frames put before the chunk.
    pub(super) fn stand_in_stack(&mut self, f: FrameId) -> Option<StackId> {
        let outer = self.outer.as_deref_mut()?;
        let k = stand_in(f.0, outer.stand_ins.len())?;
        outer.stand_ins.get_mut(k)?.1 = true;
        Some(StackId(f.0))
    }
}

/// A string read from the notes' copies (`bytes`) goes to the scratch buffer.
fn copy_in(v: Value, bytes: Option<&[u8]>, scratch: &mut Vec<u8>) -> Value {
    match (v, bytes) {
        (Value::Str { len, off }, Some(bytes)) => {
            let start = scratch.len() as u64;
            let from = usize::try_from(off).unwrap_or(usize::MAX);
            let got = from
                .checked_add(len as usize)
                .and_then(|end| bytes.get(from..end))
                .unwrap_or(&[]);
            scratch.extend_from_slice(got);
            Value::Str {
                len: got.len() as u32,
                off: start | SCRATCH,
            }
        }
        (v, _) => v,
    }
}

/// What a stand-in slot holds in the serial machine.
#[derive(Clone, Copy)]
enum Resolved {
    Frame(FrameId, Value),
    Stack(StackId, Value),
}

/// A run of batches decoded apart: `[start, end)`, the memo's length at each end, the
/// run's entries before each end (`first`, `last`) as the pre-pass counted them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Chunk {
    pub(super) start: u64,
    pub(super) start_len: u64,
    pub(super) end: u64,
    pub(super) end_len: u64,
    /// Offset of the run's first `APPENDS` ([`super::prepass::Lengths`]).
    pub(super) run: u64,
    pub(super) first: u64,
    pub(super) last: u64,
}

/// Where a chunk's machine writes its list's entries: its part of the list they stay
/// in ([`Room`]), which they must fill exactly.
pub(super) struct Region<'a> {
    part: &'a mut [RawEvent],
    filled: usize,
    over: bool,
}

impl Region<'_> {
    #[inline]
    pub(super) fn put(&mut self, ev: RawEvent) {
        if let Some(slot) = self.part.get_mut(self.filled) {
            *slot = ev;
            self.filled += 1;
        } else {
            self.over = true;
        }
    }
}

/// The list of a run's entries, sized before the chunks run, each chunk's entries
/// written in their place (no chunk list copied into it at the merge).
pub(super) struct Room {
    run: u64,
    /// The entries before the run's first chunk: the serial machine's, copied in once
    /// the chunks are merged, with those after its last.
    head: usize,
    entries: Vec<RawEvent>,
}

/// The rooms of the chunks' runs (each chunk's run has one, as long as its chunks'
/// entries and the hint's rest), taking their hints from the serial machine; `None`
/// where a run's chunks do not follow each other or the entries are more than the
/// input can back ([`super::machine::ENTRY_BYTES`]).
pub(super) fn rooms(vm: &mut Vm<'_>, chunks: &[Chunk]) -> Option<Vec<Room>> {
    // Per run: its head and its entries to the last chunk's end.
    let mut runs: Vec<(u64, u64, u64)> = Vec::new();
    let mut prev: Option<&Chunk> = None;
    for c in chunks {
        match prev {
            Some(p) if p.run == c.run => {
                if p.end != c.start || p.last != c.first {
                    return None;
                }
            }
            _ => runs.push((c.run, c.first, c.first)),
        }
        runs.last_mut()?.2 = c.last;
        prev = Some(c);
    }
    let mut out = Vec::with_capacity(runs.len());
    for (run, head, len) in runs {
        let hint = vm
            .list_hints
            .binary_search_by_key(&run, |&(at, _)| at)
            .ok()
            .and_then(|i| vm.list_hints.get_mut(i))
            .map_or(0, |(_, n)| std::mem::take(n));
        let want = hint.max(len).min(vm.reserve_left);
        if len > want || head > len {
            return None;
        }
        vm.reserve_left -= want;
        // Zeroed by the allocator, untouched: each chunk's thread brings in the pages of
        // its part as it writes its entries (`calloc` of fresh pages writes nothing), and
        // no entry is written twice.
        let mut entries: Vec<RawEvent> =
            bytemuck::allocation::zeroed_vec(usize::try_from(len).ok()?);
        entries
            .try_reserve_exact(usize::try_from(want - len).ok()?)
            .ok()?;
        out.push(Room {
            run,
            head: usize::try_from(head).ok()?,
            entries,
        });
    }
    Some(out)
}

/// Each chunk's part of its room, in chunk order.
pub(super) fn parts<'r>(rooms: &'r mut [Room], chunks: &[Chunk]) -> Vec<&'r mut [RawEvent]> {
    let mut out = Vec::with_capacity(chunks.len());
    let mut rest: &mut [RawEvent] = &mut [];
    let mut rooms = rooms.iter_mut();
    let mut run = None;
    for c in chunks {
        if run != Some(c.run)
            && let Some(room) = rooms.next()
        {
            rest = room.entries.get_mut(room.head..).unwrap_or_default();
            run = Some(c.run);
        }
        let n = usize::try_from(c.last - c.first)
            .unwrap_or(0)
            .min(rest.len());
        let (part, tail) = std::mem::take(&mut rest).split_at_mut(n);
        out.push(part);
        rest = tail;
    }
    out
}

/// The rooms' runs as the chunks are merged: each run's head and the serial machine's
/// list of it.
pub(super) struct Runs {
    heads: Vec<(u64, usize)>,
    lists: Vec<u32>,
}

impl Runs {
    pub(super) fn of(rooms: &[Room]) -> Runs {
        Runs {
            heads: rooms.iter().map(|r| (r.run, r.head)).collect(),
            lists: vec![0; rooms.len()],
        }
    }

    /// Merges a chunk ([`merge`]); `None` if the serial machine does not stand where the
    /// chunk's machine assumed.
    pub(super) fn merge(&mut self, vm: &mut Vm<'_>, chunk: &Chunk, done: Done<'_>) -> Option<()> {
        let i = self
            .heads
            .binary_search_by_key(&chunk.run, |&(r, _)| r)
            .ok()?;
        let n = merge(vm, chunk, done, self.heads.get(i)?.1)?;
        let list = self.lists.get_mut(i)?;
        if n != 0 {
            if *list != 0 && *list != n {
                return None;
            }
            *list = n;
        }
        Some(())
    }

    /// The rooms put in place of the serial machine's lists of their runs, with the
    /// entries it put there (before the first chunk, after the last); `None` if a list
    /// is shorter than its head.
    pub(super) fn settle(self, vm: &mut Vm<'_>, rooms: Vec<Room>) -> Option<()> {
        for (mut room, n) in rooms.into_iter().zip(self.lists) {
            if n == 0 {
                // No entries in the run's chunks nor before them.
                if room.entries.is_empty() {
                    continue;
                }
                return None;
            }
            let list = vm.event_lists.get_mut(n as usize - 1)?;
            room.entries
                .get_mut(..room.head)?
                .copy_from_slice(list.get(..room.head)?);
            room.entries.extend_from_slice(list.get(room.head..)?);
            *list = room.entries;
        }
        Some(())
    }
}

/// A memo slot a chunk put and a later `GET` reads.
pub(super) enum Export {
    Value(Value),
    /// A string, bytes or wide integer in the chunk's scratch buffer: its bytes.
    Span(Value, Vec<u8>),
    StandIn(usize),
    Frame(FrameId, u64),
    Stack(StackId, u64),
}

/// What a chunk's machine made.
pub(super) struct Done<'r> {
    /// Its part of the room, filled.
    events: &'r mut [RawEvent],
    builder: Builder,
    stand_ins: Vec<(u32, bool)>,
    exports: Vec<(u32, Export)>,
}

/// The chunks of the runs noted, each at least `chunk_bytes` long; a run's last chunk
/// goes on to its last batch noted (what the serial machine decodes after it is copied
/// into the room).
pub(super) fn plan_chunks(notes: &Notes, chunk_bytes: u64) -> Vec<Chunk> {
    let mut out = Vec::new();
    // Where the next chunk of the run starts, and the run's last batch so far.
    let mut from: Option<(u64, u64, u64, u64)> = None;
    let mut tip = None;
    for &(at, len, run, dicts) in &notes.batches {
        match from {
            Some((start, start_len, r, first)) if r == run => {
                if at.saturating_sub(start) >= chunk_bytes {
                    out.push(Chunk {
                        start,
                        start_len,
                        end: at,
                        end_len: len,
                        run,
                        first,
                        last: dicts,
                    });
                    from = Some((at, len, run, dicts));
                }
            }
            _ => {
                stretch(&mut out, from, tip);
                from = Some((at, len, run, dicts));
            }
        }
        tip = Some((at, len, run, dicts));
    }
    stretch(&mut out, from, tip);
    out
}

/// The run's last chunk, if it ends at `from`, taken on to `tip`.
fn stretch(
    out: &mut [Chunk],
    from: Option<(u64, u64, u64, u64)>,
    tip: Option<(u64, u64, u64, u64)>,
) {
    if let (Some(c), Some((start, ..)), Some((at, len, run, dicts))) = (out.last_mut(), from, tip)
        && c.run == run
        && c.end == start
        && at > c.end
    {
        c.end = at;
        c.end_len = len;
        c.last = dicts;
    }
}

/// Decodes `data` on `plan.threads` threads; the serial decode where that cannot be done
/// exactly. `tamper` changes the chunks planned (tests: misnoted boundaries). Returns the
/// result and the number of chunks merged.
pub(super) fn decode(
    data: &[u8],
    plan: Plan,
    tamper: &dyn Fn(&mut Vec<Chunk>),
) -> (Result<RawSnapshot, ImportError>, usize) {
    if let Some((snap, merged)) = try_parallel(data, plan, tamper) {
        return (Ok(snap), merged);
    }
    (super::decode_serial(data), 0)
}

fn try_parallel(
    data: &[u8],
    plan: Plan,
    tamper: &dyn Fn(&mut Vec<Chunk>),
) -> Option<(RawSnapshot, usize)> {
    let mut scan = Scanner::new(data.len() as u64, u64::MAX);
    scan.notes = Some(Box::new(Notes::new(data.len() as u64, plan.batch_step)));
    scan.scan(data, true);
    let hints = scan.lengths.hints();
    let notes = scan.notes.take()?;
    let mut vm = Vm::with_refs(data, scan.refs, data.len(), true);
    vm.list_hints = hints;
    let mut chunks = if notes.puts || notes.overflow {
        Vec::new()
    } else {
        plan_chunks(&notes, plan.chunk_bytes)
    };
    tamper(&mut chunks);
    let mut rooms = rooms(&mut vm, &chunks)?;
    let mut runs = Runs::of(&rooms);
    let parts: Vec<Mutex<Option<&mut [RawEvent]>>> = parts(&mut rooms, &chunks)
        .into_iter()
        .map(|p| Mutex::new(Some(p)))
        .collect();
    let results: Vec<Mutex<Option<Done>>> = chunks.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..plan.threads.clamp(1, 16).min(chunks.len()) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let (Some(c), Some(slot), Some(part)) =
                        (chunks.get(i), results.get(i), parts.get(i))
                    else {
                        break;
                    };
                    let Some(part) = part.lock().ok().and_then(|mut p| p.take()) else {
                        break;
                    };
                    let src = Source {
                        window: data
                            .get(..usize::try_from(c.end).unwrap_or(usize::MAX))
                            .unwrap_or(&[]),
                        base: 0,
                        input_len: data.len(),
                        string_bytes: None,
                    };
                    let done = run_chunk(&src, &vm.memo, &notes.strings, *c, part);
                    if let Ok(mut slot) = slot.lock() {
                        *slot = done;
                    }
                }
            });
        }
    });
    let merged = chunks.len();
    for (c, r) in chunks.iter().zip(results) {
        let done = r.into_inner().ok()??;
        vm.data = data.get(..usize::try_from(c.start).ok()?)?;
        vm.last = false;
        if !matches!(vm.run_window(), Ok(None)) || vm.pos as u64 != c.start {
            return None;
        }
        vm.data = data;
        runs.merge(&mut vm, c, done)?;
    }
    drop(parts);
    runs.settle(&mut vm, rooms)?;
    vm.data = data;
    vm.last = true;
    let (root, stop_at) = vm.run().ok()?;
    let snap = vm.snapshot(root, stop_at).ok()?;
    Some((snap, merged))
}

/// The memo of a chunk's machine: the slots `GET`s read among those the chunk puts,
/// numbered from the chunk's first.
pub(super) fn chunk_refs(global: &Memo, c: Chunk, bytes: usize) -> Option<IndexSet> {
    let floor = u32::try_from(c.start_len).ok()?;
    let span = u32::try_from(c.end_len.checked_sub(c.start_len)?).ok()?;
    let mut set = IndexSet::new(bytes.max(span as usize));
    for j in 0..span {
        if global.is_ref(floor + j) {
            set.insert(j);
        }
    }
    Some(set)
}

/// Where a chunk's bytes are: the whole input (`base` 0), or the chunk's own bytes at
/// `base` with the notes' copies of the strings before it.
pub(super) struct Source<'a> {
    pub(super) window: &'a [u8],
    pub(super) base: usize,
    pub(super) input_len: usize,
    pub(super) string_bytes: Option<&'a [u8]>,
}

/// Runs chunk `c`'s machine, its entries written to `part`, which they must fill.
pub(super) fn run_chunk<'r>(
    src: &Source<'_>,
    global: &Memo,
    strings: &[(u32, u32, u64)],
    c: Chunk,
    part: &'r mut [RawEvent],
) -> Option<Done<'r>> {
    let start = usize::try_from(c.start).ok()?;
    let end = usize::try_from(c.end).ok()?;
    let refs = chunk_refs(global, c, end.checked_sub(start)?)?;
    let mut vm = Vm::with_refs(src.window, refs, src.input_len, true);
    vm.base = src.base;
    vm.copy_spans = src.string_bytes.is_some();
    vm.memo.floor = u32::try_from(c.start_len).ok()?;
    vm.last = false;
    vm.pos = start;
    vm.outer = Some(Box::new(Outer {
        strings,
        bytes: src.string_bytes,
        global,
        seen: vec![0; global.slots.len()],
        values: Vec::new(),
        sparse: HashMap::new(),
        stand_ins: Vec::new(),
    }));
    let list = vm.alloc(Kind::List, start).ok()?;
    vm.stack.push(Value::Obj(list));
    vm.event_lists.push(Vec::new());
    vm.heap.get_mut(list as usize)?.events = 1;
    vm.region = Some(Region {
        part: &mut *part,
        filled: 0,
        over: false,
    });
    if !matches!(vm.run_window(), Ok(None)) {
        return None;
    }
    let span = c.end_len.checked_sub(c.start_len)?;
    let clean = vm.pos == end
        && vm.marks.is_empty()
        && vm.stack == [Value::Obj(list)]
        && vm.extra_events.is_empty()
        && vm.memo.set.is_none()
        && vm.memo.len == span;
    if !clean {
        return None;
    }
    let c_list = vm.heap.get(list as usize)?;
    let region = vm.region.take()?;
    if !c_list.items.is_empty()
        || c_list.events != 1
        || region.over
        || region.filled != region.part.len()
    {
        return None;
    }
    let stand_ins = vm.outer.take().map(|o| o.stand_ins).unwrap_or_default();
    let mut exports = Vec::new();
    for j in 0..u32::try_from(span).ok()? {
        let Some(v) = vm.memo.get(j) else { continue };
        let e = match v {
            Value::Obj(id) => {
                let h = vm.heap.get(id as usize)?;
                match h.seal {
                    Seal::Frame(f) => Export::Frame(f, h.offset),
                    Seal::Stack(s) => Export::Stack(s, h.offset),
                    Seal::Open => return None,
                }
            }
            Value::Frame(f) => Export::StandIn(stand_in(f.0, stand_ins.len())?),
            Value::Stack(_) | Value::Event(_) => return None,
            Value::Str { len, off } | Value::Bytes { len, off } | Value::BigInt { len, off }
                if off & SCRATCH != 0 =>
            {
                Export::Span(v, vm.text().span(len, off).to_vec())
            }
            v => Export::Value(v),
        };
        exports.push((vm.memo.floor + j, e));
    }
    let builder = std::mem::take(&mut vm.builder);
    drop(vm);
    Some(Done {
        events: part,
        builder,
        stand_ins,
        exports,
    })
}

/// Merges a chunk into the serial machine standing at its start, its list holding the
/// run's `run_head` entries; `None` if it does not stand where the chunk's machine assumed.
/// Returns 1 + the index of the serial machine's list of entries (0: none yet).
fn merge(vm: &mut Vm<'_>, chunk: &Chunk, done: Done<'_>, run_head: usize) -> Option<u32> {
    if vm.memo.len != chunk.start_len || vm.memo.set.is_some() || vm.base() >= vm.stack.len() {
        return None;
    }
    let Some(&Value::Obj(list)) = vm.stack.last() else {
        return None;
    };
    let head = vm.heap.get(list as usize)?;
    if head.kind != Kind::List || head.seal != Seal::Open || !head.items.is_empty() {
        return None;
    }
    // Each stand-in slot: a frame dict, or a list of frames where the chunk took it for
    // one, that the serial machine has converted.
    let mut stand_ins = Vec::with_capacity(done.stand_ins.len());
    for &(slot, as_stack) in &done.stand_ins {
        let v = vm.memo.get(slot)?;
        let Value::Obj(id) = v else { return None };
        stand_ins.push(match (vm.heap.get(id as usize)?.seal, as_stack) {
            (Seal::Frame(f), false) => Resolved::Frame(f, v),
            (Seal::Stack(s), true) => Resolved::Stack(s, v),
            _ => return None,
        });
    }
    let local = &done.builder.frames;
    if local.frame_count() as u64 + stand_ins.len() as u64 >= u64::from(u32::MAX) {
        return None;
    }
    let tables = &mut vm.builder;
    let strs: Vec<StrId> = (0..local.string_count() as u32)
        .map(|i| tables.frames.intern_str(local.str(StrId(i))))
        .collect();
    let map_str = |id: StrId| strs.get(id.0 as usize).copied();
    let mut fx = vec![0u32];
    for info in local.fx_infos() {
        let mapped = FxInfo {
            node_op: map_str(info.node_op)?,
            node_name: map_str(info.node_name)?,
            node_target: map_str(info.node_target)?,
            original_trace: map_str(info.original_trace)?,
            node_info: map_str(info.node_info)?,
        };
        fx.push(tables.frames.intern_fx(mapped));
    }
    let mut frames = Vec::with_capacity(local.frame_count());
    for i in 0..local.frame_count() as u32 {
        let f = local.frame(FrameId(i))?;
        let line_text = match f.line_text {
            Some(t) => Some(map_str(t)?),
            None => None,
        };
        frames.push(tables.frames.intern_frame(Frame {
            name: map_str(f.name)?,
            filename: map_str(f.filename)?,
            line: f.line,
            line_text,
            fx: *fx.get(f.fx as usize)?,
        }));
    }
    let mut stacks = Vec::with_capacity(local.stack_count());
    let mut buf = Vec::new();
    for i in 0..local.stack_count() as u32 {
        buf.clear();
        for &f in local.stack(StackId(i)) {
            buf.push(match stand_in(f.0, stand_ins.len()) {
                Some(k) => match stand_ins.get(k)? {
                    Resolved::Frame(f, _) => *f,
                    Resolved::Stack(..) => return None,
                },
                None => *frames.get(f.0 as usize)?,
            });
        }
        stacks.push(tables.frames.intern_stack(&buf));
    }
    let pools: Vec<u32> = done
        .builder
        .pools()
        .iter()
        .map(|&p| tables.intern_pool(p))
        .collect();
    // The entries, renumbered where they are; the serial list (the run's head) gets
    // them when the rooms settle.
    let mut n = vm.heap.get(list as usize)?.events;
    if n == 0 && !done.events.is_empty() {
        vm.appends_at = usize::try_from(chunk.start).ok()?;
        let new = vm.new_event_list();
        vm.event_lists.push(new);
        n = u32::try_from(vm.event_lists.len()).ok()?;
        vm.heap.get_mut(list as usize)?.events = n;
    }
    let list_len = match n {
        0 => 0,
        n => vm.event_lists.get(n as usize - 1)?.len(),
    };
    if list_len != run_head {
        return None;
    }
    for ev in done.events.iter_mut() {
        ev.stack = match stand_in(ev.stack.0, stand_ins.len()) {
            Some(k) => match stand_ins.get(k)? {
                Resolved::Stack(s, _) => *s,
                Resolved::Frame(..) => return None,
            },
            None => *stacks.get(ev.stack.0 as usize)?,
        };
        ev.user_metadata = map_str(ev.user_metadata)?;
        if ev.pool != 0 {
            ev.pool = *pools.get(ev.pool as usize - 1)?;
        }
    }
    // The chunk's slots that later `GET`s read.
    for (i, e) in done.exports {
        let v = match e {
            Export::Value(v) => v,
            Export::Span(v, bytes) => {
                let off = vm.scratch.len() as u64 | SCRATCH;
                vm.scratch.extend_from_slice(&bytes);
                let len = u32::try_from(bytes.len()).ok()?;
                match v {
                    Value::Bytes { .. } => Value::Bytes { len, off },
                    Value::BigInt { .. } => Value::BigInt { len, off },
                    _ => Value::Str { len, off },
                }
            }
            Export::StandIn(k) => match stand_ins.get(k)? {
                Resolved::Frame(_, v) | Resolved::Stack(_, v) => *v,
            },
            Export::Frame(f, offset) => sealed(
                vm,
                Kind::Dict,
                offset,
                Seal::Frame(*frames.get(f.0 as usize)?),
            )?,
            Export::Stack(st, offset) => sealed(
                vm,
                Kind::List,
                offset,
                Seal::Stack(*stacks.get(st.0 as usize)?),
            )?,
        };
        vm.memo.store(i, v);
    }
    vm.memo.len = chunk.end_len;
    vm.pos = usize::try_from(chunk.end).ok()?;
    Some(n)
}

/// A converted, shared container as the serial machine would hold it.
fn sealed(vm: &mut Vm<'_>, kind: Kind, offset: u64, seal: Seal) -> Option<Value> {
    let id = vm.alloc(kind, usize::try_from(offset).ok()?).ok()?;
    let c = vm.heap.get_mut(id as usize)?;
    c.seal = seal;
    c.shared = true;
    Some(Value::Obj(id))
}

#[cfg(test)]
#[path = "parallel_tests.rs"]
pub(in crate::snapshot::pickle) mod tests;
