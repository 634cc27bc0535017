//! Interned strings, frames and stacks: a snapshot repeats the same few hundred frames
//! millions of times, so each is stored once and events point at a [`StackId`].

use std::collections::HashMap;

/// Index into [`FrameTable::strings`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, bytemuck::Zeroable)]
pub struct StrId(pub u32);

/// Index into [`FrameTable::frames`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FrameId(pub u32);

/// Index into the stack table; `StackId::EMPTY` (0) is the empty stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, bytemuck::Zeroable)]
pub struct StackId(pub u32);

impl StackId {
    /// The empty stack (no `frames`, or `frames == []`).
    pub const EMPTY: StackId = StackId(0);
}

/// One stack frame (`{"name", "filename", "line"}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Frame {
    pub name: StrId,
    pub filename: StrId,
    /// `line` when the file gives an integer that fits in an `i64`;
    /// [`Frame::LINE_UNKNOWN`] otherwise, with the file's value in `line_text`.
    pub line: i64,
    /// The file's `line` as text when it is not an `i64`: a wider integer (PyTorch writes
    /// 2^64 − 1, its `-1` stored unsigned, for frames without a line, e.g. those of
    /// `torch/_subclasses/fake_tensor.py` under `torch.compile`) or another type. `None`
    /// when `line` holds the value or the file has none. The line is only displayed, so
    /// no value of it refuses a snapshot.
    pub line_text: Option<StrId>,
    /// FX node information of a frame of a `torch.compile` graph: 1 + index into the
    /// table's FX infos ([`FrameTable::fx`]); 0 for none.
    pub fx: u32,
}

/// The FX fields PyTorch adds to frames of compiled graphs (`fx_node_op`, `fx_node_name`,
/// `fx_node_target`, `fx_original_trace`, `fx_node_info`; #166676). "" where absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FxInfo {
    pub node_op: StrId,
    pub node_name: StrId,
    pub node_target: StrId,
    pub original_trace: StrId,
    pub node_info: StrId,
}

impl FxInfo {
    /// Whether no field is set (interned "" is [`StrId::EMPTY`]).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        *self == FxInfo::default()
    }
}

impl StrId {
    /// The empty string, interned first in every table.
    pub const EMPTY: StrId = StrId(0);
}

impl Frame {
    /// `line` of a frame whose line is not an `i64` (or absent).
    pub const LINE_UNKNOWN: i64 = i64::MIN;
}

/// Strings, frames and stacks, each stored once.
///
/// Invariants: `stack_offsets[0] == 0`, stack 0 is empty; `stack_offsets` is
/// non-decreasing and its last element is `stack_frames.len()`.
#[derive(Debug, Clone)]
pub struct FrameTable {
    strings: Vec<Box<str>>,
    frames: Vec<Frame>,
    stack_offsets: Vec<u32>,
    stack_frames: Vec<FrameId>,
    fx: Vec<FxInfo>,
    fx_index: HashMap<FxInfo, u32>,
    string_index: HashMap<Box<str>, StrId>,
    frame_index: HashMap<Frame, FrameId>,
    stack_index: HashMap<Box<[FrameId]>, StackId>,
}

impl Default for FrameTable {
    fn default() -> Self {
        FrameTable {
            strings: vec!["".into()],
            frames: Vec::new(),
            stack_offsets: vec![0, 0],
            stack_frames: Vec::new(),
            fx: Vec::new(),
            fx_index: HashMap::new(),
            string_index: HashMap::from([("".into(), StrId::EMPTY)]),
            frame_index: HashMap::new(),
            stack_index: HashMap::new(),
        }
    }
}

impl FrameTable {
    /// Interns a string.
    pub fn intern_str(&mut self, s: &str) -> StrId {
        if let Some(&id) = self.string_index.get(s) {
            return id;
        }
        let id = StrId(self.strings.len() as u32);
        self.strings.push(s.into());
        self.string_index.insert(s.into(), id);
        id
    }

    /// Interns a frame.
    pub fn intern_frame(&mut self, frame: Frame) -> FrameId {
        if let Some(&id) = self.frame_index.get(&frame) {
            return id;
        }
        let id = FrameId(self.frames.len() as u32);
        self.frames.push(frame);
        self.frame_index.insert(frame, id);
        id
    }

    /// Interns FX node information; the value for [`Frame::fx`] (0 for an empty one).
    pub fn intern_fx(&mut self, info: FxInfo) -> u32 {
        if info.is_empty() {
            return 0;
        }
        if let Some(&i) = self.fx_index.get(&info) {
            return i;
        }
        self.fx.push(info);
        let i = self.fx.len() as u32;
        self.fx_index.insert(info, i);
        i
    }

    /// A frame's FX node information, if it has any.
    #[must_use]
    pub fn fx(&self, frame: &Frame) -> Option<&FxInfo> {
        self.fx.get((frame.fx as usize).checked_sub(1)?)
    }

    /// Number of frames that carry FX node information.
    #[must_use]
    pub fn fx_frame_count(&self) -> usize {
        self.frames.iter().filter(|f| f.fx != 0).count()
    }

    /// Interns a stack (innermost frame first, as PyTorch lists them).
    pub fn intern_stack(&mut self, frames: &[FrameId]) -> StackId {
        if frames.is_empty() {
            return StackId::EMPTY;
        }
        if let Some(&id) = self.stack_index.get(frames) {
            return id;
        }
        let id = StackId((self.stack_offsets.len() - 1) as u32);
        self.stack_frames.extend_from_slice(frames);
        self.stack_offsets.push(self.stack_frames.len() as u32);
        self.stack_index.insert(frames.into(), id);
        id
    }

    /// The string behind an id ("" for an id this table does not hold).
    #[must_use]
    pub fn str(&self, id: StrId) -> &str {
        self.strings.get(id.0 as usize).map_or("", |s| s)
    }

    /// The frame behind an id.
    #[must_use]
    pub fn frame(&self, id: FrameId) -> Option<&Frame> {
        self.frames.get(id.0 as usize)
    }

    /// The frames of a stack, innermost first (empty for an unknown id).
    #[must_use]
    pub fn stack(&self, id: StackId) -> &[FrameId] {
        let i = id.0 as usize;
        match (self.stack_offsets.get(i), self.stack_offsets.get(i + 1)) {
            (Some(&a), Some(&b)) => &self.stack_frames[a as usize..b as usize],
            _ => &[],
        }
    }

    /// Number of distinct stacks, the empty one included.
    #[must_use]
    pub fn stack_count(&self) -> usize {
        self.stack_offsets.len() - 1
    }

    /// Number of distinct frames.
    #[must_use]
    pub fn frame_count(&self) -> usize {
        self.frames.len()
    }

    /// Number of distinct strings, "" included.
    #[must_use]
    pub(crate) fn string_count(&self) -> usize {
        self.strings.len()
    }

    /// The FX node informations, by [`Frame::fx`] − 1.
    #[must_use]
    pub(crate) fn fx_infos(&self) -> &[FxInfo] {
        &self.fx
    }

    /// A frame's line as text: the number, the file's own text of a value that is not an
    /// `i64`, or `?` when the file gives none.
    #[must_use]
    pub fn line_label(&self, frame: &Frame) -> std::borrow::Cow<'_, str> {
        match frame.line_text {
            Some(text) => self.str(text).into(),
            None if frame.line == Frame::LINE_UNKNOWN => "?".into(),
            None => frame.line.to_string().into(),
        }
    }

    /// A stack as text, one `name (filename:line)` per frame, innermost first.
    #[must_use]
    pub fn format_stack(&self, id: StackId) -> Vec<String> {
        self.stack(id)
            .iter()
            .filter_map(|&f| self.frame(f))
            .map(|f| {
                format!(
                    "{} ({}:{})",
                    self.str(f.name),
                    self.str(f.filename),
                    self.line_label(f)
                )
            })
            .collect()
    }

    /// Drops the look-up indexes once decoding is done (they are only needed to intern).
    pub fn finish(&mut self) {
        self.string_index = HashMap::new();
        self.fx_index = HashMap::new();
        self.frame_index = HashMap::new();
        self.stack_index = HashMap::new();
    }

    /// Approximate heap bytes held by the table.
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        self.strings.iter().map(|s| s.len() + 16).sum::<usize>()
            + self.frames.len() * std::mem::size_of::<Frame>()
            + self.stack_offsets.len() * 4
            + self.stack_frames.len() * 4
    }
}
