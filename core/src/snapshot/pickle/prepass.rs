//! The pre-pass: which memo indices are ever read back, where a decoding window may
//! end, and how long the long lists are ([`Lengths`]: the machine sizes a device trace's
//! entries up front). It runs over the whole input at once, or over it in pieces
//! ([`Scanner::scan`]), so that a streamed decode never holds the file.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::memo::IndexSet;
use super::opcodes::{
    fixed_args, le_u32, length_prefix, line_at, op, parse_memo_index, read_length,
};

// The pre-pass's view of an opcode byte: below 0x80 the number of argument bytes to
// skip, else one of these classes. A table keeps the common case to one load and one
// well-predicted branch (the pass reads ~9 M opcodes for a 32 MB snapshot).
pub(super) const SCAN_GET1: u8 = 0x80;
pub(super) const SCAN_GET4: u8 = 0x81;
pub(super) const SCAN_COUNTED: u8 = 0x82;
pub(super) const SCAN_LINE: u8 = 0x83;
pub(super) const SCAN_GET_LINE: u8 = 0x84;
// Opcodes [`Lengths`] follows (all without arguments but `FRAME`).
pub(super) const SCAN_MARK: u8 = 0x85;
pub(super) const SCAN_EMPTY_DICT: u8 = 0x86;
pub(super) const SCAN_APPENDS: u8 = 0x87;
/// An opcode that pops to the last mark, other than `APPENDS`.
pub(super) const SCAN_CLOSE: u8 = 0x88;
pub(super) const SCAN_FRAME: u8 = 0x89;
/// `MEMOIZE`, and the three memo stores (counted by [`Notes`]).
pub(super) const SCAN_MEMOIZE: u8 = 0x8a;
pub(super) const SCAN_PUT1: u8 = 0x8b;
pub(super) const SCAN_PUT4: u8 = 0x8c;
pub(super) const SCAN_END: u8 = 0xff;

pub(super) static SCAN_TABLE: [u8; 256] = {
    let mut t = [SCAN_END; 256];
    let mut b = 0;
    while b < 256 {
        let code = b as u8;
        t[b] = match code {
            op::STOP => SCAN_END,
            op::BINGET => SCAN_GET1,
            op::LONG_BINGET => SCAN_GET4,
            op::GET => SCAN_GET_LINE,
            op::INT | op::LONG | op::FLOAT | op::STRING | op::UNICODE | op::PUT => SCAN_LINE,
            op::MARK => SCAN_MARK,
            op::EMPTY_DICT => SCAN_EMPTY_DICT,
            op::APPENDS => SCAN_APPENDS,
            op::SETITEMS
            | op::DICT
            | op::LIST
            | op::TUPLE
            | op::FROZENSET
            | op::ADDITEMS
            | op::POP_MARK => SCAN_CLOSE,
            op::FRAME => SCAN_FRAME,
            op::MEMOIZE => SCAN_MEMOIZE,
            op::BINPUT => SCAN_PUT1,
            op::LONG_BINPUT => SCAN_PUT4,
            _ => match fixed_args(code) {
                Some(n) => n as u8,
                None if length_prefix(code).is_some() => SCAN_COUNTED,
                None => SCAN_END,
            },
        };
        b += 1;
    }
    t
};

/// The pre-pass: which memo indices are ever read back. Stops where the machine would
/// stop (STOP, or an opcode it refuses or cannot read), so it never sees further.
/// Also gives the long lists' lengths ([`Lengths::hints`]).
pub(super) fn scan_references(data: &[u8]) -> (IndexSet, Vec<(u64, u64)>) {
    let mut s = Scanner::new(data.len() as u64, u64::MAX);
    s.scan(data, true);
    let hints = s.lengths.hints();
    (s.refs, hints)
}

/// How the scan ended for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    /// At an opcode the machine stops at or refuses (`STOP`, an unknown or refused
    /// opcode), which starts at this offset: the machine needs nothing after its byte.
    Opcode(u64),
    /// At an opcode it cannot read (truncated, a bad length or memo index): the machine
    /// needs the rest of the input to say how much is missing.
    Unreadable,
}

/// The pre-pass over an input given in pieces, in order.
#[derive(Debug)]
pub(super) struct Scanner {
    pub(super) refs: IndexSet,
    /// Offset in the whole input of the next opcode.
    pub(super) pos: u64,
    /// Opcode starts, one per `step` bytes or more: a decoding window may end at each.
    pub(super) boundaries: Vec<u64>,
    step: u64,
    next_boundary: u64,
    /// Set once the scan has stopped.
    pub(super) end: Option<End>,
    pub(super) lengths: Lengths,
    /// What a parallel decode needs (whole-file decodes only: [`super::parallel`]).
    pub(super) notes: Option<Box<Notes>>,
    /// A segment's scan ([`super::segments`]): the list opcodes written down for
    /// [`Scanner::absorb`] rather than followed, since the marks open before the segment
    /// are not known here.
    pub(super) log: Option<Box<Log>>,
}

/// The pre-pass's notes for a parallel decode ([`super::parallel`]): the memo's length
/// at the start of batches of long lists, and which memo slots hold which strings.
#[derive(Debug, Default)]
pub(super) struct Notes {
    /// `MEMOIZE`s so far (Python's `len(memo)` while no `PUT` came).
    pub(super) memos: u64,
    /// Whether any `PUT`, `BINPUT` or `LONG_BINPUT` came (the memo's length is then
    /// not the count of `MEMOIZE`s: no parallel decode).
    pub(super) puts: bool,
    /// Batches of a run ([`Lengths`]) that may start a chunk: (offset of its `MARK`,
    /// memo length there, offset of the run's first `APPENDS`, dicts the run's earlier
    /// batches made), one per `batch_step` bytes at most.
    pub(super) batches: Vec<(u64, u64, u64, u64)>,
    pub(super) batch_step: u64,
    /// Memo slots `MEMOIZE`d directly after a string opcode: (index, length, offset of
    /// the string's bytes), by index. At most `strings_cap` (then `overflow`).
    pub(super) strings: Vec<(u32, u32, u64)>,
    pub(super) strings_cap: usize,
    pub(super) overflow: bool,
    /// Streamed: the strings' bytes are copied here (their offsets in `strings` are
    /// into it), as the pieces they were read from go away.
    pub(super) keep_bytes: bool,
    pub(super) string_bytes: Vec<u8>,
    /// The last string's bytes (streamed).
    pending: Vec<u8>,
    /// End of the last string opcode and its string's (length, offset).
    last_str: (u64, u32, u64),
    /// A segment's scan ([`super::segments`]): the strings memoized in all segments, held
    /// to the whole input's bound (the serial scan's notes overflow if and only if the
    /// input's strings do).
    pub(super) totals: Option<Arc<Totals>>,
    /// Strings and bytes not yet added to `totals`.
    unshared: (u64, u64),
}

/// The strings memoized and their bytes, over all of an input's segments.
#[derive(Debug, Default)]
pub(super) struct Totals {
    strings: AtomicU64,
    bytes: AtomicU64,
}

impl Notes {
    pub(super) fn new(input_len: u64, batch_step: u64) -> Notes {
        Notes {
            batch_step: batch_step.max(1),
            strings_cap: usize::try_from(input_len / 32).unwrap_or(usize::MAX) + 4096,
            last_str: (u64::MAX, 0, 0),
            ..Notes::default()
        }
    }

    fn memoize(&mut self, at: u64) {
        if self.last_str.0 == at {
            if self.past_bound() {
                self.overflow = true;
            } else if let Ok(i) = u32::try_from(self.memos) {
                let off = if self.keep_bytes {
                    let off = self.string_bytes.len() as u64;
                    self.string_bytes.extend_from_slice(&self.pending);
                    off
                } else {
                    self.last_str.2
                };
                self.strings.push((i, self.last_str.1, off));
            }
        }
        self.memos += 1;
    }

    /// Whether one more string (its bytes pending) would go past the notes' bound.
    fn past_bound(&mut self) -> bool {
        let cap = self.strings_cap as u64;
        let pending = self.pending.len() as u64;
        if self.strings.len() as u64 >= cap || self.string_bytes.len() as u64 + pending > cap * 4 {
            return true;
        }
        if self.totals.is_none() {
            return false;
        }
        // A segment: counted here, added to all segments' totals now and then (one
        // shared count per string would be a contended cache line on many threads).
        self.unshared.0 += 1;
        self.unshared.1 += pending;
        self.unshared.0 >= 4096 && self.share()
    }

    /// Adds the strings counted since the last time to all segments' totals; whether
    /// those are past the whole input's bound.
    pub(super) fn share(&mut self) -> bool {
        let Some(t) = &self.totals else { return false };
        let (n, b) = std::mem::take(&mut self.unshared);
        let strings = t.strings.fetch_add(n, Ordering::Relaxed) + n;
        let bytes = t.bytes.fetch_add(b, Ordering::Relaxed) + b;
        strings > self.strings_cap as u64 || bytes > self.strings_cap as u64 * 4
    }

    fn batch(&mut self, at: u64, (run, dicts): (u64, u64)) {
        if self
            .batches
            .last()
            .is_none_or(|&(last, ..)| at >= last.saturating_add(self.batch_step))
        {
            self.batches.push((at, self.memos, run, dicts));
        }
    }
}

/// What a piece of input holds at its end.
enum Stop {
    /// Every opcode in it was read.
    Whole,
    /// The opcode where the piece was left needs more bytes.
    Short,
    /// The scan is over ([`End`]).
    Over(End),
}

impl Scanner {
    /// A scan of an input of `dense_bytes` bytes (or, streamed, a bound on it that
    /// [`Scanner::raise_limit`] raises) recording a boundary every `step` bytes.
    pub(super) fn new(dense_bytes: u64, step: u64) -> Scanner {
        Scanner {
            refs: IndexSet::new(usize::try_from(dense_bytes).unwrap_or(usize::MAX)),
            pos: 0,
            boundaries: Vec::new(),
            step,
            next_boundary: step,
            end: None,
            lengths: Lengths::default(),
            notes: None,
            log: None,
        }
    }

    /// Raises the memo indices kept dense to what `bytes` bytes of input justify (a
    /// streamed gzip input, whose size is known only at its end).
    pub(super) fn raise_limit(&mut self, bytes: u64) {
        self.refs
            .raise_dense_limit(usize::try_from(bytes).unwrap_or(usize::MAX));
    }

    /// Scans `data`, the input from [`Scanner::pos`] on; `last`: nothing follows it.
    /// Returns how many bytes were read: the rest starts an opcode that needs more
    /// (given again, with what follows, to the next call).
    pub(super) fn scan(&mut self, data: &[u8], last: bool) -> usize {
        if self.end.is_some() {
            return data.len();
        }
        let (read, stop) = self.scan_piece(data);
        self.pos += read as u64;
        match stop {
            Stop::Whole | Stop::Short if last => self.end = Some(End::Unreadable),
            Stop::Over(end) => self.end = Some(end),
            Stop::Whole | Stop::Short => {}
        }
        if self.end.is_some() {
            return data.len();
        }
        read
    }

    /// Scans `piece`, the input after what `carry` holds (what an opcode cut by the last
    /// piece's end has read of it), keeping in `carry` what one cut by this piece's end has.
    pub(super) fn scan_carrying(&mut self, carry: &mut Vec<u8>, piece: &[u8], last: bool) {
        if carry.is_empty() {
            let read = self.scan(piece, last);
            carry.extend_from_slice(piece.get(read..).unwrap_or(&[]));
        } else {
            carry.extend_from_slice(piece);
            let read = self.scan(carry, last);
            carry.drain(..read.min(carry.len()));
        }
    }

    fn scan_piece(&mut self, data: &[u8]) -> (usize, Stop) {
        let refs = &mut self.refs;
        let lengths = &mut self.lengths;
        let mut log = self.log.as_deref_mut();
        let base = self.pos;
        let mut pos = 0usize;
        // Opcodes before `limit` start before the next boundary: no check for one there.
        let mut limit = 0usize;
        loop {
            if pos >= limit {
                if base + pos as u64 >= self.next_boundary {
                    self.boundaries.push(base + pos as u64);
                    self.next_boundary = (base + pos as u64).saturating_add(self.step);
                }
                let to_boundary = self.next_boundary.saturating_sub(base);
                limit = usize::try_from(to_boundary).map_or(data.len(), |b| b.min(data.len()));
                if pos >= data.len() {
                    return (pos, Stop::Whole);
                }
            }
            let Some(&code) = data.get(pos) else {
                return (pos, Stop::Whole);
            };
            // GETs are half of a snapshot's opcodes: a predicted branch each, so that the
            // next position does not wait for the table load.
            if code == op::LONG_BINGET
                && let Some(i) = le_u32(data, pos + 1)
            {
                refs.insert(i);
                pos += 5;
                continue;
            }
            if code == op::BINGET
                && let Some(&i) = data.get(pos + 1)
            {
                refs.insert(u32::from(i));
                pos += 2;
                continue;
            }
            let start = pos;
            let class = SCAN_TABLE[code as usize];
            if class < 0x80 {
                let next = pos + 1 + class as usize;
                if next > data.len() {
                    return (start, Stop::Short);
                }
                pos = next;
                continue;
            }
            pos += 1;
            match class {
                SCAN_GET1 => match data.get(pos) {
                    Some(&i) => {
                        refs.insert(u32::from(i));
                        pos += 1;
                    }
                    None => return (start, Stop::Short),
                },
                SCAN_GET4 => match le_u32(data, pos) {
                    Some(i) => {
                        refs.insert(i);
                        pos += 4;
                    }
                    None => return (start, Stop::Short),
                },
                SCAN_COUNTED => {
                    let Some((width, signed)) = length_prefix(code) else {
                        return (start, Stop::Over(End::Unreadable));
                    };
                    let next = match read_length(data, pos, width, signed) {
                        Ok(Some(len)) => usize::try_from(len)
                            .ok()
                            .and_then(|l| l.checked_add(width))
                            .and_then(|n| pos.checked_add(n)),
                        Ok(None) => return (start, Stop::Short),
                        Err(_) => return (start, Stop::Over(End::Unreadable)),
                    };
                    match next {
                        Some(p) if p <= data.len() => {
                            if let Some(n) = self.notes.as_deref_mut()
                                && matches!(
                                    code,
                                    op::SHORT_BINUNICODE
                                        | op::BINUNICODE
                                        | op::BINUNICODE8
                                        | op::SHORT_BINSTRING
                                        | op::BINSTRING
                                )
                            {
                                let len = u32::try_from(p - pos - width).unwrap_or(u32::MAX);
                                n.last_str = (base + p as u64, len, base + (pos + width) as u64);
                                if n.keep_bytes {
                                    n.pending.clear();
                                    n.pending
                                        .extend_from_slice(data.get(pos + width..p).unwrap_or(&[]));
                                }
                            }
                            pos = p;
                        }
                        Some(_) => return (start, Stop::Short),
                        None => return (start, Stop::Over(End::Unreadable)),
                    }
                }
                SCAN_LINE | SCAN_GET_LINE => match line_at(data, pos) {
                    Some((line, next)) => {
                        if code == op::PUT
                            && let Some(n) = self.notes.as_deref_mut()
                        {
                            n.puts = true;
                        }
                        if class == SCAN_GET_LINE {
                            match parse_memo_index(line) {
                                Some(i) => refs.insert(i),
                                None => return (start, Stop::Over(End::Unreadable)),
                            };
                        }
                        pos = next;
                    }
                    None => return (start, Stop::Short),
                },
                SCAN_MARK => {
                    let at = base + start as u64;
                    if let Some(l) = log.as_deref_mut() {
                        l.mark(at, self.notes.as_deref().map_or(0, |n| n.memos));
                    } else {
                        let run = lengths.mark(at);
                        if let (Some(run), Some(n)) = (run, self.notes.as_deref_mut()) {
                            n.batch(at, run);
                        }
                    }
                }
                SCAN_MEMOIZE => {
                    if let Some(n) = self.notes.as_deref_mut() {
                        n.memoize(base + start as u64);
                    }
                }
                SCAN_PUT1 | SCAN_PUT4 => {
                    let next = pos + if class == SCAN_PUT1 { 1 } else { 4 };
                    if next > data.len() {
                        return (start, Stop::Short);
                    }
                    pos = next;
                    if let Some(n) = self.notes.as_deref_mut() {
                        n.puts = true;
                    }
                }
                SCAN_EMPTY_DICT => match log.as_deref_mut() {
                    Some(l) => l.ops.push(LOG_DICT),
                    None => lengths.dict(),
                },
                SCAN_APPENDS => match log.as_deref_mut() {
                    Some(l) => l.appends(base + start as u64),
                    None => lengths.appends(base + start as u64),
                },
                SCAN_CLOSE => match log.as_deref_mut() {
                    Some(l) => l.ops.push(LOG_CLOSE),
                    None => lengths.close(),
                },
                SCAN_FRAME => {
                    if pos + 8 > data.len() {
                        return (start, Stop::Short);
                    }
                    pos += 8;
                    let (at, end) = (base + start as u64, base + pos as u64);
                    match log.as_deref_mut() {
                        Some(l) => l.frame(at, end),
                        None => lengths.frame(at, end),
                    }
                }
                _ => return (start, Stop::Over(End::Opcode(base + start as u64))),
            }
        }
    }
}

/// A segment's list opcodes ([`Lengths`]' part of the pre-pass), written down in order
/// for [`Scanner::absorb`] to follow once the marks open before the segment are known.
/// A `MARK` needs its offset only where it may follow an `APPENDS` directly (then it may
/// continue a run, noted with the `MEMOIZE`s before it in the segment); a `FRAME` only
/// where it may follow one (it carries the `APPENDS`' end on).
#[derive(Debug)]
pub(super) struct Log {
    start: u64,
    ops: Vec<u8>,
    /// Each `APPENDS`'s offset from `start`.
    appends: Vec<u32>,
    marks: Vec<(u64, u64)>,
    frames: Vec<(u64, u64)>,
    /// Where this segment's last `APPENDS` ended (carried on by a `FRAME` right after
    /// it); `None` before its first: what came before the segment decides.
    appends_end: Option<u64>,
    /// An `APPENDS` too far from `start` to be written down.
    too_far: bool,
}

const LOG_DICT: u8 = 0;
const LOG_CLOSE: u8 = 1;
/// A `MARK` that does not follow an `APPENDS` directly.
const LOG_MARK: u8 = 2;
const LOG_MARK_AT: u8 = 3;
const LOG_APPENDS: u8 = 4;
const LOG_FRAME: u8 = 5;

impl Log {
    pub(super) fn new(start: u64) -> Log {
        Log {
            start,
            ops: Vec::new(),
            appends: Vec::new(),
            marks: Vec::new(),
            frames: Vec::new(),
            appends_end: None,
            too_far: false,
        }
    }

    /// The memory the log holds, in bytes.
    fn bytes(&self) -> u64 {
        (self.ops.len() + 4 * self.appends.len() + 16 * (self.marks.len() + self.frames.len()))
            as u64
    }

    fn mark(&mut self, at: u64, memos: u64) {
        if self.appends_end.is_none_or(|e| e == at) {
            self.ops.push(LOG_MARK_AT);
            self.marks.push((at, memos));
        } else {
            self.ops.push(LOG_MARK);
        }
    }

    fn appends(&mut self, at: u64) {
        match u32::try_from(at - self.start) {
            Ok(off) => self.appends.push(off),
            Err(_) => self.too_far = true,
        }
        self.ops.push(LOG_APPENDS);
        self.appends_end = Some(at + 1);
    }

    fn frame(&mut self, at: u64, end: u64) {
        match self.appends_end {
            Some(e) if e != at => {}
            _ => {
                self.ops.push(LOG_FRAME);
                self.frames.push((at, end));
                if self.appends_end.is_some() {
                    self.appends_end = Some(end);
                }
            }
        }
    }
}

impl Scanner {
    /// A scan of the segment of an input of `input_len` bytes that starts at `start`
    /// (an opcode start), its list opcodes written down ([`Log`]) and its notes kept
    /// to the whole input's bound, counted in `totals`.
    pub(super) fn segment(
        input_len: u64,
        start: u64,
        step: u64,
        notes: Option<(u64, bool)>,
        totals: &Arc<Totals>,
    ) -> Scanner {
        let mut s = Scanner::new(input_len, step);
        s.pos = start;
        s.next_boundary = start;
        s.log = Some(Box::new(Log::new(start)));
        s.notes = notes.map(|(batch_step, keep_bytes)| {
            let mut n = Notes::new(input_len, batch_step);
            n.keep_bytes = keep_bytes;
            n.totals = Some(Arc::clone(totals));
            Box::new(n)
        });
        s
    }

    /// What a segment's scan holds of its list opcodes, in bytes ([`Log`]).
    pub(super) fn log_bytes(&self) -> u64 {
        self.log.as_deref().map_or(0, Log::bytes)
    }

    /// Takes `seg`, the scan of the segment that starts where this scan stands (its
    /// [`Scanner::pos`]): follows its list opcodes from the marks open here, notes its
    /// batches, and takes its memo indices, boundaries, strings and end, as if this scan
    /// had read the segment itself. False where that cannot be done exactly (the caller
    /// then scans the input serially).
    pub(super) fn absorb(&mut self, seg: Scanner) -> bool {
        let Some(log) = seg.log else { return false };
        if log.too_far
            || log.start != self.pos
            || self.end.is_some()
            || self.refs.dense_limit != seg.refs.dense_limit
        {
            return false;
        }
        let prefix = self.notes.as_deref().map_or(0, |n| n.memos);
        let (mut appends, mut marks, mut frames) =
            (log.appends.iter(), log.marks.iter(), log.frames.iter());
        // Every level there is (as `Lengths::level` would make them), so that the common
        // opcodes below index them directly.
        if self.lengths.levels.len() < MAX_DEPTH {
            self.lengths.levels.resize(MAX_DEPTH, Level::default());
        }
        for &op in &log.ops {
            let l = &mut self.lengths;
            match op {
                LOG_DICT => {
                    if let Some(level) = l.levels.get_mut(l.depth) {
                        level.dicts += 1;
                    }
                }
                LOG_CLOSE => l.close(),
                LOG_MARK => {
                    // `open(false)`: no run continued.
                    l.depth += 1;
                    if let Some(level) = l.levels.get_mut(l.depth) {
                        level.dicts = 0;
                        level.continues = false;
                    }
                }
                LOG_MARK_AT => {
                    let Some(&(at, memos)) = marks.next() else {
                        return false;
                    };
                    let run = l.mark(at);
                    if let (Some(run), Some(n)) = (run, self.notes.as_deref_mut()) {
                        n.memos = prefix + memos;
                        n.batch(at, run);
                    }
                }
                LOG_APPENDS => {
                    let Some(&off) = appends.next() else {
                        return false;
                    };
                    l.appends(log.start + u64::from(off));
                }
                _ => {
                    let Some(&(at, end)) = frames.next() else {
                        return false;
                    };
                    l.frame(at, end);
                }
            }
        }
        match (self.notes.as_deref_mut(), seg.notes) {
            (Some(n), Some(s)) => {
                if s.overflow || !n.take_strings(prefix, &s) {
                    return false;
                }
                n.puts |= s.puts;
                n.memos = prefix + s.memos;
            }
            (None, None) => {}
            _ => return false,
        }
        self.refs.union(seg.refs);
        // A segment's first boundary is its start, where the one before may have ended.
        let last = self.boundaries.last().copied();
        self.boundaries.extend(
            seg.boundaries
                .into_iter()
                .filter(|&b| last.is_none_or(|l| b > l)),
        );
        self.pos = seg.pos;
        self.end = seg.end;
        true
    }
}

#[cfg(test)]
impl Scanner {
    /// Notes a boundary from `at` on (every opcode, with a step of 1).
    pub(super) fn next_boundary_at(&mut self, at: u64) {
        self.next_boundary = at;
    }

    /// Everything the scan found but its boundaries, a line a part (long ones hashed),
    /// to compare two scans.
    pub(super) fn digest(&mut self) -> Vec<String> {
        use std::hash::{DefaultHasher, Hash, Hasher};
        fn hashed<T: Hash + std::fmt::Debug>(name: &str, v: &T) -> String {
            let mut h = DefaultHasher::new();
            v.hash(&mut h);
            let text = format!("{v:?}");
            let text = if text.len() > 200 {
                &text[..200]
            } else {
                &text[..]
            };
            format!("{name}: {:x} {text}", h.finish())
        }
        let mut sparse: Vec<u32> = self.refs.sparse.iter().copied().collect();
        sparse.sort_unstable();
        let mut out = vec![
            hashed("refs", &self.refs.bits),
            hashed("sparse refs", &sparse),
            hashed("hints", &self.lengths.hints()),
            format!("end {:?} at {}", self.end, self.pos),
        ];
        if let Some(n) = self.notes.as_deref() {
            out.push(format!(
                "memos {} puts {} overflow {}",
                n.memos, n.puts, n.overflow
            ));
            out.push(hashed("batches", &n.batches));
            out.push(hashed("strings", &n.strings));
            out.push(hashed("string bytes", &n.string_bytes));
        }
        out
    }
}

impl Notes {
    /// A segment's memoized strings (`s`, its indices counted from the segment's first
    /// `MEMOIZE`, `prefix` of them before it), each taken as [`Notes::memoize`] would
    /// have: up to the same bound.
    fn take_strings(&mut self, prefix: u64, s: &Notes) -> bool {
        // All of them within the bound (the common case): taken at once.
        if self.strings.len() + s.strings.len() <= self.strings_cap
            && self.string_bytes.len() + s.string_bytes.len() <= self.strings_cap * 4
            && let Ok(prefix) = u32::try_from(prefix)
            && u32::try_from(u64::from(prefix) + s.memos).is_ok()
        {
            let base = self.string_bytes.len() as u64;
            let keep = self.keep_bytes;
            self.strings.extend(
                s.strings
                    .iter()
                    .map(|&(i, len, off)| (i + prefix, len, if keep { off + base } else { off })),
            );
            self.string_bytes.extend_from_slice(&s.string_bytes);
            return true;
        }
        for &(i, len, off) in &s.strings {
            let extra = if self.keep_bytes { len as usize } else { 0 };
            if self.strings.len() >= self.strings_cap
                || self.string_bytes.len() + extra > self.strings_cap * 4
            {
                self.overflow = true;
            } else if let Ok(i) = u32::try_from(prefix + u64::from(i)) {
                let off = if self.keep_bytes {
                    let from = usize::try_from(off).unwrap_or(usize::MAX);
                    let Some(bytes) = s.string_bytes.get(from..from.saturating_add(extra)) else {
                        return false;
                    };
                    let at = self.string_bytes.len() as u64;
                    self.string_bytes.extend_from_slice(bytes);
                    at
                } else {
                    off
                };
                self.strings.push((i, len, off));
            }
        }
        true
    }
}

/// Lists appended to in runs of many `APPENDS` batches (a device trace: `pickle.dump`
/// appends 1,000 items a batch), noted by the offset of the run's first `APPENDS` with
/// the number of dicts made directly in its batches (a trace entry is one).
///
/// Follows only the marks: a batch's `MARK` directly after an `APPENDS` (or after a
/// `FRAME` that directly follows one) at the same mark depth goes on the same list, as
/// nothing came between. A hint, never trusted for the decode's result: the machine only
/// reserves room by it, within a bound of the input's size ([`super::machine::Vm`]).
#[derive(Debug, Default)]
pub(super) struct Lengths {
    /// Marks open.
    depth: usize,
    /// Per depth below [`MAX_DEPTH`] (index: marks open): dicts made at that depth since
    /// its mark, whether that mark directly followed an `APPENDS` of the depth below, and
    /// the run of the depth (offset of its first `APPENDS`, dicts so far).
    levels: Vec<Level>,
    /// Where the last `APPENDS` (or a `FRAME` right after it) ended, and its depth after.
    appends_end: u64,
    appends_depth: usize,
    /// Runs over, of at least [`MIN_RUN`] dicts.
    found: Vec<(u64, u64)>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Level {
    dicts: u64,
    continues: bool,
    run: Option<(u64, u64)>,
}

/// Mark depths followed (a snapshot's trace entries are three deep).
const MAX_DEPTH: usize = 64;
/// Runs shorter than this are not noted (their lists grow as they go).
pub(super) const MIN_RUN: u64 = 4096;

impl Lengths {
    fn level(&mut self, depth: usize) -> Option<&mut Level> {
        if depth >= MAX_DEPTH {
            return None;
        }
        if self.levels.len() <= depth {
            self.levels.resize(depth + 1, Level::default());
        }
        self.levels.get_mut(depth)
    }

    /// A `MARK`; the run it continues (offset of the run's first `APPENDS`, dicts its
    /// batches made so far), if any.
    fn mark(&mut self, at: u64) -> Option<(u64, u64)> {
        self.open(at == self.appends_end)
    }

    /// A `MARK` right after the last `APPENDS` (`adjacent`: nothing between but a
    /// `FRAME`) or not; the run it continues, if any.
    fn open(&mut self, adjacent: bool) -> Option<(u64, u64)> {
        let continues = adjacent && self.appends_depth == self.depth;
        let run = if continues {
            self.levels.get(self.depth).and_then(|l| l.run)
        } else {
            None
        };
        self.depth += 1;
        if let Some(l) = self.level(self.depth) {
            l.dicts = 0;
            l.continues = continues;
        }
        run
    }

    fn dict(&mut self) {
        if let Some(l) = self.level(self.depth) {
            l.dicts += 1;
        }
    }

    fn close(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }

    fn appends(&mut self, at: u64) {
        if self.depth == 0 {
            return;
        }
        let (dicts, continues) = self
            .level(self.depth)
            .map_or((0, false), |l| (l.dicts, l.continues));
        self.depth -= 1;
        let mut over = None;
        if let Some(l) = self.level(self.depth) {
            match &mut l.run {
                Some((_, n)) if continues => *n += dicts,
                run => over = run.replace((at, dicts)),
            }
        }
        self.keep(over);
        self.appends_end = at + 1;
        self.appends_depth = self.depth;
    }

    fn frame(&mut self, at: u64, end: u64) {
        if at == self.appends_end {
            self.appends_end = end;
        }
    }

    fn keep(&mut self, run: Option<(u64, u64)>) {
        if let Some((at, n)) = run
            && n >= MIN_RUN
        {
            self.found.push((at, n));
        }
    }

    /// The runs noted, by offset.
    pub(super) fn hints(&mut self) -> Vec<(u64, u64)> {
        let open: Vec<_> = self
            .levels
            .iter_mut()
            .filter_map(|l| l.run.take())
            .collect();
        for run in open {
            self.keep(Some(run));
        }
        let mut found = std::mem::take(&mut self.found);
        found.sort_unstable();
        found
    }
}

#[cfg(test)]
#[path = "prepass_tests.rs"]
mod tests;
