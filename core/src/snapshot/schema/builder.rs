//! The builder: the tables a snapshot is built with while a decoder reads it (frames,
//! stacks and strings, the entries' pool ids, each interned once), and the parts of the
//! snapshot the walk produced.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::snapshot::schema::{EventFields, FieldError, FrameFields, Scalar, lossy, missing};
use crate::snapshot::{
    Action, Frame, FrameId, FrameTable, FxInfo, HostSegment, OtherAction, RawEvent, RawSegment,
    RawSettings, RawSnapshot, StackId, StrId,
};

/// The tables a snapshot is built with while it is read: frames, stacks and strings, and
/// the entries' pool ids, each interned once.
#[derive(Debug, Default)]
pub(crate) struct Builder {
    pub(crate) frames: FrameTable,
    /// The distinct `pool_id`s of trace entries ([`RawEvent::pool`] − 1 indexes it).
    pools: Vec<(u64, u64)>,
    pool_index: HashMap<(u64, u64), u32>,
}

/// The parts of a snapshot the decoder's walk produced.
#[derive(Debug, Default)]
pub(crate) struct Parts {
    pub(crate) segments: Vec<RawSegment>,
    pub(crate) device_traces: Vec<Vec<RawEvent>>,
    pub(crate) settings: RawSettings,
    pub(crate) host_segments: Vec<HostSegment>,
    pub(crate) host_traces: Vec<RawEvent>,
    pub(crate) host_items_skipped: u64,
}

impl Builder {
    /// A trace entry with its stack and `pool_id`. Allocator actions need a place (`addr`,
    /// or `device_free` for `oom`) and a size; `snapshot` and other entries may lack them.
    pub(crate) fn event<'a>(
        &mut self,
        f: &EventFields<Scalar<'a>>,
        stack: StackId,
        pool: Option<(u64, u64)>,
    ) -> Result<RawEvent, FieldError<'a>> {
        let action_text = f.action.ok_or(missing("action"))?.str("action")?;
        let action = Action::from_bytes(action_text);
        let other = if action == Action::Other {
            OtherAction::from_bytes(action_text)
        } else {
            OtherAction::Plain
        };
        let needs_place = !matches!(action, Action::Snapshot | Action::Other);
        let (addr_key, addr) = match (action, f.device_free) {
            (Action::Oom, Some(v)) => ("device_free", Some(v)),
            (Action::Oom, None) if f.addr.is_none() => ("device_free", None),
            _ => ("addr", f.addr),
        };
        let addr = match addr {
            Some(v) => v.u64(addr_key)?,
            None if needs_place => return Err(missing(addr_key)),
            None => 0,
        };
        let size = match f.size {
            Some(v) => v.u64("size")?,
            None if needs_place => return Err(missing("size")),
            None => 0,
        };
        let stream = f.stream.map_or(Ok(0), |v| v.u64("stream"))?;
        let time_us = f.time_us.map_or(Ok(0), |v| v.i64("time_us"))?;
        // `user_metadata` (a note) and `pool_id` are only displayed and counted.
        let user_metadata = match f.user_metadata.and_then(Scalar::text) {
            Some(b) if !b.is_empty() => self.frames.intern_str(&lossy(b)),
            _ => StrId::EMPTY,
        };
        Ok(RawEvent {
            action,
            other,
            addr,
            size,
            stream,
            time_us,
            stack,
            pool: pool.map_or(0, |p| self.intern_pool(p)),
            user_metadata,
        })
    }

    /// The distinct `pool_id`s of trace entries so far.
    pub(crate) fn pools(&self) -> &[(u64, u64)] {
        &self.pools
    }

    pub(crate) fn intern_pool(&mut self, pool: (u64, u64)) -> u32 {
        if let Some(&i) = self.pool_index.get(&pool) {
            return i;
        }
        self.pools.push(pool);
        let i = u32::try_from(self.pools.len()).unwrap_or(u32::MAX);
        self.pool_index.insert(pool, i);
        i
    }

    /// A stack frame; its `line` and FX fields are only displayed, so any value is kept.
    pub(crate) fn frame<'a>(
        &mut self,
        f: &FrameFields<Scalar<'a>>,
    ) -> Result<FrameId, FieldError<'a>> {
        let name = f.name.ok_or(missing("name"))?.str("name")?;
        let filename = f.filename.ok_or(missing("filename"))?.str("filename")?;
        let (line, line_text) = self.frame_line(f.line);
        let table = &mut self.frames;
        let name = table.intern_str(&lossy(name));
        let filename = table.intern_str(&lossy(filename));
        let mut fx_str = |v: Option<Scalar<'_>>| match v.and_then(Scalar::text) {
            Some(b) => table.intern_str(&lossy(b)),
            None => StrId::EMPTY,
        };
        let fx = FxInfo {
            node_op: fx_str(f.fx_node_op),
            node_name: fx_str(f.fx_node_name),
            node_target: fx_str(f.fx_node_target),
            original_trace: fx_str(f.fx_original_trace),
            node_info: fx_str(f.fx_node_info),
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

    /// A frame's `line` as [`Frame::line`] and [`Frame::line_text`]: what fits an `i64` as a
    /// number, any other value as the file's text.
    fn frame_line(&mut self, v: Option<Scalar<'_>>) -> (i64, Option<StrId>) {
        let line_text = match v {
            Some(Scalar::Int(i)) if i != Frame::LINE_UNKNOWN => return (i, None),
            Some(Scalar::Int(i)) => i.to_string(),
            Some(Scalar::UInt(u)) => u.to_string(),
            Some(Scalar::BigInt(bytes)) => le_to_decimal(bytes),
            Some(Scalar::Bool(b)) => if b { "True" } else { "False" }.to_owned(),
            Some(Scalar::Float(f)) => format!("{f:?}"),
            // JSON integers wider than 64 bits arrive as floats.
            Some(Scalar::JsonFloat(f)) if f.fract() == 0.0 && f.is_finite() => format!("{f:.0}"),
            Some(Scalar::JsonFloat(f)) => f.to_string(),
            Some(Scalar::Str(b)) => lossy(b).into_owned(),
            // None, absent, or a container.
            Some(Scalar::None | Scalar::Other(_)) | None => return (Frame::LINE_UNKNOWN, None),
        };
        (
            Frame::LINE_UNKNOWN,
            Some(self.frames.intern_str(&line_text)),
        )
    }

    /// The snapshot.
    pub(crate) fn finish(mut self, parts: Parts) -> RawSnapshot {
        self.frames.finish();
        RawSnapshot {
            segments: parts.segments,
            device_traces: parts.device_traces,
            settings: parts.settings,
            frames: self.frames,
            event_pools: self.pools,
            host_segments: parts.host_segments,
            host_traces: parts.host_traces,
            host_items_skipped: parts.host_items_skipped,
        }
    }
}

/// Little-endian two's complement bytes as decimal text (any width).
pub(crate) fn le_to_decimal(bytes: &[u8]) -> String {
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
