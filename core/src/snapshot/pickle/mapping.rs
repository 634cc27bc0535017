//! Schema pass: the consumed top-level value into a [`RawSnapshot`].

use super::fields::{
    FieldError, Fields, Problem, as_bool, as_f64, as_str, as_u64, fe, lossy, missing,
};
use super::machine::{Res, Vm, schema_err};
use super::value::{Container, Kind, Seal, Text, Value};
use crate::snapshot::{
    BlockState, HostSegment, RawBlock, RawEvent, RawSegment, RawSettings, RawSnapshot, SegmentType,
    StackId,
};

impl Vm<'_> {
    pub(super) fn type_name(&self, v: Value) -> &'static str {
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
    pub(super) fn repr(&self, v: Value) -> String {
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

    pub(super) fn render(&self, e: FieldError) -> String {
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

    pub(super) fn container(&self, v: Value) -> Option<&Container> {
        match v {
            Value::Obj(id) => self.heap.get(id as usize),
            _ => None,
        }
    }

    /// The pairs of an unconverted dict.
    pub(super) fn dict(&self, v: Value) -> Option<(u32, u64)> {
        match v {
            Value::Obj(id) => {
                let c = self.heap.get(id as usize)?;
                (c.kind == Kind::Dict && c.seal == Seal::Open).then_some((id, c.offset))
            }
            _ => None,
        }
    }

    /// `dict[key]` (the last one written wins, as in Python).
    pub(super) fn field(&self, dict: u32, key: &[u8]) -> Option<Value> {
        let c = self.heap.get(dict as usize)?;
        let text = self.text();
        c.items
            .chunks_exact(2)
            .rev()
            .find(|p| p.first().and_then(|&k| text.str_bytes(k)) == Some(key))
            .and_then(|p| p.get(1).copied())
    }

    pub(super) fn offset_of(&self, v: Value, fallback: u64) -> u64 {
        self.container(v).map_or(fallback, |c| c.offset)
    }
}
/// A sequence as the schema pass reads it.
pub(super) enum Seq {
    Items(u32, usize),
    Stack(StackId),
    Events(usize),
}

impl Vm<'_> {
    pub(super) fn seq(&self, v: Value) -> Option<Seq> {
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

    pub(super) fn item(&self, id: u32, i: usize) -> Value {
        self.heap
            .get(id as usize)
            .and_then(|c| c.items.get(i).copied())
            .unwrap_or(Value::None)
    }

    pub(super) fn stack_slow(
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

    pub(super) fn event_slow(
        &mut self,
        v: Value,
        fallback: u64,
        loc: &dyn Fn() -> String,
    ) -> Res<RawEvent> {
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

    pub(super) fn traces(&mut self, v: Value, fallback: u64) -> Res<Vec<Vec<RawEvent>>> {
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

    pub(super) fn segment(&mut self, v: Value, fallback: u64, index: usize) -> Res<RawSegment> {
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

    pub(super) fn pool_id(&self, v: Value) -> Result<(u64, u64), FieldError> {
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

    pub(super) fn blocks(
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

    pub(super) fn settings(&self, v: Value, fallback: u64) -> Res<RawSettings> {
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
    pub(super) fn per_device<T>(&self, v: Value, read: impl Fn(Value) -> Option<T>) -> Vec<T> {
        match self.seq(v) {
            Some(Seq::Items(id, n)) => (0..n).filter_map(|i| read(self.item(id, i))).collect(),
            _ => read(v).into_iter().collect(),
        }
    }

    /// `host_segments`: what can be read of each segment; the number skipped.
    pub(super) fn host_segments(&self, v: Value) -> (Vec<HostSegment>, u64) {
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
    pub(super) fn host_traces(&mut self, v: Value) -> (Vec<RawEvent>, u64) {
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
    pub(super) fn roundup(&self, v: Value) -> Result<[u32; 16], FieldError> {
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

    pub(super) fn snapshot(mut self, root: Value, stop_at: usize) -> Res<RawSnapshot> {
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
