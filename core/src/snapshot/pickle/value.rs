//! The machine's values: 16-byte `Copy` values, containers, and the bytes behind spans.

use crate::snapshot::{FrameId, StackId};

/// Set in a span's offset when the bytes live in the scratch buffer (decoded escapes)
/// rather than in the input.
pub(super) const SCRATCH: u64 = 1 << 63;

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
pub(super) enum Value {
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
pub(super) enum Kind {
    List,
    Tuple,
    Dict,
    Set,
    FrozenSet,
}

/// What a container was converted into, once it was consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seal {
    Open,
    Frame(FrameId),
    Stack(StackId),
}

#[derive(Debug)]
pub(super) struct Container {
    /// Items; for dicts, keys and values alternating (insertion order, duplicates kept:
    /// readers take the last).
    pub(super) items: Vec<Value>,
    /// Where the opcode that created it starts (for error messages).
    pub(super) offset: u64,
    /// 1 + index into [`Vm::event_lists`] of trace entries appended to this list while
    /// `items` was empty; 0 for none.
    pub(super) events: u32,
    pub(super) kind: Kind,
    /// Reachable twice (memo slot read back by a `GET`, or `DUP`): never freed.
    pub(super) shared: bool,
    pub(super) seal: Seal,
}

/// Bytes behind spans: the input and the scratch buffer.
#[derive(Clone, Copy)]
pub(super) struct Text<'s> {
    pub(super) data: &'s [u8],
    pub(super) scratch: &'s [u8],
}

impl Text<'static> {
    /// No bytes (for values that hold no span).
    pub(super) const EMPTY: Text<'static> = Text {
        data: &[],
        scratch: &[],
    };
}

impl<'s> Text<'s> {
    pub(super) fn span(&self, len: u32, off: u64) -> &'s [u8] {
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
    pub(super) fn word(&self, len: u32, off: u64) -> Option<u64> {
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

    pub(super) fn str_bytes(&self, v: Value) -> Option<&'s [u8]> {
        match v {
            Value::Str { len, off } => Some(self.span(len, off)),
            _ => None,
        }
    }
}
