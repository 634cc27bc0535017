//! JSON snapshots (what `memory_viz` accepts besides pickles): the same structure as the
//! pickle, tuples written as lists.
//!
//! The file is streamed through serde seeds straight into the [`RawSnapshot`] (frames
//! interned as they are read), never into a `serde_json::Value` tree, for the same
//! memory reasons as the pickle decoder. Integers are read as `u64`/`i64` as the field
//! needs: device addresses use all 64 bits. Error messages match the pickle decoder's,
//! with the position `serde_json` reports turned into a byte offset.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::error::ImportError;
use super::{
    Action, BlockState, Frame, FrameId, FrameTable, OtherAction, RawBlock, RawEvent, RawSegment,
    RawSettings, RawSnapshot, SegmentType, StackId, StrId,
};

/// Decodes a snapshot saved as JSON.
pub(crate) fn decode_snapshot_json(data: &[u8]) -> Result<RawSnapshot, ImportError> {
    let mut de = serde_json::Deserializer::from_slice(data);
    let mut frames = FrameTable::default();
    let top = TopSeed {
        frames: &mut frames,
    }
    .deserialize(&mut de)
    .map_err(|e| json_error(data, &e))?;
    de.end().map_err(|e| json_error(data, &e))?;
    frames.finish();
    Ok(RawSnapshot {
        segments: top.segments,
        device_traces: top.device_traces,
        settings: top.settings,
        frames,
        // The 2.12/2.13 additions (entry `pool_id`/`user_metadata`, host data) are read
        // from pickles only; JSON files of them decode without them.
        event_pools: Vec::new(),
        host_segments: Vec::new(),
        host_traces: Vec::new(),
        host_items_skipped: 0,
    })
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

// ---------------------------------------------------------------------------------------
// Where in the snapshot (for messages)

#[derive(Debug, Clone, Copy)]
enum Loc {
    Top,
    Settings,
    Segment(usize),
    Block(usize, usize),
    Event(usize, usize),
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loc::Top => f.write_str("snapshot"),
            Loc::Settings => f.write_str("allocator_settings"),
            Loc::Segment(s) => write!(f, "segments[{s}]"),
            Loc::Block(s, b) => write!(f, "segments[{s}].blocks[{b}]"),
            Loc::Event(d, i) => write!(f, "device_traces[{d}][{i}]"),
        }
    }
}

fn err<E: de::Error>(loc: impl fmt::Display, problem: impl fmt::Display) -> E {
    E::custom(format_args!("{loc}: {problem}"))
}

// ---------------------------------------------------------------------------------------
// Keys (matched without allocating)

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Segments,
    DeviceTraces,
    AllocatorSettings,
    Device,
    Address,
    TotalSize,
    AllocatedSize,
    ActiveSize,
    RequestedSize,
    Stream,
    SegmentType,
    SegmentPoolId,
    IsExpandable,
    Frames,
    Blocks,
    Size,
    State,
    Action,
    Addr,
    DeviceFree,
    TimeUs,
    Name,
    Filename,
    Line,
    Conf,
    MaxSplitSize,
    GcThreshold,
    ExpandableSegments,
    Roundup,
    Other,
}

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key, E> {
                Ok(match s {
                    "segments" => Key::Segments,
                    "device_traces" => Key::DeviceTraces,
                    "allocator_settings" => Key::AllocatorSettings,
                    "device" => Key::Device,
                    "address" => Key::Address,
                    "total_size" => Key::TotalSize,
                    "allocated_size" => Key::AllocatedSize,
                    "active_size" => Key::ActiveSize,
                    "requested_size" => Key::RequestedSize,
                    "stream" => Key::Stream,
                    "segment_type" => Key::SegmentType,
                    "segment_pool_id" => Key::SegmentPoolId,
                    "is_expandable" => Key::IsExpandable,
                    "frames" => Key::Frames,
                    "blocks" => Key::Blocks,
                    "size" => Key::Size,
                    "state" => Key::State,
                    "action" => Key::Action,
                    "addr" => Key::Addr,
                    "device_free" => Key::DeviceFree,
                    "time_us" => Key::TimeUs,
                    "name" => Key::Name,
                    "filename" => Key::Filename,
                    "line" => Key::Line,
                    "PYTORCH_CUDA_ALLOC_CONF" => Key::Conf,
                    "max_split_size" => Key::MaxSplitSize,
                    "garbage_collection_threshold" => Key::GcThreshold,
                    "expandable_segments" => Key::ExpandableSegments,
                    "roundup_power2_divisions" => Key::Roundup,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

// ---------------------------------------------------------------------------------------
// Scalars: one visitor, typed by what the field wants, with the pickle decoder's messages

/// What a scalar field accepts; every method not overridden is a type error.
trait Want {
    type Out;
    const EXPECTED: &'static str;
    fn from_u64(_: u64) -> Result<Self::Out, String> {
        Err(String::new())
    }
    fn from_i64(v: i64) -> Result<Self::Out, String> {
        match u64::try_from(v) {
            Ok(u) => Self::from_u64(u),
            Err(_) => Err(String::new()),
        }
    }
    fn from_f64(_: f64) -> Result<Self::Out, String> {
        Err(String::new())
    }
    fn from_bool(_: bool) -> Result<Self::Out, String> {
        Err(String::new())
    }
    fn from_str(_: &str) -> Result<Self::Out, String> {
        Err(String::new())
    }
    fn from_null() -> Result<Self::Out, String> {
        Err(String::new())
    }
}

/// An integer field as u64; floats are accepted when they hold an exact integer (some
/// JSON writers print every number as a float).
fn integral_f64(v: f64) -> Option<u64> {
    (v.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&v)).then_some(v as u64)
}

struct U64;
impl Want for U64 {
    type Out = u64;
    const EXPECTED: &'static str = "an unsigned integer";
    fn from_u64(v: u64) -> Result<u64, String> {
        Ok(v)
    }
    fn from_i64(v: i64) -> Result<u64, String> {
        u64::try_from(v).map_err(|_| format!("is negative ({v}), expected {}", Self::EXPECTED))
    }
    fn from_f64(v: f64) -> Result<u64, String> {
        integral_f64(v).ok_or_else(String::new)
    }
}

struct I64;
impl Want for I64 {
    type Out = i64;
    const EXPECTED: &'static str = "an integer";
    fn from_u64(v: u64) -> Result<i64, String> {
        i64::try_from(v).map_err(|_| "is an integer that does not fit in 64 bits".to_owned())
    }
    fn from_i64(v: i64) -> Result<i64, String> {
        Ok(v)
    }
}

struct F64;
impl Want for F64 {
    type Out = f64;
    const EXPECTED: &'static str = "a number";
    fn from_u64(v: u64) -> Result<f64, String> {
        Ok(v as f64)
    }
    fn from_i64(v: i64) -> Result<f64, String> {
        Ok(v as f64)
    }
    fn from_f64(v: f64) -> Result<f64, String> {
        Ok(v)
    }
}

struct Bool;
impl Want for Bool {
    type Out = bool;
    const EXPECTED: &'static str = "a bool";
    fn from_bool(v: bool) -> Result<bool, String> {
        Ok(v)
    }
    fn from_u64(v: u64) -> Result<bool, String> {
        match v {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(String::new()),
        }
    }
}

/// A string, `null` read as "".
struct Text;
impl Want for Text {
    type Out = String;
    const EXPECTED: &'static str = "a string";
    fn from_str(v: &str) -> Result<String, String> {
        Ok(v.to_owned())
    }
    fn from_null() -> Result<String, String> {
        Ok(String::new())
    }
}

struct ActionWant;
impl Want for ActionWant {
    type Out = (Action, OtherAction);
    const EXPECTED: &'static str = "a string";
    fn from_str(v: &str) -> Result<(Action, OtherAction), String> {
        let action = Action::from_bytes(v.as_bytes());
        let other = if action == Action::Other {
            OtherAction::from_bytes(v.as_bytes())
        } else {
            OtherAction::Plain
        };
        Ok((action, other))
    }
}

struct StateWant;
impl Want for StateWant {
    type Out = BlockState;
    const EXPECTED: &'static str = "a string";
    fn from_str(v: &str) -> Result<BlockState, String> {
        match v {
            "active_allocated" => Ok(BlockState::ActiveAllocated),
            // The name PyTorch's docstring uses for the same state.
            "active_pending_free" | "active_awaiting_free" => Ok(BlockState::ActivePendingFree),
            "inactive" => Ok(BlockState::Inactive),
            _ => Err(format!(
                "is {:?}, expected active_allocated, active_pending_free or inactive",
                short(v)
            )),
        }
    }
}

struct SegmentTypeWant;
impl Want for SegmentTypeWant {
    type Out = SegmentType;
    const EXPECTED: &'static str = "a string";
    fn from_str(v: &str) -> Result<SegmentType, String> {
        match v {
            "large" => Ok(SegmentType::Large),
            "small" => Ok(SegmentType::Small),
            _ => Err(format!(
                "is {:?}, expected \"large\" or \"small\"",
                short(v)
            )),
        }
    }
}

/// `max_split_size`: −1 (or `SIZE_MAX`) is PyTorch's "unlimited".
struct MaxSplit;
impl Want for MaxSplit {
    type Out = Option<u64>;
    const EXPECTED: &'static str = "-1 or a size";
    fn from_u64(v: u64) -> Result<Option<u64>, String> {
        Ok((v != u64::MAX).then_some(v))
    }
    fn from_i64(v: i64) -> Result<Option<u64>, String> {
        match v {
            -1 => Ok(None),
            _ => u64::try_from(v)
                .map(Some)
                .map_err(|_| format!("is negative ({v}), expected {}", Self::EXPECTED)),
        }
    }
}

fn short(s: &str) -> String {
    s.chars().take(60).collect()
}

/// A scalar field `key` of the object at `loc`.
struct Field<W> {
    key: &'static str,
    loc: Loc,
    want: PhantomData<W>,
}

fn field<W>(key: &'static str, loc: Loc) -> Field<W> {
    Field {
        key,
        loc,
        want: PhantomData,
    }
}

impl<W: Want> Field<W> {
    fn check<E: de::Error>(&self, r: Result<W::Out, String>, found: &str) -> Result<W::Out, E> {
        r.map_err(|why| {
            let key = self.key;
            if why.is_empty() {
                err(
                    self.loc,
                    format_args!("`{key}` is {found}, expected {}", W::EXPECTED),
                )
            } else {
                err(self.loc, format_args!("`{key}` {why}"))
            }
        })
    }
}

impl<'de, W: Want> DeserializeSeed<'de> for Field<W> {
    type Value = W::Out;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<W::Out, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, W: Want> Visitor<'de> for Field<W> {
    type Value = W::Out;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(W::EXPECTED)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<W::Out, E> {
        self.check(W::from_u64(v), "an integer")
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<W::Out, E> {
        self.check(W::from_i64(v), "an integer")
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<W::Out, E> {
        self.check(W::from_f64(v), "a float")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<W::Out, E> {
        self.check(W::from_bool(v), "a bool")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<W::Out, E> {
        self.check(W::from_str(v), "a string")
    }
    fn visit_unit<E: de::Error>(self) -> Result<W::Out, E> {
        self.check(W::from_null(), "None")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<W::Out, A::Error> {
        self.check(Err(String::new()), "a list")
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<W::Out, A::Error> {
        self.check(Err(String::new()), "a dict")
    }
}

// ---------------------------------------------------------------------------------------
// Containers

/// Wrong container type for `key` at `loc`: a visitor that accepts nothing else.
fn wrong<E: de::Error>(loc: Loc, what: &str, found: &str, expected: &str) -> E {
    err(loc, format_args!("{what} is {found}, expected {expected}"))
}

/// Reports the JSON type found where a list or dict was expected.
macro_rules! reject_scalars {
    ($loc:expr, $what:expr, $expected:expr) => {
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Err(wrong($loc(&self), $what, "an integer", $expected))
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Err(wrong($loc(&self), $what, "an integer", $expected))
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Err(wrong($loc(&self), $what, "a float", $expected))
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Err(wrong($loc(&self), $what, "a bool", $expected))
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Err(wrong($loc(&self), $what, "a string", $expected))
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Err(wrong($loc(&self), $what, "None", $expected))
        }
    };
}

struct TopSeed<'t> {
    frames: &'t mut FrameTable,
}

struct Top {
    segments: Vec<RawSegment>,
    device_traces: Vec<Vec<RawEvent>>,
    settings: RawSettings,
}

impl<'de> DeserializeSeed<'de> for TopSeed<'_> {
    type Value = Top;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Top, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TopSeed<'_> {
    type Value = Top;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a snapshot dict")
    }
    reject_scalars!(|_: &Self| Loc::Top, "the JSON", "a dict with `segments`");

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top, A::Error> {
        let mut segments = None;
        let mut device_traces = Vec::new();
        let mut settings = RawSettings::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Segments => {
                    segments = Some(map.next_value_seed(SegmentsSeed {
                        frames: &mut *self.frames,
                    })?);
                }
                Key::DeviceTraces => {
                    device_traces = map
                        .next_value_seed(TracesSeed {
                            frames: &mut *self.frames,
                        })?
                        .unwrap_or_default();
                }
                Key::AllocatorSettings => {
                    settings = map.next_value_seed(SettingsSeed)?.unwrap_or_default();
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let segments = segments.ok_or_else(|| err(Loc::Top, "missing `segments`"))?;
        Ok(Top {
            segments,
            device_traces,
            settings,
        })
    }

    /// The pre-2.1 form: just the list of segments.
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Top, A::Error> {
        let segments = SegmentsSeed {
            frames: self.frames,
        }
        .visit_seq(seq)?;
        Ok(Top {
            segments,
            device_traces: Vec::new(),
            settings: RawSettings::default(),
        })
    }
}

struct SegmentsSeed<'t> {
    frames: &'t mut FrameTable,
}

impl<'de> DeserializeSeed<'de> for SegmentsSeed<'_> {
    type Value = Vec<RawSegment>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for SegmentsSeed<'_> {
    type Value = Vec<RawSegment>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of segments")
    }
    reject_scalars!(|_: &Self| Loc::Top, "`segments`", "a list of segment dicts");
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(wrong(
            Loc::Top,
            "`segments`",
            "a dict",
            "a list of segment dicts",
        ))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(s) = seq.next_element_seed(SegmentSeed {
            frames: &mut *self.frames,
            index: out.len(),
        })? {
            out.push(s);
        }
        Ok(out)
    }
}

struct SegmentSeed<'t> {
    frames: &'t mut FrameTable,
    index: usize,
}

impl<'de> DeserializeSeed<'de> for SegmentSeed<'_> {
    type Value = RawSegment;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<RawSegment, D::Error> {
        d.deserialize_any(self)
    }
}

/// A block as read, before its address is known for sure.
struct PartialBlock {
    address: Option<u64>,
    size: u64,
    requested_size: Option<u64>,
    state: BlockState,
    stack: StackId,
    index: usize,
}

impl<'de> Visitor<'de> for SegmentSeed<'_> {
    type Value = RawSegment;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a segment dict")
    }
    reject_scalars!(
        |s: &Self| Loc::Segment(s.index),
        "the item",
        "a segment dict"
    );
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<RawSegment, A::Error> {
        Err(wrong(
            Loc::Segment(self.index),
            "the item",
            "a list",
            "a segment dict",
        ))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawSegment, A::Error> {
        let loc = Loc::Segment(self.index);
        let (mut device, mut address, mut total_size, mut segment_type) = (None, None, None, None);
        let (mut allocated, mut active, mut requested) = (None, None, None);
        let (mut stream, mut pool, mut expandable) = (0, (0, 0), false);
        let (mut stack, mut blocks) = (StackId::EMPTY, None);
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Device => device = Some(map.next_value_seed(field::<U64>("device", loc))?),
                Key::Address => address = Some(map.next_value_seed(field::<U64>("address", loc))?),
                Key::TotalSize => {
                    total_size = Some(map.next_value_seed(field::<U64>("total_size", loc))?);
                }
                Key::AllocatedSize => {
                    allocated = Some(map.next_value_seed(field::<U64>("allocated_size", loc))?);
                }
                Key::ActiveSize => {
                    active = Some(map.next_value_seed(field::<U64>("active_size", loc))?);
                }
                Key::RequestedSize => {
                    requested = Some(map.next_value_seed(field::<U64>("requested_size", loc))?);
                }
                Key::Stream => stream = map.next_value_seed(field::<U64>("stream", loc))?,
                Key::SegmentType => {
                    segment_type =
                        Some(map.next_value_seed(field::<SegmentTypeWant>("segment_type", loc))?);
                }
                Key::SegmentPoolId => pool = map.next_value_seed(PoolSeed { loc })?,
                Key::IsExpandable => {
                    expandable = map.next_value_seed(field::<Bool>("is_expandable", loc))?;
                }
                Key::Frames => {
                    stack = map.next_value_seed(StackSeed {
                        frames: &mut *self.frames,
                        loc,
                    })?;
                }
                Key::Blocks => {
                    blocks = Some(map.next_value_seed(BlocksSeed {
                        frames: &mut *self.frames,
                        segment: self.index,
                    })?);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let need =
            |v: Option<u64>, key: &str| v.ok_or_else(|| err(loc, format_args!("missing `{key}`")));
        let device = need(device, "device")?;
        let device = u32::try_from(device).map_err(|_| {
            err(
                loc,
                format_args!("`device` is {device}, expected a device ordinal"),
            )
        })?;
        let address = need(address, "address")?;
        let total_size = need(total_size, "total_size")?;
        let segment_type = segment_type.ok_or_else(|| err(loc, "missing `segment_type`"))?;
        let partial = blocks.ok_or_else(|| err(loc, "missing `blocks`"))?;
        let mut blocks = Vec::with_capacity(partial.len());
        let mut next = Some(address);
        for b in partial {
            let Some(address) = b.address.or(next) else {
                return Err(err(
                    Loc::Block(self.index, b.index),
                    "`address` is an integer that does not fit in 64 bits",
                ));
            };
            next = address.checked_add(b.size);
            blocks.push(RawBlock {
                address,
                size: b.size,
                // Older files: an active block was requested whole, a free one never.
                requested_size: b
                    .requested_size
                    .unwrap_or(if b.state == BlockState::Inactive {
                        0
                    } else {
                        b.size
                    }),
                state: b.state,
                stack: b.stack,
            });
        }
        // Saturating: hostile sizes must not overflow.
        let sum = |f: fn(&RawBlock) -> Option<u64>| {
            blocks.iter().filter_map(f).fold(0u64, u64::saturating_add)
        };
        let allocated_size = allocated
            .unwrap_or_else(|| sum(|b| (b.state == BlockState::ActiveAllocated).then_some(b.size)));
        let active_size =
            active.unwrap_or_else(|| sum(|b| (b.state != BlockState::Inactive).then_some(b.size)));
        let requested_size = requested.unwrap_or_else(|| {
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
            segment_pool_id: pool,
            is_expandable: expandable,
            stack,
            blocks,
        })
    }
}

/// `segment_pool_id`: a pair (a list in JSON), `null` as `(0, 0)`.
struct PoolSeed {
    loc: Loc,
}

impl<'de> DeserializeSeed<'de> for PoolSeed {
    type Value = (u64, u64);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(u64, u64), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PoolSeed {
    type Value = (u64, u64);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a pair of integers")
    }
    fn visit_unit<E: de::Error>(self) -> Result<(u64, u64), E> {
        Ok((0, 0))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(u64, u64), E> {
        Err(wrong(
            self.loc,
            "`segment_pool_id`",
            "an integer",
            "a pair of integers",
        ))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(u64, u64), E> {
        Err(wrong(
            self.loc,
            "`segment_pool_id`",
            "an integer",
            "a pair of integers",
        ))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(u64, u64), E> {
        Err(wrong(
            self.loc,
            "`segment_pool_id`",
            "a string",
            "a pair of integers",
        ))
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(u64, u64), A::Error> {
        Err(wrong(
            self.loc,
            "`segment_pool_id`",
            "a dict",
            "a pair of integers",
        ))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(u64, u64), A::Error> {
        let bad = || {
            wrong(
                self.loc,
                "`segment_pool_id`",
                "a list of another length",
                "a pair of integers",
            )
        };
        let a = seq.next_element_seed(field::<U64>("segment_pool_id", self.loc))?;
        let b = seq.next_element_seed(field::<U64>("segment_pool_id", self.loc))?;
        match (a, b, seq.next_element::<IgnoredAny>()?) {
            (Some(a), Some(b), None) => Ok((a, b)),
            _ => Err(bad()),
        }
    }
}

struct BlocksSeed<'t> {
    frames: &'t mut FrameTable,
    segment: usize,
}

impl<'de> DeserializeSeed<'de> for BlocksSeed<'_> {
    type Value = Vec<PartialBlock>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for BlocksSeed<'_> {
    type Value = Vec<PartialBlock>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of blocks")
    }
    reject_scalars!(
        |s: &Self| Loc::Segment(s.segment),
        "`blocks`",
        "a list of block dicts"
    );
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(wrong(
            Loc::Segment(self.segment),
            "`blocks`",
            "a dict",
            "a list of block dicts",
        ))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(b) = seq.next_element_seed(BlockSeed {
            frames: &mut *self.frames,
            loc: Loc::Block(self.segment, out.len()),
            index: out.len(),
        })? {
            out.push(b);
        }
        Ok(out)
    }
}

struct BlockSeed<'t> {
    frames: &'t mut FrameTable,
    loc: Loc,
    index: usize,
}

impl<'de> DeserializeSeed<'de> for BlockSeed<'_> {
    type Value = PartialBlock;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<PartialBlock, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for BlockSeed<'_> {
    type Value = PartialBlock;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a block dict")
    }
    reject_scalars!(|s: &Self| s.loc, "the item", "a block dict");
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<PartialBlock, A::Error> {
        Err(wrong(self.loc, "the item", "a list", "a block dict"))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PartialBlock, A::Error> {
        let loc = self.loc;
        let (mut address, mut size, mut requested, mut state) = (None, None, None, None);
        let mut stack = StackId::EMPTY;
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Address => address = Some(map.next_value_seed(field::<U64>("address", loc))?),
                Key::Size => size = Some(map.next_value_seed(field::<U64>("size", loc))?),
                Key::RequestedSize => {
                    requested = Some(map.next_value_seed(field::<U64>("requested_size", loc))?);
                }
                Key::State => state = Some(map.next_value_seed(field::<StateWant>("state", loc))?),
                Key::Frames => {
                    stack = map.next_value_seed(StackSeed {
                        frames: &mut *self.frames,
                        loc,
                    })?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(PartialBlock {
            address,
            size: size.ok_or_else(|| err(loc, "missing `size`"))?,
            requested_size: requested,
            state: state.ok_or_else(|| err(loc, "missing `state`"))?,
            stack,
            index: self.index,
        })
    }
}

struct TracesSeed<'t> {
    frames: &'t mut FrameTable,
}

impl<'de> DeserializeSeed<'de> for TracesSeed<'_> {
    type Value = Option<Vec<Vec<RawEvent>>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TracesSeed<'_> {
    type Value = Option<Vec<Vec<RawEvent>>>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of trace lists")
    }
    reject_scalars!(
        |_: &Self| Loc::Top,
        "`device_traces`",
        "a list (one per device)"
    );
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(wrong(
            Loc::Top,
            "`device_traces`",
            "a dict",
            "a list (one per device)",
        ))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(t) = seq.next_element_seed(EventsSeed {
            frames: &mut *self.frames,
            device: out.len(),
        })? {
            out.push(t);
        }
        Ok(Some(out))
    }
}

struct EventsSeed<'t> {
    frames: &'t mut FrameTable,
    device: usize,
}

impl<'de> DeserializeSeed<'de> for EventsSeed<'_> {
    type Value = Vec<RawEvent>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

struct DeviceLoc(usize);

impl fmt::Display for DeviceLoc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device_traces[{}]", self.0)
    }
}

impl<'de> Visitor<'de> for EventsSeed<'_> {
    type Value = Vec<RawEvent>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of trace entries")
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Err(err(
            DeviceLoc(self.device),
            "expected a list of trace entries, found an integer",
        ))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Err(err(
            DeviceLoc(self.device),
            "expected a list of trace entries, found an integer",
        ))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Err(err(
            DeviceLoc(self.device),
            "expected a list of trace entries, found a string",
        ))
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(err(
            DeviceLoc(self.device),
            "expected a list of trace entries, found a dict",
        ))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(e) = seq.next_element_seed(EventSeed {
            frames: &mut *self.frames,
            loc: Loc::Event(self.device, out.len()),
        })? {
            out.push(e);
        }
        out.shrink_to_fit();
        Ok(out)
    }
}

struct EventSeed<'t> {
    frames: &'t mut FrameTable,
    loc: Loc,
}

impl<'de> DeserializeSeed<'de> for EventSeed<'_> {
    type Value = RawEvent;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<RawEvent, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for EventSeed<'_> {
    type Value = RawEvent;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a trace entry dict")
    }
    reject_scalars!(|s: &Self| s.loc, "the item", "a trace entry dict");
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<RawEvent, A::Error> {
        Err(wrong(self.loc, "the item", "a list", "a trace entry dict"))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawEvent, A::Error> {
        let loc = self.loc;
        let (mut action, mut addr, mut device_free, mut size) = (None, None, None, None);
        let (mut stream, mut time_us, mut stack) = (0, 0, StackId::EMPTY);
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Action => {
                    action = Some(map.next_value_seed(field::<ActionWant>("action", loc))?);
                }
                Key::Addr => addr = Some(map.next_value_seed(field::<U64>("addr", loc))?),
                Key::DeviceFree => {
                    device_free = Some(map.next_value_seed(field::<U64>("device_free", loc))?);
                }
                Key::Size => size = Some(map.next_value_seed(field::<U64>("size", loc))?),
                Key::Stream => stream = map.next_value_seed(field::<U64>("stream", loc))?,
                Key::TimeUs => time_us = map.next_value_seed(field::<I64>("time_us", loc))?,
                Key::Frames => {
                    stack = map.next_value_seed(StackSeed {
                        frames: &mut *self.frames,
                        loc,
                    })?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let (action, other) = action.ok_or_else(|| err(loc, "missing `action`"))?;
        // Same rules as the pickle decoder: allocator actions need a place, `oom` gives
        // `device_free` instead of `addr`.
        let needs_place = !matches!(action, Action::Snapshot | Action::Other);
        let (addr_key, addr) = match action {
            Action::Oom if device_free.is_some() || addr.is_none() => ("device_free", device_free),
            _ => ("addr", addr),
        };
        let addr = match addr {
            Some(a) => a,
            None if needs_place => return Err(err(loc, format_args!("missing `{addr_key}`"))),
            None => 0,
        };
        let size = match size {
            Some(s) => s,
            None if needs_place => return Err(err(loc, "missing `size`")),
            None => 0,
        };
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
}

/// A `frames` list, interned; `null` reads as the empty stack.
struct StackSeed<'t> {
    frames: &'t mut FrameTable,
    loc: Loc,
}

impl<'de> DeserializeSeed<'de> for StackSeed<'_> {
    type Value = StackId;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<StackId, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StackSeed<'_> {
    type Value = StackId;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of frames")
    }
    fn visit_unit<E: de::Error>(self) -> Result<StackId, E> {
        Ok(StackId::EMPTY)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<StackId, E> {
        Err(wrong(
            self.loc,
            "`frames`",
            "an integer",
            "a list of frame dicts",
        ))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<StackId, E> {
        Err(wrong(
            self.loc,
            "`frames`",
            "an integer",
            "a list of frame dicts",
        ))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<StackId, E> {
        Err(wrong(
            self.loc,
            "`frames`",
            "a float",
            "a list of frame dicts",
        ))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<StackId, E> {
        Err(wrong(
            self.loc,
            "`frames`",
            "a bool",
            "a list of frame dicts",
        ))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<StackId, E> {
        Err(wrong(
            self.loc,
            "`frames`",
            "a string",
            "a list of frame dicts",
        ))
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<StackId, A::Error> {
        Err(wrong(
            self.loc,
            "`frames`",
            "a dict",
            "a list of frame dicts",
        ))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StackId, A::Error> {
        let mut ids: Vec<FrameId> = Vec::new();
        while let Some(f) = seq.next_element_seed(FrameSeed {
            frames: &mut *self.frames,
            parent: self.loc,
            index: ids.len(),
        })? {
            ids.push(f);
        }
        Ok(self.frames.intern_stack(&ids))
    }
}

struct FrameSeed<'t> {
    frames: &'t mut FrameTable,
    parent: Loc,
    index: usize,
}

/// `parent.frames[k]` for messages.
struct FrameLoc(Loc, usize);

impl fmt::Display for FrameLoc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.frames[{}]", self.0, self.1)
    }
}

impl<'de> DeserializeSeed<'de> for FrameSeed<'_> {
    type Value = FrameId;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<FrameId, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for FrameSeed<'_> {
    type Value = FrameId;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a frame dict")
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<FrameId, E> {
        Err(err(
            FrameLoc(self.parent, self.index),
            "expected a frame dict, found an integer",
        ))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<FrameId, E> {
        Err(err(
            FrameLoc(self.parent, self.index),
            "expected a frame dict, found an integer",
        ))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<FrameId, E> {
        Err(err(
            FrameLoc(self.parent, self.index),
            "expected a frame dict, found a string",
        ))
    }
    fn visit_unit<E: de::Error>(self) -> Result<FrameId, E> {
        Err(err(
            FrameLoc(self.parent, self.index),
            "expected a frame dict, found None",
        ))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<FrameId, A::Error> {
        Err(err(
            FrameLoc(self.parent, self.index),
            "expected a frame dict, found a list",
        ))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FrameId, A::Error> {
        let at = FrameLoc(self.parent, self.index);
        let (mut name, mut filename, mut line) = (None, None, None);
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Name => {
                    name = Some(map.next_value_seed(StrIdSeed {
                        frames: &mut *self.frames,
                        key: "name",
                        at: &at,
                    })?);
                }
                Key::Filename => {
                    filename = Some(map.next_value_seed(StrIdSeed {
                        frames: &mut *self.frames,
                        key: "filename",
                        at: &at,
                    })?);
                }
                Key::Line => line = Some(map.next_value_seed(LineSeed)?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let name = name.ok_or_else(|| err(&at, "missing `name`"))?;
        let filename = filename.ok_or_else(|| err(&at, "missing `filename`"))?;
        let (line, line_text) = match line.unwrap_or(LineValue::Unknown) {
            LineValue::Int(i) => (i, None),
            LineValue::Text(t) => (Frame::LINE_UNKNOWN, Some(self.frames.intern_str(&t))),
            LineValue::Unknown => (Frame::LINE_UNKNOWN, None),
        };
        Ok(self.frames.intern_frame(Frame {
            name,
            filename,
            line,
            line_text,
            fx: 0,
        }))
    }
}

/// A frame's `name` or `filename`, interned without an intermediate `String`.
struct StrIdSeed<'t, 'a> {
    frames: &'t mut FrameTable,
    key: &'static str,
    at: &'a FrameLoc,
}

impl<'de> DeserializeSeed<'de> for StrIdSeed<'_, '_> {
    type Value = super::StrId;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrIdSeed<'_, '_> {
    type Value = super::StrId;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.frames.intern_str(v))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Err(err(
            self.at,
            format_args!("`{}` is an integer, expected a string", self.key),
        ))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Err(err(
            self.at,
            format_args!("`{}` is an integer, expected a string", self.key),
        ))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Err(err(
            self.at,
            format_args!("`{}` is a float, expected a string", self.key),
        ))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Err(err(
            self.at,
            format_args!("`{}` is a bool, expected a string", self.key),
        ))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Err(err(
            self.at,
            format_args!("`{}` is None, expected a string", self.key),
        ))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(err(
            self.at,
            format_args!("`{}` is a list, expected a string", self.key),
        ))
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(err(
            self.at,
            format_args!("`{}` is a dict, expected a string", self.key),
        ))
    }
}

struct LineSeed;

/// A frame's `line` as the file gives it (only displayed, so any value is kept).
enum LineValue {
    Int(i64),
    Text(String),
    Unknown,
}

impl<'de> DeserializeSeed<'de> for LineSeed {
    type Value = LineValue;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<LineValue, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for LineSeed {
    type Value = LineValue;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a line number")
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<LineValue, E> {
        Ok(if v == Frame::LINE_UNKNOWN {
            LineValue::Text(v.to_string())
        } else {
            LineValue::Int(v)
        })
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<LineValue, E> {
        Ok(i64::try_from(v).map_or_else(|_| LineValue::Text(v.to_string()), LineValue::Int))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<LineValue, E> {
        // JSON integers wider than 64 bits arrive here (serde_json reads them as floats).
        Ok(LineValue::Text(if v.fract() == 0.0 && v.is_finite() {
            format!("{v:.0}")
        } else {
            v.to_string()
        }))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<LineValue, E> {
        Ok(LineValue::Text(v.to_owned()))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<LineValue, E> {
        Ok(LineValue::Text(if v { "True" } else { "False" }.to_owned()))
    }
    fn visit_unit<E: de::Error>(self) -> Result<LineValue, E> {
        Ok(LineValue::Unknown)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<LineValue, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(LineValue::Unknown)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LineValue, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(LineValue::Unknown)
    }
}

struct SettingsSeed;

impl<'de> DeserializeSeed<'de> for SettingsSeed {
    type Value = Option<RawSettings>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for SettingsSeed {
    type Value = Option<RawSettings>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a settings dict")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Err(err(Loc::Settings, "expected a dict, found an integer"))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Err(err(Loc::Settings, "expected a dict, found an integer"))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Err(err(Loc::Settings, "expected a dict, found a string"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(err(Loc::Settings, "expected a dict, found a list"))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let loc = Loc::Settings;
        let mut s = RawSettings {
            present: true,
            ..RawSettings::default()
        };
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Conf => {
                    s.conf = map.next_value_seed(field::<Text>("PYTORCH_CUDA_ALLOC_CONF", loc))?;
                }
                Key::MaxSplitSize => {
                    s.max_split_size_bytes =
                        map.next_value_seed(field::<MaxSplit>("max_split_size", loc))?;
                }
                Key::GcThreshold => {
                    s.garbage_collection_threshold =
                        map.next_value_seed(field::<F64>("garbage_collection_threshold", loc))?;
                }
                Key::ExpandableSegments => {
                    s.expandable_segments =
                        map.next_value_seed(field::<Bool>("expandable_segments", loc))?;
                }
                Key::Roundup => {
                    s.roundup_power2_divisions = Some(map.next_value_seed(RoundupSeed)?);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Some(s))
    }
}

/// `roundup_power2_divisions`: `{"1": n, …, "32768": n}` (index = log2 of the key), or a
/// plain list of 16.
struct RoundupSeed;

const ROUNDUP: &str = "roundup_power2_divisions";

impl<'de> DeserializeSeed<'de> for RoundupSeed {
    type Value = [u32; 16];
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<[u32; 16], D::Error> {
        d.deserialize_any(self)
    }
}

fn divisions<E: de::Error>(n: u64) -> Result<u32, E> {
    u32::try_from(n).map_err(|_| {
        err(
            Loc::Settings,
            format_args!("`{ROUNDUP}` is {n}, expected a division count"),
        )
    })
}

impl<'de> Visitor<'de> for RoundupSeed {
    type Value = [u32; 16];
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a dict of divisions")
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<[u32; 16], E> {
        Err(err(
            Loc::Settings,
            format_args!("`{ROUNDUP}` is an integer, expected a dict of divisions"),
        ))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<[u32; 16], E> {
        Err(err(
            Loc::Settings,
            format_args!("`{ROUNDUP}` is a string, expected a dict of divisions"),
        ))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<[u32; 16], A::Error> {
        let mut table = [0u32; 16];
        while let Some(key) = map.next_key::<RoundupKey>()? {
            let n = map.next_value_seed(field::<U64>(ROUNDUP, Loc::Settings))?;
            // Unknown keys are ignored, like every other unknown key.
            if let Some(slot) = key.0.and_then(|i| table.get_mut(i)) {
                *slot = divisions(n)?;
            }
        }
        Ok(table)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<[u32; 16], A::Error> {
        let mut table = [0u32; 16];
        let mut i = 0;
        while let Some(n) = seq.next_element_seed(field::<U64>(ROUNDUP, Loc::Settings))? {
            if let Some(slot) = table.get_mut(i) {
                *slot = divisions(n)?;
            }
            i += 1;
        }
        Ok(table)
    }
}

/// A key "1" … "32768" as its table index; `None` for anything else.
struct RoundupKey(Option<usize>);

impl<'de> de::Deserialize<'de> for RoundupKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RoundupKey, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RoundupKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<RoundupKey, E> {
                Ok(RoundupKey(
                    s.parse::<u32>()
                        .ok()
                        .filter(|m| m.is_power_of_two() && *m <= 32768)
                        .map(|m| m.trailing_zeros() as usize),
                ))
            }
        }
        d.deserialize_str(V)
    }
}
