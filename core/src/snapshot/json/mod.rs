//! JSON snapshots (what `memory_viz` accepts besides pickles): the same structure as the
//! pickle, tuples written as lists.
//!
//! The file is streamed through serde seeds straight into the snapshot's schema
//! ([`super::schema`], the one mapping both decoders feed), never into a
//! `serde_json::Value` tree, for the same memory reasons as the pickle decoder. The seeds
//! only walk the containers: each dict's values are kept as [`Scalar`]s (strings borrowed
//! from the input unless they hold escapes) and handed to the schema when the dict ends, so
//! messages match the pickle decoder's, with the position `serde_json` reports turned into
//! a byte offset.

// Every seed's `found` has the one shape that `found_scalars!` calls, whether it uses the
// seed or can fail.
#![allow(clippy::unused_self, clippy::unnecessary_wraps)]

use crate::snapshot::json::host::HostSegmentsSeed;
use crate::snapshot::json::host::HostTracesSeed;
use std::fmt::{self, Display};

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::error::ImportError;
use super::schema::{
    self, BlockFields, Builder, Divisions, EventFields, FrameFields, Key, Loc, Pair, Parts,
    PerDevice, Scalar, SegmentFields, SettingsFields, Shape,
};
use super::{FrameId, RawEvent, RawSegment, RawSettings, RawSnapshot, StackId};

/// Decodes a snapshot saved as JSON.
pub(crate) fn decode_snapshot_json(data: &[u8]) -> Result<RawSnapshot, ImportError> {
    let mut de = serde_json::Deserializer::from_slice(data);
    let mut builder = Builder::default();
    let parts = TopSeed { b: &mut builder }
        .deserialize(&mut de)
        .map_err(|e| json_error(data, &e))?;
    de.end().map_err(|e| json_error(data, &e))?;
    Ok(builder.finish(parts))
}

/// `serde_json` reports line and column (1-based, counted in bytes); the byte offset is
/// computed from them so that JSON errors read like pickle errors.
fn json_error(data: &[u8], e: &serde_json::Error) -> ImportError {
    let (line, column) = (e.line(), e.column());
    let line_start = if line <= 1 {
        0
    } else {
        data.iter()
            .enumerate()
            .filter(|&(_, &b)| b == b'\n')
            .nth(line - 2)
            .map_or(data.len(), |(i, _)| i + 1)
    };
    let offset = (line_start + column.saturating_sub(1)).min(data.len());
    let full = e.to_string();
    let suffix = format!(" at line {line} column {column}");
    let message = full.strip_suffix(&suffix).unwrap_or(&full).to_owned();
    ImportError::Json {
        offset: offset as u64,
        line,
        column,
        message,
    }
}

fn err<E: de::Error>(loc: impl Display, problem: impl Display) -> E {
    E::custom(format_args!("{loc}: {problem}"))
}

fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// A JSON integer as the schema reads it.
fn int(v: u64) -> Scalar<'static> {
    i64::try_from(v).map_or(Scalar::UInt(v), Scalar::Int)
}

// ---------------------------------------------------------------------------------------
// Values and keys

/// A JSON value as the schema reads it: a scalar, strings with escapes owned.
#[derive(Debug, Clone)]
enum Json<'de> {
    Scalar(Scalar<'de>),
    Text(String),
}

impl Json<'_> {
    fn get(&self) -> Scalar<'_> {
        match self {
            Json::Scalar(s) => *s,
            Json::Text(t) => Scalar::Str(t.as_bytes()),
        }
    }
}

/// A scalar that may borrow a visitor's transient text, kept.
fn owned<'de>(s: Scalar<'_>) -> Json<'de> {
    Json::Scalar(match s {
        Scalar::Str(b) | Scalar::BigInt(b) => {
            return Json::Text(String::from_utf8_lossy(b).into_owned());
        }
        Scalar::None => Scalar::None,
        Scalar::Bool(v) => Scalar::Bool(v),
        Scalar::Int(v) => Scalar::Int(v),
        Scalar::UInt(v) => Scalar::UInt(v),
        Scalar::Float(v) => Scalar::Float(v),
        Scalar::JsonFloat(v) => Scalar::JsonFloat(v),
        Scalar::Other(what) => Scalar::Other(what),
    })
}

/// Any value as a [`Json`]; containers are skipped and named.
struct ScalarSeed;

impl<'de> DeserializeSeed<'de> for ScalarSeed {
    type Value = Json<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Json<'de>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ScalarSeed {
    type Value = Json<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Json<'de>, E> {
        Ok(Json::Scalar(Scalar::Bool(v)))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Json<'de>, E> {
        Ok(Json::Scalar(Scalar::Int(v)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Json<'de>, E> {
        Ok(Json::Scalar(int(v)))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Json<'de>, E> {
        Ok(Json::Scalar(Scalar::JsonFloat(v)))
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Json<'de>, E> {
        Ok(Json::Scalar(Scalar::Str(v.as_bytes())))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Json<'de>, E> {
        Ok(Json::Text(v.to_owned()))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Json<'de>, E> {
        Ok(Json::Scalar(Scalar::None))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Json<'de>, A::Error> {
        drain_seq(seq)?;
        Ok(Json::Scalar(Scalar::Other("a list")))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Json<'de>, A::Error> {
        drain_map(map)?;
        Ok(Json::Scalar(Scalar::Other("a dict")))
    }
}

/// A dict key as the schema names it, matched without allocating.
struct JKey(Key);

impl<'de> de::Deserialize<'de> for JKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<JKey, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = JKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<JKey, E> {
                Ok(JKey(Key::from_bytes(s.as_bytes())))
            }
        }
        d.deserialize_str(V)
    }
}

/// A key with its text (`allocator_settings` lists the keys it does not know).
struct NamedKey(Key, String);

impl<'de> de::Deserialize<'de> for NamedKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<NamedKey, D::Error> {
        let name = String::deserialize(d)?;
        Ok(NamedKey(Key::from_bytes(name.as_bytes()), name))
    }
}

/// The value under `key` into `fields` if it reads that key, else skipped.
macro_rules! read_field {
    ($map:expr, $fields:expr, $key:expr) => {
        if $fields.reads($key) {
            $fields.set($key, $map.next_value_seed(ScalarSeed)?);
        } else {
            $map.next_value::<IgnoredAny>()?;
        }
    };
}

/// `DeserializeSeed` for a visitor seed, through `deserialize_any`.
macro_rules! seed {
    ($seed:ident<'_>, $out:ty) => {
        impl<'de> DeserializeSeed<'de> for $seed<'_> {
            type Value = $out;
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<$out, D::Error> {
                d.deserialize_any(self)
            }
        }
    };
    ($seed:ident, $out:ty) => {
        impl<'de> DeserializeSeed<'de> for $seed {
            type Value = $out;
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<$out, D::Error> {
                d.deserialize_any(self)
            }
        }
    };
}

/// The scalar visits of a seed that wants a container: each hands what it found to the
/// seed's `found`.
macro_rules! found_scalars {
    () => {
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
            self.found(Scalar::Bool(v))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            self.found(Scalar::Int(v))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            self.found(int(v))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            self.found(Scalar::JsonFloat(v))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            self.found(Scalar::Str(v.as_bytes()))
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            self.found(Scalar::None)
        }
    };
}

// ---------------------------------------------------------------------------------------
// The top level

struct TopSeed<'b> {
    b: &'b mut Builder,
}

seed!(TopSeed<'_>, Parts);

impl TopSeed<'_> {
    fn found<E: de::Error>(self, s: Scalar<'_>) -> Result<Parts, E> {
        Err(err(Loc::Snapshot, Shape::Snapshot("JSON").problem(s)))
    }
}

impl<'de> Visitor<'de> for TopSeed<'_> {
    type Value = Parts;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a snapshot dict")
    }
    found_scalars!();

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Parts, A::Error> {
        let b = self.b;
        let mut parts = Parts::default();
        let (mut segments, mut host_skipped) = (None, [0; 2]);
        while let Some(JKey(key)) = map.next_key()? {
            match key {
                Key::Segments => segments = Some(map.next_value_seed(SegmentsSeed { b: &mut *b })?),
                Key::DeviceTraces => {
                    parts.device_traces = map.next_value_seed(TracesSeed { b: &mut *b })?;
                }
                Key::AllocatorSettings => parts.settings = map.next_value_seed(SettingsSeed)?,
                Key::HostSegments => {
                    (parts.host_segments, host_skipped[0]) =
                        map.next_value_seed(HostSegmentsSeed)?;
                }
                Key::HostTraces => {
                    (parts.host_traces, host_skipped[1]) =
                        map.next_value_seed(HostTracesSeed { b: &mut *b })?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        parts.segments = segments.ok_or_else(|| err(Loc::Snapshot, schema::missing("segments")))?;
        parts.host_items_skipped = host_skipped[0] + host_skipped[1];
        Ok(parts)
    }

    /// The pre-2.1 form: just the list of segments.
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Parts, A::Error> {
        Ok(Parts {
            segments: SegmentsSeed { b: self.b }.visit_seq(seq)?,
            ..Parts::default()
        })
    }
}

// ---------------------------------------------------------------------------------------
// Segments and blocks

struct SegmentsSeed<'b> {
    b: &'b mut Builder,
}

seed!(SegmentsSeed<'_>, Vec<RawSegment>);

impl SegmentsSeed<'_> {
    fn found<E: de::Error>(self, s: Scalar<'_>) -> Result<Vec<RawSegment>, E> {
        Err(err(Loc::Segments, Shape::Segments.problem(s)))
    }
}

impl<'de> Visitor<'de> for SegmentsSeed<'_> {
    type Value = Vec<RawSegment>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of segments")
    }
    found_scalars!();
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        self.found(Scalar::Other("a dict"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(s) = seq.next_element_seed(SegmentSeed {
            b: &mut *self.b,
            index: out.len(),
        })? {
            out.push(s);
        }
        Ok(out)
    }
}

struct SegmentSeed<'b> {
    b: &'b mut Builder,
    index: usize,
}

seed!(SegmentSeed<'_>, RawSegment);

impl SegmentSeed<'_> {
    fn found<E: de::Error>(self, s: Scalar<'_>) -> Result<RawSegment, E> {
        Err(err(Loc::Segment(self.index), Shape::Segment.problem(s)))
    }
}

impl<'de> Visitor<'de> for SegmentSeed<'_> {
    type Value = RawSegment;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a segment dict")
    }
    found_scalars!();
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<RawSegment, A::Error> {
        self.found(Scalar::Other("a list"))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawSegment, A::Error> {
        let loc = Loc::Segment(self.index);
        let mut fields = SegmentFields::default();
        let (mut pool, mut stack, mut blocks) = (JsonPair::Absent, StackId::EMPTY, None);
        while let Some(JKey(key)) = map.next_key()? {
            match key {
                Key::SegmentPoolId => pool = map.next_value_seed(PairSeed)?,
                Key::Frames => {
                    stack = map
                        .next_value_seed(StackSeed::strict(&mut *self.b, loc))?
                        .unwrap_or(StackId::EMPTY);
                }
                Key::Blocks => {
                    blocks = Some(map.next_value_seed(BlocksSeed {
                        b: &mut *self.b,
                        segment: self.index,
                    })?);
                }
                _ => read_field!(map, fields, key),
            }
        }
        let head = fields.map(Json::get).head().map_err(|e| err(loc, e))?;
        let pool = schema::segment_pool_id(pool.get()).map_err(|e| err(loc, e))?;
        let partial = blocks.ok_or_else(|| err(loc, schema::missing("blocks")))?;
        let mut blocks = Vec::with_capacity(partial.len());
        let mut next_address = Some(head.address);
        for (i, (fields, stack)) in partial.iter().enumerate() {
            let mut block = fields
                .map(Json::get)
                .block(&mut next_address)
                .map_err(|e| err(Loc::Block(self.index, i), e))?;
            block.stack = *stack;
            blocks.push(block);
        }
        Ok(head.segment(pool, stack, blocks))
    }
}

/// A pair (a list of two) as found; never refused here (the schema decides).
enum JsonPair<'de> {
    Absent,
    Two(Json<'de>, Json<'de>),
    Not(Json<'de>),
}

impl JsonPair<'_> {
    fn get(&self) -> Pair<'_> {
        match self {
            JsonPair::Absent => Pair::Absent,
            JsonPair::Two(a, b) => Pair::Two(a.get(), b.get()),
            JsonPair::Not(x) => Pair::Not(x.get()),
        }
    }
}

struct PairSeed;

seed!(PairSeed, JsonPair<'de>);

impl PairSeed {
    fn found<'de, E: de::Error>(self, s: Scalar<'_>) -> Result<JsonPair<'de>, E> {
        Ok(match s {
            Scalar::None => JsonPair::Absent,
            _ => JsonPair::Not(owned(s)),
        })
    }
}

impl<'de> Visitor<'de> for PairSeed {
    type Value = JsonPair<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a pair of integers")
    }
    found_scalars!();
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let a = seq.next_element_seed(ScalarSeed)?;
        let b = seq.next_element_seed(ScalarSeed)?;
        let more = seq.next_element::<IgnoredAny>()?.is_some();
        drain_seq(seq)?;
        Ok(match (a, b, more) {
            (Some(a), Some(b), false) => JsonPair::Two(a, b),
            _ => JsonPair::Not(Json::Scalar(Scalar::Other("a list"))),
        })
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        drain_map(map)?;
        self.found(Scalar::Other("a dict"))
    }
}

struct BlocksSeed<'b> {
    b: &'b mut Builder,
    segment: usize,
}

seed!(BlocksSeed<'_>, Vec<(BlockFields<Json<'de>>, StackId)>);

impl BlocksSeed<'_> {
    fn found<T, E: de::Error>(self, s: Scalar<'_>) -> Result<T, E> {
        Err(err(Loc::Segment(self.segment), Shape::Blocks.problem(s)))
    }
}

impl<'de> Visitor<'de> for BlocksSeed<'_> {
    type Value = Vec<(BlockFields<Json<'de>>, StackId)>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of blocks")
    }
    found_scalars!();
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        self.found(Scalar::Other("a dict"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(b) = seq.next_element_seed(BlockSeed {
            b: &mut *self.b,
            loc: Loc::Block(self.segment, out.len()),
        })? {
            out.push(b);
        }
        Ok(out)
    }
}

struct BlockSeed<'b> {
    b: &'b mut Builder,
    loc: Loc,
}

seed!(BlockSeed<'_>, (BlockFields<Json<'de>>, StackId));

impl BlockSeed<'_> {
    fn found<T, E: de::Error>(self, s: Scalar<'_>) -> Result<T, E> {
        Err(err(self.loc, Shape::Block.problem(s)))
    }
}

impl<'de> Visitor<'de> for BlockSeed<'_> {
    type Value = (BlockFields<Json<'de>>, StackId);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a block dict")
    }
    found_scalars!();
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        self.found(Scalar::Other("a list"))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = BlockFields::default();
        let mut stack = StackId::EMPTY;
        while let Some(JKey(key)) = map.next_key()? {
            if key == Key::Frames {
                stack = map
                    .next_value_seed(StackSeed::strict(&mut *self.b, self.loc))?
                    .unwrap_or(StackId::EMPTY);
            } else {
                read_field!(map, fields, key);
            }
        }
        Ok((fields, stack))
    }
}

// ---------------------------------------------------------------------------------------
// Traces, entries and frames

struct TracesSeed<'b> {
    b: &'b mut Builder,
}

seed!(TracesSeed<'_>, Vec<Vec<RawEvent>>);

impl TracesSeed<'_> {
    fn found<E: de::Error>(self, s: Scalar<'_>) -> Result<Vec<Vec<RawEvent>>, E> {
        match s {
            Scalar::None => Ok(Vec::new()),
            _ => Err(err(Loc::DeviceTraces, Shape::Traces.problem(s))),
        }
    }
}

impl<'de> Visitor<'de> for TracesSeed<'_> {
    type Value = Vec<Vec<RawEvent>>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of trace lists")
    }
    found_scalars!();
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        self.found(Scalar::Other("a dict"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(t) = seq.next_element_seed(EventsSeed {
            b: &mut *self.b,
            device: out.len(),
        })? {
            out.push(t);
        }
        Ok(out)
    }
}

struct EventsSeed<'b> {
    b: &'b mut Builder,
    device: usize,
}

seed!(EventsSeed<'_>, Vec<RawEvent>);

impl EventsSeed<'_> {
    fn found<E: de::Error>(self, s: Scalar<'_>) -> Result<Vec<RawEvent>, E> {
        Err(err(Loc::Trace(self.device), Shape::Trace.problem(s)))
    }
}

impl<'de> Visitor<'de> for EventsSeed<'_> {
    type Value = Vec<RawEvent>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of trace entries")
    }
    found_scalars!();
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        self.found(Scalar::Other("a dict"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        let loc = |i| Loc::Entry(self.device, i);
        while let Some(e) = seq.next_element_seed(EventSeed {
            b: &mut *self.b,
            loc: loc(out.len()),
            lenient: false,
        })? {
            out.extend(e);
        }
        out.shrink_to_fit();
        Ok(out)
    }
}

/// A trace entry. Lenient (host traces, only displayed): a problem skips the entry
/// (`None`) instead of refusing the file.
struct EventSeed<'b> {
    b: &'b mut Builder,
    loc: Loc,
    lenient: bool,
}

seed!(EventSeed<'_>, Option<RawEvent>);

impl EventSeed<'_> {
    fn found<E: de::Error>(self, s: Scalar<'_>) -> Result<Option<RawEvent>, E> {
        if self.lenient {
            return Ok(None);
        }
        Err(err(self.loc, Shape::Entry.problem(s)))
    }
}

impl<'de> Visitor<'de> for EventSeed<'_> {
    type Value = Option<RawEvent>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a trace entry dict")
    }
    found_scalars!();
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Option<RawEvent>, A::Error> {
        if self.lenient {
            drain_seq(seq)?;
        }
        self.found(Scalar::Other("a list"))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<RawEvent>, A::Error> {
        let (loc, lenient) = (self.loc, self.lenient);
        let mut fields = EventFields::default();
        let (mut stack, mut pool) = (Some(StackId::EMPTY), JsonPair::Absent);
        while let Some(JKey(key)) = map.next_key()? {
            match key {
                Key::Frames => {
                    stack = map.next_value_seed(StackSeed {
                        b: &mut *self.b,
                        loc,
                        lenient,
                    })?;
                }
                Key::PoolId => pool = map.next_value_seed(PairSeed)?,
                _ => read_field!(map, fields, key),
            }
        }
        let pool = schema::entry_pool_id(pool.get());
        let Some(stack) = stack else { return Ok(None) };
        match self.b.event(&fields.map(Json::get), stack, pool) {
            Ok(e) => Ok(Some(e)),
            Err(_) if lenient => Ok(None),
            Err(e) => Err(err(loc, e)),
        }
    }
}

/// A `frames` list, interned; `null` reads as the empty stack. Lenient: `None` for a list
/// that is not one of frames.
struct StackSeed<'b> {
    b: &'b mut Builder,
    loc: Loc,
    lenient: bool,
}

seed!(StackSeed<'_>, Option<StackId>);

impl<'b> StackSeed<'b> {
    fn strict(b: &'b mut Builder, loc: Loc) -> StackSeed<'b> {
        StackSeed {
            b,
            loc,
            lenient: false,
        }
    }

    fn found<E: de::Error>(self, s: Scalar<'_>) -> Result<Option<StackId>, E> {
        match s {
            Scalar::None => Ok(Some(StackId::EMPTY)),
            _ if self.lenient => Ok(None),
            _ => Err(err(self.loc, Shape::Frames.problem(s))),
        }
    }
}

impl<'de> Visitor<'de> for StackSeed<'_> {
    type Value = Option<StackId>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of frames")
    }
    found_scalars!();
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        if self.lenient {
            drain_map(map)?;
        }
        self.found(Scalar::Other("a dict"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut ids: Vec<FrameId> = Vec::new();
        let mut all = true;
        while let Some(f) = seq.next_element_seed(FrameSeed {
            b: &mut *self.b,
            at: self.loc,
            index: ids.len(),
            lenient: self.lenient,
        })? {
            match f {
                Some(f) => ids.push(f),
                None => all = false,
            }
        }
        Ok(all.then(|| self.b.frames.intern_stack(&ids)))
    }
}

struct FrameSeed<'b> {
    b: &'b mut Builder,
    at: Loc,
    index: usize,
    lenient: bool,
}

seed!(FrameSeed<'_>, Option<FrameId>);

impl FrameSeed<'_> {
    fn found<E: de::Error>(self, s: Scalar<'_>) -> Result<Option<FrameId>, E> {
        if self.lenient {
            return Ok(None);
        }
        Err(err(self.at.frame(self.index), Shape::Frame.problem(s)))
    }
}

impl<'de> Visitor<'de> for FrameSeed<'_> {
    type Value = Option<FrameId>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a frame dict")
    }
    found_scalars!();
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Option<FrameId>, A::Error> {
        if self.lenient {
            drain_seq(seq)?;
        }
        self.found(Scalar::Other("a list"))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<FrameId>, A::Error> {
        let mut fields = FrameFields::default();
        while let Some(JKey(key)) = map.next_key()? {
            read_field!(map, fields, key);
        }
        match self.b.frame(&fields.map(Json::get)) {
            Ok(f) => Ok(Some(f)),
            Err(_) if self.lenient => Ok(None),
            Err(e) => Err(err(self.at.frame(self.index), e)),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Settings

struct SettingsSeed;

seed!(SettingsSeed, RawSettings);

impl SettingsSeed {
    fn found<E: de::Error>(self, s: Scalar<'_>) -> Result<RawSettings, E> {
        match s {
            Scalar::None => Ok(RawSettings::default()),
            _ => Err(err(Loc::Settings, Shape::Settings.problem(s))),
        }
    }
}

impl<'de> Visitor<'de> for SettingsSeed {
    type Value = RawSettings;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a settings dict")
    }
    found_scalars!();
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<RawSettings, A::Error> {
        self.found(Scalar::Other("a list"))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawSettings, A::Error> {
        let mut fields = SettingsFields::default();
        let (mut roundup, mut overflowed, mut max_entries) = (None, None, None);
        let mut keys = Vec::new();
        while let Some(NamedKey(key, name)) = map.next_key()? {
            keys.push(name);
            match key {
                Key::Roundup => roundup = Some(map.next_value_seed(ListSeed)?),
                Key::TraceAllocOverflowed => overflowed = Some(map.next_value_seed(ListSeed)?),
                Key::TraceAllocMaxEntries => max_entries = Some(map.next_value_seed(ListSeed)?),
                _ => read_field!(map, fields, key),
            }
        }
        let roundup = roundup.as_ref().map(|r| match r {
            JsonList::Dict(pairs) => {
                Divisions::Dict(pairs.iter().map(|(k, v)| (k.get(), v.get())).collect())
            }
            JsonList::List(items) => Divisions::List(items.iter().map(Json::get).collect()),
            JsonList::One(x) => Divisions::Not(x.get()),
        });
        let (overflowed, max_entries) = (
            overflowed.as_ref().map(per_device),
            max_entries.as_ref().map(per_device),
        );
        schema::settings(
            &fields.map(Json::get),
            roundup.as_ref(),
            overflowed.as_ref(),
            max_entries.as_ref(),
            keys,
        )
        .map_err(|e| err(Loc::Settings, e))
    }
}

fn per_device<'a>(l: &'a JsonList<'_>) -> PerDevice<'a> {
    match l {
        JsonList::List(items) => PerDevice::List(items.iter().map(Json::get).collect()),
        JsonList::One(x) => PerDevice::One(x.get()),
        JsonList::Dict(_) => PerDevice::One(Scalar::Other("a dict")),
    }
}

/// A value that may be a list or dict of scalars (`roundup_power2_divisions`,
/// `trace_alloc_*`), or one value.
enum JsonList<'de> {
    Dict(Vec<(Json<'de>, Json<'de>)>),
    List(Vec<Json<'de>>),
    One(Json<'de>),
}

struct ListSeed;

impl<'de> DeserializeSeed<'de> for ListSeed {
    type Value = JsonList<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<JsonList<'de>, D::Error> {
        d.deserialize_any(self)
    }
}

impl ListSeed {
    fn found<'de, E: de::Error>(self, s: Scalar<'_>) -> Result<JsonList<'de>, E> {
        Ok(JsonList::One(owned(s)))
    }
}

impl<'de> Visitor<'de> for ListSeed {
    type Value = JsonList<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list or dict")
    }
    found_scalars!();
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(x) = seq.next_element_seed(ScalarSeed)? {
            items.push(x);
        }
        Ok(JsonList::List(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut pairs = Vec::new();
        while let Some(k) = map.next_key_seed(ScalarSeed)? {
            pairs.push((k, map.next_value_seed(ScalarSeed)?));
        }
        Ok(JsonList::Dict(pairs))
    }
}

// Pinned host memory, in its own file.
mod host;
