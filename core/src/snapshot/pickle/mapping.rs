//! The schema pass: the pickled top-level value walked into the snapshot's schema
//! ([`crate::snapshot::schema`]), which makes the [`RawSnapshot`]. Only the walk over the
//! machine's containers is here; what each key means is the schema's.

use std::fmt::Display;

use super::fields::{Fields, pair, scalar, type_name};
use super::machine::{Res, Vm, schema_err};
use super::value::{Container, Kind, Seal, Text, Value};
use crate::snapshot::error::ImportError;
use crate::snapshot::schema::{
    self, BlockFields, Divisions, HostSegmentFields, Key, Loc, Parts, PerDevice, Scalar,
    SegmentFields, SettingsFields, Shape, entry_pool_id, lossy, segment_pool_id,
};
use crate::snapshot::{
    HostSegment, RawBlock, RawEvent, RawSegment, RawSettings, RawSnapshot, StackId,
};

/// A schema problem at `offset`.
#[allow(clippy::unnecessary_box_returns)] // boxed on purpose, see `Res`
fn err(offset: u64, loc: impl Display, problem: impl Display) -> Box<ImportError> {
    schema_err(offset, loc.to_string(), problem.to_string())
}

/// Input bytes each snapshot element (device, trace entry, segment, block, frame of a
/// stack read from a list) must be backed by, on average, beyond [`ELEMENT_SLACK`].
///
/// A pickle can reference one memoised object many times for a byte or two each (`GET`,
/// `DUP`): a list of 4,000 entries shared by 200,000 devices is 0.5 MB of pickle but
/// 800 M entries. Every element the schema pass produces is counted against the input's
/// size, so what the decoder builds stays proportional to the input however it shares.
/// `pickle.dump` writes every element as its own object of tens of bytes (a trace entry
/// is a dict of five or more keys); the corpus test `pickles_stay_far_within_the_element_budget` checks that
/// every real snapshot spends at least twice this per element — so they never come near it.
pub const BYTES_PER_ELEMENT: u64 = 8;
/// Elements any input may have, whatever its size (small hand-built files).
pub const ELEMENT_SLACK: u64 = 4096;

/// The most snapshot elements an input of `len` bytes may decode to.
pub(super) fn element_budget(len: usize) -> u64 {
    (len as u64 / BYTES_PER_ELEMENT).saturating_add(ELEMENT_SLACK)
}

/// A sequence as the schema pass reads it.
enum Seq {
    Items(u32, usize),
    Stack(StackId),
    Events(usize),
}

impl Vm<'_> {
    pub(super) fn type_name(&self, v: Value) -> &'static str {
        type_name(&self.heap, v)
    }

    fn scalar(&self, v: Value) -> Scalar<'_> {
        scalar(&self.text(), &self.heap, v)
    }

    /// Counts `n` elements produced at `loc` (object at `offset`) against the input's
    /// budget; an error once the input cannot justify them.
    fn spend(&mut self, n: usize, offset: u64, loc: Loc) -> Res<()> {
        match self.elements_left.checked_sub(n as u64) {
            Some(left) => {
                self.elements_left = left;
                Ok(())
            }
            None => Err(err(
                offset,
                loc,
                format!(
                    "the pickle's shared references expand to more than {} snapshot elements \
                     (devices, trace entries, segments, blocks, frames), more than its {} bytes \
                     justify at {BYTES_PER_ELEMENT} bytes each: one object referenced over and over",
                    element_budget(self.input_len),
                    self.input_len
                ),
            )),
        }
    }

    fn container(&self, v: Value) -> Option<&Container> {
        match v {
            Value::Obj(id) => self.heap.get(id as usize),
            _ => None,
        }
    }

    /// An unconverted dict: its id and offset.
    fn dict(&self, v: Value) -> Option<(u32, u64)> {
        match v {
            Value::Obj(id) => {
                let c = self.heap.get(id as usize)?;
                (c.kind == Kind::Dict && c.seal == Seal::Open).then_some((id, c.offset))
            }
            _ => None,
        }
    }

    /// A dict's keys as the schema names them, with their values (in file order).
    fn pairs(&self, dict: u32) -> impl Iterator<Item = (Key, Value)> + '_ {
        let text = self.text();
        let items = self.heap.get(dict as usize).map_or(&[][..], |c| &c.items);
        items.chunks_exact(2).filter_map(move |p| {
            let k = text.str_bytes(*p.first()?)?;
            Some((Key::from_bytes(k), *p.get(1)?))
        })
    }

    fn offset_of(&self, v: Value, fallback: u64) -> u64 {
        self.container(v).map_or(fallback, |c| c.offset)
    }

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

    /// The items of a sequence as scalars (settings values).
    fn scalars(&self, id: u32, n: usize) -> Vec<Scalar<'_>> {
        (0..n).map(|i| self.scalar(self.item(id, i))).collect()
    }

    /// A `frames` value of the object at `loc` (at `offset`) as a stack.
    fn stack_slow(&mut self, v: Option<Value>, offset: u64, loc: Loc) -> Res<StackId> {
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
                let problem = Shape::Frames.problem(self.scalar(v));
                return Err(err(self.offset_of(v, offset), loc, problem));
            }
        };
        let list_offset = self.offset_of(v, offset);
        self.spend(n, list_offset, loc)?;
        let mut ids = Vec::with_capacity(n);
        for k in 0..n {
            let item = self.item(id, k);
            let f = match item {
                Value::Frame(f) => f,
                _ if let Some(Seal::Frame(f)) = self.container(item).map(|c| c.seal) => f,
                _ => {
                    let Some((dict, off)) = self.dict(item) else {
                        let problem = Shape::Frame.problem(self.scalar(item));
                        return Err(err(list_offset, loc.frame(k), problem));
                    };
                    let text = Text {
                        data: self.data,
                        scratch: &self.scratch,
                    };
                    let heap = &self.heap[..];
                    let items = heap.get(dict as usize).map_or(&[][..], |c| &c.items);
                    let fields = Fields::collect(&text, items);
                    let frame = fields.frame.map(|&v| scalar(&text, heap, v));
                    self.builder
                        .frame(&frame)
                        .map_err(|e| err(off, loc.frame(k), e))?
                }
            };
            ids.push(f);
        }
        Ok(self.builder.frames.intern_stack(&ids))
    }

    fn event_slow(&mut self, v: Value, fallback: u64, loc: Loc) -> Res<RawEvent> {
        if let Value::Event(i) = v
            && let Some(ev) = self.extra_events.get(i as usize)
        {
            return Ok(*ev);
        }
        let Some((dict, off)) = self.dict(v) else {
            let problem = Shape::Entry.problem(self.scalar(v));
            return Err(err(self.offset_of(v, fallback), loc, problem));
        };
        let items = self.heap.get(dict as usize).map_or(&[][..], |c| &c.items);
        let fields = Fields::collect(&self.text(), items);
        let stack = self.stack_slow(fields.frames, off, loc)?;
        let text = Text {
            data: self.data,
            scratch: &self.scratch,
        };
        let heap = &self.heap[..];
        let event = fields.event.map(|&v| scalar(&text, heap, v));
        let pool = entry_pool_id(pair(&text, heap, fields.pool_id));
        self.builder
            .event(&event, stack, pool)
            .map_err(|e| err(off, loc, e))
    }

    fn traces(&mut self, v: Value, fallback: u64) -> Res<Vec<Vec<RawEvent>>> {
        let (id, n) = match self.seq(v) {
            Some(Seq::Items(id, n)) => (id, n),
            Some(Seq::Stack(StackId::EMPTY)) => return Ok(Vec::new()),
            _ => {
                let problem = Shape::Traces.problem(self.scalar(v));
                return Err(err(self.offset_of(v, fallback), Loc::DeviceTraces, problem));
            }
        };
        let outer_offset = self.offset_of(v, fallback);
        self.spend(n, outer_offset, Loc::DeviceTraces)?;
        let mut out = Vec::with_capacity(n);
        for d in 0..n {
            let inner = self.item(id, d);
            let mut events = match self.seq(inner) {
                Some(Seq::Events(k)) => {
                    let shared = self.container(inner).is_some_and(|c| c.shared);
                    let len = self.event_lists.get(k).map_or(0, Vec::len);
                    let inner_off = self.offset_of(inner, outer_offset);
                    self.spend(len, inner_off, Loc::Trace(d))?;
                    match self.event_lists.get_mut(k) {
                        Some(list) if shared => list.clone(),
                        Some(list) => std::mem::take(list),
                        None => Vec::new(),
                    }
                }
                Some(Seq::Stack(StackId::EMPTY)) => Vec::new(),
                Some(Seq::Items(inner_id, m)) => {
                    let inner_off = self.offset_of(inner, outer_offset);
                    self.spend(m, inner_off, Loc::Trace(d))?;
                    let mut events = Vec::with_capacity(m);
                    for i in 0..m {
                        let item = self.item(inner_id, i);
                        events.push(self.event_slow(item, inner_off, Loc::Entry(d, i))?);
                    }
                    events
                }
                _ => {
                    let problem = Shape::Trace.problem(self.scalar(inner));
                    let offset = self.offset_of(inner, outer_offset);
                    return Err(err(offset, Loc::Trace(d), problem));
                }
            };
            events.shrink_to_fit();
            out.push(events);
        }
        Ok(out)
    }

    fn segment(&mut self, v: Value, fallback: u64, index: usize) -> Res<RawSegment> {
        let loc = Loc::Segment(index);
        let Some((dict, off)) = self.dict(v) else {
            let problem = Shape::Segment.problem(self.scalar(v));
            return Err(err(self.offset_of(v, fallback), loc, problem));
        };
        let mut fields = SegmentFields::default();
        let (mut pool, mut frames, mut blocks) = (None, None, None);
        for (key, v) in self.pairs(dict) {
            match key {
                Key::SegmentPoolId => pool = Some(v),
                Key::Frames => frames = Some(v),
                Key::Blocks => blocks = Some(v),
                _ => {
                    fields.set(key, v);
                }
            }
        }
        let head = fields
            .map(|&v| self.scalar(v))
            .head()
            .map_err(|e| err(off, loc, e))?;
        let pool =
            segment_pool_id(pair(&self.text(), &self.heap, pool)).map_err(|e| err(off, loc, e))?;
        let stack = self.stack_slow(frames, off, loc)?;
        let blocks_value = blocks.ok_or_else(|| err(off, loc, schema::missing("blocks")))?;
        let blocks = self.blocks(blocks_value, off, index, head.address)?;
        Ok(head.segment(pool, stack, blocks))
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
                let problem = Shape::Blocks.problem(self.scalar(v));
                return Err(err(
                    self.offset_of(v, seg_offset),
                    Loc::Segment(seg),
                    problem,
                ));
            }
        };
        let list_offset = self.offset_of(v, seg_offset);
        self.spend(n, list_offset, Loc::Segment(seg))?;
        let mut blocks = Vec::with_capacity(n);
        let mut next_address = Some(seg_address);
        for i in 0..n {
            let item = self.item(id, i);
            let loc = Loc::Block(seg, i);
            let Some((dict, off)) = self.dict(item) else {
                let problem = Shape::Block.problem(self.scalar(item));
                return Err(err(list_offset, loc, problem));
            };
            let mut fields = BlockFields::default();
            let mut frames = None;
            for (key, v) in self.pairs(dict) {
                if key == Key::Frames {
                    frames = Some(v);
                } else {
                    fields.set(key, v);
                }
            }
            let mut block = fields
                .map(|&v| self.scalar(v))
                .block(&mut next_address)
                .map_err(|e| err(off, loc, e))?;
            block.stack = self.stack_slow(frames, off, loc)?;
            blocks.push(block);
        }
        Ok(blocks)
    }

    fn settings(&self, v: Value, fallback: u64) -> Res<RawSettings> {
        let Some((dict, off)) = self.dict(v) else {
            let problem = Shape::Settings.problem(self.scalar(v));
            return Err(err(self.offset_of(v, fallback), Loc::Settings, problem));
        };
        let mut fields = SettingsFields::default();
        let (mut roundup, mut overflowed, mut max_entries) = (None, None, None);
        for (key, v) in self.pairs(dict) {
            match key {
                Key::Roundup => roundup = Some(v),
                Key::TraceAllocOverflowed => overflowed = Some(v),
                Key::TraceAllocMaxEntries => max_entries = Some(v),
                _ => {
                    fields.set(key, v);
                }
            }
        }
        let roundup = roundup.map(|v| {
            if let Some((d, _)) = self.dict(v) {
                let items = self.heap.get(d as usize).map_or(&[][..], |c| &c.items);
                Divisions::Dict(
                    items
                        .chunks_exact(2)
                        .map(|p| (self.scalar(p[0]), self.scalar(p[1])))
                        .collect(),
                )
            } else if let Some(Seq::Items(id, n)) = self.seq(v) {
                Divisions::List(self.scalars(id, n))
            } else {
                Divisions::Not(self.scalar(v))
            }
        });
        let per_device = |v: Value| match self.seq(v) {
            Some(Seq::Items(id, n)) => PerDevice::List(self.scalars(id, n)),
            _ => PerDevice::One(self.scalar(v)),
        };
        let (overflowed, max_entries) = (overflowed.map(per_device), max_entries.map(per_device));
        let items = self.heap.get(dict as usize).map_or(&[][..], |c| &c.items);
        let text = self.text();
        let keys = items.chunks_exact(2).map(|p| {
            text.str_bytes(p[0])
                .map_or_else(|| self.scalar(p[0]).repr(), |b| lossy(b).into_owned())
        });
        schema::settings(
            &fields.map(|&v| self.scalar(v)),
            roundup.as_ref(),
            overflowed.as_ref(),
            max_entries.as_ref(),
            keys,
        )
        .map_err(|e| err(off, Loc::Settings, e))
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
                let mut fields = HostSegmentFields::default();
                for (key, v) in self.pairs(d) {
                    fields.set(key, v);
                }
                fields.map(|&v| self.scalar(v)).host_segment()
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
    fn host_traces(&mut self, v: Value) -> Res<(Vec<RawEvent>, u64)> {
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
                        let len = self.event_lists.get(k).map_or(0, Vec::len);
                        self.spend(len, self.offset_of(l, 0), Loc::HostTraces)?;
                        match self.event_lists.get_mut(k) {
                            Some(list) if shared => out.extend_from_slice(list),
                            Some(list) => out.append(list),
                            None => {}
                        }
                    }
                    Some(Seq::Items(id, n)) => {
                        self.spend(n, self.offset_of(l, 0), Loc::HostTraces)?;
                        for i in 0..n {
                            let item = self.item(id, i);
                            if matches!(self.seq(item), Some(Seq::Items(..) | Seq::Events(_))) {
                                nested.push(item);
                            } else if let Ok(ev) = self.event_slow(item, 0, Loc::HostTraces) {
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
        Ok((out, skipped))
    }

    pub(super) fn snapshot(mut self, root: Value, stop_at: usize) -> Res<RawSnapshot> {
        let stop = stop_at as u64;
        let root_offset = self.offset_of(root, stop);
        let (mut segments, mut traces, mut settings, mut host_segments, mut host_traces) =
            (None, None, None, None, None);
        if let Some((dict, off)) = self.dict(root) {
            for (key, v) in self.pairs(dict) {
                match key {
                    Key::Segments => segments = Some(v),
                    Key::DeviceTraces => traces = Some(v),
                    Key::AllocatorSettings => settings = Some(v),
                    Key::HostSegments => host_segments = Some(v),
                    Key::HostTraces => host_traces = Some(v),
                    _ => {}
                }
            }
            if segments.is_none() {
                return Err(err(off, Loc::Snapshot, schema::missing("segments")));
            }
        } else if matches!(self.seq(root), Some(Seq::Items(..))) {
            // The pre-2.1 `torch.cuda.memory_snapshot()` form: just the segment list.
            segments = Some(root);
        } else {
            let problem = Shape::Snapshot("pickle").problem(self.scalar(root));
            return Err(err(root_offset, Loc::Snapshot, problem));
        }
        let segments_value = segments.unwrap_or(Value::None);
        let (seg_id, n) = match self.seq(segments_value) {
            Some(Seq::Items(id, n)) => (id, n),
            Some(Seq::Stack(StackId::EMPTY)) => (0, 0),
            _ => {
                let problem = Shape::Segments.problem(self.scalar(segments_value));
                let offset = self.offset_of(segments_value, root_offset);
                return Err(err(offset, Loc::Segments, problem));
            }
        };
        let seg_offset = self.offset_of(segments_value, root_offset);
        self.spend(n, seg_offset, Loc::Segments)?;
        let mut parts = Parts {
            segments: Vec::with_capacity(n),
            ..Parts::default()
        };
        for i in 0..n {
            let item = self.item(seg_id, i);
            parts.segments.push(self.segment(item, seg_offset, i)?);
        }
        parts.device_traces = match traces {
            None | Some(Value::None) => Vec::new(),
            Some(t) => self.traces(t, root_offset)?,
        };
        parts.settings = match settings {
            None | Some(Value::None) => RawSettings::default(),
            Some(s) => self.settings(s, root_offset)?,
        };
        let (segs, seg_skipped) = host_segments.map_or((Vec::new(), 0), |v| self.host_segments(v));
        let (trace, trace_skipped) = match host_traces {
            Some(v) => self.host_traces(v)?,
            None => (Vec::new(), 0),
        };
        parts.host_segments = segs;
        parts.host_traces = trace;
        parts.host_items_skipped = seg_skipped + trace_skipped;
        Ok(std::mem::take(&mut self.builder).finish(parts))
    }
}
