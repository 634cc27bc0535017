//! A built [`Trace`] as flat little-endian bytes of our own (versioned), for a process
//! that replays it without decoding the snapshot again: the browser's search workers get
//! the trace the engine's worker built instead of the file.
//!
//! It holds what a replay needs: the settings and, per device, its ops, start state,
//! recorded segment events, event count and `initial_ops`. Not the frame table, the
//! markers, the inferences nor the capacity evidence (a decoded trace has them empty):
//! replays, `whatif`'s sweep and its sizes never read them.
//!
//! Layout: `ASTR`, version (u32), the settings, the number of device traces (u32), the
//! devices (u32 count, then each); counts are u32 or u64, strings a u32 length and UTF-8,
//! `Option`s a 0/1 byte first. A decode error names the byte offset it stopped at.

use super::{DeviceTrace, Op, OpKind, PoolId, PoolTable, StartBlock, StartSegment, Trace};
use crate::snapshot::{Action, OtherAction, RawEvent, RawSettings, StackId, StrId};

/// The first bytes of an encoded trace.
pub const MAGIC: &[u8; 4] = b"ASTR";
/// The version [`encode`] writes and [`decode`] reads.
pub const VERSION: u32 = 1;

/// Bytes that are not an encoded trace: where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("encoded trace, byte {offset}: {message}")]
pub struct BinaryError {
    pub offset: usize,
    pub message: String,
}

const ACTIONS: [Action; 10] = [
    Action::Alloc,
    Action::FreeRequested,
    Action::FreeCompleted,
    Action::SegmentAlloc,
    Action::SegmentFree,
    Action::SegmentMap,
    Action::SegmentUnmap,
    Action::Oom,
    Action::Snapshot,
    Action::Other,
];
const OTHERS: [OtherAction; 4] = [
    OtherAction::Plain,
    OtherAction::Annotate,
    OtherAction::UserDefined,
    OtherAction::Unknown,
];

const ALLOC: u8 = 0;
const FREE: u8 = 1;
const COMPLETE_FREE: u8 = 2;
const EMPTY_CACHE: u8 = 3;
const RELEASE_POOL: u8 = 4;

/// The fewest bytes an op, a start segment, a block and a segment event take: a count
/// larger than the bytes left could hold is refused before anything is reserved.
const MIN_OP: usize = 25;
const MIN_SEGMENT: usize = 45;
const MIN_BLOCK: usize = 25;
const SEGMENT_EVENT: usize = 46;

/// `trace` as bytes ([`decode`] reads them back).
#[must_use]
pub fn encode(trace: &Trace) -> Vec<u8> {
    let ops: usize = trace.devices.iter().map(|d| d.ops.len()).sum();
    let mut out = Vec::with_capacity(64 + ops * 45);
    encode_into(trace, &mut |piece| out.extend_from_slice(piece));
    out
}

/// [`encode`]'s bytes handed to `put` in pieces of at most [`PIECE`] bytes, in order, never
/// all held: a host writes them where they go (the browser's engine worker straight into
/// the JS array it posts, not a copy of the whole trace in its wasm memory).
pub fn encode_into(trace: &Trace, put: &mut dyn FnMut(&[u8])) {
    let mut w = Writer {
        buf: Vec::with_capacity(PIECE),
        put,
    };
    w.bytes(MAGIC);
    w.u32(VERSION);
    settings(&mut w, &trace.snapshot.settings);
    w.len(trace.snapshot.device_traces);
    w.len(trace.devices.len());
    for d in &trace.devices {
        device(&mut w, d);
    }
    w.flush();
}

/// The length of [`encode`]'s bytes (an encode that keeps none of them).
#[must_use]
pub fn encoded_len(trace: &Trace) -> usize {
    let mut n = 0;
    encode_into(trace, &mut |piece| n += piece.len());
    n
}

/// The largest piece [`encode_into`] hands on.
pub const PIECE: usize = 64 << 10;

/// The trace [`encode`] wrote into `bytes`.
///
/// # Errors
/// [`BinaryError`] (its byte offset) for bytes that are not one: another magic or
/// version, a value out of range, a free of an op that is not an earlier alloc, or bytes
/// missing or left over.
pub fn decode(bytes: &[u8]) -> Result<Trace, BinaryError> {
    let mut r = Reader { bytes, at: 0 };
    if r.take(4)? != MAGIC {
        return Err(error(0, "not an encoded trace"));
    }
    let version = r.u32()?;
    if version != VERSION {
        return Err(error(4, &format!("version {version}, not {VERSION}")));
    }
    let mut trace = Trace::default();
    trace.snapshot.settings = read_settings(&mut r)?;
    trace.snapshot.device_traces = r.u32()? as usize;
    let n = r.count(4 + 16 + 4 + 8)?;
    trace.devices = (0..n)
        .map(|_| read_device(&mut r))
        .collect::<Result<_, _>>()?;
    if r.at != bytes.len() {
        return Err(error(r.at, "bytes after the trace"));
    }
    Ok(trace)
}

struct Writer<'a> {
    buf: Vec<u8>,
    put: &'a mut dyn FnMut(&[u8]),
}

impl Writer<'_> {
    fn bytes(&mut self, b: &[u8]) {
        if self.buf.len() + b.len() > PIECE {
            self.flush();
        }
        self.buf.extend_from_slice(b);
    }
    fn flush(&mut self) {
        if !self.buf.is_empty() {
            (self.put)(&self.buf);
            self.buf.clear();
        }
    }
    fn u8(&mut self, v: u8) {
        self.bytes(&[v]);
    }
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    fn len(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }
    fn str(&mut self, s: &str) {
        self.len(s.len());
        self.bytes(s.as_bytes());
    }
}

fn settings(w: &mut Writer<'_>, s: &RawSettings) {
    w.str(&s.conf);
    w.u8(u8::from(s.max_split_size_bytes.is_some()));
    w.u64(s.max_split_size_bytes.unwrap_or(0));
    w.u64(s.garbage_collection_threshold.to_bits());
    w.u8(u8::from(s.expandable_segments));
    w.u8(u8::from(s.roundup_power2_divisions.is_some()));
    for d in s.roundup_power2_divisions.unwrap_or_default() {
        w.u32(d);
    }
    w.u8(u8::from(s.present));
    w.len(s.trace_alloc_overflowed.len());
    for o in &s.trace_alloc_overflowed {
        w.u8(u8::from(*o));
    }
    w.len(s.trace_alloc_max_entries.len());
    for m in &s.trace_alloc_max_entries {
        w.u64(*m);
    }
    w.len(s.other_keys.len());
    for k in &s.other_keys {
        w.str(k);
    }
}

fn device(w: &mut Writer<'_>, d: &DeviceTrace) {
    w.u32(d.device);
    w.u64(d.events as u64);
    w.u64(d.initial_ops as u64);
    w.u64(d.ops.len() as u64);
    for op in &d.ops {
        let (tag, alloc) = match op.kind {
            OpKind::Alloc { .. } => (ALLOC, 0),
            OpKind::Free { alloc, .. } => (FREE, alloc),
            OpKind::CompleteFree { alloc } => (COMPLETE_FREE, alloc),
            OpKind::EmptyCache => (EMPTY_CACHE, 0),
            OpKind::ReleasePool { .. } => (RELEASE_POOL, 0),
        };
        w.u8(tag);
        w.u32(op.event_index);
        w.u64(op.recorded_addr);
        w.u32(op.stack.0);
        w.u64(op.time_us.cast_unsigned());
        match op.kind {
            OpKind::Alloc {
                size_bytes,
                stream,
                pool,
                recorded_oom,
                restored,
            } => {
                let pool = d.pool(pool);
                w.u64(size_bytes);
                w.u64(stream);
                w.u64(pool.0);
                w.u64(pool.1);
                w.u8(u8::from(recorded_oom) | u8::from(restored) << 1);
            }
            OpKind::Free { deferred, .. } => {
                w.u32(alloc);
                w.u8(u8::from(deferred));
            }
            OpKind::CompleteFree { .. } => w.u32(alloc),
            OpKind::EmptyCache => {}
            OpKind::ReleasePool { pool } => {
                w.u64(pool.0);
                w.u64(pool.1);
            }
        }
    }
    w.len(d.start.len());
    for s in &d.start {
        w.u64(s.addr);
        w.u64(s.size_bytes);
        w.u64(s.stream);
        w.u64(s.pool.0);
        w.u64(s.pool.1);
        w.u8(u8::from(s.small) | u8::from(s.expandable) << 1);
        w.len(s.blocks.len());
        for b in &s.blocks {
            w.u64(b.addr);
            w.u64(b.size_bytes);
            w.u64(b.requested_bytes);
            w.u8(u8::from(b.pending));
        }
    }
    w.u64(d.segment_events.len() as u64);
    for e in &d.segment_events {
        let index = |found: Option<usize>| u8::try_from(found.unwrap_or(0)).unwrap_or(0);
        w.u8(index(ACTIONS.iter().position(|a| *a == e.action)));
        w.u8(index(OTHERS.iter().position(|o| *o == e.other)));
        w.u64(e.addr);
        w.u64(e.size);
        w.u64(e.stream);
        w.u64(e.time_us.cast_unsigned());
        w.u32(e.stack.0);
        w.u32(e.pool);
        w.u32(e.user_metadata.0);
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

fn error(offset: usize, message: &str) -> BinaryError {
    BinaryError {
        offset,
        message: message.to_string(),
    }
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], BinaryError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.bytes.len())
            .ok_or_else(|| error(self.at, &format!("{n} bytes missing")))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], BinaryError> {
        let s = self.take(N)?;
        Ok(<[u8; N]>::try_from(s).unwrap_or([0; N]))
    }

    fn u8(&mut self) -> Result<u8, BinaryError> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, BinaryError> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, BinaryError> {
        self.array().map(u64::from_le_bytes)
    }

    fn flag(&mut self) -> Result<bool, BinaryError> {
        let at = self.at;
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(error(at, &format!("{v} is not a flag (0 or 1)"))),
        }
    }

    /// A u32 count of items of at least `each` bytes (no more than the bytes left hold).
    fn count(&mut self, each: usize) -> Result<usize, BinaryError> {
        let at = self.at;
        let n = self.u32()? as usize;
        self.fits(at, n, each)
    }

    /// A u64 count, as [`Reader::count`].
    fn count64(&mut self, each: usize) -> Result<usize, BinaryError> {
        let at = self.at;
        let n = usize::try_from(self.u64()?).unwrap_or(usize::MAX);
        self.fits(at, n, each)
    }

    fn fits(&self, at: usize, n: usize, each: usize) -> Result<usize, BinaryError> {
        if n.saturating_mul(each) > self.bytes.len() - self.at {
            return Err(error(at, &format!("a count of {n} past the end")));
        }
        Ok(n)
    }

    fn str(&mut self) -> Result<String, BinaryError> {
        let n = self.count(1)?;
        let at = self.at;
        let s = self.take(n)?;
        String::from_utf8(s.to_vec()).map_err(|_| error(at, "a string not in UTF-8"))
    }

    fn pool(&mut self) -> Result<PoolId, BinaryError> {
        Ok(PoolId(self.u64()?, self.u64()?))
    }

    /// A byte that indexes `table`.
    fn pick<T: Copy>(&mut self, table: &[T], what: &str) -> Result<T, BinaryError> {
        let at = self.at;
        let v = self.u8()?;
        table
            .get(usize::from(v))
            .copied()
            .ok_or_else(|| error(at, &format!("{v} is not {what}")))
    }
}

fn read_settings(r: &mut Reader) -> Result<RawSettings, BinaryError> {
    let conf = r.str()?;
    let has_max = r.flag()?;
    let max = r.u64()?;
    let gc = f64::from_bits(r.u64()?);
    let expandable = r.flag()?;
    let has_divisions = r.flag()?;
    let mut divisions = [0u32; 16];
    for d in &mut divisions {
        *d = r.u32()?;
    }
    let present = r.flag()?;
    let n = r.count(1)?;
    let overflowed = (0..n).map(|_| r.flag()).collect::<Result<_, _>>()?;
    let n = r.count(8)?;
    let max_entries = (0..n).map(|_| r.u64()).collect::<Result<_, _>>()?;
    let n = r.count(4)?;
    let other_keys = (0..n).map(|_| r.str()).collect::<Result<_, _>>()?;
    Ok(RawSettings {
        conf,
        max_split_size_bytes: has_max.then_some(max),
        garbage_collection_threshold: gc,
        expandable_segments: expandable,
        roundup_power2_divisions: has_divisions.then_some(divisions),
        present,
        trace_alloc_overflowed: overflowed,
        trace_alloc_max_entries: max_entries,
        other_keys,
    })
}

fn read_device(r: &mut Reader) -> Result<DeviceTrace, BinaryError> {
    let device = r.u32()?;
    let events = usize::try_from(r.u64()?).unwrap_or(usize::MAX);
    let at = r.at;
    let initial_ops = usize::try_from(r.u64()?).unwrap_or(usize::MAX);
    let n = r.count64(MIN_OP)?;
    if initial_ops > n {
        return Err(error(at, &format!("{initial_ops} initial ops of {n}")));
    }
    let mut ops: Vec<Op> = Vec::with_capacity(n);
    let mut pools = PoolTable::default();
    for i in 0..n {
        ops.push(read_op(r, &ops, &mut pools, i)?);
    }
    let n = r.count(MIN_SEGMENT)?;
    let mut start = Vec::with_capacity(n);
    for _ in 0..n {
        let (addr, size_bytes, stream, pool) = (r.u64()?, r.u64()?, r.u64()?, r.pool()?);
        let at = r.at;
        let flags = r.u8()?;
        if flags > 3 {
            return Err(error(at, &format!("segment flags {flags}")));
        }
        let m = r.count(MIN_BLOCK)?;
        let mut blocks = Vec::with_capacity(m);
        for _ in 0..m {
            blocks.push(StartBlock {
                addr: r.u64()?,
                size_bytes: r.u64()?,
                requested_bytes: r.u64()?,
                pending: r.flag()?,
            });
        }
        start.push(StartSegment {
            addr,
            size_bytes,
            stream,
            pool,
            small: flags & 1 != 0,
            expandable: flags & 2 != 0,
            blocks,
        });
    }
    let n = r.count64(SEGMENT_EVENT)?;
    let mut segment_events = Vec::with_capacity(n);
    for _ in 0..n {
        segment_events.push(RawEvent {
            action: r.pick(&ACTIONS, "an action")?,
            other: r.pick(&OTHERS, "a kind of other action")?,
            addr: r.u64()?,
            size: r.u64()?,
            stream: r.u64()?,
            time_us: r.u64()?.cast_signed(),
            stack: StackId(r.u32()?),
            pool: r.u32()?,
            user_metadata: StrId(r.u32()?),
        });
    }
    Ok(DeviceTrace {
        device,
        ops,
        pools: pools.into_ids(),
        start,
        inferred: Vec::new(),
        events,
        initial_ops,
        segment_events,
        capacity: super::evidence::CapacityEvidence::default(),
    })
}

/// Op `index`, after `before`: a free refers to an earlier alloc.
fn read_op(
    r: &mut Reader,
    before: &[Op],
    pools: &mut PoolTable,
    index: usize,
) -> Result<Op, BinaryError> {
    let at = r.at;
    let tag = r.u8()?;
    let event_index = r.u32()?;
    let recorded_addr = r.u64()?;
    let stack = StackId(r.u32()?);
    let time_us = r.u64()?.cast_signed();
    let alloc_of = |r: &mut Reader| -> Result<u32, BinaryError> {
        let at = r.at;
        let alloc = r.u32()?;
        match before.get(alloc as usize) {
            Some(op) if op.is_alloc() => Ok(alloc),
            _ => Err(error(
                at,
                &format!("op {index} frees op {alloc}, not an earlier alloc"),
            )),
        }
    };
    let kind = match tag {
        ALLOC => {
            let (size_bytes, stream, pool) = (r.u64()?, r.u64()?, r.pool()?);
            let at = r.at;
            let flags = r.u8()?;
            if flags > 3 {
                return Err(error(at, &format!("alloc flags {flags}")));
            }
            OpKind::Alloc {
                size_bytes,
                stream,
                pool: pools.intern(pool),
                recorded_oom: flags & 1 != 0,
                restored: flags & 2 != 0,
            }
        }
        FREE => OpKind::Free {
            alloc: alloc_of(r)?,
            deferred: r.flag()?,
        },
        COMPLETE_FREE => OpKind::CompleteFree {
            alloc: alloc_of(r)?,
        },
        EMPTY_CACHE => OpKind::EmptyCache,
        RELEASE_POOL => OpKind::ReleasePool { pool: r.pool()? },
        t => return Err(error(at, &format!("op {index}: {t} is not a kind of op"))),
    };
    Ok(Op {
        kind,
        event_index,
        recorded_addr,
        stack,
        time_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::PoolIx;

    fn tiny() -> Trace {
        let mut t = Trace::default();
        t.snapshot.settings.conf = "expandable_segments:True".into();
        t.snapshot.settings.roundup_power2_divisions = Some([4; 16]);
        t.snapshot.device_traces = 1;
        let alloc = |size_bytes| Op {
            kind: OpKind::Alloc {
                size_bytes,
                stream: 7,
                pool: PoolIx(1),
                recorded_oom: false,
                restored: true,
            },
            event_index: 0,
            recorded_addr: 1 << 30,
            stack: StackId(3),
            time_us: -5,
        };
        let mut free = alloc(0);
        free.kind = OpKind::Free {
            alloc: 0,
            deferred: true,
        };
        t.devices.push(DeviceTrace {
            device: 2,
            ops: vec![alloc(512), free],
            pools: vec![PoolId(1, 2)],
            events: 9,
            ..DeviceTrace::default()
        });
        t
    }

    #[test]
    fn a_trace_reads_back_as_written() {
        let t = tiny();
        let bytes = encode(&t);
        let back = decode(&bytes).expect("decodes");
        assert_eq!(back.devices[0].ops, t.devices[0].ops);
        assert_eq!(back.devices[0].pools, [PoolId(1, 2)]);
        assert_eq!(back.snapshot.settings, t.snapshot.settings);
        assert_eq!(encode(&back), bytes);
    }

    /// A trace of many pieces: each at most [`PIECE`] bytes, their length [`encoded_len`],
    /// and together a trace that reads back as the one written.
    #[test]
    fn a_trace_written_in_pieces_reads_back() {
        let mut t = tiny();
        let ops = t.devices[0].ops.clone();
        for k in 0..20_000u32 {
            let mut pair = ops.clone();
            pair[0].event_index = k;
            pair[1].kind = OpKind::Free {
                alloc: 2 * k,
                deferred: k % 2 == 0,
            };
            t.devices[0].ops.extend(pair);
        }
        t.devices[0].ops.drain(..2);
        let mut pieces = Vec::new();
        encode_into(&t, &mut |p| pieces.push(p.to_vec()));
        assert!(pieces.len() > 5, "{} pieces", pieces.len());
        assert!(pieces.iter().all(|p| !p.is_empty() && p.len() <= PIECE));
        let bytes = pieces.concat();
        assert_eq!(encoded_len(&t), bytes.len());
        let back = decode(&bytes).expect("decodes");
        assert_eq!(back.devices[0].ops, t.devices[0].ops);
        assert_eq!(back.snapshot.settings, t.snapshot.settings);
    }

    #[test]
    fn bad_bytes_name_the_offset() {
        let bytes = encode(&tiny());
        let e = decode(&bytes[..bytes.len() - 3]).expect_err("cut short");
        assert!(
            e.offset <= bytes.len() && e.to_string().contains("missing"),
            "{e}"
        );
        let mut wrong = bytes.clone();
        wrong[4] = 9;
        assert_eq!(decode(&wrong).expect_err("version").offset, 4);
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(decode(&longer).expect_err("extra").offset, bytes.len());
    }
}
