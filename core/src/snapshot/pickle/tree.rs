//! Generic values (tests, tools): any pickle of plain Python values as a [`PyValue`] tree.

use super::ints::le_to_i128;
use super::machine::{Res, Vm, malformed};
use super::value::{Kind, Seal, Value};
use crate::snapshot::error::ImportError;
use crate::snapshot::schema::lossy;
use crate::snapshot::{Frame, FrameId, RawEvent};

/// A Python value as a pickle states it. For tests and tools; snapshots go through
/// [`super::decode_snapshot`], which never builds such a tree.
///
/// Dicts and sets keep their items in the order written (duplicates included).
#[derive(Debug, Clone, PartialEq)]
pub enum PyValue {
    None,
    Bool(bool),
    /// Integers that fit 128 bits.
    Int(i128),
    /// Wider integers: minimal little-endian two's complement bytes.
    BigInt(Vec<u8>),
    Float(f64),
    /// Text (invalid UTF-8 replaced by U+FFFD).
    Str(String),
    /// `bytes` and `bytearray`.
    Bytes(Vec<u8>),
    List(Vec<PyValue>),
    Tuple(Vec<PyValue>),
    Dict(Vec<(PyValue, PyValue)>),
    Set(Vec<PyValue>),
    FrozenSet(Vec<PyValue>),
}

/// Nesting deeper than this is refused by [`decode_value`]: the tree it returns is
/// dropped recursively.
pub const MAX_VALUE_DEPTH: usize = 1000;

/// Decodes any pickle of plain Python values (protocols 0–5, same refusals as
/// snapshots) into a [`PyValue`] tree. Memo-shared objects are copied; the tree is
/// limited to [`MAX_VALUE_DEPTH`] levels and to 8 nodes per input byte (plus a million),
/// so a small pickle cannot expand into a huge tree.
pub fn decode_value(data: &[u8]) -> Result<PyValue, ImportError> {
    let mut vm = Vm::new(data, false);
    let (root, stop_at) = vm.run().map_err(|e| *e)?;
    let budget = data.len().saturating_mul(8).saturating_add(1_000_000);
    vm.to_py(root, stop_at, budget).map_err(|e| *e)
}

/// One container being expanded by [`Vm::to_py`].
struct Open {
    id: u32,
    kind: Kind,
    next: usize,
    out: Vec<PyValue>,
}

impl Vm<'_> {
    pub(super) fn scalar_py(&self, v: Value) -> PyValue {
        let text = self.text();
        match v {
            Value::None | Value::Obj(_) => PyValue::None,
            Value::Bool(b) => PyValue::Bool(b),
            Value::Int(i) => PyValue::Int(i128::from(i)),
            Value::UInt(u) => PyValue::Int(i128::from(u)),
            Value::BigInt { len, off } => {
                let b = text.span(len, off);
                le_to_i128(b).map_or_else(|| PyValue::BigInt(b.to_vec()), PyValue::Int)
            }
            Value::Float(f) => PyValue::Float(f),
            Value::Str { len, off } => PyValue::Str(lossy(text.span(len, off)).into_owned()),
            Value::Bytes { len, off } => PyValue::Bytes(text.span(len, off).to_vec()),
            Value::Frame(f) => self.frame_py(f),
            Value::Stack(s) => PyValue::List(
                self.builder
                    .frames
                    .stack(s)
                    .iter()
                    .map(|&f| self.frame_py(f))
                    .collect(),
            ),
            Value::Event(i) => self
                .extra_events
                .get(i as usize)
                .map_or(PyValue::None, event_py),
        }
    }

    pub(super) fn frame_py(&self, f: FrameId) -> PyValue {
        let Some(fr) = self.builder.frames.frame(f) else {
            return PyValue::None;
        };
        PyValue::Dict(vec![
            (
                PyValue::Str("name".into()),
                PyValue::Str(self.builder.frames.str(fr.name).into()),
            ),
            (
                PyValue::Str("filename".into()),
                PyValue::Str(self.builder.frames.str(fr.filename).into()),
            ),
            (
                PyValue::Str("line".into()),
                match fr.line_text {
                    Some(t) => {
                        let t = self.builder.frames.str(t);
                        t.parse()
                            .map_or_else(|_| PyValue::Str(t.into()), PyValue::Int)
                    }
                    None if fr.line == Frame::LINE_UNKNOWN => PyValue::None,
                    None => PyValue::Int(i128::from(fr.line)),
                },
            ),
        ])
    }

    pub(super) fn to_py(&self, root: Value, stop_at: usize, budget: usize) -> Res<PyValue> {
        let too_deep = || {
            malformed(
                stop_at,
                format!("value nested deeper than {MAX_VALUE_DEPTH} levels"),
            )
        };
        let mut nodes = 0usize;
        let mut open: Vec<Open> = Vec::new();
        let mut pending = Some(root);
        loop {
            if let Some(v) = pending.take() {
                nodes += 1;
                if nodes > budget {
                    return Err(malformed(
                        stop_at,
                        format!("value expands to more than {budget} nodes (memo sharing)"),
                    ));
                }
                let container = match v {
                    Value::Obj(id) => self.heap.get(id as usize).map(|c| (id, c)),
                    _ => None,
                };
                let done = match container {
                    Some((id, c)) if c.seal == Seal::Open && c.events == 0 => {
                        if open.len() >= MAX_VALUE_DEPTH {
                            return Err(too_deep());
                        }
                        open.push(Open {
                            id,
                            kind: c.kind,
                            next: 0,
                            out: Vec::with_capacity(c.items.len().min(1 << 16)),
                        });
                        None
                    }
                    Some((_, c)) => Some(match c.seal {
                        Seal::Frame(f) => self.frame_py(f),
                        Seal::Stack(s) => self.scalar_py(Value::Stack(s)),
                        Seal::Open => PyValue::List(
                            self.event_lists
                                .get(c.events as usize - 1)
                                .map(|l| l.iter().map(event_py).collect())
                                .unwrap_or_default(),
                        ),
                    }),
                    None => Some(self.scalar_py(v)),
                };
                if let Some(p) = done {
                    match open.last_mut() {
                        Some(parent) => parent.out.push(p),
                        None => return Ok(p),
                    }
                }
                continue;
            }
            let Some(top) = open.last_mut() else {
                return Err(malformed(stop_at, "empty value (internal)"));
            };
            let items = self.heap.get(top.id as usize).map_or(&[][..], |c| &c.items);
            if let Some(&v) = items.get(top.next) {
                top.next += 1;
                pending = Some(v);
                continue;
            }
            let Some(done) = open.pop() else { continue };
            let value = match done.kind {
                Kind::List => PyValue::List(done.out),
                Kind::Tuple => PyValue::Tuple(done.out),
                Kind::Set => PyValue::Set(done.out),
                Kind::FrozenSet => PyValue::FrozenSet(done.out),
                Kind::Dict => {
                    let mut pairs = Vec::with_capacity(done.out.len() / 2);
                    let mut it = done.out.into_iter();
                    while let (Some(k), Some(v)) = (it.next(), it.next()) {
                        pairs.push((k, v));
                    }
                    PyValue::Dict(pairs)
                }
            };
            match open.last_mut() {
                Some(parent) => parent.out.push(value),
                None => return Ok(value),
            }
        }
    }
}

pub(super) fn event_py(e: &RawEvent) -> PyValue {
    let s = |x: &str| PyValue::Str(x.into());
    PyValue::Dict(vec![
        (s("action"), s(e.action.as_str())),
        (s("addr"), PyValue::Int(i128::from(e.addr))),
        (s("size"), PyValue::Int(i128::from(e.size))),
        (s("stream"), PyValue::Int(i128::from(e.stream))),
        (s("time_us"), PyValue::Int(i128::from(e.time_us))),
    ])
}
