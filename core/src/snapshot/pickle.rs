//! A pickle decoder for the subset snapshots use; it never executes anything.
//!
//! PyTorch writes snapshots with `pickle.dump` (protocol 4 on current Pythons, 5 on some):
//! plain dicts, lists, tuples, strings, ints, floats and bools. This module runs the
//! pickle machine over exactly those opcodes and refuses every opcode that would import
//! or call code (`GLOBAL`, `REDUCE`, `BUILD`, …).
//!
//! Why it is shaped the way it is:
//! - **No generic tree of the whole file.** A trace entry is ~86 bytes of pickle but would
//!   be several hundred as a tree, so the machine converts as it goes: a frame dict
//!   becomes a [`FrameId`] and a trace-entry dict a [`RawEvent`] the moment a list
//!   consumes it (`APPEND`/`APPENDS`), and a list stored under a `frames` key becomes a
//!   [`StackId`] the moment its dict consumes it (`SETITEM(S)`). Objects are complete
//!   when consumed: `pickle.dump` builds each object fully before using it.
//! - **A pre-pass over the opcodes** finds which memo slots are ever read back (`GET`).
//!   Only those are stored (protocol 4 memoizes every object, so storing all would cost
//!   16 bytes per object), and only objects stored there can be seen twice. Every other
//!   converted object is dropped on the spot and its slot reused.
//! - Memo-shared frame dicts and frame lists (each frame dict is referenced by many
//!   stacks) are converted once and remember the result ("sealed"); a pickle that changes
//!   a sealed object afterwards is refused rather than decoded wrongly.
//! - Strings, bytes and wide integers are byte ranges into the input, never copied
//!   (escaped protocol-0 text is decoded into one scratch buffer).
//! - The machine is a loop over an explicit stack: nesting depth costs heap, not call
//!   stack. Every length is checked against the remaining input before use.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, Hasher};

use super::error::ImportError;
use super::{
    Action, BlockState, Frame, FrameId, FrameTable, FxInfo, HostSegment, OtherAction, RawBlock,
    RawEvent, RawSegment, RawSettings, RawSnapshot, SegmentType, StackId, StrId,
};

// ---------------------------------------------------------------------------------------
// Opcodes

mod op {
    pub const MARK: u8 = b'(';
    pub const STOP: u8 = b'.';
    pub const POP: u8 = b'0';
    pub const POP_MARK: u8 = b'1';
    pub const DUP: u8 = b'2';
    pub const FLOAT: u8 = b'F';
    pub const INT: u8 = b'I';
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const LONG: u8 = b'L';
    pub const BININT2: u8 = b'M';
    pub const NONE: u8 = b'N';
    pub const PERSID: u8 = b'P';
    pub const BINPERSID: u8 = b'Q';
    pub const REDUCE: u8 = b'R';
    pub const STRING: u8 = b'S';
    pub const BINSTRING: u8 = b'T';
    pub const SHORT_BINSTRING: u8 = b'U';
    pub const UNICODE: u8 = b'V';
    pub const BINUNICODE: u8 = b'X';
    pub const APPEND: u8 = b'a';
    pub const BUILD: u8 = b'b';
    pub const GLOBAL: u8 = b'c';
    pub const DICT: u8 = b'd';
    pub const EMPTY_DICT: u8 = b'}';
    pub const APPENDS: u8 = b'e';
    pub const GET: u8 = b'g';
    pub const BINGET: u8 = b'h';
    pub const INST: u8 = b'i';
    pub const LONG_BINGET: u8 = b'j';
    pub const LIST: u8 = b'l';
    pub const EMPTY_LIST: u8 = b']';
    pub const OBJ: u8 = b'o';
    pub const PUT: u8 = b'p';
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const SETITEM: u8 = b's';
    pub const TUPLE: u8 = b't';
    pub const EMPTY_TUPLE: u8 = b')';
    pub const SETITEMS: u8 = b'u';
    pub const BINFLOAT: u8 = b'G';
    pub const PROTO: u8 = 0x80;
    pub const NEWOBJ: u8 = 0x81;
    pub const EXT1: u8 = 0x82;
    pub const EXT2: u8 = 0x83;
    pub const EXT4: u8 = 0x84;
    pub const TUPLE1: u8 = 0x85;
    pub const TUPLE2: u8 = 0x86;
    pub const TUPLE3: u8 = 0x87;
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const LONG1: u8 = 0x8a;
    pub const LONG4: u8 = 0x8b;
    pub const BINBYTES: u8 = b'B';
    pub const SHORT_BINBYTES: u8 = b'C';
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE8: u8 = 0x8d;
    pub const BINBYTES8: u8 = 0x8e;
    pub const EMPTY_SET: u8 = 0x8f;
    pub const ADDITEMS: u8 = 0x90;
    pub const FROZENSET: u8 = 0x91;
    pub const NEWOBJ_EX: u8 = 0x92;
    pub const STACK_GLOBAL: u8 = 0x93;
    pub const MEMOIZE: u8 = 0x94;
    pub const FRAME: u8 = 0x95;
    pub const BYTEARRAY8: u8 = 0x96;
    pub const NEXT_BUFFER: u8 = 0x97;
    pub const READONLY_BUFFER: u8 = 0x98;
}

/// Why an opcode is refused, or `None` if the machine runs it.
fn refusal(byte: u8) -> Option<(&'static str, &'static str)> {
    const CODE: &str = "snapshots never need code execution";
    const EXT: &str = "extension registry codes name classes; snapshots never need them";
    const PERSIST: &str = "persistent ids need a custom unpickler; snapshots never use them";
    const BUFFER: &str = "out-of-band buffers are not supported; snapshots never use them";
    Some(match byte {
        op::GLOBAL => ("GLOBAL", CODE),
        op::STACK_GLOBAL => ("STACK_GLOBAL", CODE),
        op::REDUCE => ("REDUCE", CODE),
        op::BUILD => ("BUILD", CODE),
        op::INST => ("INST", CODE),
        op::OBJ => ("OBJ", CODE),
        op::NEWOBJ => ("NEWOBJ", CODE),
        op::NEWOBJ_EX => ("NEWOBJ_EX", CODE),
        op::EXT1 => ("EXT1", EXT),
        op::EXT2 => ("EXT2", EXT),
        op::EXT4 => ("EXT4", EXT),
        op::PERSID => ("PERSID", PERSIST),
        op::BINPERSID => ("BINPERSID", PERSIST),
        op::NEXT_BUFFER => ("NEXT_BUFFER", BUFFER),
        op::READONLY_BUFFER => ("READONLY_BUFFER", BUFFER),
        _ => return None,
    })
}

// ---------------------------------------------------------------------------------------
// Values

/// Set in a span's offset when the bytes live in the scratch buffer (decoded escapes)
/// rather than in the input.
const SCRATCH: u64 = 1 << 63;

/// A value on the machine's stack, in the memo or in a container: 16 bytes, `Copy`.
///
/// Spans (`len`, `off`) point into the input, or into the scratch buffer when `off` has
/// the [`SCRATCH`] bit.
///
/// `repr(u32)` pins the layout (tag in bytes 0–3, payloads at 4 or 8): with Rust's
/// default layout `Bool` sat at byte 1 and every copy became overlapping unaligned moves
/// that stalled store forwarding in the hottest path (`GET` → push).
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(u32)]
enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// Integers in `i64::MAX + 1 ..= u64::MAX` (addresses with the top bit set).
    UInt(u64),
    /// Wider integers: minimal little-endian two's complement bytes.
    BigInt {
        len: u32,
        off: u64,
    },
    Float(f64),
    /// UTF-8 as written (validated when read; invalid sequences read as U+FFFD).
    Str {
        len: u32,
        off: u64,
    },
    Bytes {
        len: u32,
        off: u64,
    },
    /// A container in the machine's heap.
    Obj(u32),
    /// A converted frame dict (snapshot mode only).
    Frame(FrameId),
    /// A converted list of frame dicts (snapshot mode only).
    Stack(StackId),
    /// A converted trace entry in [`Vm::extra_events`] (snapshot mode only).
    Event(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    List,
    Tuple,
    Dict,
    Set,
    FrozenSet,
}

/// What a container was converted into, once it was consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seal {
    Open,
    Frame(FrameId),
    Stack(StackId),
}

#[derive(Debug)]
struct Container {
    /// Items; for dicts, keys and values alternating (insertion order, duplicates kept:
    /// readers take the last).
    items: Vec<Value>,
    /// Where the opcode that created it starts (for error messages).
    offset: u64,
    /// 1 + index into [`Vm::event_lists`] of trace entries appended to this list while
    /// `items` was empty; 0 for none.
    events: u32,
    kind: Kind,
    /// Reachable twice (memo slot read back by a `GET`, or `DUP`): never freed.
    shared: bool,
    seal: Seal,
}

/// Bytes behind spans: the input and the scratch buffer.
#[derive(Clone, Copy)]
struct Text<'s> {
    data: &'s [u8],
    scratch: &'s [u8],
}

impl<'s> Text<'s> {
    fn span(&self, len: u32, off: u64) -> &'s [u8] {
        let (buf, start) = if off & SCRATCH == 0 {
            (self.data, off)
        } else {
            (self.scratch, off & !SCRATCH)
        };
        usize::try_from(start)
            .ok()
            .and_then(|s| buf.get(s..s.checked_add(len as usize)?))
            .unwrap_or(&[])
    }

    /// A span of at most 8 bytes as a little-endian word (zero-padded), loaded without a
    /// `memcpy` call when 8 bytes are readable at its start (the usual case: keys sit in
    /// the middle of the input).
    #[inline]
    fn word(&self, len: u32, off: u64) -> Option<u64> {
        if len > 8 {
            return None;
        }
        let (buf, start) = if off & SCRATCH == 0 {
            (self.data, off)
        } else {
            (self.scratch, off & !SCRATCH)
        };
        let start = usize::try_from(start).ok()?;
        if let Some(b) = buf.get(start..start.checked_add(8)?)
            && let Ok(b) = <[u8; 8]>::try_from(b)
        {
            let w = u64::from_le_bytes(b);
            return Some(if len == 8 {
                w
            } else {
                w & ((1u64 << (8 * len)) - 1)
            });
        }
        let bytes = buf.get(start..start.checked_add(len as usize)?)?;
        Some(
            bytes
                .iter()
                .rev()
                .fold(0u64, |w, &b| (w << 8) | u64::from(b)),
        )
    }

    fn str_bytes(&self, v: Value) -> Option<&'s [u8]> {
        match v {
            Value::Str { len, off } => Some(self.span(len, off)),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Memo

/// A set of memo indices: a bitset for indices the input could plausibly reach (at most
/// 8 per input byte, so its memory stays below the input size), a hash set beyond.
#[derive(Debug, Default)]
struct IndexSet {
    bits: Vec<u64>,
    dense_limit: u32,
    sparse: HashSet<u32>,
}

impl IndexSet {
    fn new(input_len: usize) -> IndexSet {
        let limit = input_len.saturating_mul(8).clamp(4096, u32::MAX as usize);
        IndexSet {
            bits: Vec::new(),
            dense_limit: u32::try_from(limit).unwrap_or(u32::MAX),
            sparse: HashSet::new(),
        }
    }

    /// Inserts; true if it was not there.
    #[inline]
    fn insert(&mut self, i: u32) -> bool {
        if i >= self.dense_limit {
            return self.sparse.insert(i);
        }
        let word = (i >> 6) as usize;
        if word >= self.bits.len() {
            self.bits.resize(word + 1, 0);
        }
        match self.bits.get_mut(word) {
            Some(w) => {
                let bit = 1u64 << (i & 63);
                let new = *w & bit == 0;
                *w |= bit;
                new
            }
            None => false,
        }
    }
}

/// The memo, storing only the slots the pre-pass saw read back.
#[derive(Debug)]
struct Memo {
    /// Indices some `GET` reads.
    refs: IndexSet,
    /// Per 8 dense indices: `(slots used by lower indices) << 8 | which of the 8 are
    /// referenced`. One load and a 256-byte table find a slot (a rank over 64-bit words
    /// needed a software popcount on baseline x86-64, and a slot per index 4 bytes).
    dir: Vec<u64>,
    slots: Vec<Option<Value>>,
    sparse: HashMap<u32, Value>,
    /// Distinct indices ever stored, tracked from the first explicit `PUT` on (until
    /// then they are exactly `0..len`).
    set: Option<IndexSet>,
    /// Python's `len(memo)`: the index `MEMOIZE` uses.
    len: u64,
    input_len: usize,
}

impl Memo {
    fn new(refs: IndexSet, input_len: usize) -> Memo {
        let mut dir = Vec::with_capacity(refs.bits.len() * 8);
        let mut total = 0u64;
        for w in &refs.bits {
            for byte in w.to_le_bytes() {
                dir.push(total << 8 | u64::from(byte));
                total += u64::from(byte.count_ones());
            }
        }
        Memo {
            refs,
            dir,
            slots: vec![None; usize::try_from(total).unwrap_or(0)],
            sparse: HashMap::new(),
            set: None,
            len: 0,
            input_len,
        }
    }

    #[inline]
    fn dense_slot(&self, i: u32) -> Option<usize> {
        static POP8: [u8; 256] = {
            let mut t = [0u8; 256];
            let mut i = 0;
            while i < 256 {
                t[i] = (i as u8).count_ones() as u8;
                i += 1;
            }
            t
        };
        let e = *self.dir.get((i >> 3) as usize)?;
        let bit = 1u64 << (i & 7);
        if e & bit == 0 {
            return None;
        }
        let below = POP8[(e & (bit - 1)) as usize];
        Some((e >> 8) as usize + usize::from(below))
    }

    /// `memo[len(memo)] = v` (`MEMOIZE`); `None` if the memo is full, else whether the
    /// slot is kept (some `GET` reads it).
    #[inline]
    fn memoize(&mut self, v: Value) -> Option<bool> {
        let i = u32::try_from(self.len).ok()?;
        match &mut self.set {
            None => self.len += 1,
            Some(set) => {
                if set.insert(i) {
                    self.len += 1;
                }
            }
        }
        Some(self.store(i, v))
    }

    /// `memo[i] = v` (`PUT`); true if the slot is kept.
    fn put(&mut self, i: u32, v: Value) -> bool {
        let len = self.len;
        let set = self.set.get_or_insert_with(|| {
            let mut set = IndexSet::new(self.input_len);
            for k in 0..len {
                set.insert(k as u32);
            }
            set
        });
        if set.insert(i) {
            self.len += 1;
        }
        self.store(i, v)
    }

    #[inline]
    fn store(&mut self, i: u32, v: Value) -> bool {
        if i >= self.refs.dense_limit {
            if self.refs.sparse.contains(&i) {
                self.sparse.insert(i, v);
                return true;
            }
            return false;
        }
        match self.dense_slot(i).and_then(|s| self.slots.get_mut(s)) {
            Some(slot) => {
                *slot = Some(v);
                true
            }
            None => false,
        }
    }

    #[inline]
    fn get(&self, i: u32) -> Option<Value> {
        if i >= self.refs.dense_limit {
            return self.sparse.get(&i).copied();
        }
        self.slots.get(self.dense_slot(i)?).copied().flatten()
    }
}

// ---------------------------------------------------------------------------------------
// Reading opcode arguments (shared by the pre-pass and the machine so that both see the
// same opcode boundaries)

fn le_u32(data: &[u8], pos: usize) -> Option<u32> {
    let b = data.get(pos..pos.checked_add(4)?)?;
    Some(u32::from_le_bytes(b.try_into().ok()?))
}

fn le_u64(data: &[u8], pos: usize) -> Option<u64> {
    let b = data.get(pos..pos.checked_add(8)?)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

/// The line starting at `pos` (without its `\n`) and the position after the `\n`.
fn line_at(data: &[u8], pos: usize) -> Option<(&[u8], usize)> {
    let rest = data.get(pos..)?;
    let n = rest.iter().position(|&b| b == b'\n')?;
    Some((rest.get(..n)?, pos + n + 1))
}

/// Size of a length-prefixed opcode's prefix, and whether the length is signed.
const fn length_prefix(op: u8) -> Option<(usize, bool)> {
    Some(match op {
        op::SHORT_BINSTRING | op::SHORT_BINBYTES | op::SHORT_BINUNICODE | op::LONG1 => (1, false),
        op::BINSTRING | op::LONG4 => (4, true),
        op::BINBYTES | op::BINUNICODE => (4, false),
        op::BINUNICODE8 | op::BINBYTES8 | op::BYTEARRAY8 => (8, false),
        _ => return None,
    })
}

/// Reads a length prefix at `pos`: `Ok(Some(len))`, `Ok(None)` if truncated, `Err(n)` for
/// a negative signed length `n`.
fn read_length(data: &[u8], pos: usize, width: usize, signed: bool) -> Result<Option<u64>, i64> {
    Ok(Some(match (width, signed) {
        (1, _) => match data.get(pos) {
            Some(&b) => u64::from(b),
            None => return Ok(None),
        },
        (4, false) => match le_u32(data, pos) {
            Some(v) => u64::from(v),
            None => return Ok(None),
        },
        (4, true) => match le_u32(data, pos) {
            Some(v) => {
                let v = v as i32;
                if v < 0 {
                    return Err(i64::from(v));
                }
                v as u64
            }
            None => return Ok(None),
        },
        _ => match le_u64(data, pos) {
            Some(v) => v,
            None => return Ok(None),
        },
    }))
}

/// Number of argument bytes of a fixed-size opcode (0 for none); `None` for opcodes
/// with variable arguments or no meaning.
const fn fixed_args(op: u8) -> Option<usize> {
    Some(match op {
        op::MARK
        | op::STOP
        | op::POP
        | op::POP_MARK
        | op::DUP
        | op::NONE
        | op::APPEND
        | op::DICT
        | op::EMPTY_DICT
        | op::APPENDS
        | op::LIST
        | op::EMPTY_LIST
        | op::SETITEM
        | op::TUPLE
        | op::EMPTY_TUPLE
        | op::SETITEMS
        | op::TUPLE1
        | op::TUPLE2
        | op::TUPLE3
        | op::NEWTRUE
        | op::NEWFALSE
        | op::EMPTY_SET
        | op::ADDITEMS
        | op::FROZENSET
        | op::MEMOIZE => 0,
        op::PROTO | op::BININT1 | op::BINGET | op::BINPUT => 1,
        op::BININT2 => 2,
        op::BININT | op::LONG_BINGET | op::LONG_BINPUT => 4,
        op::BINFLOAT | op::FRAME => 8,
        _ => return None,
    })
}

/// Python's `int(line)` for memo indices; `None` if not a small non-negative integer.
fn parse_memo_index(line: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(line).ok()?.trim();
    s.strip_prefix('+').unwrap_or(s).parse::<u32>().ok()
}

// The pre-pass's view of an opcode byte: below 0x80 the number of argument bytes to
// skip, else one of these classes. A table keeps the common case to one load and one
// well-predicted branch (the pass reads ~9 M opcodes for a 32 MB snapshot).
const SCAN_GET1: u8 = 0x80;
const SCAN_GET4: u8 = 0x81;
const SCAN_COUNTED: u8 = 0x82;
const SCAN_LINE: u8 = 0x83;
const SCAN_GET_LINE: u8 = 0x84;
const SCAN_END: u8 = 0xff;

static SCAN_TABLE: [u8; 256] = {
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
fn scan_references(data: &[u8]) -> IndexSet {
    let mut refs = IndexSet::new(data.len());
    let mut pos = 0usize;
    while let Some(&code) = data.get(pos) {
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
        let class = SCAN_TABLE[code as usize];
        if class < 0x80 {
            // Past the end only ends the loop: the machine reports the truncation.
            pos += 1 + class as usize;
            continue;
        }
        pos += 1;
        match class {
            SCAN_GET1 => match data.get(pos) {
                Some(&i) => {
                    refs.insert(u32::from(i));
                    pos += 1;
                }
                None => break,
            },
            SCAN_GET4 => match le_u32(data, pos) {
                Some(i) => {
                    refs.insert(i);
                    pos += 4;
                }
                None => break,
            },
            SCAN_COUNTED => {
                let Some((width, signed)) = length_prefix(code) else {
                    break;
                };
                let next = match read_length(data, pos, width, signed) {
                    Ok(Some(len)) => usize::try_from(len)
                        .ok()
                        .and_then(|l| l.checked_add(width))
                        .and_then(|n| pos.checked_add(n)),
                    _ => None,
                };
                match next {
                    Some(p) if p <= data.len() => pos = p,
                    _ => break,
                }
            }
            SCAN_LINE | SCAN_GET_LINE => match line_at(data, pos) {
                Some((line, next)) => {
                    if class == SCAN_GET_LINE {
                        match parse_memo_index(line) {
                            Some(i) => refs.insert(i),
                            None => break,
                        };
                    }
                    pos = next;
                }
                None => break,
            },
            _ => break,
        }
    }
    refs
}

// ---------------------------------------------------------------------------------------
// Integers

/// Python's limit on decimal integer literals (`sys.get_int_max_str_digits()`), which
/// also keeps the quadratic decimal-to-binary conversion cheap.
const MAX_INT_DIGITS: usize = 4300;

/// The minimal length of a little-endian two's complement number (redundant sign
/// bytes at the top dropped).
fn minimal_len(bytes: &[u8]) -> usize {
    let mut n = bytes.len();
    while n >= 2 {
        let (Some(&top), Some(&below)) = (bytes.get(n - 1), bytes.get(n - 2)) else {
            break;
        };
        let redundant = (top == 0 && below & 0x80 == 0) || (top == 0xff && below & 0x80 != 0);
        if !redundant {
            break;
        }
        n -= 1;
    }
    if n == 1 && bytes.first() == Some(&0) {
        0
    } else {
        n
    }
}

/// Little-endian two's complement bytes as an `i128`, if they fit.
fn le_to_i128(bytes: &[u8]) -> Option<i128> {
    if bytes.len() > 16 {
        return None;
    }
    let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
    let mut buf = if negative { [0xffu8; 16] } else { [0u8; 16] };
    buf.get_mut(..bytes.len())?.copy_from_slice(bytes);
    Some(i128::from_le_bytes(buf))
}

fn int_value(v: i128) -> Option<Value> {
    if let Ok(i) = i64::try_from(v) {
        Some(Value::Int(i))
    } else if let Ok(u) = u64::try_from(v) {
        Some(Value::UInt(u))
    } else {
        None
    }
}

/// Decimal digits (with optional sign and surrounding whitespace) as little-endian two's
/// complement bytes; `None` if not an integer literal.
fn decimal_to_le(text: &[u8]) -> Option<Vec<u8>> {
    let s = std::str::from_utf8(text).ok()?.trim();
    let (negative, digits) = match s.as_bytes().first()? {
        b'-' => (true, s.get(1..)?),
        b'+' => (false, s.get(1..)?),
        _ => (false, s),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Magnitude in base-2^64 limbs, fed 19 decimal digits at a time.
    let mut limbs: Vec<u64> = vec![0];
    for chunk in digits.as_bytes().chunks(19) {
        let mut mul = 1u128;
        let mut add = 0u128;
        for &d in chunk {
            mul *= 10;
            add = add * 10 + u128::from(d - b'0');
        }
        let mut carry = add;
        for limb in &mut limbs {
            let v = u128::from(*limb) * mul + carry;
            *limb = v as u64;
            carry = v >> 64;
        }
        if carry != 0 {
            limbs.push(carry as u64);
        }
    }
    let mut bytes: Vec<u8> = limbs.iter().flat_map(|l| l.to_le_bytes()).collect();
    bytes.push(0); // room for the sign bit
    if negative {
        // Two's complement: invert and add one.
        let mut carry = true;
        for b in &mut bytes {
            let (v, c) = (!*b).overflowing_add(u8::from(carry));
            *b = v;
            carry = c;
        }
    }
    let n = minimal_len(&bytes);
    bytes.truncate(n);
    Some(bytes)
}

// ---------------------------------------------------------------------------------------
// Text decoding for protocol-0 opcodes

/// Python's `codecs.escape_decode` (the `STRING` opcode's body).
fn escape_decode(src: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    while let Some(&b) = src.get(i) {
        i += 1;
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let Some(&e) = src.get(i) else {
            out.push(b'\\');
            break;
        };
        i += 1;
        match e {
            b'\n' => {}
            b'\\' => out.push(b'\\'),
            b'\'' => out.push(b'\''),
            b'"' => out.push(b'"'),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut v = u32::from(e - b'0');
                for _ in 0..2 {
                    match src.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push(v as u8);
            }
            b'x' => {
                let hex = src
                    .get(i..i + 2)
                    .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
                if let Some(v) = hex {
                    out.push(v);
                    i += 2;
                } else {
                    out.extend_from_slice(b"\\x");
                }
            }
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
}

/// Python's `raw-unicode-escape` decoding (the `UNICODE` opcode), written as UTF-8.
fn raw_unicode_decode(src: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    let mut buf = [0u8; 4];
    while let Some(&b) = src.get(i) {
        i += 1;
        let width = match (b, src.get(i)) {
            (b'\\', Some(b'u')) => 4,
            (b'\\', Some(b'U')) => 8,
            _ => 0,
        };
        let code = (width > 0)
            .then(|| src.get(i + 1..i + 1 + width))
            .flatten()
            .and_then(|h| u32::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        let c = if let Some(code) = code {
            i += 1 + width;
            char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER)
        } else {
            char::from(b) // latin-1
        };
        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
    }
}

// ---------------------------------------------------------------------------------------
// Field extraction (shared by the fast path, which drops the error, and the schema pass,
// which reports it)

#[derive(Debug, Clone, Copy)]
enum Problem {
    Missing,
    WrongType(&'static str),
    Negative(&'static str),
    TooWide,
    BadValue(&'static str),
}

#[derive(Debug, Clone, Copy)]
struct FieldError {
    key: &'static str,
    problem: Problem,
    found: Value,
}

fn fe(key: &'static str, problem: Problem, found: Value) -> FieldError {
    FieldError {
        key,
        problem,
        found,
    }
}

fn missing(key: &'static str) -> FieldError {
    fe(key, Problem::Missing, Value::None)
}

const UNSIGNED: &str = "an unsigned integer";

fn as_u64(v: Value, key: &'static str) -> Result<u64, FieldError> {
    match v {
        Value::Int(i) => u64::try_from(i).map_err(|_| fe(key, Problem::Negative(UNSIGNED), v)),
        Value::UInt(u) => Ok(u),
        Value::BigInt { .. } => Err(fe(key, Problem::TooWide, v)),
        _ => Err(fe(key, Problem::WrongType(UNSIGNED), v)),
    }
}

fn as_i64(v: Value, key: &'static str) -> Result<i64, FieldError> {
    match v {
        Value::Int(i) => Ok(i),
        Value::UInt(_) | Value::BigInt { .. } => Err(fe(key, Problem::TooWide, v)),
        _ => Err(fe(key, Problem::WrongType("an integer"), v)),
    }
}

fn as_bool(v: Value, key: &'static str) -> Result<bool, FieldError> {
    match v {
        Value::Bool(b) => Ok(b),
        // Protocol 0/1 and some writers use 0/1.
        Value::Int(0) => Ok(false),
        Value::Int(1) => Ok(true),
        _ => Err(fe(key, Problem::WrongType("a bool"), v)),
    }
}

fn as_f64(v: Value, key: &'static str) -> Result<f64, FieldError> {
    match v {
        Value::Float(f) => Ok(f),
        Value::Int(i) => Ok(i as f64),
        Value::UInt(u) => Ok(u as f64),
        _ => Err(fe(key, Problem::WrongType("a number"), v)),
    }
}

fn as_str<'s>(text: &Text<'s>, v: Value, key: &'static str) -> Result<&'s [u8], FieldError> {
    text.str_bytes(v)
        .ok_or_else(|| fe(key, Problem::WrongType("a string"), v))
}

fn lossy(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

/// The keys of trace entries and frames, read in one pass over a dict (last one wins,
/// as in a Python dict).
#[derive(Default)]
struct Fields {
    action: Option<Value>,
    addr: Option<Value>,
    device_free: Option<Value>,
    size: Option<Value>,
    stream: Option<Value>,
    time_us: Option<Value>,
    frames: Option<Value>,
    name: Option<Value>,
    filename: Option<Value>,
    line: Option<Value>,
    pool_id: Option<Value>,
    user_metadata: Option<Value>,
    fx_node_op: Option<Value>,
    fx_node_name: Option<Value>,
    fx_node_target: Option<Value>,
    fx_original_trace: Option<Value>,
    fx_node_info: Option<Value>,
}

impl Fields {
    fn collect(text: &Text<'_>, pairs: &[Value]) -> Fields {
        // Keys compared as one little-endian word (plus length) instead of a `memcmp`
        // call per candidate: this runs for every trace entry.
        const fn word(s: &[u8]) -> u64 {
            let mut w = 0u64;
            let mut i = s.len();
            while i > 0 {
                i -= 1;
                w = (w << 8) | s[i] as u64;
            }
            w
        }
        const ACTION: u64 = word(b"action");
        const ADDR: u64 = word(b"addr");
        const SIZE: u64 = word(b"size");
        const STREAM: u64 = word(b"stream");
        const TIME_US: u64 = word(b"time_us");
        const FRAMES: u64 = word(b"frames");
        const NAME: u64 = word(b"name");
        const FILENAME: u64 = word(b"filename");
        const LINE: u64 = word(b"line");
        const POOL_ID: u64 = word(b"pool_id");
        let mut f = Fields::default();
        for pair in pairs.chunks_exact(2) {
            let [k, v] = *pair else { continue };
            let Value::Str { len, off } = k else { continue };
            let slot = if let Some(w) = text.word(len, off) {
                match (len, w) {
                    (6, ACTION) => &mut f.action,
                    (4, ADDR) => &mut f.addr,
                    (4, SIZE) => &mut f.size,
                    (6, STREAM) => &mut f.stream,
                    (7, TIME_US) => &mut f.time_us,
                    (6, FRAMES) => &mut f.frames,
                    (4, NAME) => &mut f.name,
                    (8, FILENAME) => &mut f.filename,
                    (4, LINE) => &mut f.line,
                    (7, POOL_ID) => &mut f.pool_id,
                    _ => continue,
                }
            } else {
                match text.span(len, off) {
                    b"device_free" => &mut f.device_free,
                    b"user_metadata" => &mut f.user_metadata,
                    b"fx_node_op" => &mut f.fx_node_op,
                    b"fx_node_name" => &mut f.fx_node_name,
                    b"fx_node_target" => &mut f.fx_node_target,
                    b"fx_original_trace" => &mut f.fx_original_trace,
                    b"fx_node_info" => &mut f.fx_node_info,
                    _ => continue,
                }
            };
            *slot = Some(v);
        }
        f
    }

    fn is_event(&self) -> bool {
        self.action.is_some()
    }

    fn is_frame(&self) -> bool {
        self.action.is_none()
            && self.name.is_some()
            && self.filename.is_some()
            && self.line.is_some()
    }

    fn event(&self, text: &Text<'_>, stack: StackId) -> Result<RawEvent, FieldError> {
        let action_text = as_str(text, self.action.ok_or(missing("action"))?, "action")?;
        let action = Action::from_bytes(action_text);
        let other = if action == Action::Other {
            OtherAction::from_bytes(action_text)
        } else {
            OtherAction::Plain
        };
        // Allocator actions always carry an address and a size; `snapshot` and
        // user-defined entries may not, and are never replayed.
        let needs_place = !matches!(action, Action::Snapshot | Action::Other);
        let (addr_key, addr) = match (action, self.device_free) {
            (Action::Oom, Some(v)) => ("device_free", Some(v)),
            (Action::Oom, None) if self.addr.is_none() => ("device_free", None),
            _ => ("addr", self.addr),
        };
        let addr = match addr {
            Some(v) => as_u64(v, addr_key)?,
            None if needs_place => return Err(missing(addr_key)),
            None => 0,
        };
        let size = match self.size {
            Some(v) => as_u64(v, "size")?,
            None if needs_place => return Err(missing("size")),
            None => 0,
        };
        let stream = self.stream.map_or(Ok(0), |v| as_u64(v, "stream"))?;
        let time_us = self.time_us.map_or(Ok(0), |v| as_i64(v, "time_us"))?;
        Ok(RawEvent {
            action,
            other,
            addr,
            size,
            stream,
            time_us,
            stack,
            pool: 0,
            user_metadata: StrId::EMPTY,
        })
    }

    /// `pool_id` and `user_metadata` of an entry (display and bookkeeping only: a value of
    /// another shape reads as absent, never refused).
    fn event_extras(
        &self,
        heap: &[Container],
        text: &Text<'_>,
        frames: &mut FrameTable,
        pools: &mut PoolTable,
        ev: &mut RawEvent,
    ) {
        if let Some(Value::Obj(id)) = self.pool_id
            && let Some(c) = heap.get(id as usize)
            && matches!(c.kind, Kind::Tuple | Kind::List)
            && let [a, b] = c.items[..]
            && let (Ok(a), Ok(b)) = (as_u64(a, "pool_id"), as_u64(b, "pool_id"))
        {
            ev.pool = pools.intern((a, b));
        }
        if let Some(v) = self.user_metadata
            && let Some(bytes) = text.str_bytes(v)
            && !bytes.is_empty()
        {
            ev.user_metadata = frames.intern_str(&lossy(bytes));
        }
    }

    fn frame(&self, text: &Text<'_>, table: &mut FrameTable) -> Result<FrameId, FieldError> {
        let name = as_str(text, self.name.ok_or(missing("name"))?, "name")?;
        let filename = as_str(text, self.filename.ok_or(missing("filename"))?, "filename")?;
        let (line, line_text) = frame_line(text, self.line, table);
        let name = table.intern_str(&lossy(name));
        let filename = table.intern_str(&lossy(filename));
        let mut fx_str = |v: Option<Value>| match v.and_then(|v| text.str_bytes(v)) {
            Some(b) => table.intern_str(&lossy(b)),
            None => StrId::EMPTY,
        };
        let fx = FxInfo {
            node_op: fx_str(self.fx_node_op),
            node_name: fx_str(self.fx_node_name),
            node_target: fx_str(self.fx_node_target),
            original_trace: fx_str(self.fx_original_trace),
            node_info: fx_str(self.fx_node_info),
        };
        let fx = table.intern_fx(fx);
        Ok(table.intern_frame(Frame {
            name,
            filename,
            line,
            line_text,
            fx,
        }))
    }
}

/// The distinct `pool_id`s of trace entries, interned (see [`RawEvent::pool`]).
#[derive(Default)]
struct PoolTable {
    pools: Vec<(u64, u64)>,
    index: HashMap<(u64, u64), u32>,
}

impl PoolTable {
    fn intern(&mut self, pool: (u64, u64)) -> u32 {
        if let Some(&i) = self.index.get(&pool) {
            return i;
        }
        self.pools.push(pool);
        let i = u32::try_from(self.pools.len()).unwrap_or(u32::MAX);
        self.index.insert(pool, i);
        i
    }
}

/// A frame's `line` as [`Frame::line`] and [`Frame::line_text`]: any value is kept, the
/// line is only displayed.
fn frame_line(text: &Text<'_>, v: Option<Value>, table: &mut FrameTable) -> (i64, Option<StrId>) {
    let line_text = match v {
        Some(Value::Int(i)) if i != Frame::LINE_UNKNOWN => return (i, None),
        Some(Value::Int(i)) => i.to_string(),
        Some(Value::UInt(u)) => u.to_string(),
        Some(Value::BigInt { len, off }) => le_to_decimal(text.span(len, off)),
        Some(Value::Bool(b)) => if b { "True" } else { "False" }.to_owned(),
        Some(Value::Float(f)) => format!("{f:?}"),
        Some(Value::Str { len, off }) => lossy(text.span(len, off)).into_owned(),
        // None, absent, or a container.
        _ => return (Frame::LINE_UNKNOWN, None),
    };
    (Frame::LINE_UNKNOWN, Some(table.intern_str(&line_text)))
}

/// Little-endian two's complement bytes as decimal text (any width).
fn le_to_decimal(bytes: &[u8]) -> String {
    let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
    // Magnitude in base-2^32 limbs, most significant first.
    let mut mag: Vec<u8> = bytes.to_vec();
    if negative {
        let mut carry = true;
        for b in &mut mag {
            let (v, c) = (!*b).overflowing_add(u8::from(carry));
            *b = v;
            carry = c;
        }
    }
    let mut limbs: Vec<u32> = mag
        .chunks(4)
        .rev()
        .map(|c| c.iter().rev().fold(0u32, |w, &b| (w << 8) | u32::from(b)))
        .collect();
    // Peel off 9 decimal digits at a time.
    let mut groups: Vec<u32> = Vec::new();
    while limbs.iter().any(|&l| l != 0) {
        let mut rem = 0u64;
        for l in &mut limbs {
            let cur = (rem << 32) | u64::from(*l);
            *l = (cur / 1_000_000_000) as u32;
            rem = cur % 1_000_000_000;
        }
        groups.push(rem as u32);
    }
    let mut out = String::from(if negative { "-" } else { "" });
    match groups.split_last() {
        None => out.push('0'),
        Some((top, rest)) => {
            out.push_str(&top.to_string());
            for g in rest.iter().rev() {
                let _ = write!(out, "{g:09}");
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// The machine

/// A hasher for keys that already are good 64-bit hashes.
#[derive(Default)]
struct PreHashed(u64);

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
enum Item {
    Value(Value),
    Event(RawEvent),
}

struct Vm<'a> {
    data: &'a [u8],
    pos: usize,
    scratch: Vec<u8>,
    stack: Vec<Value>,
    /// Stack heights at each `MARK`; the values above the last one are Python's
    /// current stack.
    marks: Vec<usize>,
    memo: Memo,
    heap: Vec<Container>,
    /// Heap slots of converted containers, reused by the next containers.
    free: Vec<u32>,
    event_lists: Vec<Vec<RawEvent>>,
    /// Trace entries of lists that also hold other items (see [`Value::Event`]).
    extra_events: Vec<RawEvent>,
    frames: FrameTable,
    /// Scratch for interning stacks.
    frame_buf: Vec<FrameId>,
    /// Stacks by a fast hash of their frame ids, checked against the table on a hit:
    /// every trace entry has its own frames list, and hashing each through the
    /// table's `SipHash` index was a visible cost.
    stack_cache: HashMap<u64, StackId, BuildHasherDefault<PreHashed>>,
    /// `pool_id`s of trace entries.
    pools: PoolTable,
    /// Snapshot mode: convert frames, stacks and trace entries as they are consumed.
    eager: bool,
}

/// Errors are boxed inside the machine: a `Result` of one pointer keeps the hot paths'
/// returns in registers.
type Res<T> = Result<T, Box<ImportError>>;

#[cold]
#[inline(never)]
#[allow(clippy::unnecessary_box_returns)] // boxed on purpose, see `Res`
fn schema_err(offset: u64, location: String, problem: String) -> Box<ImportError> {
    Box::new(ImportError::Schema {
        offset,
        location,
        problem,
    })
}

#[cold]
#[inline(never)]
#[allow(clippy::unnecessary_box_returns)] // boxed on purpose, see `Res`
fn malformed(offset: usize, message: impl Into<String>) -> Box<ImportError> {
    Box::new(ImportError::Malformed {
        offset: offset as u64,
        message: message.into(),
    })
}

#[cold]
#[inline(never)]
#[allow(clippy::unnecessary_box_returns)] // boxed on purpose, see `Res`
fn truncated(offset: usize, what: &'static str, missing_bytes: u64) -> Box<ImportError> {
    Box::new(ImportError::Truncated {
        offset: offset as u64,
        what,
        missing_bytes,
    })
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::List => "list",
        Kind::Tuple => "tuple",
        Kind::Dict => "dict",
        Kind::Set => "set",
        Kind::FrozenSet => "frozenset",
    }
}

impl<'a> Vm<'a> {
    fn new(data: &'a [u8], eager: bool) -> Vm<'a> {
        let refs = scan_references(data);
        Vm {
            data,
            pos: 0,
            scratch: Vec::new(),
            stack: Vec::with_capacity(64),
            marks: Vec::with_capacity(16),
            memo: Memo::new(refs, data.len()),
            heap: Vec::new(),
            free: Vec::new(),
            event_lists: Vec::new(),
            extra_events: Vec::new(),
            frames: FrameTable::default(),
            frame_buf: Vec::new(),
            stack_cache: HashMap::default(),
            pools: PoolTable::default(),
            eager,
        }
    }

    fn text(&self) -> Text<'_> {
        Text {
            data: self.data,
            scratch: &self.scratch,
        }
    }

    // --- reading arguments -------------------------------------------------------------

    fn take(&mut self, n: usize, at: usize, what: &'static str) -> Res<&'a [u8]> {
        let data = self.data;
        let end = self.pos.checked_add(n).filter(|&e| e <= data.len());
        match end.and_then(|e| data.get(self.pos..e)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(truncated(
                at,
                what,
                (n as u64).saturating_sub(data.len().saturating_sub(self.pos) as u64),
            )),
        }
    }

    fn arg_u8(&mut self, at: usize, what: &'static str) -> Res<u8> {
        match self.data.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                Ok(b)
            }
            None => Err(truncated(at, what, 1)),
        }
    }

    fn arg_u32(&mut self, at: usize, what: &'static str) -> Res<u32> {
        match le_u32(self.data, self.pos) {
            Some(v) => {
                self.pos += 4;
                Ok(v)
            }
            None => Err(truncated(
                at,
                what,
                4 - self.data.len().saturating_sub(self.pos).min(4) as u64,
            )),
        }
    }

    fn arg_line(&mut self, at: usize, what: &'static str) -> Res<&'a [u8]> {
        match line_at(self.data, self.pos) {
            Some((line, next)) => {
                self.pos = next;
                Ok(line)
            }
            None => Err(malformed(at, format!("{what} argument has no end of line"))),
        }
    }

    /// A length-prefixed argument: the prefix is checked against the remaining input
    /// before anything is read, so a 10 GB prefix costs nothing.
    fn arg_counted(&mut self, code: u8, at: usize, what: &'static str) -> Res<(u32, u64)> {
        let (width, signed) = length_prefix(code).unwrap_or((1, false));
        let len = match read_length(self.data, self.pos, width, signed) {
            Ok(Some(len)) => len,
            Ok(None) => {
                let have = self.data.len().saturating_sub(self.pos) as u64;
                return Err(truncated(at, what, width as u64 - have.min(width as u64)));
            }
            Err(n) => return Err(malformed(at, format!("{what} with negative length {n}"))),
        };
        self.pos += width;
        let remaining = self.data.len().saturating_sub(self.pos) as u64;
        if len > remaining {
            return Err(truncated(at, what, len - remaining));
        }
        let len32 = u32::try_from(len).map_err(|_| {
            malformed(
                at,
                format!("{what} of {len} bytes: items over 4 GiB are not supported"),
            )
        })?;
        let off = self.pos as u64;
        self.pos += len as usize;
        Ok((len32, off))
    }

    /// Appends decoded bytes to the scratch buffer and returns their span.
    fn scratch_span(&mut self, at: usize, f: impl FnOnce(&mut Vec<u8>)) -> Res<(u32, u64)> {
        let start = self.scratch.len();
        f(&mut self.scratch);
        let len = u32::try_from(self.scratch.len() - start)
            .map_err(|_| malformed(at, "decoded text over 4 GiB is not supported"))?;
        Ok((len, start as u64 | SCRATCH))
    }

    fn push_le_int(&mut self, bytes_len: u32, off: u64) {
        let text = self.text();
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
        let value = bytes
            .get(..n)
            .and_then(le_to_i128)
            .and_then(int_value)
            .unwrap_or(Value::BigInt { len: n as u32, off });
        self.stack.push(value);
    }

    fn push_decimal(&mut self, text: &[u8], at: usize, what: &'static str) -> Res<()> {
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
    fn base(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn need(&self, n: usize, at: usize, what: &'static str) -> Res<()> {
        if self.stack.len().saturating_sub(self.base()) < n {
            return Err(malformed(
                at,
                format!("{what} needs {n} value(s) on the stack above the last MARK"),
            ));
        }
        Ok(())
    }

    fn pop(&mut self, at: usize, what: &'static str) -> Res<Value> {
        self.need(1, at, what)?;
        self.stack
            .pop()
            .ok_or_else(|| malformed(at, format!("{what} on an empty stack")))
    }

    fn top(&self, at: usize, what: &'static str) -> Res<Value> {
        self.need(1, at, what)?;
        self.stack
            .last()
            .copied()
            .ok_or_else(|| malformed(at, format!("{what} on an empty stack")))
    }

    fn pop_mark(&mut self, at: usize, what: &'static str) -> Res<usize> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| malformed(at, format!("{what} without a MARK")))?;
        if mark > self.stack.len() {
            return Err(malformed(at, "MARK above the stack (internal)"));
        }
        Ok(mark)
    }

    /// The container just below `mark`, which must be on Python's (restored) current stack.
    fn target_below(&self, mark: usize, at: usize, what: &'static str, want: Kind) -> Res<u32> {
        if mark <= self.base() {
            return Err(malformed(
                at,
                format!("{what} has no {} below its MARK", kind_name(want)),
            ));
        }
        let v = self.stack.get(mark - 1).copied().unwrap_or(Value::None);
        self.expect_kind(v, at, what, want)
    }

    fn expect_kind(&self, v: Value, at: usize, what: &'static str, want: Kind) -> Res<u32> {
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
    fn take_stack(&mut self) -> Vec<Value> {
        std::mem::take(&mut self.stack)
    }

    fn restore_stack(&mut self, mut stack: Vec<Value>, mark: usize) {
        stack.truncate(mark);
        self.stack = stack;
    }

    // --- heap ------------------------------------------------------------------------

    fn alloc(&mut self, kind: Kind, at: usize) -> Res<u32> {
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
            items: Vec::new(),
            offset: at as u64,
            events: 0,
            kind,
            shared: false,
            seal: Seal::Open,
        });
        Ok(id)
    }

    /// Returns an unshared container's slot for reuse (its only reference was consumed).
    fn release(&mut self, id: u32) {
        if let Some(c) = self.heap.get_mut(id as usize) {
            c.items.clear();
            // Keep a small buffer for the next dict; drop big ones.
            if c.items.capacity() > 64 {
                c.items = Vec::new();
            }
            c.events = 0;
            c.seal = Seal::Open;
            c.shared = false;
            self.free.push(id);
        }
    }

    /// Records a conversion: shared containers keep the result, others are released.
    fn seal(&mut self, id: u32, seal: Seal) {
        let shared = self.heap.get(id as usize).is_some_and(|c| c.shared);
        if shared {
            if let Some(c) = self.heap.get_mut(id as usize) {
                c.seal = seal;
                c.items = Vec::new();
            }
        } else {
            self.release(id);
        }
    }

    fn mark_shared(&mut self, v: Value) {
        if let Value::Obj(id) = v
            && let Some(c) = self.heap.get_mut(id as usize)
        {
            c.shared = true;
        }
    }

    fn new_container(&mut self, kind: Kind, items: &[Value], at: usize) -> Res<Value> {
        let id = self.alloc(kind, at)?;
        if let Some(c) = self.heap.get_mut(id as usize) {
            c.items.extend_from_slice(items);
        }
        Ok(Value::Obj(id))
    }

    // --- conversions as objects are consumed -------------------------------------------

    /// A list consumes `v`: frame dicts become frames, trace-entry dicts events.
    fn convert_item(&mut self, v: Value) -> Item {
        let Value::Obj(id) = v else {
            return Item::Value(v);
        };
        let Some(c) = self.heap.get(id as usize) else {
            return Item::Value(v);
        };
        match c.seal {
            Seal::Frame(f) => return Item::Value(Value::Frame(f)),
            Seal::Stack(_) => return Item::Value(v),
            Seal::Open => {}
        }
        if c.kind != Kind::Dict {
            return Item::Value(v);
        }
        let text = Text {
            data: self.data,
            scratch: &self.scratch,
        };
        let fields = Fields::collect(&text, &c.items);
        if fields.is_event() {
            // A shared entry could be read again elsewhere: the schema pass converts it.
            if c.shared {
                return Item::Value(v);
            }
            let stack = match fields.frames {
                None => Some(StackId::EMPTY),
                Some(Value::Stack(s)) => Some(s),
                Some(Value::Obj(j)) => match self.heap.get(j as usize).map(|c| c.seal) {
                    Some(Seal::Stack(s)) => Some(s),
                    _ => None,
                },
                Some(_) => None,
            };
            if let Some(mut ev) = stack.and_then(|s| fields.event(&text, s).ok()) {
                fields.event_extras(
                    &self.heap,
                    &text,
                    &mut self.frames,
                    &mut self.pools,
                    &mut ev,
                );
                // The entry's own `pool_id` tuple goes with it.
                if let Some(Value::Obj(t)) = fields.pool_id
                    && self
                        .heap
                        .get(t as usize)
                        .is_some_and(|c| !c.shared && c.seal == Seal::Open && c.kind == Kind::Tuple)
                {
                    self.release(t);
                }
                self.release(id);
                return Item::Event(ev);
            }
        } else if fields.is_frame()
            && let Ok(f) = fields.frame(&text, &mut self.frames)
        {
            self.seal(id, Seal::Frame(f));
            return Item::Value(Value::Frame(f));
        }
        Item::Value(v)
    }

    /// A dict consumes a list under `frames`: a list of frames becomes a stack.
    fn convert_stack(&mut self, id: u32) -> Option<StackId> {
        let c = self.heap.get(id as usize)?;
        match c.seal {
            Seal::Stack(s) => return Some(s),
            Seal::Frame(_) => return None,
            Seal::Open => {}
        }
        if c.kind != Kind::List || c.events != 0 {
            return None;
        }
        self.frame_buf.clear();
        for item in &c.items {
            let f = match *item {
                Value::Frame(f) => f,
                Value::Obj(j) => match self.heap.get(j as usize)?.seal {
                    Seal::Frame(f) => f,
                    _ => return None,
                },
                _ => return None,
            };
            self.frame_buf.push(f);
        }
        let hash = self.frame_buf.iter().fold(0u64, |h, f| {
            (h.rotate_left(5) ^ u64::from(f.0)).wrapping_mul(0x517c_c1b7_2722_0a95)
        });
        let s = match self.stack_cache.get(&hash) {
            Some(&s) if self.frames.stack(s) == self.frame_buf.as_slice() => s,
            _ => {
                let s = self.frames.intern_stack(&self.frame_buf);
                self.stack_cache.insert(hash, s);
                s
            }
        };
        self.seal(id, Seal::Stack(s));
        Some(s)
    }

    fn is_frames_key(&self, k: Value) -> bool {
        const FRAMES: u64 = u64::from_le_bytes(*b"frames\0\0");
        matches!(k, Value::Str { len: 6, off } if self.text().word(6, off) == Some(FRAMES))
    }

    fn append(&mut self, list: u32, v: Value) {
        let item = if self.eager {
            self.convert_item(v)
        } else {
            Item::Value(v)
        };
        let Some(c) = self.heap.get_mut(list as usize) else {
            return;
        };
        match item {
            Item::Event(ev) => {
                if c.items.is_empty() {
                    if c.events == 0 {
                        self.event_lists.push(Vec::new());
                        c.events = self.event_lists.len() as u32;
                    }
                    if let Some(list) = self.event_lists.get_mut(c.events as usize - 1) {
                        list.push(ev);
                    }
                } else {
                    c.items.push(Value::Event(self.extra_events.len() as u32));
                    self.extra_events.push(ev);
                }
            }
            Item::Value(v) => {
                if c.events != 0 {
                    // The list mixes entries with other items: keep order via extra_events.
                    if let Some(evs) = self.event_lists.get_mut(c.events as usize - 1) {
                        for ev in evs.drain(..) {
                            c.items.push(Value::Event(self.extra_events.len() as u32));
                            self.extra_events.push(ev);
                        }
                    }
                    c.events = 0;
                }
                c.items.push(v);
            }
        }
    }

    /// `dict.update(pairs)`; converts lists under `frames` in place first.
    fn set_items(
        &mut self,
        dict: u32,
        pairs: &mut [Value],
        at: usize,
        what: &'static str,
    ) -> Res<()> {
        if !pairs.len().is_multiple_of(2) {
            return Err(malformed(at, format!("{what} with an odd number of items")));
        }
        if self.eager {
            for pair in pairs.chunks_exact_mut(2) {
                if let [k, v] = pair
                    && let Value::Obj(id) = *v
                    && self.is_frames_key(*k)
                    && let Some(s) = self.convert_stack(id)
                {
                    *v = Value::Stack(s);
                }
            }
        }
        if let Some(c) = self.heap.get_mut(dict as usize) {
            c.items.extend_from_slice(pairs);
        }
        Ok(())
    }

    // --- the loop --------------------------------------------------------------------

    /// Runs to `STOP`; returns the pickled value and the offset of `STOP`.
    fn run(&mut self) -> Res<(Value, usize)> {
        loop {
            let at = self.pos;
            let Some(&code) = self.data.get(at) else {
                return Err(truncated(at, "next opcode (no STOP)", 1));
            };
            self.pos = at + 1;
            // The three most frequent opcodes of a snapshot (≈ 60 % of them) get a
            // predictable branch each before the jump table.
            if code == op::LONG_BINGET {
                let i = self.arg_u32(at, "LONG_BINGET")?;
                self.get(i, at)?;
                continue;
            }
            if code == op::BINGET {
                let i = self.arg_u8(at, "BINGET")?;
                self.get(u32::from(i), at)?;
                continue;
            }
            if code == op::MEMOIZE {
                self.memoize(at)?;
                continue;
            }
            match code {
                op::BINGET => {
                    let i = self.arg_u8(at, "BINGET")?;
                    self.get(u32::from(i), at)?;
                }
                op::LONG_BINGET => {
                    let i = self.arg_u32(at, "LONG_BINGET")?;
                    self.get(i, at)?;
                }
                op::GET => {
                    let line = self.arg_line(at, "GET")?;
                    let i = parse_memo_index(line)
                        .ok_or_else(|| malformed(at, format!("GET index {:?}", lossy(line))))?;
                    self.get(i, at)?;
                }
                op::MEMOIZE => self.memoize(at)?,
                op::BINPUT => {
                    let i = self.arg_u8(at, "BINPUT")?;
                    self.put(u32::from(i), at, "BINPUT")?;
                }
                op::LONG_BINPUT => {
                    let i = self.arg_u32(at, "LONG_BINPUT")?;
                    self.put(i, at, "LONG_BINPUT")?;
                }
                op::PUT => {
                    let line = self.arg_line(at, "PUT")?;
                    let i = parse_memo_index(line)
                        .ok_or_else(|| malformed(at, format!("PUT index {:?}", lossy(line))))?;
                    self.put(i, at, "PUT")?;
                }
                op::MARK => self.marks.push(self.stack.len()),
                op::EMPTY_DICT => {
                    let id = self.alloc(Kind::Dict, at)?;
                    self.stack.push(Value::Obj(id));
                }
                op::EMPTY_LIST => {
                    let id = self.alloc(Kind::List, at)?;
                    self.stack.push(Value::Obj(id));
                }
                op::EMPTY_TUPLE => {
                    let v = self.new_container(Kind::Tuple, &[], at)?;
                    self.stack.push(v);
                }
                op::EMPTY_SET => {
                    let id = self.alloc(Kind::Set, at)?;
                    self.stack.push(Value::Obj(id));
                }
                op::SETITEMS => {
                    let mark = self.pop_mark(at, "SETITEMS")?;
                    let dict = self.target_below(mark, at, "SETITEMS", Kind::Dict)?;
                    let mut stack = self.take_stack();
                    let r = self.set_items(
                        dict,
                        stack.get_mut(mark..).unwrap_or(&mut []),
                        at,
                        "SETITEMS",
                    );
                    self.restore_stack(stack, mark);
                    r?;
                }
                op::SETITEM => {
                    self.need(3, at, "SETITEM")?;
                    let v = self.pop(at, "SETITEM")?;
                    let k = self.pop(at, "SETITEM")?;
                    let dict =
                        self.expect_kind(self.top(at, "SETITEM")?, at, "SETITEM", Kind::Dict)?;
                    self.set_items(dict, &mut [k, v], at, "SETITEM")?;
                }
                op::APPENDS => {
                    let mark = self.pop_mark(at, "APPENDS")?;
                    let list = self.target_below(mark, at, "APPENDS", Kind::List)?;
                    let stack = self.take_stack();
                    for &v in stack.get(mark..).unwrap_or(&[]) {
                        self.append(list, v);
                    }
                    self.restore_stack(stack, mark);
                }
                op::APPEND => {
                    self.need(2, at, "APPEND")?;
                    let v = self.pop(at, "APPEND")?;
                    let list =
                        self.expect_kind(self.top(at, "APPEND")?, at, "APPEND", Kind::List)?;
                    self.append(list, v);
                }
                op::ADDITEMS => {
                    let mark = self.pop_mark(at, "ADDITEMS")?;
                    let set = self.target_below(mark, at, "ADDITEMS", Kind::Set)?;
                    if let (Some(c), Some(items)) =
                        (self.heap.get_mut(set as usize), self.stack.get(mark..))
                    {
                        c.items.extend_from_slice(items);
                    }
                    self.stack.truncate(mark);
                }
                op::LIST => {
                    let mark = self.pop_mark(at, "LIST")?;
                    let id = self.alloc(Kind::List, at)?;
                    let stack = self.take_stack();
                    for &v in stack.get(mark..).unwrap_or(&[]) {
                        self.append(id, v);
                    }
                    self.restore_stack(stack, mark);
                    self.stack.push(Value::Obj(id));
                }
                op::DICT => {
                    let mark = self.pop_mark(at, "DICT")?;
                    let id = self.alloc(Kind::Dict, at)?;
                    let mut stack = self.take_stack();
                    let r =
                        self.set_items(id, stack.get_mut(mark..).unwrap_or(&mut []), at, "DICT");
                    self.restore_stack(stack, mark);
                    r?;
                    self.stack.push(Value::Obj(id));
                }
                op::TUPLE | op::FROZENSET => {
                    let name = if code == op::TUPLE {
                        "TUPLE"
                    } else {
                        "FROZENSET"
                    };
                    let kind = if code == op::TUPLE {
                        Kind::Tuple
                    } else {
                        Kind::FrozenSet
                    };
                    let mark = self.pop_mark(at, name)?;
                    let stack = self.take_stack();
                    let r = self.new_container(kind, stack.get(mark..).unwrap_or(&[]), at);
                    self.restore_stack(stack, mark);
                    self.stack.push(r?);
                }
                op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                    let n = usize::from(code - op::TUPLE1) + 1;
                    self.need(n, at, "TUPLEn")?;
                    let mark = self.stack.len() - n;
                    let stack = self.take_stack();
                    let r = self.new_container(Kind::Tuple, stack.get(mark..).unwrap_or(&[]), at);
                    self.restore_stack(stack, mark);
                    self.stack.push(r?);
                }
                op::BININT1 => {
                    let b = self.arg_u8(at, "BININT1")?;
                    self.stack.push(Value::Int(i64::from(b)));
                }
                op::BININT2 => {
                    let b = self.take(2, at, "BININT2")?;
                    let v = b.first().copied().map_or(0, u16::from)
                        | b.get(1).copied().map_or(0, u16::from) << 8;
                    self.stack.push(Value::Int(i64::from(v)));
                }
                op::BININT => {
                    let v = self.arg_u32(at, "BININT")?;
                    self.stack.push(Value::Int(i64::from(v as i32)));
                }
                op::LONG1 | op::LONG4 => {
                    let name = if code == op::LONG1 { "LONG1" } else { "LONG4" };
                    let (len, off) = self.arg_counted(code, at, name)?;
                    self.push_le_int(len, off);
                }
                op::SHORT_BINUNICODE | op::BINUNICODE | op::BINUNICODE8 => {
                    let name = match code {
                        op::SHORT_BINUNICODE => "SHORT_BINUNICODE",
                        op::BINUNICODE => "BINUNICODE",
                        _ => "BINUNICODE8",
                    };
                    let (len, off) = self.arg_counted(code, at, name)?;
                    self.stack.push(Value::Str { len, off });
                }
                op::SHORT_BINSTRING | op::BINSTRING => {
                    // Python 2 `str`: Python 3 reads it as text (ASCII by default).
                    let name = if code == op::BINSTRING {
                        "BINSTRING"
                    } else {
                        "SHORT_BINSTRING"
                    };
                    let (len, off) = self.arg_counted(code, at, name)?;
                    self.stack.push(Value::Str { len, off });
                }
                op::SHORT_BINBYTES | op::BINBYTES | op::BINBYTES8 | op::BYTEARRAY8 => {
                    let name = match code {
                        op::SHORT_BINBYTES => "SHORT_BINBYTES",
                        op::BINBYTES => "BINBYTES",
                        op::BINBYTES8 => "BINBYTES8",
                        _ => "BYTEARRAY8",
                    };
                    let (len, off) = self.arg_counted(code, at, name)?;
                    self.stack.push(Value::Bytes { len, off });
                }
                op::NEWTRUE => self.stack.push(Value::Bool(true)),
                op::NEWFALSE => self.stack.push(Value::Bool(false)),
                op::NONE => self.stack.push(Value::None),
                op::BINFLOAT => {
                    let b = self.take(8, at, "BINFLOAT")?;
                    let bits = b.try_into().map_or(0, u64::from_be_bytes);
                    self.stack.push(Value::Float(f64::from_bits(bits)));
                }
                op::FLOAT => {
                    let line = self.arg_line(at, "FLOAT")?;
                    let f = std::str::from_utf8(line)
                        .ok()
                        .and_then(|s| s.trim().parse::<f64>().ok())
                        .ok_or_else(|| {
                            malformed(at, format!("FLOAT argument {:?}", lossy(line)))
                        })?;
                    self.stack.push(Value::Float(f));
                }
                op::INT => {
                    let line = self.arg_line(at, "INT")?;
                    match line {
                        b"00" => self.stack.push(Value::Bool(false)),
                        b"01" => self.stack.push(Value::Bool(true)),
                        _ => self.push_decimal(line, at, "INT")?,
                    }
                }
                op::LONG => {
                    let line = self.arg_line(at, "LONG")?;
                    let digits = line.strip_suffix(b"L").unwrap_or(line);
                    self.push_decimal(digits, at, "LONG")?;
                }
                op::STRING => {
                    let line = self.arg_line(at, "STRING")?;
                    let body = match line {
                        [q @ (b'\'' | b'"'), body @ .., end] if q == end => body,
                        _ => return Err(malformed(at, "STRING argument is not quoted")),
                    };
                    let (len, off) = self.scratch_span(at, |s| escape_decode(body, s))?;
                    self.stack.push(Value::Str { len, off });
                }
                op::UNICODE => {
                    let line = self.arg_line(at, "UNICODE")?;
                    let (len, off) = self.scratch_span(at, |s| raw_unicode_decode(line, s))?;
                    self.stack.push(Value::Str { len, off });
                }
                op::POP => {
                    if self.stack.len() > self.base() {
                        self.stack.pop();
                    } else if self.marks.pop().is_none() {
                        return Err(malformed(at, "POP on an empty stack"));
                    }
                }
                op::POP_MARK => {
                    let mark = self.pop_mark(at, "POP_MARK")?;
                    self.stack.truncate(mark);
                }
                op::DUP => {
                    let v = self.top(at, "DUP")?;
                    // Two references now: never convert-and-free it.
                    self.mark_shared(v);
                    self.stack.push(v);
                }
                op::PROTO => {
                    let p = self.arg_u8(at, "PROTO")?;
                    if p > 5 {
                        return Err(malformed(at, format!("unsupported pickle protocol {p}")));
                    }
                }
                op::FRAME => {
                    // Framing only groups opcodes for buffered reads: nothing to do.
                    self.take(8, at, "FRAME")?;
                }
                op::STOP => {
                    let v = self.pop(at, "STOP")?;
                    return Ok((v, at));
                }
                _ => {
                    return Err(Box::new(match refusal(code) {
                        Some((name, reason)) => ImportError::RefusedOpcode {
                            offset: at as u64,
                            name,
                            reason,
                        },
                        None => ImportError::UnknownOpcode {
                            offset: at as u64,
                            byte: code,
                        },
                    }));
                }
            }
        }
    }

    // Half of all opcodes of a snapshot are GETs: keep this in the loop.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn get(&mut self, i: u32, at: usize) -> Res<()> {
        match self.memo.get(i) {
            Some(v) => {
                self.stack.push(v);
                Ok(())
            }
            None => Err(malformed(at, format!("memo index {i} was never stored"))),
        }
    }

    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn memoize(&mut self, at: usize) -> Res<()> {
        let v = self.top(at, "MEMOIZE")?;
        match self.memo.memoize(v) {
            Some(true) => self.mark_shared(v),
            Some(false) => {}
            None => return Err(malformed(at, "more than 4 billion memo entries")),
        }
        Ok(())
    }

    fn put(&mut self, i: u32, at: usize, what: &'static str) -> Res<()> {
        let v = self.top(at, what)?;
        if self.memo.put(i, v) {
            self.mark_shared(v);
        }
        Ok(())
    }

    // --- reading values back ---------------------------------------------------------

    fn type_name(&self, v: Value) -> &'static str {
        match v {
            Value::None => "None",
            Value::Bool(_) => "a bool",
            Value::Int(_) | Value::UInt(_) | Value::BigInt { .. } => "an integer",
            Value::Float(_) => "a float",
            Value::Str { .. } => "a string",
            Value::Bytes { .. } => "bytes",
            Value::Frame(_) => "a frame dict",
            Value::Stack(_) => "a list of frames",
            Value::Event(_) => "a trace entry",
            Value::Obj(id) => match self.heap.get(id as usize) {
                Some(c) => match (c.seal, c.kind) {
                    (Seal::Frame(_), _) => "a frame dict",
                    (Seal::Stack(_), _) => "a list of frames",
                    (Seal::Open, Kind::List) if c.events != 0 => "a list of trace entries",
                    (Seal::Open, Kind::List) => "a list",
                    (Seal::Open, Kind::Tuple) => "a tuple",
                    (Seal::Open, Kind::Dict) => "a dict",
                    (Seal::Open, Kind::Set) => "a set",
                    (Seal::Open, Kind::FrozenSet) => "a frozenset",
                },
                None => "an object",
            },
        }
    }

    /// A short readable rendering of a scalar for error messages.
    fn repr(&self, v: Value) -> String {
        match v {
            Value::Int(i) => i.to_string(),
            Value::UInt(u) => u.to_string(),
            Value::Str { len, off } => {
                let s = lossy(self.text().span(len, off)).into_owned();
                let short: String = s.chars().take(60).collect();
                format!("{short:?}")
            }
            other => self.type_name(other).to_owned(),
        }
    }

    fn render(&self, e: FieldError) -> String {
        let key = e.key;
        match e.problem {
            Problem::Missing => format!("missing `{key}`"),
            Problem::WrongType(expected) => {
                format!(
                    "`{key}` is {}, expected {expected}",
                    self.type_name(e.found)
                )
            }
            Problem::Negative(expected) => {
                format!(
                    "`{key}` is negative ({}), expected {expected}",
                    self.repr(e.found)
                )
            }
            Problem::TooWide => format!("`{key}` is an integer that does not fit in 64 bits"),
            Problem::BadValue(expected) => {
                format!("`{key}` is {}, expected {expected}", self.repr(e.found))
            }
        }
    }

    fn container(&self, v: Value) -> Option<&Container> {
        match v {
            Value::Obj(id) => self.heap.get(id as usize),
            _ => None,
        }
    }

    /// The pairs of an unconverted dict.
    fn dict(&self, v: Value) -> Option<(u32, u64)> {
        match v {
            Value::Obj(id) => {
                let c = self.heap.get(id as usize)?;
                (c.kind == Kind::Dict && c.seal == Seal::Open).then_some((id, c.offset))
            }
            _ => None,
        }
    }

    /// `dict[key]` (the last one written wins, as in Python).
    fn field(&self, dict: u32, key: &[u8]) -> Option<Value> {
        let c = self.heap.get(dict as usize)?;
        let text = self.text();
        c.items
            .chunks_exact(2)
            .rev()
            .find(|p| p.first().and_then(|&k| text.str_bytes(k)) == Some(key))
            .and_then(|p| p.get(1).copied())
    }

    fn offset_of(&self, v: Value, fallback: u64) -> u64 {
        self.container(v).map_or(fallback, |c| c.offset)
    }
}

// ---------------------------------------------------------------------------------------
// Schema pass: the consumed top-level value into a RawSnapshot

/// A sequence as the schema pass reads it.
enum Seq {
    Items(u32, usize),
    Stack(StackId),
    Events(usize),
}

impl Vm<'_> {
    fn seq(&self, v: Value) -> Option<Seq> {
        match v {
            Value::Stack(s) => Some(Seq::Stack(s)),
            Value::Obj(id) => {
                let c = self.heap.get(id as usize)?;
                match (c.seal, c.kind) {
                    (Seal::Stack(s), _) => Some(Seq::Stack(s)),
                    (Seal::Open, Kind::List) if c.events != 0 => {
                        Some(Seq::Events(c.events as usize - 1))
                    }
                    (Seal::Open, Kind::List | Kind::Tuple) => Some(Seq::Items(id, c.items.len())),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    fn item(&self, id: u32, i: usize) -> Value {
        self.heap
            .get(id as usize)
            .and_then(|c| c.items.get(i).copied())
            .unwrap_or(Value::None)
    }

    fn stack_slow(
        &mut self,
        v: Option<Value>,
        offset: u64,
        loc: &dyn Fn() -> String,
    ) -> Res<StackId> {
        let Some(v) = v else {
            return Ok(StackId::EMPTY);
        };
        let seq = match v {
            Value::None => return Ok(StackId::EMPTY),
            _ => self.seq(v),
        };
        let (id, n) = match seq {
            Some(Seq::Stack(s)) => return Ok(s),
            Some(Seq::Items(id, n)) => (id, n),
            _ => {
                return Err(schema_err(
                    self.offset_of(v, offset),
                    loc(),
                    format!(
                        "`frames` is {}, expected a list of frame dicts",
                        self.type_name(v)
                    ),
                ));
            }
        };
        let list_offset = self.offset_of(v, offset);
        let mut ids = Vec::with_capacity(n);
        for k in 0..n {
            let item = self.item(id, k);
            let f = match item {
                Value::Frame(f) => f,
                _ if let Some(Seal::Frame(f)) = self.container(item).map(|c| c.seal) => f,
                _ => {
                    let Some((dict, off)) = self.dict(item) else {
                        return Err(schema_err(
                            list_offset,
                            format!("{}.frames[{k}]", loc()),
                            format!("expected a frame dict, found {}", self.type_name(item)),
                        ));
                    };
                    let text = Text {
                        data: self.data,
                        scratch: &self.scratch,
                    };
                    let fields = Fields::collect(
                        &text,
                        self.heap.get(dict as usize).map_or(&[], |c| &c.items),
                    );
                    match fields.frame(&text, &mut self.frames) {
                        Ok(f) => f,
                        Err(e) => {
                            return Err(schema_err(
                                off,
                                format!("{}.frames[{k}]", loc()),
                                self.render(e),
                            ));
                        }
                    }
                }
            };
            ids.push(f);
        }
        Ok(self.frames.intern_stack(&ids))
    }

    fn event_slow(&mut self, v: Value, fallback: u64, loc: &dyn Fn() -> String) -> Res<RawEvent> {
        if let Value::Event(i) = v
            && let Some(ev) = self.extra_events.get(i as usize)
        {
            return Ok(*ev);
        }
        let Some((dict, off)) = self.dict(v) else {
            return Err(schema_err(
                self.offset_of(v, fallback),
                loc(),
                format!("expected a trace entry dict, found {}", self.type_name(v)),
            ));
        };
        let text = self.text();
        let frames = Fields::collect(
            &text,
            self.heap.get(dict as usize).map_or(&[], |c| &c.items),
        )
        .frames;
        let stack = self.stack_slow(frames, off, loc)?;
        let text = Text {
            data: self.data,
            scratch: &self.scratch,
        };
        let fields = Fields::collect(
            &text,
            self.heap.get(dict as usize).map_or(&[], |c| &c.items),
        );
        let mut ev = fields
            .event(&text, stack)
            .map_err(|e| schema_err(off, loc(), self.render(e)))?;
        fields.event_extras(
            &self.heap,
            &text,
            &mut self.frames,
            &mut self.pools,
            &mut ev,
        );
        Ok(ev)
    }

    fn traces(&mut self, v: Value, fallback: u64) -> Res<Vec<Vec<RawEvent>>> {
        let (id, n) = match self.seq(v) {
            Some(Seq::Items(id, n)) => (id, n),
            Some(Seq::Stack(StackId::EMPTY)) => return Ok(Vec::new()),
            _ => {
                return Err(schema_err(
                    self.offset_of(v, fallback),
                    "device_traces".into(),
                    format!(
                        "expected a list (one per device), found {}",
                        self.type_name(v)
                    ),
                ));
            }
        };
        let outer_offset = self.offset_of(v, fallback);
        let mut out = Vec::with_capacity(n);
        for d in 0..n {
            let inner = self.item(id, d);
            let loc_d = || format!("device_traces[{d}]");
            let events = match self.seq(inner) {
                Some(Seq::Events(k)) => {
                    let shared = self.container(inner).is_some_and(|c| c.shared);
                    match self.event_lists.get_mut(k) {
                        Some(list) if shared => list.clone(),
                        Some(list) => std::mem::take(list),
                        None => Vec::new(),
                    }
                }
                Some(Seq::Stack(StackId::EMPTY)) => Vec::new(),
                Some(Seq::Items(inner_id, m)) => {
                    let inner_off = self.offset_of(inner, outer_offset);
                    let mut events = Vec::with_capacity(m);
                    for i in 0..m {
                        let item = self.item(inner_id, i);
                        let loc = || format!("device_traces[{d}][{i}]");
                        events.push(self.event_slow(item, inner_off, &loc)?);
                    }
                    events
                }
                _ => {
                    return Err(schema_err(
                        self.offset_of(inner, outer_offset),
                        loc_d(),
                        format!(
                            "expected a list of trace entries, found {}",
                            self.type_name(inner)
                        ),
                    ));
                }
            };
            let mut events = events;
            events.shrink_to_fit();
            out.push(events);
        }
        Ok(out)
    }

    fn segment(&mut self, v: Value, fallback: u64, index: usize) -> Res<RawSegment> {
        let loc = || format!("segments[{index}]");
        let Some((dict, off)) = self.dict(v) else {
            return Err(schema_err(
                self.offset_of(v, fallback),
                loc(),
                format!("expected a segment dict, found {}", self.type_name(v)),
            ));
        };
        let err = |vm: &Self, e: FieldError| schema_err(off, loc(), vm.render(e));
        let req = |vm: &Self, key: &'static str| vm.field(dict, key.as_bytes()).ok_or(missing(key));
        let opt_u64 = |vm: &Self, key: &'static str| {
            vm.field(dict, key.as_bytes())
                .map(|v| as_u64(v, key))
                .transpose()
        };
        let r = (|| {
            let device = as_u64(req(self, "device")?, "device")?;
            let device = u32::try_from(device).map_err(|_| {
                fe(
                    "device",
                    Problem::BadValue("a device ordinal"),
                    Value::UInt(device),
                )
            })?;
            let address = as_u64(req(self, "address")?, "address")?;
            let total_size = as_u64(req(self, "total_size")?, "total_size")?;
            let type_value = req(self, "segment_type")?;
            let segment_type = match as_str(&self.text(), type_value, "segment_type")? {
                b"large" => SegmentType::Large,
                b"small" => SegmentType::Small,
                _ => {
                    return Err(fe(
                        "segment_type",
                        Problem::BadValue("\"large\" or \"small\""),
                        type_value,
                    ));
                }
            };
            let stream = opt_u64(self, "stream")?.unwrap_or(0);
            let is_expandable = self
                .field(dict, b"is_expandable")
                .map(|v| as_bool(v, "is_expandable"))
                .transpose()?
                .unwrap_or(false);
            let sizes = [
                opt_u64(self, "allocated_size")?,
                opt_u64(self, "active_size")?,
                opt_u64(self, "requested_size")?,
            ];
            Ok((
                device,
                address,
                total_size,
                segment_type,
                stream,
                is_expandable,
                sizes,
            ))
        })();
        let (device, address, total_size, segment_type, stream, is_expandable, sizes) =
            r.map_err(|e| err(self, e))?;
        let pool = self.field(dict, b"segment_pool_id");
        let segment_pool_id = match pool {
            None | Some(Value::None) => (0, 0),
            Some(p) => self.pool_id(p).map_err(|e| err(self, e))?,
        };
        let frames = self.field(dict, b"frames");
        let stack = self.stack_slow(frames, off, &loc)?;
        let blocks_value = self
            .field(dict, b"blocks")
            .ok_or_else(|| err(self, missing("blocks")))?;
        let blocks = self.blocks(blocks_value, off, index, address)?;
        // Older files lack the byte sums: rebuild them from the blocks.
        // Saturating: hostile sizes must not overflow.
        let sum = |f: fn(&RawBlock) -> Option<u64>| {
            blocks.iter().filter_map(f).fold(0u64, u64::saturating_add)
        };
        let allocated_size = sizes[0]
            .unwrap_or_else(|| sum(|b| (b.state == BlockState::ActiveAllocated).then_some(b.size)));
        let active_size = sizes[1]
            .unwrap_or_else(|| sum(|b| (b.state != BlockState::Inactive).then_some(b.size)));
        let requested_size = sizes[2].unwrap_or_else(|| {
            sum(|b| (b.state != BlockState::Inactive).then_some(b.requested_size))
        });
        Ok(RawSegment {
            device,
            address,
            total_size,
            allocated_size,
            active_size,
            requested_size,
            stream,
            segment_type,
            segment_pool_id,
            is_expandable,
            stack,
            blocks,
        })
    }

    fn pool_id(&self, v: Value) -> Result<(u64, u64), FieldError> {
        let bad = fe(
            "segment_pool_id",
            Problem::WrongType("a pair of integers"),
            v,
        );
        match self.seq(v) {
            Some(Seq::Items(id, 2)) => Ok((
                as_u64(self.item(id, 0), "segment_pool_id")?,
                as_u64(self.item(id, 1), "segment_pool_id")?,
            )),
            _ => Err(bad),
        }
    }

    fn blocks(
        &mut self,
        v: Value,
        seg_offset: u64,
        seg: usize,
        seg_address: u64,
    ) -> Res<Vec<RawBlock>> {
        let (id, n) = match self.seq(v) {
            Some(Seq::Items(id, n)) => (id, n),
            Some(Seq::Stack(StackId::EMPTY)) => (0, 0),
            _ => {
                return Err(schema_err(
                    self.offset_of(v, seg_offset),
                    format!("segments[{seg}]"),
                    format!(
                        "`blocks` is {}, expected a list of block dicts",
                        self.type_name(v)
                    ),
                ));
            }
        };
        let list_offset = self.offset_of(v, seg_offset);
        let mut blocks = Vec::with_capacity(n);
        let mut next_address = Some(seg_address);
        for i in 0..n {
            let item = self.item(id, i);
            let loc = || format!("segments[{seg}].blocks[{i}]");
            let Some((dict, off)) = self.dict(item) else {
                return Err(schema_err(
                    list_offset,
                    loc(),
                    format!("expected a block dict, found {}", self.type_name(item)),
                ));
            };
            let r = (|| {
                let size = as_u64(self.field(dict, b"size").ok_or(missing("size"))?, "size")?;
                let state_value = self.field(dict, b"state").ok_or(missing("state"))?;
                let state = match as_str(&self.text(), state_value, "state")? {
                    b"active_allocated" => BlockState::ActiveAllocated,
                    // The name PyTorch's docstring uses for the same state.
                    b"active_pending_free" | b"active_awaiting_free" => {
                        BlockState::ActivePendingFree
                    }
                    b"inactive" => BlockState::Inactive,
                    _ => {
                        return Err(fe(
                            "state",
                            Problem::BadValue("active_allocated, active_pending_free or inactive"),
                            state_value,
                        ));
                    }
                };
                let address = match self.field(dict, b"address") {
                    Some(a) => as_u64(a, "address")?,
                    None => next_address.ok_or(fe("address", Problem::TooWide, Value::None))?,
                };
                let requested_size = match self.field(dict, b"requested_size") {
                    Some(r) => as_u64(r, "requested_size")?,
                    // Older files: an active block was requested whole, a free one never.
                    None if state == BlockState::Inactive => 0,
                    None => size,
                };
                Ok((size, state, address, requested_size))
            })();
            let (size, state, address, requested_size) =
                r.map_err(|e| schema_err(off, loc(), self.render(e)))?;
            next_address = address.checked_add(size);
            let frames = self.field(dict, b"frames");
            let stack = self.stack_slow(frames, off, &loc)?;
            blocks.push(RawBlock {
                address,
                size,
                requested_size,
                state,
                stack,
            });
        }
        Ok(blocks)
    }

    fn settings(&self, v: Value, fallback: u64) -> Res<RawSettings> {
        let loc = || "allocator_settings".to_owned();
        let Some((dict, off)) = self.dict(v) else {
            return Err(schema_err(
                self.offset_of(v, fallback),
                loc(),
                format!("expected a dict, found {}", self.type_name(v)),
            ));
        };
        let r = (|| {
            let mut s = RawSettings {
                present: true,
                ..RawSettings::default()
            };
            match self.field(dict, b"PYTORCH_CUDA_ALLOC_CONF") {
                None | Some(Value::None) => {}
                Some(c) => {
                    s.conf =
                        lossy(as_str(&self.text(), c, "PYTORCH_CUDA_ALLOC_CONF")?).into_owned();
                }
            }
            if let Some(m) = self.field(dict, b"max_split_size") {
                s.max_split_size_bytes = match m {
                    // PyTorch's "unlimited" (SIZE_MAX) appears as −1, or as SIZE_MAX itself.
                    Value::Int(-1) | Value::UInt(u64::MAX) => None,
                    Value::Int(i) if i < 0 => {
                        return Err(fe("max_split_size", Problem::Negative("-1 or a size"), m));
                    }
                    _ => Some(as_u64(m, "max_split_size")?),
                };
            }
            if let Some(g) = self.field(dict, b"garbage_collection_threshold") {
                s.garbage_collection_threshold = as_f64(g, "garbage_collection_threshold")?;
            }
            if let Some(e) = self.field(dict, b"expandable_segments") {
                s.expandable_segments = as_bool(e, "expandable_segments")?;
            }
            if let Some(r) = self.field(dict, b"roundup_power2_divisions") {
                s.roundup_power2_divisions = Some(self.roundup(r)?);
            }
            // Only displayed: a value of another shape is left out, never refused.
            if let Some(v) = self.field(dict, b"trace_alloc_overflowed") {
                s.trace_alloc_overflowed = self.per_device(v, |x| as_bool(x, "").ok());
            }
            if let Some(v) = self.field(dict, b"trace_alloc_max_entries") {
                s.trace_alloc_max_entries = self.per_device(v, |x| as_u64(x, "").ok());
            }
            let text = self.text();
            let items = self.heap.get(dict as usize).map_or(&[][..], |c| &c.items);
            for pair in items.chunks_exact(2) {
                let name = text
                    .str_bytes(pair[0])
                    .map_or_else(|| self.repr(pair[0]), |b| lossy(b).into_owned());
                if !KNOWN_SETTINGS.contains(&name.as_str()) && !s.other_keys.contains(&name) {
                    s.other_keys.push(name);
                }
            }
            Ok(s)
        })();
        r.map_err(|e| schema_err(off, loc(), self.render(e)))
    }

    /// A per-device setting: a list of values, or one value for all devices.
    fn per_device<T>(&self, v: Value, read: impl Fn(Value) -> Option<T>) -> Vec<T> {
        match self.seq(v) {
            Some(Seq::Items(id, n)) => (0..n).filter_map(|i| read(self.item(id, i))).collect(),
            _ => read(v).into_iter().collect(),
        }
    }

    /// `host_segments`: what can be read of each segment; the number skipped.
    fn host_segments(&self, v: Value) -> (Vec<HostSegment>, u64) {
        let Some(Seq::Items(id, n)) = self.seq(v) else {
            return (Vec::new(), u64::from(!matches!(v, Value::None)));
        };
        let mut out = Vec::with_capacity(n);
        let mut skipped = 0;
        for i in 0..n {
            let seg = self.dict(self.item(id, i)).and_then(|(d, _)| {
                let num = |k: &[u8], key| self.field(d, k).and_then(|x| as_u64(x, key).ok());
                Some(HostSegment {
                    address: num(b"address", "address")?,
                    total_size: num(b"total_size", "total_size")
                        .or_else(|| num(b"size", "size"))?,
                    allocated_size: num(b"allocated_size", "allocated_size").unwrap_or(0),
                })
            });
            match seg {
                Some(h) => out.push(h),
                None => skipped += 1,
            }
        }
        (out, skipped)
    }

    /// `host_traces`: one list of entries or one list per device, concatenated; entries
    /// that do not read as trace entries are skipped and counted.
    fn host_traces(&mut self, v: Value) -> (Vec<RawEvent>, u64) {
        let mut out = Vec::new();
        let mut skipped = 0;
        let mut lists = vec![v];
        let mut depth = 0;
        while !lists.is_empty() && depth < 2 {
            let mut nested = Vec::new();
            for l in std::mem::take(&mut lists) {
                match self.seq(l) {
                    Some(Seq::Events(k)) => {
                        let shared = self.container(l).is_some_and(|c| c.shared);
                        match self.event_lists.get_mut(k) {
                            Some(list) if shared => out.extend_from_slice(list),
                            Some(list) => out.append(list),
                            None => {}
                        }
                    }
                    Some(Seq::Items(id, n)) => {
                        for i in 0..n {
                            let item = self.item(id, i);
                            if matches!(self.seq(item), Some(Seq::Items(..) | Seq::Events(_))) {
                                nested.push(item);
                            } else if let Ok(ev) = self.event_slow(item, 0, &String::new) {
                                out.push(ev);
                            } else {
                                skipped += 1;
                            }
                        }
                    }
                    Some(Seq::Stack(StackId::EMPTY)) => {}
                    _ => skipped += 1,
                }
            }
            lists = nested;
            depth += 1;
        }
        skipped += lists.len() as u64;
        (out, skipped)
    }

    /// `roundup_power2_divisions`: a dict `"1"…"32768"` (MiB) → divisions, index = log2
    /// of the key; older writers may use a plain list of 16.
    fn roundup(&self, v: Value) -> Result<[u32; 16], FieldError> {
        const KEY: &str = "roundup_power2_divisions";
        let mut table = [0u32; 16];
        let value = |x: Value| {
            let n = as_u64(x, KEY)?;
            u32::try_from(n).map_err(|_| fe(KEY, Problem::BadValue("a division count"), x))
        };
        if let Some((dict, _)) = self.dict(v) {
            let text = self.text();
            let items = self.heap.get(dict as usize).map_or(&[][..], |c| &c.items);
            for pair in items.chunks_exact(2) {
                let [k, x] = *pair else { continue };
                // Unknown keys are ignored, like every other unknown key.
                let Some(mib) = text
                    .str_bytes(k)
                    .and_then(|b| std::str::from_utf8(b).ok())
                    .and_then(|s| s.parse::<u32>().ok())
                    .filter(|m| m.is_power_of_two() && *m <= 32768)
                else {
                    continue;
                };
                if let Some(slot) = table.get_mut(mib.trailing_zeros() as usize) {
                    *slot = value(x)?;
                }
            }
            return Ok(table);
        }
        match self.seq(v) {
            Some(Seq::Items(id, n)) => {
                for (i, slot) in table.iter_mut().enumerate().take(n) {
                    *slot = value(self.item(id, i))?;
                }
                Ok(table)
            }
            _ => Err(fe(KEY, Problem::WrongType("a dict of divisions"), v)),
        }
    }

    fn snapshot(mut self, root: Value, stop_at: usize) -> Res<RawSnapshot> {
        let stop = stop_at as u64;
        let root_offset = self.offset_of(root, stop);
        let mut host = (None, None);
        let (segments_value, traces_value, settings_value) =
            if let Some((dict, off)) = self.dict(root) {
                let segments = self.field(dict, b"segments").ok_or_else(|| {
                    schema_err(off, "snapshot".into(), "missing `segments`".into())
                })?;
                host = (
                    self.field(dict, b"host_segments"),
                    self.field(dict, b"host_traces"),
                );
                (
                    segments,
                    self.field(dict, b"device_traces"),
                    self.field(dict, b"allocator_settings"),
                )
            } else if matches!(self.seq(root), Some(Seq::Items(..))) {
                // The pre-2.1 `torch.cuda.memory_snapshot()` form: just the segment list.
                (root, None, None)
            } else {
                return Err(schema_err(
                    root_offset,
                    "snapshot".into(),
                    format!(
                        "the pickle holds {}, expected a dict with `segments`",
                        self.type_name(root)
                    ),
                ));
            };
        let (seg_id, n) = match self.seq(segments_value) {
            Some(Seq::Items(id, n)) => (id, n),
            Some(Seq::Stack(StackId::EMPTY)) => (0, 0),
            _ => {
                return Err(schema_err(
                    self.offset_of(segments_value, root_offset),
                    "segments".into(),
                    format!(
                        "expected a list of segment dicts, found {}",
                        self.type_name(segments_value)
                    ),
                ));
            }
        };
        let seg_offset = self.offset_of(segments_value, root_offset);
        let mut segments = Vec::with_capacity(n);
        for i in 0..n {
            let item = self.item(seg_id, i);
            segments.push(self.segment(item, seg_offset, i)?);
        }
        let device_traces = match traces_value {
            None | Some(Value::None) => Vec::new(),
            Some(t) => self.traces(t, root_offset)?,
        };
        let settings = match settings_value {
            None | Some(Value::None) => RawSettings::default(),
            Some(s) => self.settings(s, root_offset)?,
        };
        let (host_segments, seg_skipped) =
            host.0.map_or((Vec::new(), 0), |v| self.host_segments(v));
        let (host_traces, trace_skipped) = host.1.map_or((Vec::new(), 0), |v| self.host_traces(v));
        let mut frames = std::mem::take(&mut self.frames);
        frames.finish();
        Ok(RawSnapshot {
            segments,
            device_traces,
            settings,
            frames,
            event_pools: std::mem::take(&mut self.pools.pools),
            host_segments,
            host_traces,
            host_items_skipped: seg_skipped + trace_skipped,
        })
    }
}

/// `allocator_settings` keys PyTorch 2.5–2.13 writes (the others are listed in
/// [`RawSettings::other_keys`]).
pub(crate) const KNOWN_SETTINGS: &[&str] = &[
    "PYTORCH_CUDA_ALLOC_CONF",
    "max_split_size",
    "garbage_collection_threshold",
    "expandable_segments",
    "pinned_num_register_threads",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "roundup_power2_divisions",
    "graph_capture_record_stream_reuse",
    "trace_alloc_overflowed",
    "trace_alloc_max_entries",
];

/// Decodes a snapshot pickle (uncompressed).
pub(crate) fn decode_snapshot_pickle(data: &[u8]) -> Result<RawSnapshot, ImportError> {
    let mut vm = Vm::new(data, true);
    let (root, stop_at) = vm.run().map_err(|e| *e)?;
    vm.snapshot(root, stop_at).map_err(|e| *e)
}

// ---------------------------------------------------------------------------------------
// Generic values (tests, tools)

/// A Python value as a pickle states it. For tests and tools; snapshots go through
/// [`super::decode_snapshot`], which never builds such a tree.
///
/// Dicts and sets keep their items in the order written (duplicates included).
#[derive(Debug, Clone, PartialEq)]
pub enum PyValue {
    None,
    Bool(bool),
    /// Integers that fit 128 bits.
    Int(i128),
    /// Wider integers: minimal little-endian two's complement bytes.
    BigInt(Vec<u8>),
    Float(f64),
    /// Text (invalid UTF-8 replaced by U+FFFD).
    Str(String),
    /// `bytes` and `bytearray`.
    Bytes(Vec<u8>),
    List(Vec<PyValue>),
    Tuple(Vec<PyValue>),
    Dict(Vec<(PyValue, PyValue)>),
    Set(Vec<PyValue>),
    FrozenSet(Vec<PyValue>),
}

/// Nesting deeper than this is refused by [`decode_value`]: the tree it returns is
/// dropped recursively.
pub const MAX_VALUE_DEPTH: usize = 1000;

/// Decodes any pickle of plain Python values (protocols 0–5, same refusals as
/// snapshots) into a [`PyValue`] tree. Memo-shared objects are copied; the tree is
/// limited to [`MAX_VALUE_DEPTH`] levels and to 8 nodes per input byte (plus a million),
/// so a small pickle cannot expand into a huge tree.
pub fn decode_value(data: &[u8]) -> Result<PyValue, ImportError> {
    let mut vm = Vm::new(data, false);
    let (root, stop_at) = vm.run().map_err(|e| *e)?;
    let budget = data.len().saturating_mul(8).saturating_add(1_000_000);
    vm.to_py(root, stop_at, budget).map_err(|e| *e)
}

/// One container being expanded by [`Vm::to_py`].
struct Open {
    id: u32,
    kind: Kind,
    next: usize,
    out: Vec<PyValue>,
}

impl Vm<'_> {
    fn scalar_py(&self, v: Value) -> PyValue {
        let text = self.text();
        match v {
            Value::None | Value::Obj(_) => PyValue::None,
            Value::Bool(b) => PyValue::Bool(b),
            Value::Int(i) => PyValue::Int(i128::from(i)),
            Value::UInt(u) => PyValue::Int(i128::from(u)),
            Value::BigInt { len, off } => {
                let b = text.span(len, off);
                le_to_i128(b).map_or_else(|| PyValue::BigInt(b.to_vec()), PyValue::Int)
            }
            Value::Float(f) => PyValue::Float(f),
            Value::Str { len, off } => PyValue::Str(lossy(text.span(len, off)).into_owned()),
            Value::Bytes { len, off } => PyValue::Bytes(text.span(len, off).to_vec()),
            Value::Frame(f) => self.frame_py(f),
            Value::Stack(s) => PyValue::List(
                self.frames
                    .stack(s)
                    .iter()
                    .map(|&f| self.frame_py(f))
                    .collect(),
            ),
            Value::Event(i) => self
                .extra_events
                .get(i as usize)
                .map_or(PyValue::None, event_py),
        }
    }

    fn frame_py(&self, f: FrameId) -> PyValue {
        let Some(fr) = self.frames.frame(f) else {
            return PyValue::None;
        };
        PyValue::Dict(vec![
            (
                PyValue::Str("name".into()),
                PyValue::Str(self.frames.str(fr.name).into()),
            ),
            (
                PyValue::Str("filename".into()),
                PyValue::Str(self.frames.str(fr.filename).into()),
            ),
            (
                PyValue::Str("line".into()),
                match fr.line_text {
                    Some(t) => {
                        let t = self.frames.str(t);
                        t.parse()
                            .map_or_else(|_| PyValue::Str(t.into()), PyValue::Int)
                    }
                    None if fr.line == Frame::LINE_UNKNOWN => PyValue::None,
                    None => PyValue::Int(i128::from(fr.line)),
                },
            ),
        ])
    }

    fn to_py(&self, root: Value, stop_at: usize, budget: usize) -> Res<PyValue> {
        let too_deep = || {
            malformed(
                stop_at,
                format!("value nested deeper than {MAX_VALUE_DEPTH} levels"),
            )
        };
        let mut nodes = 0usize;
        let mut open: Vec<Open> = Vec::new();
        let mut pending = Some(root);
        loop {
            if let Some(v) = pending.take() {
                nodes += 1;
                if nodes > budget {
                    return Err(malformed(
                        stop_at,
                        format!("value expands to more than {budget} nodes (memo sharing)"),
                    ));
                }
                let container = match v {
                    Value::Obj(id) => self.heap.get(id as usize).map(|c| (id, c)),
                    _ => None,
                };
                let done = match container {
                    Some((id, c)) if c.seal == Seal::Open && c.events == 0 => {
                        if open.len() >= MAX_VALUE_DEPTH {
                            return Err(too_deep());
                        }
                        open.push(Open {
                            id,
                            kind: c.kind,
                            next: 0,
                            out: Vec::with_capacity(c.items.len().min(1 << 16)),
                        });
                        None
                    }
                    Some((_, c)) => Some(match c.seal {
                        Seal::Frame(f) => self.frame_py(f),
                        Seal::Stack(s) => self.scalar_py(Value::Stack(s)),
                        Seal::Open => PyValue::List(
                            self.event_lists
                                .get(c.events as usize - 1)
                                .map(|l| l.iter().map(event_py).collect())
                                .unwrap_or_default(),
                        ),
                    }),
                    None => Some(self.scalar_py(v)),
                };
                if let Some(p) = done {
                    match open.last_mut() {
                        Some(parent) => parent.out.push(p),
                        None => return Ok(p),
                    }
                }
                continue;
            }
            let Some(top) = open.last_mut() else {
                return Err(malformed(stop_at, "empty value (internal)"));
            };
            let items = self.heap.get(top.id as usize).map_or(&[][..], |c| &c.items);
            if let Some(&v) = items.get(top.next) {
                top.next += 1;
                pending = Some(v);
                continue;
            }
            let Some(done) = open.pop() else { continue };
            let value = match done.kind {
                Kind::List => PyValue::List(done.out),
                Kind::Tuple => PyValue::Tuple(done.out),
                Kind::Set => PyValue::Set(done.out),
                Kind::FrozenSet => PyValue::FrozenSet(done.out),
                Kind::Dict => {
                    let mut pairs = Vec::with_capacity(done.out.len() / 2);
                    let mut it = done.out.into_iter();
                    while let (Some(k), Some(v)) = (it.next(), it.next()) {
                        pairs.push((k, v));
                    }
                    PyValue::Dict(pairs)
                }
            };
            match open.last_mut() {
                Some(parent) => parent.out.push(value),
                None => return Ok(value),
            }
        }
    }
}

fn event_py(e: &RawEvent) -> PyValue {
    let s = |x: &str| PyValue::Str(x.into());
    PyValue::Dict(vec![
        (s("action"), s(e.action.as_str())),
        (s("addr"), PyValue::Int(i128::from(e.addr))),
        (s("size"), PyValue::Int(i128::from(e.size))),
        (s("stream"), PyValue::Int(i128::from(e.stream))),
        (s("time_us"), PyValue::Int(i128::from(e.time_us))),
    ])
}
