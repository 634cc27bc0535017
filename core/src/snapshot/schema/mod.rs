//! The snapshot's schema, written once: which keys of which dicts mean what, what each
//! value may be, the defaults of older files, what is refused and in which words, and how
//! the pieces become a [`RawSnapshot`].
//!
//! Both decoders feed it. A decoder only walks its format's containers (the pickle machine
//! its heap, the JSON decoder serde's stream) and hands each dict's values over as
//! [`Scalar`]s in the field structs below (`EventFields`, `FrameFields`, …); the nested
//! containers of the schema (a stack, a pool-id pair, a list of blocks) it resolves first
//! and passes in. Messages name the place ([`Loc`]) and the problem in the same words for
//! both formats. Fields that are only displayed (frame lines, host memory, FX info,
//! `user_metadata`, `trace_alloc_*`) never refuse a file.
//!
//! A new field: its key in [`keys!`], a slot in the object's `fields!` struct, its meaning
//! in that struct's function here, the `RawSnapshot` field in `mod.rs`; both decoders then
//! read it (a nested container also needs a case in each walker).

mod builder;

pub(crate) use builder::{Builder, Parts};

use std::borrow::Cow;
use std::fmt;

use super::{BlockState, HostSegment, RawBlock, RawSegment, RawSettings, SegmentType, StackId};

// ---------------------------------------------------------------------------------------
// Keys

/// A key of at most 8 bytes as one little-endian word, zero-padded (keys hold no NUL, so
/// the word alone tells them apart).
#[must_use]
pub(crate) const fn word(s: &[u8]) -> u64 {
    let mut w = 0u64;
    let mut i = if s.len() < 8 { s.len() } else { 8 };
    while i > 0 {
        i -= 1;
        w = (w << 8) | s[i] as u64;
    }
    w
}

/// The first and the last 8 bytes of `s` (at least 8 long) as [`word`]s.
const fn ends(s: &[u8]) -> (u64, u64) {
    match (s.first_chunk::<8>(), s.last_chunk::<8>()) {
        (Some(&head), Some(&tail)) => (u64::from_le_bytes(head), u64::from_le_bytes(tail)),
        _ => (0, 0),
    }
}

macro_rules! keys {
    (short { $($s:ident = $sname:literal,)* } long { $($l:ident = $lname:literal,)* }) => {
        /// A key of a snapshot dict that the schema reads; `Other` for the rest.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum Key { $($s,)* $($l,)* Other }

        #[allow(non_upper_case_globals)]
        mod short_words {
            $(pub(super) const $s: u64 = super::word($sname);)*
        }

        /// The first and the last 8 bytes of each long key, as [`word`]s.
        #[allow(non_upper_case_globals)]
        mod long_ends {
            $(pub(super) const $l: (u64, u64) = super::ends($lname);)*
        }

        impl Key {
            /// Every key the schema reads.
            #[cfg(test)]
            pub(crate) const ALL: &[Key] = &[$(Key::$s,)* $(Key::$l,)*];

            /// The key as the file spells it. A long key is found by its first and last 8
            /// bytes, then compared whole (trace entries carry `compile_context` and
            /// `user_metadata`: two long keys per entry).
            pub(crate) fn from_bytes(bytes: &[u8]) -> Key {
                if bytes.len() <= 8 {
                    return Key::from_word(bytes.len(), word(bytes));
                }
                let key = match ends(bytes) {
                    $(long_ends::$l => Key::$l,)*
                    _ => return Key::Other,
                };
                // Up to 16 bytes, the two words cover the key.
                let name = key.name();
                let same = bytes.len() == name.len() && (bytes.len() <= 16 || bytes == name);
                if same { key } else { Key::Other }
            }

            /// A key of `len` ≤ 8 bytes by its [`word`]: one compare tree and no `memcmp`
            /// (this runs for every key of every trace entry).
            #[inline]
            pub(crate) fn from_word(len: usize, w: u64) -> Key {
                let (key, key_len) = match w {
                    $(short_words::$s => (Key::$s, $sname.len()),)*
                    _ => return Key::Other,
                };
                if key_len == len { key } else { Key::Other }
            }

            /// The key's name in the file.
            pub(crate) const fn name(self) -> &'static [u8] {
                match self {
                    $(Key::$s => $sname,)*
                    $(Key::$l => $lname,)*
                    Key::Other => b"",
                }
            }
        }
    };
}

keys! {
    short {
        Segments = b"segments",
        Device = b"device",
        Address = b"address",
        Stream = b"stream",
        Frames = b"frames",
        Blocks = b"blocks",
        Size = b"size",
        State = b"state",
        Action = b"action",
        Addr = b"addr",
        TimeUs = b"time_us",
        PoolId = b"pool_id",
        Name = b"name",
        Filename = b"filename",
        Line = b"line",
    }
    long {
        DeviceTraces = b"device_traces",
        AllocatorSettings = b"allocator_settings",
        HostSegments = b"host_segments",
        HostTraces = b"host_traces",
        TotalSize = b"total_size",
        AllocatedSize = b"allocated_size",
        ActiveSize = b"active_size",
        RequestedSize = b"requested_size",
        SegmentType = b"segment_type",
        SegmentPoolId = b"segment_pool_id",
        IsExpandable = b"is_expandable",
        DeviceFree = b"device_free",
        UserMetadata = b"user_metadata",
        FxNodeOp = b"fx_node_op",
        FxNodeName = b"fx_node_name",
        FxNodeTarget = b"fx_node_target",
        FxOriginalTrace = b"fx_original_trace",
        FxNodeInfo = b"fx_node_info",
        Conf = b"PYTORCH_CUDA_ALLOC_CONF",
        MaxSplitSize = b"max_split_size",
        GcThreshold = b"garbage_collection_threshold",
        ExpandableSegments = b"expandable_segments",
        Roundup = b"roundup_power2_divisions",
        TraceAllocOverflowed = b"trace_alloc_overflowed",
        TraceAllocMaxEntries = b"trace_alloc_max_entries",
    }
}

/// `allocator_settings` keys PyTorch 2.5–2.13 writes (the others are listed in
/// [`RawSettings::other_keys`]).
const KNOWN_SETTINGS: &[&str] = &[
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

// ---------------------------------------------------------------------------------------
// Values

/// A value as a decoder hands it over; containers only as what they are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Scalar<'a> {
    None,
    Bool(bool),
    Int(i64),
    /// Integers in `i64::MAX + 1 ..= u64::MAX` (addresses with the top bit set).
    UInt(u64),
    /// Wider integers: minimal little-endian two's complement bytes.
    BigInt(&'a [u8]),
    Float(f64),
    /// A JSON number `serde_json` read as a float (`3.0`, `1e3`, an integer past 64 bits):
    /// JSON does not say it is no integer, so an unsigned field takes it when it holds one
    /// exactly (some JSON writers print every number as a float).
    JsonFloat(f64),
    /// Text as written (invalid UTF-8 reads as U+FFFD).
    Str(&'a [u8]),
    /// Anything else, as messages name it (`bytes`, `a list`, `a dict`, …).
    Other(&'static str),
}

const UNSIGNED: &str = "an unsigned integer";

impl<'a> Scalar<'a> {
    /// How messages name the value's type.
    pub(crate) fn type_name(self) -> &'static str {
        match self {
            Scalar::None => "None",
            Scalar::Bool(_) => "a bool",
            Scalar::Int(_) | Scalar::UInt(_) | Scalar::BigInt(_) => "an integer",
            Scalar::Float(_) | Scalar::JsonFloat(_) => "a float",
            Scalar::Str(_) => "a string",
            Scalar::Other(what) => what,
        }
    }

    /// A short readable rendering for messages.
    pub(crate) fn repr(self) -> String {
        match self {
            Scalar::Int(i) => i.to_string(),
            Scalar::UInt(u) => u.to_string(),
            Scalar::Str(b) => {
                let short: String = lossy(b).chars().take(60).collect();
                format!("{short:?}")
            }
            other => other.type_name().to_owned(),
        }
    }

    pub(crate) fn u64(self, key: &'static str) -> Result<u64, FieldError<'a>> {
        match self {
            Scalar::Int(i) => {
                u64::try_from(i).map_err(|_| fe(key, Problem::Negative(UNSIGNED), self))
            }
            Scalar::UInt(u) => Ok(u),
            Scalar::BigInt(_) => Err(fe(key, Problem::TooWide, self)),
            Scalar::JsonFloat(f)
                if f.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&f) =>
            {
                Ok(f as u64)
            }
            _ => Err(fe(key, Problem::WrongType(UNSIGNED), self)),
        }
    }

    fn i64(self, key: &'static str) -> Result<i64, FieldError<'a>> {
        match self {
            Scalar::Int(i) => Ok(i),
            Scalar::UInt(_) | Scalar::BigInt(_) => Err(fe(key, Problem::TooWide, self)),
            _ => Err(fe(key, Problem::WrongType("an integer"), self)),
        }
    }

    fn bool(self, key: &'static str) -> Result<bool, FieldError<'a>> {
        match self {
            Scalar::Bool(b) => Ok(b),
            // Protocol 0/1 and some writers use 0/1.
            Scalar::Int(0) => Ok(false),
            Scalar::Int(1) => Ok(true),
            _ => Err(fe(key, Problem::WrongType("a bool"), self)),
        }
    }

    fn f64(self, key: &'static str) -> Result<f64, FieldError<'a>> {
        match self {
            Scalar::Float(f) | Scalar::JsonFloat(f) => Ok(f),
            Scalar::Int(i) => Ok(i as f64),
            Scalar::UInt(u) => Ok(u as f64),
            _ => Err(fe(key, Problem::WrongType("a number"), self)),
        }
    }

    fn str(self, key: &'static str) -> Result<&'a [u8], FieldError<'a>> {
        match self {
            Scalar::Str(b) => Ok(b),
            _ => Err(fe(key, Problem::WrongType("a string"), self)),
        }
    }

    /// The text of a string, `None` for anything else.
    fn text(self) -> Option<&'a [u8]> {
        match self {
            Scalar::Str(b) => Some(b),
            _ => None,
        }
    }
}

/// Bytes as text, invalid UTF-8 replaced.
pub(crate) fn lossy(bytes: &[u8]) -> Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

/// A pair of values (a tuple in pickles, a list in JSON), as the decoder found it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Pair<'a> {
    /// No key, or `None`.
    Absent,
    Two(Scalar<'a>, Scalar<'a>),
    /// Anything else.
    Not(Scalar<'a>),
}

/// `roundup_power2_divisions` as the decoder found it.
#[derive(Debug, Clone)]
pub(crate) enum Divisions<'a> {
    /// `{"1": n, …, "32768": n}` (MiB → divisions).
    Dict(Vec<(Scalar<'a>, Scalar<'a>)>),
    /// Older writers: a plain list of 16.
    List(Vec<Scalar<'a>>),
    Not(Scalar<'a>),
}

/// A per-device setting: a list of values, or one value for all devices.
#[derive(Debug, Clone)]
pub(crate) enum PerDevice<'a> {
    List(Vec<Scalar<'a>>),
    One(Scalar<'a>),
}

impl<'a> PerDevice<'a> {
    /// The values that read as `T`; the others are left out (only displayed).
    fn read<T>(&self, f: impl Fn(Scalar<'a>) -> Option<T>) -> Vec<T> {
        match self {
            PerDevice::List(v) => v.iter().filter_map(|&x| f(x)).collect(),
            PerDevice::One(x) => f(*x).into_iter().collect(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Errors

/// What is wrong with a field.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Problem {
    Missing,
    WrongType(&'static str),
    Negative(&'static str),
    TooWide,
    BadValue(&'static str),
}

/// A field that does not read as the schema says, with what was found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FieldError<'a> {
    key: &'static str,
    problem: Problem,
    found: Scalar<'a>,
}

fn fe<'a>(key: &'static str, problem: Problem, found: Scalar<'a>) -> FieldError<'a> {
    FieldError {
        key,
        problem,
        found,
    }
}

pub(crate) fn missing(key: &'static str) -> FieldError<'static> {
    fe(key, Problem::Missing, Scalar::None)
}

impl fmt::Display for FieldError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = self.key;
        match self.problem {
            Problem::Missing => write!(f, "missing `{key}`"),
            Problem::WrongType(expected) => {
                write!(
                    f,
                    "`{key}` is {}, expected {expected}",
                    self.found.type_name()
                )
            }
            Problem::Negative(expected) => {
                write!(
                    f,
                    "`{key}` is negative ({}), expected {expected}",
                    self.found.repr()
                )
            }
            Problem::TooWide => write!(f, "`{key}` is an integer that does not fit in 64 bits"),
            Problem::BadValue(expected) => {
                write!(f, "`{key}` is {}, expected {expected}", self.found.repr())
            }
        }
    }
}

/// Where in the snapshot a problem is, as messages name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loc {
    Snapshot,
    Segments,
    DeviceTraces,
    Settings,
    Segment(usize),
    Block(usize, usize),
    Trace(usize),
    Entry(usize, usize),
    HostTraces,
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loc::Snapshot => f.write_str("snapshot"),
            Loc::Segments => f.write_str("segments"),
            Loc::DeviceTraces => f.write_str("device_traces"),
            Loc::Settings => f.write_str("allocator_settings"),
            Loc::Segment(s) => write!(f, "segments[{s}]"),
            Loc::Block(s, b) => write!(f, "segments[{s}].blocks[{b}]"),
            Loc::Trace(d) => write!(f, "device_traces[{d}]"),
            Loc::Entry(d, i) => write!(f, "device_traces[{d}][{i}]"),
            Loc::HostTraces => f.write_str("host_traces"),
        }
    }
}

impl Loc {
    /// `{self}.frames[k]`.
    pub(crate) fn frame(self, k: usize) -> String {
        format!("{self}.frames[{k}]")
    }
}

/// The containers of the schema, for "found X where Y belongs" messages.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Shape {
    /// The whole file; the format's name (`pickle`, `JSON`).
    Snapshot(&'static str),
    Segments,
    Segment,
    Blocks,
    Block,
    Traces,
    Trace,
    Entry,
    Frames,
    Frame,
    Settings,
}

impl Shape {
    /// The problem, when `found` stands where this container belongs.
    pub(crate) fn problem(self, found: Scalar<'_>) -> String {
        let found = found.type_name();
        match self {
            Shape::Snapshot(format) => {
                format!("the {format} holds {found}, expected a dict with `segments`")
            }
            Shape::Segments => format!("expected a list of segment dicts, found {found}"),
            Shape::Segment => format!("expected a segment dict, found {found}"),
            Shape::Blocks => format!("`blocks` is {found}, expected a list of block dicts"),
            Shape::Block => format!("expected a block dict, found {found}"),
            Shape::Traces => format!("expected a list (one per device), found {found}"),
            Shape::Trace => format!("expected a list of trace entries, found {found}"),
            Shape::Entry => format!("expected a trace entry dict, found {found}"),
            Shape::Frames => format!("`frames` is {found}, expected a list of frame dicts"),
            Shape::Frame => format!("expected a frame dict, found {found}"),
            Shape::Settings => format!("expected a dict, found {found}"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The objects

/// The fields of one kind of dict: which keys it reads, each value kept as the decoder
/// holds it (the last one written wins, as in a Python dict).
macro_rules! fields {
    ($(#[$m:meta])* $name:ident { $($field:ident: $key:ident,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy)]
        pub(crate) struct $name<V> {
            $(pub(crate) $field: Option<V>,)*
        }

        impl<V> Default for $name<V> {
            fn default() -> Self {
                $name { $($field: None,)* }
            }
        }

        impl<V> $name<V> {
            /// Stores `v` under `key`; false if this dict does not read `key`.
            #[inline]
            pub(crate) fn set(&mut self, key: Key, v: V) -> bool {
                match key {
                    $(Key::$key => self.$field = Some(v),)*
                    _ => return false,
                }
                true
            }

            /// Whether this dict reads `key` (a streaming decoder skips the others unread).
            #[allow(dead_code)] // not every dict is streamed key by key
            pub(crate) fn reads(&self, key: Key) -> bool {
                matches!(key, $(Key::$key)|*)
            }

            /// The same fields with each value converted.
            pub(crate) fn map<'s, W>(&'s self, f: impl Fn(&'s V) -> W) -> $name<W> {
                $name { $($field: self.$field.as_ref().map(&f),)* }
            }
        }
    };
}

fields!(
    /// A trace entry (`device_traces[d][i]`, `host_traces`); its `frames` and `pool_id`
    /// are containers the decoder resolves.
    EventFields {
        action: Action,
        addr: Addr,
        device_free: DeviceFree,
        size: Size,
        stream: Stream,
        time_us: TimeUs,
        user_metadata: UserMetadata,
    }
);

fields!(
    /// A stack frame.
    FrameFields {
        name: Name,
        filename: Filename,
        line: Line,
        fx_node_op: FxNodeOp,
        fx_node_name: FxNodeName,
        fx_node_target: FxNodeTarget,
        fx_original_trace: FxOriginalTrace,
        fx_node_info: FxNodeInfo,
    }
);

fields!(
    /// A segment of the end state; `segment_pool_id`, `frames` and `blocks` are containers.
    SegmentFields {
        device: Device,
        address: Address,
        total_size: TotalSize,
        segment_type: SegmentType,
        stream: Stream,
        is_expandable: IsExpandable,
        allocated_size: AllocatedSize,
        active_size: ActiveSize,
        requested_size: RequestedSize,
    }
);

fields!(
    /// A block of a segment; `frames` is a container.
    BlockFields {
        address: Address,
        size: Size,
        requested_size: RequestedSize,
        state: State,
    }
);

fields!(
    /// `allocator_settings`; `roundup_power2_divisions` and `trace_alloc_*` are
    /// containers (or one value).
    SettingsFields {
        conf: Conf,
        max_split_size: MaxSplitSize,
        garbage_collection_threshold: GcThreshold,
        expandable_segments: ExpandableSegments,
    }
);

fields!(
    /// A segment of the pinned host allocator (`host_segments[i]`).
    HostSegmentFields {
        address: Address,
        total_size: TotalSize,
        size: Size,
        allocated_size: AllocatedSize,
    }
);

impl EventFields<Scalar<'_>> {
    /// Whether the dict is a trace entry (it has an `action`).
    pub(crate) fn is_event(&self) -> bool {
        self.action.is_some()
    }
}

impl FrameFields<Scalar<'_>> {
    /// Whether a dict that is no trace entry is a frame.
    pub(crate) fn is_frame(&self) -> bool {
        self.name.is_some() && self.filename.is_some() && self.line.is_some()
    }
}

/// What the segment's own fields say, before its blocks are read (their addresses follow
/// from the segment's).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SegmentHead {
    device: u32,
    pub(crate) address: u64,
    total_size: u64,
    segment_type: SegmentType,
    stream: u64,
    is_expandable: bool,
    /// `allocated_size`, `active_size`, `requested_size` where the file gives them.
    sizes: [Option<u64>; 3],
}

impl<'a> SegmentFields<Scalar<'a>> {
    pub(crate) fn head(&self) -> Result<SegmentHead, FieldError<'a>> {
        let req = |v: Option<Scalar<'a>>, key| v.ok_or(missing(key));
        let opt_u64 = |v: Option<Scalar<'a>>, key| v.map(|v| v.u64(key)).transpose();
        let device = req(self.device, "device")?.u64("device")?;
        let device = u32::try_from(device).map_err(|_| {
            fe(
                "device",
                Problem::BadValue("a device ordinal"),
                Scalar::UInt(device),
            )
        })?;
        let address = req(self.address, "address")?.u64("address")?;
        let total_size = req(self.total_size, "total_size")?.u64("total_size")?;
        let type_value = req(self.segment_type, "segment_type")?;
        let segment_type = match type_value.str("segment_type")? {
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
        let stream = opt_u64(self.stream, "stream")?.unwrap_or(0);
        let is_expandable = self
            .is_expandable
            .map(|v| v.bool("is_expandable"))
            .transpose()?
            .unwrap_or(false);
        let sizes = [
            opt_u64(self.allocated_size, "allocated_size")?,
            opt_u64(self.active_size, "active_size")?,
            opt_u64(self.requested_size, "requested_size")?,
        ];
        Ok(SegmentHead {
            device,
            address,
            total_size,
            segment_type,
            stream,
            is_expandable,
            sizes,
        })
    }
}

/// `segment_pool_id`: a pair of integers; `(0, 0)` (the default pools) when absent.
pub(crate) fn segment_pool_id(p: Pair<'_>) -> Result<(u64, u64), FieldError<'_>> {
    const KEY: &str = "segment_pool_id";
    match p {
        Pair::Absent => Ok((0, 0)),
        Pair::Two(a, b) => Ok((a.u64(KEY)?, b.u64(KEY)?)),
        Pair::Not(found) => Err(fe(KEY, Problem::WrongType("a pair of integers"), found)),
    }
}

/// A trace entry's `pool_id` (2.12+): only bookkeeping, so any other shape reads as absent.
pub(crate) fn entry_pool_id(p: Pair<'_>) -> Option<(u64, u64)> {
    match p {
        Pair::Two(a, b) => Some((a.u64("pool_id").ok()?, b.u64("pool_id").ok()?)),
        Pair::Absent | Pair::Not(_) => None,
    }
}

impl<'a> BlockFields<Scalar<'a>> {
    /// The block, its address given or following the previous block's (`next_address`,
    /// the segment's address for the first); the decoder sets its stack.
    pub(crate) fn block(&self, next_address: &mut Option<u64>) -> Result<RawBlock, FieldError<'a>> {
        let size = self.size.ok_or(missing("size"))?.u64("size")?;
        let state_value = self.state.ok_or(missing("state"))?;
        let state = match state_value.str("state")? {
            b"active_allocated" => BlockState::ActiveAllocated,
            // The name PyTorch's docstring uses for the same state.
            b"active_pending_free" | b"active_awaiting_free" => BlockState::ActivePendingFree,
            b"inactive" => BlockState::Inactive,
            _ => {
                return Err(fe(
                    "state",
                    Problem::BadValue("active_allocated, active_pending_free or inactive"),
                    state_value,
                ));
            }
        };
        let address = match self.address {
            Some(a) => a.u64("address")?,
            None => next_address.ok_or(fe("address", Problem::TooWide, Scalar::None))?,
        };
        let requested_size = match self.requested_size {
            Some(r) => r.u64("requested_size")?,
            // Older files: an active block was requested whole, a free one never.
            None if state == BlockState::Inactive => 0,
            None => size,
        };
        *next_address = address.checked_add(size);
        Ok(RawBlock {
            address,
            size,
            requested_size,
            state,
            stack: StackId::EMPTY,
        })
    }
}

impl SegmentHead {
    /// The segment with its pool, stack and blocks.
    pub(crate) fn segment(
        self,
        segment_pool_id: (u64, u64),
        stack: StackId,
        blocks: Vec<RawBlock>,
    ) -> RawSegment {
        // Older files lack the byte sums: rebuild them from the blocks.
        // Saturating: hostile sizes must not overflow.
        let sum = |f: fn(&RawBlock) -> Option<u64>| {
            blocks.iter().filter_map(f).fold(0u64, u64::saturating_add)
        };
        let [allocated, active, requested] = self.sizes;
        let allocated_size = allocated
            .unwrap_or_else(|| sum(|b| (b.state == BlockState::ActiveAllocated).then_some(b.size)));
        let active_size =
            active.unwrap_or_else(|| sum(|b| (b.state != BlockState::Inactive).then_some(b.size)));
        let requested_size = requested.unwrap_or_else(|| {
            sum(|b| (b.state != BlockState::Inactive).then_some(b.requested_size))
        });
        RawSegment {
            device: self.device,
            address: self.address,
            total_size: self.total_size,
            allocated_size,
            active_size,
            requested_size,
            stream: self.stream,
            segment_type: self.segment_type,
            segment_pool_id,
            is_expandable: self.is_expandable,
            stack,
            blocks,
        }
    }
}

/// `allocator_settings` with its containers; `keys` every key of the dict in file order.
pub(crate) fn settings<'a>(
    f: &SettingsFields<Scalar<'a>>,
    roundup: Option<&Divisions<'a>>,
    trace_alloc_overflowed: Option<&PerDevice<'a>>,
    trace_alloc_max_entries: Option<&PerDevice<'a>>,
    keys: impl IntoIterator<Item = String>,
) -> Result<RawSettings, FieldError<'a>> {
    let mut s = RawSettings {
        present: true,
        ..RawSettings::default()
    };
    match f.conf {
        None | Some(Scalar::None) => {}
        Some(c) => s.conf = lossy(c.str("PYTORCH_CUDA_ALLOC_CONF")?).into_owned(),
    }
    if let Some(m) = f.max_split_size {
        s.max_split_size_bytes = match m {
            // PyTorch's "unlimited" (SIZE_MAX) appears as −1, or as SIZE_MAX itself.
            Scalar::Int(-1) | Scalar::UInt(u64::MAX) => None,
            Scalar::Int(i) if i < 0 => {
                return Err(fe("max_split_size", Problem::Negative("-1 or a size"), m));
            }
            Scalar::JsonFloat(_) => {
                return Err(fe("max_split_size", Problem::WrongType("-1 or a size"), m));
            }
            _ => Some(m.u64("max_split_size")?),
        };
    }
    if let Some(g) = f.garbage_collection_threshold {
        s.garbage_collection_threshold = g.f64("garbage_collection_threshold")?;
    }
    if let Some(e) = f.expandable_segments {
        s.expandable_segments = e.bool("expandable_segments")?;
    }
    if let Some(r) = roundup {
        s.roundup_power2_divisions = Some(divisions(r)?);
    }
    // Only displayed: a value of another shape is left out, never refused.
    if let Some(v) = trace_alloc_overflowed {
        s.trace_alloc_overflowed = v.read(|x| x.bool("").ok());
    }
    if let Some(v) = trace_alloc_max_entries {
        s.trace_alloc_max_entries = v.read(|x| x.u64("").ok());
    }
    for name in keys {
        if !KNOWN_SETTINGS.contains(&name.as_str()) && !s.other_keys.contains(&name) {
            s.other_keys.push(name);
        }
    }
    Ok(s)
}

/// `roundup_power2_divisions` as the 16-entry table (index = log2 of the key in MiB).
fn divisions<'a>(d: &Divisions<'a>) -> Result<[u32; 16], FieldError<'a>> {
    const KEY: &str = "roundup_power2_divisions";
    let mut table = [0u32; 16];
    let value = |x: Scalar<'a>| {
        let n = x.u64(KEY)?;
        u32::try_from(n).map_err(|_| fe(KEY, Problem::BadValue("a division count"), x))
    };
    match d {
        Divisions::Dict(pairs) => {
            for &(k, x) in pairs {
                // Unknown keys are ignored, like every other unknown key.
                let Some(mib) = k
                    .text()
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
        }
        Divisions::List(items) => {
            for (slot, &x) in table.iter_mut().zip(items) {
                *slot = value(x)?;
            }
        }
        Divisions::Not(found) => {
            return Err(fe(KEY, Problem::WrongType("a dict of divisions"), *found));
        }
    }
    Ok(table)
}

impl HostSegmentFields<Scalar<'_>> {
    /// What can be read of a host segment (host memory is only displayed: `None` skips it).
    pub(crate) fn host_segment(&self) -> Option<HostSegment> {
        let num = |v: Option<Scalar<'_>>| v.and_then(|x| x.u64("").ok());
        Some(HostSegment {
            address: num(self.address)?,
            total_size: num(self.total_size).or_else(|| num(self.size))?,
            allocated_size: num(self.allocated_size).unwrap_or(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Key;

    #[test]
    fn every_key_is_found_by_its_name_and_no_near_miss_is() {
        for &k in Key::ALL {
            let name = k.name();
            assert_eq!(
                Key::from_bytes(name),
                k,
                "{}",
                String::from_utf8_lossy(name)
            );
            // Same length, one byte changed anywhere (the middle of a key over 16 bytes,
            // which its first and last 8 bytes do not cover, included).
            for at in 0..name.len() {
                let mut other = name.to_vec();
                other[at] ^= 0x20;
                assert_eq!(Key::from_bytes(&other), Key::Other, "{other:?}");
            }
            // A byte more or less, at either end.
            assert_eq!(Key::from_bytes(&name[1..]), Key::Other);
            assert_eq!(Key::from_bytes(&name[..name.len() - 1]), Key::Other);
            assert_eq!(Key::from_bytes(&[name, b"_"].concat()), Key::Other);
            assert_eq!(Key::from_bytes(&[b"_", name].concat()), Key::Other);
        }
        assert_eq!(Key::from_bytes(b"compile_context"), Key::Other);
        assert_eq!(Key::from_bytes(b""), Key::Other);
    }
}
