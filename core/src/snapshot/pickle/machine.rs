//! The pickle machine: its state, argument reading, the stack and the container heap.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::ints::{MAX_INT_DIGITS, decimal_to_le, int_value, le_to_i128, minimal_len};
use super::memo::IndexSet;
use super::memo::Memo;
use super::opcodes::{le_u32, length_prefix, line_at, read_length};
use super::prepass::scan_references;
use super::value::{Container, Kind, SCRATCH, Seal, Text, Value};
use crate::snapshot::error::ImportError;
use crate::snapshot::schema::{Builder, lossy};
use crate::snapshot::{FrameId, RawEvent, StackId};

/// A hasher for keys that already are good 64-bit hashes.
#[derive(Default)]
pub(super) struct PreHashed(u64);

impl Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// What a list item became when the list consumed it.
pub(super) enum Item {
    Value(Value),
    Event(RawEvent),
}

// Its switches (`last`, `copy_spans`, `eager`, `fast_entries`) are independent, each set
// by the machine's caller.
#[allow(clippy::struct_excessive_bools)]
pub(super) struct Vm<'a> {
    /// The input, or the window of it being decoded (streamed: [`super::stream`]).
    pub(super) data: &'a [u8],
    /// Offset in the whole input of `data[0]`.
    pub(super) base: usize,
    /// Offset in the whole input of the next byte to read: errors and containers name
    /// offsets of the whole input, never of a window.
    pub(super) pos: usize,
    /// The whole input's size (the element budget is counted against it).
    pub(super) input_len: usize,
    /// Whether the input ends with `data` (else the window ends at an opcode boundary
    /// and more follows).
    pub(super) last: bool,
    /// Streamed: the bytes of each string kept are copied to the scratch buffer, as the
    /// window they were read from goes away.
    pub(super) copy_spans: bool,
    pub(super) scratch: Vec<u8>,
    pub(super) stack: Vec<Value>,
    /// Stack heights at each `MARK`; the values above the last one are Python's
    /// current stack.
    pub(super) marks: Vec<usize>,
    pub(super) memo: Memo,
    pub(super) heap: Vec<Container>,
    /// Heap slots of converted containers, reused by the next containers.
    pub(super) free: Vec<u32>,
    /// Item buffers of converted containers kept sealed (the single pass keeps them all),
    /// reused by the next new containers.
    pub(super) spare_items: Vec<Vec<Value>>,
    pub(super) event_lists: Vec<Vec<RawEvent>>,
    /// Trace entries of lists that also hold other items (see [`Value::Event`]).
    pub(super) extra_events: Vec<RawEvent>,
    /// The frame table and the entries' pool ids, built as the machine goes.
    pub(super) builder: Builder,
    /// Scratch for interning stacks.
    pub(super) frame_buf: Vec<FrameId>,
    /// Scratch for the frame dicts of a frames list run as one step
    /// ([`Vm::frames_list`]).
    pub(super) frame_objs: Vec<u32>,
    /// Scratch for a trace entry run as one step ([`Vm::entry`]).
    pub(super) entry_scratch: super::entry::EntryScratch,
    /// The list and mark of entries handed over ahead of their `APPENDS` ([`Vm::entry`]).
    pub(super) entry_guard: super::entry::Guard,
    /// The `pool_id`s of those entries, interned when the `APPENDS` comes
    /// ([`Vm::intern_pools_ahead`]): where each entry is in its list's vector of events.
    pub(super) entry_pools: Vec<(usize, (u64, u64))>,
    /// Whether trace entries may run as one step ([`Vm::entry`]): only where the caller
    /// runs the input again without it should a list of entries handed over ahead be seen
    /// before its `APPENDS` (the single pass gives way to the two passes; the streamed
    /// second pass runs once more, [`super::stream`]). Off for every other machine.
    pub(super) fast_entries: bool,
    /// Stacks by a fast hash of their frame ids, checked against the table on a hit:
    /// every trace entry has its own frames list, and hashing each through the
    /// table's `SipHash` index was a visible cost.
    pub(super) stack_cache: HashMap<u64, StackId, BuildHasherDefault<PreHashed>>,
    /// Snapshot mode: convert frames, stacks and trace entries as they are consumed.
    pub(super) eager: bool,
    /// Snapshot elements the schema pass may still produce (see
    /// [`super::mapping::element_budget`]).
    pub(super) elements_left: u64,
    /// The pre-pass's long lists: offset of a run's first `APPENDS`, dicts in the run
    /// ([`super::prepass::Lengths`]); the list of trace entries that run fills is sized
    /// by it up front (no doubling of a gigabyte's entries, which in wasm is a copy).
    pub(super) list_hints: Vec<(u64, u64)>,
    /// The offset of the `APPENDS` being run.
    pub(super) appends_at: usize,
    /// Trace entries the hints may still reserve room for: within a bound of the input's
    /// size, whatever the hints say ([`ENTRY_BYTES`]).
    pub(super) reserve_left: u64,
    /// A chunk's machine: how it reads memo slots put before its chunk.
    pub(super) outer: Option<Box<super::parallel::Outer<'a>>>,
    /// A chunk's machine: where its list's entries go (the list's first entries list,
    /// [`Vm::event_lists`]`[0]`, stays empty).
    pub(super) region: Option<super::parallel::Region<'a>>,
}

/// Input bytes per trace entry the single pass reserves its first list of entries by:
/// fewer than any real snapshot spends (a dict of five keys or more, its keys read back
/// from the memo), so that the list is not doubled (a copy, and both blocks resident).
const SINGLE_PASS_ENTRY_BYTES: u64 = 40;

/// Input bytes a reserved trace entry must be backed by: real snapshots spend 72–77 bytes
/// an entry (a dict of five keys or more), so their lists are reserved exactly.
pub(super) const ENTRY_BYTES: u64 = 24;

/// Errors are boxed inside the machine: a `Result` of one pointer keeps the hot paths'
/// returns in registers.
pub(super) type Res<T> = Result<T, Box<ImportError>>;

#[cold]
#[inline(never)]
#[allow(clippy::unnecessary_box_returns)] // boxed on purpose, see `Res`
pub(super) fn schema_err(offset: u64, location: String, problem: String) -> Box<ImportError> {
    Box::new(ImportError::Schema {
        offset,
        location,
        problem,
    })
}

#[cold]
#[inline(never)]
#[allow(clippy::unnecessary_box_returns)] // boxed on purpose, see `Res`
pub(super) fn malformed(offset: usize, message: impl Into<String>) -> Box<ImportError> {
    Box::new(ImportError::Malformed {
        offset: offset as u64,
        message: message.into(),
    })
}

/// What the single pass fails with where a list of entries handed over ahead of their
/// `APPENDS` ([`Vm::entry`]) would be seen before it: it gives way to the two passes.
#[cold]
#[inline(never)]
#[allow(clippy::unnecessary_box_returns)] // boxed on purpose, see `Res`
pub(super) fn guarded(offset: usize) -> Box<ImportError> {
    malformed(
        offset,
        "a list of trace entries seen before the APPENDS that fills it",
    )
}

#[cold]
#[inline(never)]
#[allow(clippy::unnecessary_box_returns)] // boxed on purpose, see `Res`
pub(super) fn truncated(offset: usize, what: &'static str, missing_bytes: u64) -> Box<ImportError> {
    Box::new(ImportError::Truncated {
        offset: offset as u64,
        what,
        missing_bytes,
    })
}

pub(super) fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::List => "list",
        Kind::Tuple => "tuple",
        Kind::Dict => "dict",
        Kind::Set => "set",
        Kind::FrozenSet => "frozenset",
    }
}

impl<'a> Vm<'a> {
    pub(super) fn new(data: &'a [u8], eager: bool) -> Vm<'a> {
        let (refs, hints) = scan_references(data);
        let mut vm = Vm::with_refs(data, refs, data.len(), eager);
        vm.list_hints = hints;
        vm
    }

    /// A machine over the input (or its first window: see [`Vm::reseat`]) whose pre-pass
    /// found `refs`, of `input_len` bytes in all.
    pub(super) fn with_refs(
        data: &'a [u8],
        refs: IndexSet,
        input_len: usize,
        eager: bool,
    ) -> Vm<'a> {
        Vm {
            data,
            base: 0,
            pos: 0,
            input_len,
            last: true,
            copy_spans: false,
            scratch: Vec::new(),
            stack: Vec::with_capacity(64),
            marks: Vec::with_capacity(16),
            memo: Memo::new(refs, input_len),
            heap: Vec::new(),
            free: Vec::new(),
            spare_items: Vec::new(),
            event_lists: Vec::new(),
            extra_events: Vec::new(),
            builder: Builder::default(),
            frame_buf: Vec::new(),
            frame_objs: Vec::new(),
            entry_scratch: super::entry::EntryScratch::default(),
            entry_guard: super::entry::Guard::default(),
            entry_pools: Vec::new(),
            fast_entries: false,
            stack_cache: HashMap::default(),
            eager,
            elements_left: super::mapping::element_budget(input_len),
            list_hints: Vec::new(),
            appends_at: 0,
            reserve_left: input_len as u64 / ENTRY_BYTES,
            outer: None,
            region: None,
        }
    }

    /// The machine moved onto the window `data` of the input, starting at offset `base`
    /// (where the last window ended); `last`: the input ends with it.
    pub(super) fn reseat(self, data: &[u8], base: usize, last: bool) -> Vm<'_> {
        Vm {
            data,
            base,
            pos: self.pos,
            input_len: self.input_len,
            last,
            copy_spans: self.copy_spans,
            scratch: self.scratch,
            stack: self.stack,
            marks: self.marks,
            memo: self.memo,
            heap: self.heap,
            free: self.free,
            spare_items: self.spare_items,
            event_lists: self.event_lists,
            extra_events: self.extra_events,
            builder: self.builder,
            frame_buf: self.frame_buf,
            frame_objs: self.frame_objs,
            entry_scratch: self.entry_scratch,
            entry_guard: self.entry_guard,
            entry_pools: self.entry_pools,
            fast_entries: self.fast_entries,
            stack_cache: self.stack_cache,
            eager: self.eager,
            elements_left: self.elements_left,
            list_hints: self.list_hints,
            appends_at: self.appends_at,
            reserve_left: self.reserve_left,
            outer: None,
            region: None,
        }
    }

    /// Where the next byte to read is in `data`.
    #[inline]
    pub(super) fn rel(&self) -> usize {
        self.pos.wrapping_sub(self.base)
    }

    pub(super) fn text(&self) -> Text<'_> {
        Text {
            data: self.data,
            scratch: &self.scratch,
        }
    }

    // --- reading arguments -------------------------------------------------------------

    pub(super) fn take(&mut self, n: usize, at: usize, what: &'static str) -> Res<&'a [u8]> {
        let data = self.data;
        let rel = self.rel();
        let end = rel.checked_add(n).filter(|&e| e <= data.len());
        match end.and_then(|e| data.get(rel..e)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(truncated(
                at,
                what,
                (n as u64).saturating_sub(data.len().saturating_sub(rel) as u64),
            )),
        }
    }

    pub(super) fn arg_u8(&mut self, at: usize, what: &'static str) -> Res<u8> {
        match self.data.get(self.rel()) {
            Some(&b) => {
                self.pos += 1;
                Ok(b)
            }
            None => Err(truncated(at, what, 1)),
        }
    }

    pub(super) fn arg_u32(&mut self, at: usize, what: &'static str) -> Res<u32> {
        match le_u32(self.data, self.rel()) {
            Some(v) => {
                self.pos += 4;
                Ok(v)
            }
            None => Err(truncated(
                at,
                what,
                4 - self.data.len().saturating_sub(self.rel()).min(4) as u64,
            )),
        }
    }

    pub(super) fn arg_line(&mut self, at: usize, what: &'static str) -> Res<&'a [u8]> {
        match line_at(self.data, self.rel()) {
            Some((line, next)) => {
                self.pos = self.base + next;
                Ok(line)
            }
            // The single pass's window may end inside the line: more input is needed.
            None if self.memo.every.is_some() && !self.last => Err(truncated(at, what, 1)),
            None => Err(malformed(at, format!("{what} argument has no end of line"))),
        }
    }

    /// A length-prefixed argument: the prefix is checked against the remaining input
    /// before anything is read, so a 10 GB prefix costs nothing. Returns its length and
    /// where it starts in `data` ([`Vm::keep_span`] makes a value's span of it).
    pub(super) fn arg_counted(
        &mut self,
        code: u8,
        at: usize,
        what: &'static str,
    ) -> Res<(u32, usize)> {
        let (width, signed) = length_prefix(code).unwrap_or((1, false));
        let len = match read_length(self.data, self.rel(), width, signed) {
            Ok(Some(len)) => len,
            Ok(None) => {
                let have = self.data.len().saturating_sub(self.rel()) as u64;
                return Err(truncated(at, what, width as u64 - have.min(width as u64)));
            }
            Err(n) => return Err(malformed(at, format!("{what} with negative length {n}"))),
        };
        self.pos += width;
        let remaining = self.data.len().saturating_sub(self.rel()) as u64;
        if len > remaining {
            return Err(truncated(at, what, len - remaining));
        }
        let len32 = u32::try_from(len).map_err(|_| {
            malformed(
                at,
                format!("{what} of {len} bytes: items over 4 GiB are not supported"),
            )
        })?;
        let rel = self.rel();
        self.pos += len as usize;
        Ok((len32, rel))
    }

    /// The span of a value made of `len` bytes at `rel` in `data`: there, or (streamed)
    /// a copy in the scratch buffer.
    pub(super) fn keep_span(&mut self, len: u32, rel: usize) -> u64 {
        if !self.copy_spans {
            return (self.base + rel) as u64;
        }
        let start = self.scratch.len();
        let bytes = rel
            .checked_add(len as usize)
            .and_then(|end| self.data.get(rel..end))
            .unwrap_or(&[]);
        self.scratch.extend_from_slice(bytes);
        start as u64 | SCRATCH
    }

    /// Appends decoded bytes to the scratch buffer and returns their span.
    pub(super) fn scratch_span(
        &mut self,
        at: usize,
        f: impl FnOnce(&mut Vec<u8>),
    ) -> Res<(u32, u64)> {
        let start = self.scratch.len();
        f(&mut self.scratch);
        let len = u32::try_from(self.scratch.len() - start)
            .map_err(|_| malformed(at, "decoded text over 4 GiB is not supported"))?;
        Ok((len, start as u64 | SCRATCH))
    }

    pub(super) fn push_le_int(&mut self, bytes_len: u32, rel: usize) {
        let text = self.text();
        let off = rel as u64;
        // Up to 8 bytes (every address, size and time stamp): one word load and a sign
        // extension, no copy.
        if bytes_len == 0 {
            self.stack.push(Value::Int(0));
            return;
        }
        if let Some(w) = text.word(bytes_len, off) {
            let shift = 64 - 8 * bytes_len;
            self.stack.push(Value::Int(((w << shift) as i64) >> shift));
            return;
        }
        let bytes = text.span(bytes_len, off);
        let n = minimal_len(bytes);
        let value = match bytes.get(..n).and_then(le_to_i128).and_then(int_value) {
            Some(v) => v,
            None => Value::BigInt {
                len: n as u32,
                off: self.keep_span(n as u32, rel),
            },
        };
        self.stack.push(value);
    }

    pub(super) fn push_decimal(&mut self, text: &[u8], at: usize, what: &'static str) -> Res<()> {
        let digits = text.iter().filter(|b| b.is_ascii_digit()).count();
        if digits > MAX_INT_DIGITS {
            return Err(malformed(
                at,
                format!("{what} literal of {digits} digits (Python's limit is {MAX_INT_DIGITS})"),
            ));
        }
        let Some(bytes) = decimal_to_le(text) else {
            return Err(malformed(
                at,
                format!("{what} argument {:?} is not an integer", lossy(text)),
            ));
        };
        if let Some(v) = le_to_i128(&bytes).and_then(int_value) {
            self.stack.push(v);
        } else {
            let (len, off) = self.scratch_span(at, |s| s.extend_from_slice(&bytes))?;
            self.stack.push(Value::BigInt { len, off });
        }
        Ok(())
    }

    // --- stack -----------------------------------------------------------------------

    /// Start of Python's current stack (values above the last mark).
    pub(super) fn base(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    pub(super) fn need(&self, n: usize, at: usize, what: &'static str) -> Res<()> {
        if self.stack.len().saturating_sub(self.base()) < n {
            return Err(malformed(
                at,
                format!("{what} needs {n} value(s) on the stack above the last MARK"),
            ));
        }
        Ok(())
    }

    pub(super) fn pop(&mut self, at: usize, what: &'static str) -> Res<Value> {
        self.need(1, at, what)?;
        self.stack
            .pop()
            .ok_or_else(|| malformed(at, format!("{what} on an empty stack")))
    }

    pub(super) fn top(&self, at: usize, what: &'static str) -> Res<Value> {
        self.need(1, at, what)?;
        self.stack
            .last()
            .copied()
            .ok_or_else(|| malformed(at, format!("{what} on an empty stack")))
    }

    pub(super) fn pop_mark(&mut self, at: usize, what: &'static str) -> Res<usize> {
        if self.marks.len() == self.entry_guard.depth && self.entry_guard.depth != 0 {
            self.close_guard(at, what)?;
        }
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| malformed(at, format!("{what} without a MARK")))?;
        if mark > self.stack.len() {
            return Err(malformed(at, "MARK above the stack (internal)"));
        }
        Ok(mark)
    }

    /// The guarded mark of entries handed over ahead ([`Vm::entry`]) closed by `what`: by
    /// `APPENDS` as they would have been (their list given the room the loop would have
    /// given it there, [`Vm::reserve_late`]), anything else gives way.
    #[cold]
    #[inline(never)]
    fn close_guard(&mut self, at: usize, what: &'static str) -> Res<()> {
        if what != "APPENDS" {
            return Err(guarded(at));
        }
        let g = std::mem::take(&mut self.entry_guard);
        self.intern_pools_ahead(g.list);
        if g.fresh {
            self.reserve_late(g.list, at);
        }
        Ok(())
    }

    /// The room the list of entries `list` would have been given had the `APPENDS` at `at`
    /// made its vector of events, as the loop makes it ([`Vm::new_event_list`]), where its
    /// entries were handed over ahead and the vector made then without a hint: the
    /// pre-pass's hint is keyed by that `APPENDS`, unknown until it comes. Room only:
    /// nothing decoded depends on it.
    fn reserve_late(&mut self, list: u32, at: usize) {
        let hint = self.take_hint(at);
        let events = self.heap.get(list as usize).map_or(0, |c| c.events);
        let Some(v) = (events as usize)
            .checked_sub(1)
            .and_then(|k| self.event_lists.get_mut(k))
        else {
            return;
        };
        let more = usize::try_from(hint).unwrap_or(0).saturating_sub(v.len());
        // As `new_event_list`, room that cannot be had is not an error.
        let _ = v.try_reserve_exact(more);
    }

    /// Whether `list` is the guarded list of entries handed over ahead ([`Vm::entry`]):
    /// appending to it or reading it back before its `APPENDS` gives way.
    #[inline]
    pub(super) fn is_guarded(&self, list: u32) -> bool {
        self.entry_guard.depth != 0 && self.entry_guard.list == list
    }

    /// The container just below `mark`, which must be on Python's (restored) current stack.
    pub(super) fn target_below(
        &self,
        mark: usize,
        at: usize,
        what: &'static str,
        want: Kind,
    ) -> Res<u32> {
        if mark <= self.base() {
            return Err(malformed(
                at,
                format!("{what} has no {} below its MARK", kind_name(want)),
            ));
        }
        let v = self.stack.get(mark - 1).copied().unwrap_or(Value::None);
        self.expect_kind(v, at, what, want)
    }

    pub(super) fn expect_kind(
        &self,
        v: Value,
        at: usize,
        what: &'static str,
        want: Kind,
    ) -> Res<u32> {
        if let Value::Obj(id) = v
            && let Some(c) = self.heap.get(id as usize)
            && c.kind == want
        {
            if c.seal != Seal::Open {
                return Err(malformed(
                    at,
                    format!(
                        "{what} changes the {} made at byte {} after it was used \
                         (pickle.dump never does this)",
                        kind_name(c.kind),
                        c.offset
                    ),
                ));
            }
            return Ok(id);
        }
        Err(malformed(
            at,
            format!(
                "{what} onto {}, expected a {}",
                self.type_name(v),
                kind_name(want)
            ),
        ))
    }

    /// Takes the stack out of the machine so that the values above `mark` can be read
    /// while the heap changes; [`Vm::restore_stack`] truncates it to `mark` and puts it
    /// back. (Moving the stack is free; copying the items was a hot spot.)
    pub(super) fn take_stack(&mut self) -> Vec<Value> {
        std::mem::take(&mut self.stack)
    }

    pub(super) fn restore_stack(&mut self, mut stack: Vec<Value>, mark: usize) {
        stack.truncate(mark);
        self.stack = stack;
    }

    // --- heap ------------------------------------------------------------------------

    pub(super) fn alloc(&mut self, kind: Kind, at: usize) -> Res<u32> {
        if let Some(id) = self.free.pop()
            && let Some(c) = self.heap.get_mut(id as usize)
        {
            c.kind = kind;
            c.offset = at as u64;
            return Ok(id);
        }
        let id = u32::try_from(self.heap.len())
            .map_err(|_| malformed(at, "more than 4 billion containers"))?;
        self.heap.push(Container {
            items: self.spare_items.pop().unwrap_or_default(),
            offset: at as u64,
            events: 0,
            kind,
            shared: false,
            seal: Seal::Open,
        });
        Ok(id)
    }

    /// Returns an unshared container's slot for reuse (its only reference was consumed).
    pub(super) fn release(&mut self, id: u32) {
        if let Some(c) = self.heap.get_mut(id as usize) {
            c.items.clear();
            // Keep a small buffer for the next dict; drop big ones.
            if c.items.capacity() > 64 {
                c.items = Vec::new();
            }
            c.events = 0;
            c.seal = Seal::Open;
            c.shared = false;
            if self.memo.every.is_some() {
                // A memo slot still naming it must not read its next tenant
                // ([`Vm::get_every`]).
                c.offset = u64::MAX;
            }
            self.free.push(id);
        }
    }

    /// Records a conversion: shared containers keep the result, others are released.
    pub(super) fn seal(&mut self, id: u32, seal: Seal) {
        // The single pass cannot tell whether a later `GET` reads it: kept.
        let shared =
            self.memo.every.is_some() || self.heap.get(id as usize).is_some_and(|c| c.shared);
        if shared {
            if let Some(c) = self.heap.get_mut(id as usize) {
                c.seal = seal;
                let mut items = std::mem::take(&mut c.items);
                if items.capacity() <= 64 && self.spare_items.len() < 1024 {
                    items.clear();
                    self.spare_items.push(items);
                }
            }
        } else {
            self.release(id);
        }
    }

    pub(super) fn mark_shared(&mut self, v: Value) {
        if let Value::Obj(id) = v
            && let Some(c) = self.heap.get_mut(id as usize)
        {
            c.shared = true;
        }
    }

    /// A new list of trace entries, its first appended by the `APPENDS` being run: room
    /// for all of them if the pre-pass noted its run. A hint is used once (a list made
    /// later by `APPEND` or `LIST`, or again after mixing, grows as it goes).
    pub(super) fn new_event_list(&mut self) -> Vec<RawEvent> {
        let hint = self.take_hint(self.appends_at);
        // The single pass has no hints: the first list gets room for as many entries as
        // a snapshot this size can hold (real ones spend 62-86 bytes an entry; room never
        // written is never touched, so it costs no resident memory), and grows past it.
        let hint = if hint == 0 && self.memo.every.is_some() && self.event_lists.is_empty() {
            let hint = (self.input_len as u64 / SINGLE_PASS_ENTRY_BYTES).min(self.reserve_left);
            self.reserve_left -= hint;
            hint
        } else {
            hint
        };
        let mut list = Vec::new();
        if list
            .try_reserve_exact(usize::try_from(hint).unwrap_or(0))
            .is_err()
        {
            list = Vec::new();
        }
        list
    }

    /// The entries the pre-pass counted in the run whose first `APPENDS` is at `at`, once
    /// (a hint is used once), within what [`Vm::reserve_left`] still allows, which it
    /// takes.
    fn take_hint(&mut self, at: usize) -> u64 {
        let hint = self
            .list_hints
            .binary_search_by_key(&(at as u64), |&(at, _)| at)
            .ok()
            .and_then(|i| self.list_hints.get_mut(i))
            .map_or(0, |(_, n)| std::mem::take(n).min(self.reserve_left));
        self.reserve_left -= hint;
        hint
    }

    pub(super) fn new_container(&mut self, kind: Kind, items: &[Value], at: usize) -> Res<Value> {
        let id = self.alloc(kind, at)?;
        if let Some(c) = self.heap.get_mut(id as usize) {
            c.items.extend_from_slice(items);
        }
        Ok(Value::Obj(id))
    }
}
