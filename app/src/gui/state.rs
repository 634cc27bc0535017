//! The UI's data: the loaded trace and, per compared configuration, its replay and the
//! layout at the cursor — plain data from the engine, turned into view models (envelopes,
//! rows, quads) once when it arrives, never per frame.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::envelope::{ColumnEnvelope, Curve, Envelope, Levels, Samples};
use super::render::{self, Quad, QuadSet};
use super::theme;
use crate::engine::parallel::join;
use crate::engine::wire::{
    LayoutData, NO_OP, OpsTable, RecordedData, ReplayData, TraceData, block_state, format_frame,
};

/// Bytes per data unit on the byte axes of the GPU views (f32 keeps 24 bits: MiB units
/// keep a 512-byte block distinct up to 8 TiB).
pub const MIB: f64 = 1024.0 * 1024.0;

/// Fraction of a row's pitch a block fills (the rest is the gap to the next row).
const BAR: f32 = theme::ROW_HEIGHT / (theme::ROW_HEIGHT + theme::ROW_GAP);

/// A loaded trace and its views.
#[derive(Debug)]
pub struct Document {
    pub trace: Arc<TraceData>,
    /// Where the ops' seconds count from, if they have times that never go backwards
    /// ([`Document::seconds`]).
    clock: Option<Clock>,
    /// The band quads (x: op, alt x: seconds, y: MiB): quad `i` is band piece `i` of the
    /// trace, so a prefix is the largest pieces. Only once the stacked view is shown
    /// ([`Document::build_bands`]): made from the pieces as they are drawn, or, for the
    /// wgpu pipeline's upload, those built so far, a slice per frame, so that no frame
    /// stalls on millions of pieces.
    pub bands: QuadSet,
    /// The quads converted so far (`bands` is republished from it as it grows).
    bands_building: Vec<Quad>,
    /// The stack's top (live requested MiB) per op: the folded band of the stacked view
    /// ([`stack_top`]; the timeline view draws it: `views/timeline/stack_lod.rs`), so a
    /// level of detail never loses bytes. Made when the stacked view first asks for it
    /// ([`Document::stack_top`]), not on the way to the document's first frame.
    stack_top: std::sync::OnceLock<Envelope>,
    pub slots: Vec<Slot>,
    /// The best any allocator could do on this device (live-bytes peak, offline
    /// placement's peak), once the engine has computed them.
    pub bounds: Option<allocsim_core::offline::BestPossible>,
    /// The bounds job in flight.
    pub bounds_job: Option<u64>,
    /// Whether the bounds were asked for (after the main configuration's first frame).
    pub bounds_asked: bool,
    /// Whether the bands were asked for, and the job in flight (`trace.bands` is empty
    /// until it answers).
    pub bands_asked: bool,
    pub bands_job: Option<u64>,
    /// What the file records, per op, shown until the replays arrive.
    pub recorded: Option<RecordedView>,
    /// What the file records, per trace entry, to be made [`Document::recorded`] before
    /// the document is drawn ([`Document::settle_recorded`]), unless the main
    /// configuration's layout replaces it first (it comes with the trace on a trace of
    /// under a million ops: the conversion was work for nothing on the way to the first
    /// full frame).
    pub recorded_entries: Option<RecordedView>,
}

/// Pieces converted between two looks at the clock.
const BAND_SLICE: usize = 16_384;

/// The most quads published before the bands are complete: a preview of the largest
/// pieces; copying more for a preview would cost a frame more than it shows.
const BAND_PREVIEW_MAX: usize = 1 << 18;

impl Document {
    /// Seconds since the first op with an entry, per op (empty without times).
    #[must_use]
    pub fn seconds(&self) -> Seconds<'_> {
        Seconds::of(&self.trace, self.clock)
    }

    /// A document for `trace`, without replays yet and with no band built.
    #[must_use]
    pub fn new(trace: Arc<TraceData>) -> Document {
        let clock = Clock::of(&trace);
        Document {
            trace,
            clock,
            stack_top: std::sync::OnceLock::new(),
            bands: QuadSet::default(),
            bands_building: Vec::new(),
            slots: Vec::new(),
            bounds: None,
            bounds_job: None,
            bounds_asked: false,
            bands_asked: false,
            bands_job: None,
            recorded: None,
            recorded_entries: None,
        }
    }

    /// The stack's top (live requested MiB) per op ([`stack_top`]), made at the first ask.
    #[must_use]
    pub fn stack_top(&self) -> &Envelope {
        self.stack_top.get_or_init(|| stack_top(&self.trace.ops))
    }

    /// The stack's top if the stacked view made it already.
    #[must_use]
    pub fn stack_top_made(&self) -> Option<&Envelope> {
        self.stack_top.get()
    }

    /// Makes the recorded timeline waiting per trace entry ([`Document::recorded_entries`])
    /// the document's, per op.
    pub fn settle_recorded(&mut self) {
        if let Some(r) = self.recorded_entries.take() {
            self.recorded = r.per_op(&self.trace);
        }
    }

    /// Whether the main configuration is on screen: its replay and a layout, or its error.
    #[must_use]
    pub fn main_settled(&self) -> bool {
        self.slots.first().is_some_and(Slot::settled)
    }

    /// Whether every configuration is on screen: its replay and a layout, or its error.
    #[must_use]
    pub fn all_settled(&self) -> bool {
        self.slots.iter().all(Slot::settled)
    }

    /// Takes the trace's bands (stacked by the engine after the trace arrived): the
    /// trace's other tables stay the ones shared with the engine, and the band quads are
    /// built anew from them.
    pub fn set_bands(&mut self, bands: Arc<crate::engine::wire::Bands>) {
        let mut trace = TraceData::clone(&self.trace);
        trace.bands = bands;
        self.trace = Arc::new(trace);
        self.bands = QuadSet::default();
        self.bands_building.clear();
    }

    /// Whether every band piece has its quad in [`Document::bands`].
    #[must_use]
    pub fn bands_complete(&self) -> bool {
        self.bands.len() >= self.trace.bands.pieces.len()
    }

    /// Publishes the band quads for a renderer that draws them from the pieces (`held`
    /// false: glow and the CPU fallback tessellate the pieces a view draws; the quads are
    /// made from them there, never held), or converts pieces into quads for about `budget`
    /// of time (at least one slice) for one that uploads them (`held`: the wgpu pipeline's
    /// instances), and republishes [`Document::bands`] when the quads built have doubled
    /// since it was last published (up to `BAND_PREVIEW_MAX`), and at the end: the largest
    /// pieces show first, and the GPU copy is refreshed a logarithmic number of times.
    /// Returns whether every piece is built.
    pub fn build_bands(&mut self, budget: std::time::Duration, held: bool) -> bool {
        if !held {
            if self.bands.held().is_some() || self.bands.len() != self.trace.bands.pieces.len() {
                self.bands_building = Vec::new();
                self.bands = QuadSet::made(Arc::new(BandQuads {
                    trace: self.trace.clone(),
                    clock: self.clock,
                }));
            }
            return true;
        }
        let pieces = &self.trace.bands.pieces;
        let seconds = Seconds::of(&self.trace, self.clock);
        if self.bands.len() >= pieces.len() {
            return true;
        }
        let start = web_time::Instant::now();
        // In exactly their room: grown by doubling, the quads of the 1.12 GB snapshot's
        // 5.9 M pieces held 256 MB, and 384 MB while the last doubling copied them.
        if self.bands_building.capacity() < pieces.len() {
            self.bands_building
                .reserve_exact(pieces.len() - self.bands_building.len());
        }
        loop {
            let from = self.bands_building.len();
            let to = (from + BAND_SLICE).min(pieces.len());
            self.bands_building.extend(
                pieces[from..to]
                    .iter()
                    .map(|p| band_quad(&self.trace, seconds, p, None)),
            );
            if to == pieces.len() || start.elapsed() >= budget {
                break;
            }
        }
        let built = self.bands_building.len();
        if built == pieces.len() {
            self.bands = QuadSet::new(std::mem::take(&mut self.bands_building));
            return true;
        }
        if built >= 2 * self.bands.len().max(BAND_SLICE / 2) && built <= BAND_PREVIEW_MAX {
            self.bands = QuadSet::new(self.bands_building.clone());
        }
        false
    }
}

/// What a file records ([`RecordedData`]), drawn as soon as it is decoded: its reserved
/// and live requested bytes (its exact columns, drawn as f32) and its end state as a
/// memory map. Over the
/// file's trace entries while the trace is built; over the ops once it is
/// ([`RecordedView::per_op`]), until the replays arrive.
#[derive(Debug)]
pub struct RecordedView {
    /// The load job it came with.
    pub job: u64,
    pub name: String,
    pub device: u32,
    pub reserved: ColumnEnvelope,
    pub requested: ColumnEnvelope,
    pub peak_reserved_bytes: u64,
    /// The end state (`data.op`: the last entry, or the last op once per op).
    pub layout: LayoutView,
    /// A trace without ops for the map's hover (no block is linked to an op yet).
    pub no_ops: Arc<TraceData>,
}

impl RecordedView {
    #[must_use]
    pub fn new(job: u64, data: RecordedData) -> RecordedView {
        RecordedView {
            job,
            peak_reserved_bytes: data.reserved_bytes.iter().max().unwrap_or(0),
            reserved: ColumnEnvelope::new(data.reserved_bytes),
            requested: ColumnEnvelope::new(data.requested_bytes),
            layout: LayoutView::new(data.end_state, &|_, _| false),
            no_ops: Arc::new(TraceData {
                name: data.name.clone(),
                device: data.device,
                ..TraceData::default()
            }),
            name: data.name,
            device: data.device,
        }
    }

    /// Entries shown.
    #[must_use]
    pub fn len(&self) -> usize {
        self.reserved.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether this is what the file and device of `trace` record.
    #[must_use]
    pub fn is_of(&self, trace: &TraceData) -> bool {
        self.name == trace.name && self.device == trace.device
    }

    /// The same over the ops of `ops` (each op at its trace entry; the end state at the
    /// last op), or `None` when `ops` is of another file or device.
    #[must_use]
    pub fn per_op(self, trace: &TraceData) -> Option<RecordedView> {
        if !self.is_of(trace) {
            return None;
        }
        #[cfg(test)]
        PER_OP_MADE.with(|n| n.set(n.get() + 1));
        // An op the recording has no entry of (one inferred) keeps the value before it.
        let at = |env: &ColumnEnvelope| {
            let (mut last, mut column) = (0, allocsim_core::metrics::Column::default());
            for e in trace.ops.event_indexes() {
                last = env.bytes(e as usize).unwrap_or(last);
                column.push(last);
            }
            column.shrink_to_fit();
            ColumnEnvelope::new(column)
        };
        let mut layout = self.layout;
        layout.data.op = trace.ops.len().saturating_sub(1) as u32;
        let (reserved, requested) = join(|| at(&self.reserved), || at(&self.requested));
        Some(RecordedView {
            reserved,
            requested,
            layout,
            ..self
        })
    }
}

/// A compared configuration.
#[derive(Debug)]
pub struct Slot {
    /// `NAME` or `NAME@CONFIG`.
    pub spec: String,
    pub capacity_bytes: Option<u64>,
    pub replay: Option<ReplayView>,
    pub layout: Option<LayoutView>,
    /// The job of the replay in flight.
    pub replay_job: Option<u64>,
    /// The layout request in flight: (job, op).
    pub layout_job: Option<(u64, u32)>,
    pub error: Option<String>,
    /// The smallest capacity that runs the trace (or why there is none), once asked.
    pub min_capacity: Option<Result<u64, String>>,
    /// The min-capacity job in flight.
    pub min_capacity_job: Option<u64>,
    /// Layouts of this slot's replay at events one key away from the cursor, asked for
    /// in the background (and the ones just left), so that a key shows its layout in
    /// the frame that moves the cursor ([`Nearby`]).
    pub nearby: Nearby,
}

/// A slot's layouts at other events than the cursor's, kept for the keys: asked for in
/// the background once the cursor's layout is on screen (`AllocsimApp::prefetch_layouts`),
/// each the engine's own answer for that op of the slot's current replay (a new replay
/// empties it).
#[derive(Debug, Default)]
pub struct Nearby {
    /// Answered, oldest first (at most [`Nearby::KEEP`]).
    pub layouts: Vec<LayoutData>,
    /// Background requests whose answers are taken: (job, op), newest last.
    pub asked: Vec<(u64, u32)>,
}

impl Nearby {
    /// Layouts kept per slot: the six key targets of two cursors, and a few more.
    pub const KEEP: usize = 16;
    /// Background jobs remembered (the ones never sent are forgotten in turn).
    const ASKED: usize = 64;

    /// Takes the layout at `op`, if kept.
    pub fn take(&mut self, op: u32) -> Option<LayoutData> {
        let i = self.layouts.iter().position(|l| l.op == op)?;
        Some(self.layouts.remove(i))
    }

    /// Whether the layout at `op` is kept or asked for.
    #[must_use]
    pub fn has(&self, op: u32) -> bool {
        self.layouts.iter().any(|l| l.op == op) || self.asked.iter().any(|&(_, o)| o == op)
    }

    /// Keeps `layout` (the oldest kept one goes past [`Nearby::KEEP`]).
    pub fn keep(&mut self, layout: LayoutData) {
        self.layouts.retain(|l| l.op != layout.op);
        self.layouts.push(layout);
        if self.layouts.len() > Nearby::KEEP {
            self.layouts.remove(0);
        }
    }

    /// Notes a background request for the layout at `op`.
    pub fn ask(&mut self, job: u64, op: u32) {
        self.asked.push((job, op));
        if self.asked.len() > Nearby::ASKED {
            self.asked.remove(0);
        }
    }

    /// Keeps the answer of background job `job`; false if it is not one of ours.
    pub fn answer(&mut self, job: u64, layout: LayoutData) -> bool {
        let Some(i) = self.asked.iter().position(|&(j, _)| j == job) else {
            return false;
        };
        self.asked.remove(i);
        self.keep(layout);
        true
    }

    /// Forgets everything (a new replay).
    pub fn clear(&mut self) {
        *self = Nearby::default();
    }
}

impl Slot {
    /// Whether it is on screen: its replay and a layout, or its error.
    #[must_use]
    pub fn settled(&self) -> bool {
        self.error.is_some() || (self.replay.is_some() && self.layout.is_some())
    }

    #[must_use]
    pub fn new(spec: String, capacity_bytes: Option<u64>) -> Slot {
        Slot {
            spec,
            capacity_bytes,
            replay: None,
            layout: None,
            replay_job: None,
            layout_job: None,
            error: None,
            min_capacity: None,
            min_capacity_job: None,
            nearby: Nearby::default(),
        }
    }
}

/// A replay's numbers and its timeline: core's compact columns as the replay made them
/// (moved, never copied into plain vectors), and the min/max levels of the drawn curves
/// (bytes as `f32`), which read the columns where they are.
#[derive(Debug)]
pub struct ReplayView {
    pub data: ReplayData,
    reserved: Levels,
    allocated: Levels,
    largest_free: Levels,
    fragmentation: Levels,
    /// The op at which allocated bytes peak first.
    pub peak_op: u32,
}

/// A replay's sample after one op, of the columns the app keeps (its replays leave
/// requested bytes and free holes out: `engine::drawn_replay`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrawnStats {
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub largest_free_bytes: u64,
}

impl ReplayView {
    #[must_use]
    pub fn new(data: ReplayData) -> ReplayView {
        let t = &data.timeline;
        let peak_op = data.peak_op();
        // The four curves' levels, two at a time natively (on the 1.12 GB snapshot's
        // 9.7 M ops they are most of the frame that takes the main replay).
        let column = |c| move || Levels::new(Samples::Column(c));
        let ((reserved, allocated), (largest_free, fragmentation)) = join(
            || join(column(&t.reserved_bytes), column(&t.allocated_bytes)),
            || {
                join(column(&t.largest_free_bytes), || {
                    // Core's definition, per sample of the columns.
                    Levels::new(Samples::Fragmentation(t))
                })
            },
        );
        ReplayView {
            data,
            reserved,
            allocated,
            largest_free,
            fragmentation,
            peak_op,
        }
    }

    /// The heap bytes of its timeline and curves.
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        self.data.timeline.capacity_bytes()
            + [
                &self.reserved,
                &self.allocated,
                &self.largest_free,
                &self.fragmentation,
            ]
            .iter()
            .map(|l| l.heap_bytes())
            .sum::<usize>()
    }

    /// Reserved bytes per op.
    #[must_use]
    pub fn reserved(&self) -> Curve<'_> {
        self.reserved
            .over(Samples::Column(&self.data.timeline.reserved_bytes))
    }

    /// Allocated bytes per op.
    #[must_use]
    pub fn allocated(&self) -> Curve<'_> {
        self.allocated
            .over(Samples::Column(&self.data.timeline.allocated_bytes))
    }

    /// The largest free block's bytes per op.
    #[must_use]
    pub fn largest_free(&self) -> Curve<'_> {
        self.largest_free
            .over(Samples::Column(&self.data.timeline.largest_free_bytes))
    }

    /// Fragmentation (0..=1) per op.
    #[must_use]
    pub fn fragmentation(&self) -> Curve<'_> {
        self.fragmentation
            .over(Samples::Fragmentation(&self.data.timeline))
    }

    /// The drawn columns after op `k` (`None` past the ops done).
    #[must_use]
    pub fn stats_at(&self, k: usize) -> Option<DrawnStats> {
        let t = &self.data.timeline;
        Some(DrawnStats {
            reserved_bytes: t.reserved_bytes.get(k)?,
            allocated_bytes: t.allocated_bytes.get(k)?,
            largest_free_bytes: t.largest_free_bytes.get(k)?,
        })
    }

    /// Samples (ops done).
    #[must_use]
    pub fn len(&self) -> usize {
        self.data.timeline.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One row of the memory map.
#[derive(Debug, Clone, PartialEq)]
pub enum Row {
    /// A group of segments: pool and stream.
    Header { label: String },
    /// Segment `index` of the layout.
    Segment { index: usize },
}

/// The memory map of a layout: rows (grouped by pool and stream, address order) and one
/// quad per block (x: MiB from the segment start, y: row index).
#[derive(Debug)]
pub struct LayoutView {
    pub data: LayoutData,
    pub rows: Vec<Row>,
    /// Row of each segment.
    pub segment_row: Vec<u32>,
    pub quads: QuadSet,
    /// Highlighted blocks (search, selection), drawn again on top.
    pub highlight: QuadSet,
    /// The blocks of the OOM explanation's blockers, drawn on top in their colour.
    pub blockers: QuadSet,
    /// Their block indexes.
    pub blocker_blocks: Vec<usize>,
    /// Largest segment, bytes.
    pub max_segment_bytes: u64,
    pub reserved_bytes: u64,
}

impl LayoutView {
    /// Builds rows and quads; `highlighted` blocks are drawn in the highlight colour.
    #[must_use]
    pub fn new(data: LayoutData, highlighted: &dyn Fn(&LayoutData, usize) -> bool) -> LayoutView {
        let mut rows = Vec::new();
        let mut segment_row = vec![0u32; data.segments.len()];
        let mut group: Option<((u64, u64), u64)> = None;
        for (i, s) in data.segments.iter().enumerate() {
            let key = (s.pool, s.stream);
            if group != Some(key) {
                group = Some(key);
                let pool = if s.pool == (0, 0) {
                    "default pool".to_string()
                } else {
                    format!("private pool ({}, {})", s.pool.0, s.pool.1)
                };
                let stream = if s.stream == 0 {
                    "default stream".to_string()
                } else {
                    format!("stream {:#x}", s.stream)
                };
                rows.push(Row::Header {
                    label: format!("{pool} · {stream}"),
                });
            }
            segment_row[i] = rows.len() as u32;
            rows.push(Row::Segment { index: i });
        }
        let max_segment_bytes = data
            .segments
            .iter()
            .map(|s| s.size_bytes)
            .max()
            .unwrap_or(0);
        let reserved_bytes = data.segments.iter().map(|s| s.size_bytes).sum();
        let mut v = LayoutView {
            data,
            rows,
            segment_row,
            quads: QuadSet::default(),
            highlight: QuadSet::default(),
            blockers: QuadSet::default(),
            blocker_blocks: Vec::new(),
            max_segment_bytes,
            reserved_bytes,
        };
        v.quads = QuadSet::new(v.block_quads(&|_| true, None));
        v.set_highlight(highlighted);
        v
    }

    /// Recolours the highlighted blocks.
    pub fn set_highlight(&mut self, highlighted: &dyn Fn(&LayoutData, usize) -> bool) {
        let pick = |b: usize| highlighted(&self.data, b);
        self.highlight = QuadSet::new(self.block_quads(&pick, Some(theme::HIGHLIGHT)));
    }

    /// Marks the blocks `blocker` picks as the OOM explanation's blockers.
    pub fn set_blockers(&mut self, blocker: &dyn Fn(&LayoutData, usize) -> bool) {
        self.blocker_blocks = (0..self.data.blocks.len())
            .filter(|&b| blocker(&self.data, b))
            .collect();
        let pick = |b: usize| self.blocker_blocks.binary_search(&b).is_ok();
        self.blockers = QuadSet::new(self.block_quads(&pick, Some(theme::BLOCKER)));
    }

    fn block_quads(&self, pick: &dyn Fn(usize) -> bool, color: Option<egui::Color32>) -> Vec<Quad> {
        let mut out = Vec::new();
        for (si, s) in self.data.segments.iter().enumerate() {
            let row = self.segment_row[si] as f32;
            let (first, count) = (s.first as usize, s.count as usize);
            for bi in first..(first + count).min(self.data.blocks.len()) {
                if !pick(bi) {
                    continue;
                }
                let b = &self.data.blocks[bi];
                let x0 = (b.addr.saturating_sub(s.addr) as f64 / MIB) as f32;
                let x1 = ((b.addr.saturating_sub(s.addr) + b.size_bytes) as f64 / MIB) as f32;
                out.push(Quad::new(
                    x0,
                    row,
                    x1,
                    row + BAR,
                    color.unwrap_or_else(|| theme::block(b.state)),
                ));
            }
        }
        out
    }

    /// The block at byte `offset` of segment `seg`.
    #[must_use]
    pub fn block_at(&self, seg: usize, offset: u64) -> Option<usize> {
        let s = self.data.segments.get(seg)?;
        let blocks = self
            .data
            .blocks
            .get(s.first as usize..(s.first + s.count) as usize)?;
        let addr = s.addr + offset;
        let i = blocks.partition_point(|b| b.addr + b.size_bytes <= addr);
        (i < blocks.len() && blocks[i].addr <= addr).then_some(s.first as usize + i)
    }

    /// The segment and block holding byte address `addr`.
    #[must_use]
    pub fn find_address(&self, addr: u64) -> Option<(usize, usize)> {
        let seg = self
            .data
            .segments
            .iter()
            .position(|s| s.addr <= addr && addr < s.addr + s.size_bytes)?;
        let b = self.block_at(seg, addr - self.data.segments[seg].addr)?;
        Some((seg, b))
    }

    /// Bytes per block state: allocated, free, pending free, unmapped.
    #[must_use]
    pub fn totals(&self) -> [u64; 4] {
        let mut t = [0u64; 4];
        for b in &self.data.blocks {
            t[(b.state as usize).min(3)] += b.size_bytes;
        }
        t
    }
}

/// The quads of the band pieces `pick` keeps, coloured by call site (or all in `color`).
#[must_use]
pub fn band_quads(
    trace: &TraceData,
    seconds: Seconds<'_>,
    pick: &dyn Fn(&crate::engine::wire::BandPiece) -> bool,
    color: Option<egui::Color32>,
) -> Vec<Quad> {
    trace
        .bands
        .pieces
        .iter()
        .filter(|p| pick(p))
        .map(|p| band_quad(trace, seconds, p, color))
        .collect()
}

/// The quad of band piece `p`, coloured by its call site (or in `color`).
#[must_use]
pub fn band_quad(
    trace: &TraceData,
    seconds: Seconds<'_>,
    p: &crate::engine::wire::BandPiece,
    color: Option<egui::Color32>,
) -> Quad {
    let t = |x: u32| -> f32 {
        match seconds.len() {
            0 => x as f32,
            n => seconds.get((x as usize).min(n - 1)).unwrap_or(0.0) as f32,
        }
    };
    let stack = trace.ops.stack.get(p.alloc as usize).copied().unwrap_or(0);
    let c = color.unwrap_or_else(|| theme::site(stack, p.alloc));
    let y0 = (p.y0_bytes() as f64 / MIB) as f32;
    let y1 = ((p.y0_bytes() + p.height_bytes(&trace.ops)) as f64 / MIB) as f32;
    let mut q = Quad::new(p.x0 as f32, y0, p.x1 as f32, y1, c);
    q.alt_x = [t(p.x0), t(p.x1)];
    q
}

/// The band quads made from the pieces as they are drawn ([`Document::build_bands`]
/// without `held`): quad `i` is [`band_quad`] of piece `i`.
struct BandQuads {
    trace: Arc<TraceData>,
    clock: Option<Clock>,
}

impl render::QuadSource for BandQuads {
    fn len(&self) -> usize {
        self.trace.bands.pieces.len()
    }

    fn quad(&self, i: usize) -> Quad {
        let seconds = Seconds::of(&self.trace, self.clock);
        band_quad(&self.trace, seconds, &self.trace.bands.pieces[i], None)
    }
}

/// Whether the ops of `trace` have times that never go backwards (else the time axis is
/// not offered).
fn timed(trace: &TraceData) -> bool {
    let mut last = i64::MIN;
    trace.has_times
        && !trace.ops.has_no_times()
        && trace.ops.times_us().all(|t| {
            let on = t >= last;
            last = t;
            on
        })
}

/// Where a timed trace's seconds count from: its first op with a trace entry. The blocks
/// alive at a wrapped trace's start come before it, with no time of their own (their ops'
/// is 0): they are at 0 s, not at minus the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    /// The first op with an entry.
    first: usize,
    /// Its time.
    origin_us: i64,
}

impl Clock {
    /// The clock of `trace`'s ops if they have times that never go backwards ([`timed`]).
    fn of(trace: &TraceData) -> Option<Clock> {
        if !timed(trace) {
            return None;
        }
        let ops = &trace.ops;
        let first = (0..ops.len())
            .find(|&k| ops.event_index(k) != crate::engine::ops::NO_ENTRY)
            .unwrap_or(0);
        Some(Clock {
            first,
            origin_us: ops.time_us(first)?,
        })
    }
}

/// Seconds since the first op with a trace entry, per op: read from the ops table's times
/// when asked (no copy of them; empty when the trace has no times or they go backwards).
#[derive(Debug, Clone, Copy)]
pub struct Seconds<'a> {
    ops: &'a OpsTable,
    /// The ops with a time: all, or none.
    len: usize,
    clock: Clock,
}

impl Seconds<'_> {
    /// Those of `trace`'s ops on `clock`, or none without one.
    fn of(trace: &TraceData, clock: Option<Clock>) -> Seconds<'_> {
        Seconds {
            ops: &trace.ops,
            len: if clock.is_some() { trace.ops.len() } else { 0 },
            clock: clock.unwrap_or(Clock {
                first: 0,
                origin_us: 0,
            }),
        }
    }

    /// Number of ops with a time (0: untimed).
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Seconds of op `i` since the first op with an entry (0 for the blocks alive at the
    /// trace's start, before it).
    #[must_use]
    pub fn get(&self, i: usize) -> Option<f64> {
        if i >= self.len {
            return None;
        }
        if i < self.clock.first {
            return Some(0.0);
        }
        let t0 = self.clock.origin_us;
        self.ops.time_us(i).map(|t| (t - t0) as f64 / 1e6)
    }

    /// Seconds of the last op.
    #[must_use]
    pub fn last(&self) -> Option<f64> {
        self.get(self.len().checked_sub(1)?)
    }

    /// The number of ops (a prefix: the seconds never go backwards) whose seconds satisfy
    /// `pred`, as `slice::partition_point`.
    #[must_use]
    pub fn partition_point(&self, pred: impl Fn(f64) -> bool) -> usize {
        let (mut lo, mut hi) = (0, self.len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.get(mid).is_some_and(&pred) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

/// The op of trace event `event` (an index into the device's trace entries): the op made
/// from it, else the last op before it (None before the first op).
#[must_use]
pub fn op_of_event(trace: &TraceData, event: u64) -> Option<u32> {
    let k = trace.ops.ops_up_to_event(event);
    k.checked_sub(1).map(|k| k as u32)
}

/// Live allocations at op `op` grouped by call site: (stack, bytes, count), largest first.
#[must_use]
pub fn sites_at(trace: &TraceData, op: u32) -> Vec<(u32, u64, u32)> {
    let ops = &trace.ops;
    let mut by: std::collections::BTreeMap<u32, (u64, u32)> = std::collections::BTreeMap::new();
    let op = op as usize;
    for a in 0..=op.min(ops.len().saturating_sub(1)) {
        if ops.live_after(a, op) {
            let e = by.entry(ops.stack[a]).or_default();
            e.0 += ops.size_bytes(a);
            e.1 += 1;
        }
    }
    let mut v: Vec<(u32, u64, u32)> = by.into_iter().map(|(s, (b, c))| (s, b, c)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

/// What a stack search looks for, parsed once from the search field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameQuery {
    /// `capture.py:281`, the form the tooltips show: a frame whose file contains the text
    /// (case-insensitive) at exactly that line.
    FileLine { file: String, line: i64 },
    /// `281`: a frame at that line, or whose function or file contains the digits.
    Line(i64),
    /// Anything else: text in a frame as the tooltips print it ([`format_frame`],
    /// case-insensitive).
    Text(String),
}

impl FrameQuery {
    /// Parses the search text (already trimmed).
    #[must_use]
    pub fn parse(text: &str) -> FrameQuery {
        let lower = text.to_lowercase();
        let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        if digits(&lower)
            && let Ok(line) = lower.parse()
        {
            return FrameQuery::Line(line);
        }
        if let Some((file, line)) = lower.rsplit_once(':')
            && !file.is_empty()
            && digits(line)
            && let Ok(line) = line.parse()
        {
            return FrameQuery::FileLine {
                file: file.to_string(),
                line,
            };
        }
        FrameQuery::Text(lower)
    }

    /// Whether the frame `name (file:line)` matches.
    #[must_use]
    pub fn matches(&self, name: &str, file: &str, line: i64) -> bool {
        match self {
            FrameQuery::FileLine { file: f, line: l } => {
                *l == line && file.to_lowercase().contains(f.as_str())
            }
            FrameQuery::Line(l) => {
                *l == line || {
                    let d = l.to_string();
                    name.contains(&d) || file.contains(&d)
                }
            }
            FrameQuery::Text(t) => format_frame(name, file, line)
                .to_lowercase()
                .contains(t.as_str()),
        }
    }
}

/// Stacks with a frame that `needle` matches (see [`FrameQuery`]).
#[must_use]
pub fn stacks_matching(trace: &TraceData, needle: &str) -> BTreeSet<u32> {
    let query = FrameQuery::parse(needle.trim());
    let st = &trace.stacks;
    let frame_hit: Vec<bool> = st
        .frames
        .iter()
        .map(|&(n, f, line)| {
            let s = |i: u32| st.strings.get(i as usize).map_or("", String::as_str);
            query.matches(s(n), s(f), line)
        })
        .collect();
    (0..st.len() as u32)
        .filter(|&s| {
            let (a, b) = (
                st.offsets[s as usize] as usize,
                st.offsets[s as usize + 1] as usize,
            );
            st.frame_ids.get(a..b).is_some_and(|ids| {
                ids.iter()
                    .any(|&f| frame_hit.get(f as usize).copied().unwrap_or(false))
            })
        })
        .collect()
}

/// The innermost frame that is not PyTorch's own plumbing, as a short label.
#[must_use]
pub fn site_label(trace: &TraceData, stack: u32) -> String {
    let frames: Vec<(&str, &str, i64)> = trace.stacks.frames_of(stack).collect();
    if frames.is_empty() {
        return "(no stack recorded)".to_string();
    }
    let plumbing = |f: &str| {
        let ext = std::path::Path::new(f)
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        f.is_empty()
            || f.contains("torch/")
            || f.contains("torch\\")
            || f.starts_with('<')
            || matches!(ext.as_deref(), Some("cpp" | "h" | "cu" | "hpp"))
    };
    let user = frames
        .iter()
        .find(|(_, f, _)| !plumbing(f))
        .or(frames.first());
    match user {
        Some((n, f, l)) => {
            let file = f.rsplit(['/', '\\']).next().unwrap_or(f);
            format!("{n} ({file}:{l})")
        }
        None => String::new(),
    }
}

/// Whether block `b` of `layout` belongs to an allocation made at one of `stacks`.
#[must_use]
pub fn block_in_stacks(
    trace: &TraceData,
    layout: &LayoutData,
    b: usize,
    stacks: &BTreeSet<u32>,
) -> bool {
    let Some(blk) = layout.blocks.get(b) else {
        return false;
    };
    blk.alloc != NO_OP
        && blk.state != block_state::FREE
        && trace
            .ops
            .stack
            .get(blk.alloc as usize)
            .is_some_and(|s| stacks.contains(s))
}

/// The stack's top per op, as an envelope (the highest top over any span of ops).
#[must_use]
pub fn stack_top(ops: &OpsTable) -> Envelope {
    let mut top = Vec::with_capacity(ops.len());
    // From the links: no vector of a change per op beside the top (74 MiB on the 1.12 GB
    // snapshot, when the page holds the most).
    crate::engine::bands::each_live_bytes_by_links(ops, |b| top.push((b as f64 / MIB) as f32));
    Envelope::new(top)
}

#[cfg(test)]
mod seconds_tests {
    use super::*;

    fn trace_with_times(times: &[i64]) -> TraceData {
        let mut ops = crate::engine::ops::OpsBuilder::default();
        for &x in times {
            ops.push(&allocsim_core::trace::OpKind::EmptyCache, 0, 0, x);
        }
        let ops = ops.finish();
        TraceData {
            has_times: true,
            ops: Arc::new(ops),
            ..TraceData::default()
        }
    }

    /// A wrapped trace's blocks alive at its start (no entry, time 0) are at 0 s, and the
    /// seconds count from its first op with an entry: not from 0 µs, which put every op
    /// some 1.8e9 s after the first (the status line said "1795309612.898 s").
    #[test]
    fn a_wrapped_traces_seconds_count_from_its_first_entry_not_from_its_start_blocks() {
        use crate::engine::ops::NO_ENTRY;
        let mut ops = crate::engine::ops::OpsBuilder::default();
        let alloc = allocsim_core::trace::OpKind::EmptyCache;
        for _ in 0..3 {
            ops.push(&alloc, 0, NO_ENTRY, 0);
        }
        let t0 = 1_795_309_612_898_000_i64;
        for (e, dt) in [0, 1_500_000, 1_500_250, 4_000_000].into_iter().enumerate() {
            ops.push(&alloc, 0, e as u32, t0 + dt);
        }
        let t = TraceData {
            has_times: true,
            ops: Arc::new(ops.finish()),
            ..TraceData::default()
        };
        let doc = Document::new(Arc::new(t));
        let s = doc.seconds();
        let got: Vec<f64> = (0..s.len()).filter_map(|i| s.get(i)).collect();
        assert_eq!(got, [0.0, 0.0, 0.0, 0.0, 1.5, 1.500_25, 4.0]);
        assert_eq!(s.last(), Some(4.0));
        assert_eq!(s.partition_point(|x| x <= 0.0), 4);
    }

    /// The seconds read from the ops table's compact times are those of a plain copy:
    /// every op's, and every search of the time axis.
    #[test]
    fn seconds_from_the_compact_times_equal_a_plain_copy() {
        let mut times = vec![-5_000_000_000_i64, -1, 0, 7];
        let mut x = 1_700_000_000_000_000_i64;
        for i in 0..1_000 {
            x += [0, 1, 250, 70_000, 5_000_000_000][i % 5];
            times.push(x);
        }
        let t = trace_with_times(&times);
        let round: Vec<i64> = t.ops.times_us().collect();
        assert_eq!(round, times);
        assert!(timed(&t));
        let s = Seconds::of(&t, Clock::of(&t));
        let plain: Vec<f64> = times.iter().map(|&x| (x - times[0]) as f64 / 1e6).collect();
        assert_eq!(s.len(), plain.len());
        for (i, &p) in plain.iter().enumerate() {
            assert_eq!(s.get(i), Some(p), "op {i}");
        }
        assert_eq!(s.get(plain.len()), None);
        assert_eq!(s.last(), plain.last().copied());
        for &at in &[
            -1.0,
            0.0,
            5.0,
            5.000_001,
            1e6,
            plain[500],
            plain[999] + 0.5,
            1e12,
        ] {
            assert_eq!(
                s.partition_point(|t| t <= at),
                plain.partition_point(|&t| t <= at),
                "{at}"
            );
            assert_eq!(
                s.partition_point(|t| t < at),
                plain.partition_point(|&t| t < at),
                "{at}"
            );
        }
        // Extreme times survive the column exactly.
        let ends = trace_with_times(&[i64::MIN, i64::MIN + 1, -1, 0, i64::MAX]);
        assert_eq!(
            ends.ops.times_us().collect::<Vec<_>>(),
            [i64::MIN, i64::MIN + 1, -1, 0, i64::MAX]
        );
        // Times that go backwards, or none: no time axis.
        let back = trace_with_times(&[5, 4]);
        assert!(!timed(&back));
        assert!(Seconds::of(&back, Clock::of(&back)).is_empty());
        assert!(!timed(&TraceData::default()));
    }
}

#[cfg(test)]
thread_local! {
    /// How many recorded timelines were made per op ([`RecordedView::per_op`]).
    pub(crate) static PER_OP_MADE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}
