//! A dict's values as the schema reads them: the keys of a trace entry or frame collected
//! in one pass (the fast path runs it for every entry), and the machine's values as
//! [`Scalar`]s.

use super::value::{Container, Kind, Seal, Text, Value};
use crate::snapshot::schema::{EventFields, FrameFields, Key, Pair, Scalar};

/// The keys of a dict that is a trace entry or a frame, read in one pass (last one wins,
/// as in a Python dict).
#[derive(Default)]
pub(super) struct Fields {
    pub(super) event: EventFields<Value>,
    pub(super) frame: FrameFields<Value>,
    /// The entry's `frames` (a container the machine resolves).
    pub(super) frames: Option<Value>,
    /// The entry's `pool_id` (a tuple).
    pub(super) pool_id: Option<Value>,
}

impl Fields {
    /// The fields of `pairs` (a dict's keys and values alternating).
    pub(super) fn collect(text: &Text<'_>, pairs: &[Value]) -> Fields {
        let mut f = Fields::default();
        f.read(text, pairs);
        f
    }

    /// Reads the fields of `pairs` into `self`. Inlined into its callers and filling the
    /// caller's fields in place: returned by value, they were copied out once per entry.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub(super) fn read(&mut self, text: &Text<'_>, pairs: &[Value]) {
        let f = self;
        for pair in pairs.chunks_exact(2) {
            let [k, v] = *pair else { continue };
            let Value::Str { len, off } = k else { continue };
            // Keys compared as one little-endian word instead of a `memcmp` per candidate.
            let key = match text.word(len, off) {
                Some(w) => Key::from_word(len as usize, w),
                None => Key::from_bytes(text.span(len, off)),
            };
            match key {
                Key::Frames => f.frames = Some(v),
                Key::PoolId => f.pool_id = Some(v),
                _ => {
                    if !f.event.set(key, v) {
                        f.frame.set(key, v);
                    }
                }
            }
        }
    }
}

/// `v` as the schema reads it; containers by their type name.
#[inline]
pub(super) fn scalar<'s>(text: &Text<'s>, heap: &[Container], v: Value) -> Scalar<'s> {
    match v {
        Value::None => Scalar::None,
        Value::Bool(b) => Scalar::Bool(b),
        Value::Int(i) => Scalar::Int(i),
        Value::UInt(u) => Scalar::UInt(u),
        Value::BigInt { len, off } => Scalar::BigInt(text.span(len, off)),
        Value::Float(f) => Scalar::Float(f),
        Value::Str { len, off } => Scalar::Str(text.span(len, off)),
        _ => Scalar::Other(type_name(heap, v)),
    }
}

/// How messages name the type of `v`.
pub(super) fn type_name(heap: &[Container], v: Value) -> &'static str {
    match v {
        Value::Bytes { .. } => "bytes",
        Value::Frame(_) => "a frame dict",
        Value::Stack(_) => "a list of frames",
        Value::Event(_) => "a trace entry",
        Value::Obj(id) => match heap.get(id as usize) {
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
        scalar_value => scalar(&Text::EMPTY, heap, scalar_value).type_name(),
    }
}

/// A trace entry's `pool_id` value as a pair, if it is a tuple or list of two.
pub(super) fn pair<'s>(text: &Text<'s>, heap: &[Container], v: Option<Value>) -> Pair<'s> {
    match v {
        None | Some(Value::None) => Pair::Absent,
        Some(Value::Obj(id))
            if let Some(c) = heap.get(id as usize)
                && matches!(c.kind, Kind::Tuple | Kind::List)
                && let [a, b] = c.items[..] =>
        {
            Pair::Two(scalar(text, heap, a), scalar(text, heap, b))
        }
        Some(v) => Pair::Not(scalar(text, heap, v)),
    }
}
