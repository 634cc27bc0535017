//! Field extraction (shared by the fast path, which drops the error, and the schema pass,
//! which reports it).

use std::collections::HashMap;

use super::ints::le_to_decimal;
use super::value::{Container, Kind, Text, Value};
use crate::snapshot::{
    Action, Frame, FrameId, FrameTable, FxInfo, OtherAction, RawEvent, StackId, StrId,
};

#[derive(Debug, Clone, Copy)]
pub(super) enum Problem {
    Missing,
    WrongType(&'static str),
    Negative(&'static str),
    TooWide,
    BadValue(&'static str),
}

#[derive(Debug, Clone, Copy)]
pub(super) struct FieldError {
    pub(super) key: &'static str,
    pub(super) problem: Problem,
    pub(super) found: Value,
}

pub(super) fn fe(key: &'static str, problem: Problem, found: Value) -> FieldError {
    FieldError {
        key,
        problem,
        found,
    }
}

pub(super) fn missing(key: &'static str) -> FieldError {
    fe(key, Problem::Missing, Value::None)
}

pub(super) const UNSIGNED: &str = "an unsigned integer";

pub(super) fn as_u64(v: Value, key: &'static str) -> Result<u64, FieldError> {
    match v {
        Value::Int(i) => u64::try_from(i).map_err(|_| fe(key, Problem::Negative(UNSIGNED), v)),
        Value::UInt(u) => Ok(u),
        Value::BigInt { .. } => Err(fe(key, Problem::TooWide, v)),
        _ => Err(fe(key, Problem::WrongType(UNSIGNED), v)),
    }
}

pub(super) fn as_i64(v: Value, key: &'static str) -> Result<i64, FieldError> {
    match v {
        Value::Int(i) => Ok(i),
        Value::UInt(_) | Value::BigInt { .. } => Err(fe(key, Problem::TooWide, v)),
        _ => Err(fe(key, Problem::WrongType("an integer"), v)),
    }
}

pub(super) fn as_bool(v: Value, key: &'static str) -> Result<bool, FieldError> {
    match v {
        Value::Bool(b) => Ok(b),
        // Protocol 0/1 and some writers use 0/1.
        Value::Int(0) => Ok(false),
        Value::Int(1) => Ok(true),
        _ => Err(fe(key, Problem::WrongType("a bool"), v)),
    }
}

pub(super) fn as_f64(v: Value, key: &'static str) -> Result<f64, FieldError> {
    match v {
        Value::Float(f) => Ok(f),
        Value::Int(i) => Ok(i as f64),
        Value::UInt(u) => Ok(u as f64),
        _ => Err(fe(key, Problem::WrongType("a number"), v)),
    }
}

pub(super) fn as_str<'s>(
    text: &Text<'s>,
    v: Value,
    key: &'static str,
) -> Result<&'s [u8], FieldError> {
    text.str_bytes(v)
        .ok_or_else(|| fe(key, Problem::WrongType("a string"), v))
}

pub(super) fn lossy(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

/// The keys of trace entries and frames, read in one pass over a dict (last one wins,
/// as in a Python dict).
#[derive(Default)]
pub(super) struct Fields {
    pub(super) action: Option<Value>,
    pub(super) addr: Option<Value>,
    pub(super) device_free: Option<Value>,
    pub(super) size: Option<Value>,
    pub(super) stream: Option<Value>,
    pub(super) time_us: Option<Value>,
    pub(super) frames: Option<Value>,
    pub(super) name: Option<Value>,
    pub(super) filename: Option<Value>,
    pub(super) line: Option<Value>,
    pub(super) pool_id: Option<Value>,
    pub(super) user_metadata: Option<Value>,
    pub(super) fx_node_op: Option<Value>,
    pub(super) fx_node_name: Option<Value>,
    pub(super) fx_node_target: Option<Value>,
    pub(super) fx_original_trace: Option<Value>,
    pub(super) fx_node_info: Option<Value>,
}

impl Fields {
    pub(super) fn collect(text: &Text<'_>, pairs: &[Value]) -> Fields {
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

    pub(super) fn is_event(&self) -> bool {
        self.action.is_some()
    }

    pub(super) fn is_frame(&self) -> bool {
        self.action.is_none()
            && self.name.is_some()
            && self.filename.is_some()
            && self.line.is_some()
    }

    pub(super) fn event(&self, text: &Text<'_>, stack: StackId) -> Result<RawEvent, FieldError> {
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
    pub(super) fn event_extras(
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

    pub(super) fn frame(
        &self,
        text: &Text<'_>,
        table: &mut FrameTable,
    ) -> Result<FrameId, FieldError> {
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
pub(super) struct PoolTable {
    pub(super) pools: Vec<(u64, u64)>,
    pub(super) index: HashMap<(u64, u64), u32>,
}

impl PoolTable {
    pub(super) fn intern(&mut self, pool: (u64, u64)) -> u32 {
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
pub(super) fn frame_line(
    text: &Text<'_>,
    v: Option<Value>,
    table: &mut FrameTable,
) -> (i64, Option<StrId>) {
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
