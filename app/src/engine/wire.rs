//! The messages between the UI and the engine. Natively they travel through channels as
//! they are; on the web they cross to a Web Worker as bytes ([`encode`], [`decode`]).
//!
//! Every request carries a `job` number chosen by the UI; the responses to it carry the
//! same number, so the UI drops answers to questions it no longer asks.

use allocsim_core::capacity::CapacityChoice;
use allocsim_core::explain::Explanation;
use allocsim_core::metrics::{Column, Timeline, bytes, exact_vec};
use allocsim_core::models::ModelSpec;
use allocsim_core::offline::BestPossible;
use allocsim_core::whatif::SweptReplay;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// How the message of a [`Response::Failed`] begins when the engine panicked (in the
/// browser: a worker whose wasm instance cannot run again).
pub const CRASHED: &str = "the engine crashed";

pub use super::ops::{NO_ENTRY, NO_OP, OpsTable, op_kind};

/// The main configuration of a file being opened ([`Request::Open`]): its spec, and its
/// capacity — given (`capacity_bytes`), or as recorded (`as_recorded`; then unlimited is
/// assumed, what a recording without a refusal gets).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MainReplay {
    pub spec: String,
    pub capacity_bytes: Option<u64>,
    pub as_recorded: bool,
    /// The jobs the UI gives its [`Request::Replay`] of this configuration (slot 0) and
    /// its [`Request::StartLayout`]: where the browser's worker replays it ahead
    /// ([`crate::engine::Engine::open_decoded_replaying`]), it answers both unasked right
    /// after [`Response::Loaded`] (which says so: `main_answered`), so that the page takes
    /// the trace, the replay and its layout in one frame, with no round trip.
    pub answer: Option<(u64, u64)>,
}

impl MainReplay {
    /// The UI's [`Request::Replay`] of this configuration (slot 0) and its
    /// [`Request::StartLayout`], under the jobs `(replay, layout)`.
    #[must_use]
    pub fn requests(&self, (replay, layout): (u64, u64)) -> Vec<Request> {
        let replay = Request::Replay {
            job: replay,
            slot: 0,
            spec: self.spec.clone(),
            capacity_bytes: self.capacity_bytes,
        };
        let layout = Request::StartLayout {
            job: layout,
            slot: 0,
            otherwise: NO_OP,
        };
        vec![replay, layout]
    }
}

/// What the UI asks the engine to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// Decode a snapshot (`.pickle`, `.pickle.gz`, `.json`, …) and build its trace.
    Load {
        job: u64,
        name: String,
        #[serde(with = "bytes")]
        bytes: Vec<u8>,
    },
    /// Decode the snapshot file at `path`, read in pieces by the engine (natively: the
    /// file's bytes are never all held), with progress; stopped by [`Request::Cancel`].
    Open {
        job: u64,
        name: String,
        path: String,
        /// The configuration the UI will replay first: natively replayed beside the
        /// trace's build, its [`Request::Replay`] then answered from it.
        main: Box<MainReplay>,
    },
    /// Show another device of the loaded trace (answered with [`Response::Loaded`]).
    SelectDevice { job: u64, device: u32 },
    /// Replay the loaded trace through `spec` (`NAME` or `NAME@CONFIG`) under `capacity`,
    /// into compare slot `slot` (replacing what it held).
    Replay {
        job: u64,
        slot: u32,
        spec: String,
        capacity_bytes: Option<u64>,
    },
    /// Forget slot `slot` (its replay and checkpoints).
    DropSlot { slot: u32 },
    /// The memory layout of slot `slot` after ops `0..=op`.
    Layout { job: u64, slot: u32, op: u32 },
    /// The memory layout of slot `slot` where a newly opened trace's cursor goes: after
    /// the main configuration's (slot 0's) first OOM, else its first peak
    /// ([`ReplayData::start_op`]); after op `otherwise` where slot 0 has no replay. Sent
    /// right behind the replays, so that no frame of the UI sits between a replay and
    /// its layout (in the browser a frame costs 50-300 ms of a software rasterizer).
    StartLayout { job: u64, slot: u32, otherwise: u32 },
    /// Every allocation of slot `slot` whose bytes contain `addr`.
    FindAddress { job: u64, slot: u32, addr: u64 },
    /// Which PyTorch settings would run the trace under `capacity`, and at what cost
    /// (`recommend`'s sweep and trade-off table). Stopped by [`Request::Cancel`].
    WhatIf {
        job: u64,
        capacity_bytes: Option<u64>,
    },
    /// The other allocators (runtimes a PyTorch program cannot switch to by a setting)
    /// under `capacity`, for the Compare tab.
    Runtimes {
        job: u64,
        capacity_bytes: Option<u64>,
    },
    /// Why the request at `at_event` did not fit under `spec` and `capacity`
    /// (`allocsim explain --at`; at an OOM, that OOM). Cached per question until the next
    /// load.
    Explain {
        job: u64,
        spec: String,
        capacity_bytes: Option<u64>,
        at_event: u64,
    },
    /// The metrics timeline of `spec` under `capacity_bytes` as CSV (core's
    /// `Timeline::to_csv`), replayed again with every column (the app's replays keep only
    /// those it draws): answered as [`Response::CsvPiece`]s, so that no side holds the
    /// whole CSV (about 100 bytes an op).
    ExportCsv {
        job: u64,
        spec: String,
        capacity_bytes: Option<u64>,
    },
    /// The best any allocator could do on the device shown (live-bytes peak, offline
    /// placement).
    Bounds { job: u64 },
    /// The stacked-allocation bands of the device shown ([`Response::Bands`]): natively
    /// built beside the engine (a detached job), so that no replay waits for them.
    Bands { job: u64 },
    /// Stop job `job` (a what-if sweep: the replays not yet started are skipped). Not
    /// answered; the job answers [`Response::Failed`] if it stopped.
    Cancel { job: u64 },
    /// Generate a synthetic workload (core's SPEC syntax) and show it like a loaded trace.
    Workload { job: u64, spec: String },
    /// The smallest capacity (2 MiB grid) on which `spec` runs the trace.
    MinCapacity { job: u64, slot: u32, spec: String },
    /// Two snapshots compared (`allocsim diff`): B under `config_b` when given (PyTorch's
    /// defaults plus it), else its own settings. Independent of the loaded trace.
    Diff {
        job: u64,
        /// A and B.
        files: Box<[NamedBytes; 2]>,
        align: allocsim_core::diff::Align,
        config_b: Option<String>,
    },
    /// One snapshot per rank (`allocsim ranks`), the what-if `what_if` on every rank.
    Ranks {
        job: u64,
        files: Vec<NamedBytes>,
        what_if: String,
    },
    /// Rank `index` of a [`Request::Ranks`] alone (decode, replay, smallest capacity,
    /// what-if), answered with [`Response::RankDone`]: the browser runs the ranks of a set
    /// in a pool of workers and puts the rows together itself
    /// ([`crate::engine::multi::gather_ranks`]).
    Rank {
        job: u64,
        index: u32,
        rank: u32,
        file: NamedBytes,
        what_if: String,
    },
    /// What a sweep of the trace shown needs to know of it
    /// ([`allocsim_core::whatif::sweep_sizes`]), answered with [`Response::SweepSizes`]:
    /// the browser runs "What would fit?"'s replays on a pool of search workers and ranks
    /// them itself ([`allocsim_core::whatif::Sweep`]).
    SweepSizes { job: u64 },
    /// Replays `indices` of such a sweep, in order, each the trace shown through its
    /// `specs` entry under `capacity_bytes`: a worker's whole share of a batch in one
    /// message, answered with a [`Response::SweepReplayed`] per replay.
    SweepReplays {
        job: u64,
        indices: Vec<u32>,
        specs: Vec<ModelSpec>,
        capacity_bytes: Option<u64>,
    },
    /// The trace shown, for the browser's search workers (answered with
    /// [`Response::SharedTrace`]): they replay it instead of decoding the file again.
    ShareTrace { job: u64 },
    /// A search worker's trace, as [`Response::SharedTrace`] gave it (not answered): the
    /// bytes of [`allocsim_core::trace::binary`], device `device` shown.
    SearchTrace {
        job: u64,
        device: u32,
        #[serde(with = "bytes")]
        trace: Vec<u8>,
    },
}

/// A file's name and bytes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NamedBytes {
    pub name: String,
    #[serde(with = "bytes")]
    pub bytes: Vec<u8>,
}

impl Request {
    /// The job this asks for (0 for [`Request::DropSlot`], which is not answered).
    #[must_use]
    pub fn job(&self) -> u64 {
        match self {
            Request::Load { job, .. }
            | Request::Open { job, .. }
            | Request::SelectDevice { job, .. }
            | Request::Replay { job, .. }
            | Request::Layout { job, .. }
            | Request::StartLayout { job, .. }
            | Request::FindAddress { job, .. }
            | Request::WhatIf { job, .. }
            | Request::Runtimes { job, .. }
            | Request::Explain { job, .. }
            | Request::ExportCsv { job, .. }
            | Request::Bounds { job }
            | Request::Bands { job }
            | Request::Workload { job, .. }
            | Request::MinCapacity { job, .. }
            | Request::Diff { job, .. }
            | Request::Ranks { job, .. }
            | Request::Rank { job, .. }
            | Request::SweepSizes { job }
            | Request::SweepReplays { job, .. }
            | Request::ShareTrace { job }
            | Request::SearchTrace { job, .. } => *job,
            Request::DropSlot { .. } | Request::Cancel { .. } => 0,
        }
    }

    /// The request's name (its variant), for the worker's timing lines.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Load { .. } => "Load",
            Request::Open { .. } => "Open",
            Request::SelectDevice { .. } => "SelectDevice",
            Request::Replay { .. } => "Replay",
            Request::DropSlot { .. } => "DropSlot",
            Request::Layout { .. } => "Layout",
            Request::StartLayout { .. } => "StartLayout",
            Request::FindAddress { .. } => "FindAddress",
            Request::WhatIf { .. } => "WhatIf",
            Request::Runtimes { .. } => "Runtimes",
            Request::Explain { .. } => "Explain",
            Request::ExportCsv { .. } => "ExportCsv",
            Request::Bounds { .. } => "Bounds",
            Request::Bands { .. } => "Bands",
            Request::Cancel { .. } => "Cancel",
            Request::Workload { .. } => "Workload",
            Request::MinCapacity { .. } => "MinCapacity",
            Request::Diff { .. } => "Diff",
            Request::Ranks { .. } => "Ranks",
            Request::Rank { .. } => "Rank",
            Request::SweepSizes { .. } => "SweepSizes",
            Request::SweepReplays { .. } => "SweepReplays",
            Request::ShareTrace { .. } => "ShareTrace",
            Request::SearchTrace { .. } => "SearchTrace",
        }
    }
}

/// What the engine answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Response {
    /// Work on `job` goes on: `stage` is shown beside a bar at `fraction` (0..=1).
    Progress {
        job: u64,
        stage: String,
        fraction: f32,
    },
    /// What the file records, sent as soon as it is decoded, before [`Response::Loaded`]:
    /// the app draws it while the trace is built and replayed.
    Recorded {
        job: u64,
        recorded: Box<RecordedData>,
    },
    Loaded {
        job: u64,
        trace: Box<TraceData>,
        /// The main configuration's replay and layout follow, answered unasked under the
        /// jobs of [`MainReplay::answer`]: the UI asks for neither.
        main_answered: bool,
    },
    Replayed {
        job: u64,
        slot: u32,
        replay: Box<ReplayData>,
    },
    Layout {
        job: u64,
        slot: u32,
        layout: Box<LayoutData>,
    },
    AddressHits {
        job: u64,
        slot: u32,
        addr: u64,
        hits: Vec<AddressHit>,
    },
    WhatIf {
        job: u64,
        answer: Box<WhatIfData>,
    },
    Runtimes {
        job: u64,
        rows: Vec<WhatIfRow>,
    },
    Explained {
        job: u64,
        /// The op explained (the explanation's own `op_index` does not cross the wire).
        op_index: u32,
        /// Without its layout: the memory map shows the replay's own.
        explanation: Box<Explanation>,
    },
    /// A piece of the CSV [`Request::ExportCsv`] asked for, in order (the first with the
    /// header); `done` on the last.
    CsvPiece {
        job: u64,
        #[serde(with = "bytes")]
        bytes: Vec<u8>,
        done: bool,
    },
    Bounds {
        job: u64,
        bounds: BestPossible,
    },
    /// The answer to [`Request::Bands`].
    Bands {
        job: u64,
        bands: Arc<Bands>,
    },
    MinCapacity {
        job: u64,
        slot: u32,
        bytes: u64,
    },
    Diffed {
        job: u64,
        data: Box<DiffData>,
    },
    Ranked {
        job: u64,
        data: Box<RanksData>,
    },
    /// The answer to [`Request::Rank`]: its row, or why it could not be read.
    RankDone {
        job: u64,
        index: u32,
        outcome: Box<RankOutcome>,
    },
    /// The answer to [`Request::SweepSizes`].
    SweepSizes {
        job: u64,
        sizes: Vec<u64>,
    },
    /// One answer to [`Request::SweepReplays`].
    SweepReplayed {
        job: u64,
        index: u32,
        result: SweptReplay,
    },
    /// The answer to [`Request::ShareTrace`]: the trace as
    /// [`allocsim_core::trace::binary`] bytes, device `device` shown (the browser's
    /// engine worker posts it as the [`Request::SearchTrace`] the search workers take).
    SharedTrace {
        job: u64,
        device: u32,
        #[serde(with = "bytes")]
        trace: Vec<u8>,
    },
    /// The job failed; `message` is shown in the app as it is.
    Failed {
        job: u64,
        message: String,
    },
}

impl Response {
    /// The job this answers.
    #[must_use]
    pub fn job(&self) -> u64 {
        match self {
            Response::Progress { job, .. }
            | Response::Recorded { job, .. }
            | Response::Loaded { job, .. }
            | Response::Replayed { job, .. }
            | Response::Layout { job, .. }
            | Response::AddressHits { job, .. }
            | Response::WhatIf { job, .. }
            | Response::Runtimes { job, .. }
            | Response::Explained { job, .. }
            | Response::CsvPiece { job, .. }
            | Response::Bounds { job, .. }
            | Response::Bands { job, .. }
            | Response::MinCapacity { job, .. }
            | Response::Diffed { job, .. }
            | Response::Ranked { job, .. }
            | Response::RankDone { job, .. }
            | Response::SweepSizes { job, .. }
            | Response::SweepReplayed { job, .. }
            | Response::SharedTrace { job, .. }
            | Response::Failed { job, .. } => *job,
        }
    }
}

/// Stack frames, each stored once (a flattened copy of the core's frame table).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StackTable {
    #[serde(deserialize_with = "exact_vec")]
    pub strings: Vec<String>,
    /// `(name, filename, line)`, the first two indexes into `strings`.
    #[serde(deserialize_with = "exact_vec")]
    pub frames: Vec<(u32, u32, i64)>,
    /// Stack `s` is `frame_ids[offsets[s]..offsets[s + 1]]`, innermost frame first.
    #[serde(deserialize_with = "exact_vec")]
    pub offsets: Vec<u32>,
    #[serde(deserialize_with = "exact_vec")]
    pub frame_ids: Vec<u32>,
}

impl StackTable {
    /// Number of stacks (stack 0 is empty).
    #[must_use]
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// Whether the table holds no stack.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The frames of stack `s`, innermost first (empty for an unknown stack).
    pub fn frames_of(&self, s: u32) -> impl Iterator<Item = (&str, &str, i64)> + '_ {
        let s = s as usize;
        let range = match (self.offsets.get(s), self.offsets.get(s + 1)) {
            (Some(&a), Some(&b)) if a <= b && b as usize <= self.frame_ids.len() => {
                a as usize..b as usize
            }
            _ => 0..0,
        };
        self.frame_ids[range].iter().filter_map(move |&f| {
            let &(name, file, line) = self.frames.get(f as usize)?;
            Some((self.str(name), self.str(file), line))
        })
    }

    /// A stack as lines `name (file:line)`, innermost first (`?` for a frame whose line
    /// the snapshot does not give as an `i64`).
    #[must_use]
    pub fn format(&self, s: u32) -> Vec<String> {
        self.frames_of(s)
            .map(|(n, f, l)| format_frame(n, f, l))
            .collect()
    }

    fn str(&self, i: u32) -> &str {
        self.strings.get(i as usize).map_or("", String::as_str)
    }
}

/// A frame as the tooltips and the stack panel print it: `name (file:line)`, `?` for a
/// line the snapshot does not give as an `i64`.
#[must_use]
pub fn format_frame(name: &str, file: &str, line: i64) -> String {
    if line == allocsim_core::snapshot::Frame::LINE_UNKNOWN {
        format!("{name} ({file}:?)")
    } else {
        format!("{name} ({file}:{line})")
    }
}

/// One rectangle of the stacked-allocation view: allocation `alloc` occupied bytes
/// `y0_bytes..y0_bytes + height_bytes` of the stack of live allocations over ops `x0..x1`,
/// its height the allocation's requested bytes ([`BandPiece::height_bytes`]: not kept).
/// A piece is 20 bytes (its bottom in two `u32`s, so no padding): the 1.12 GB snapshot
/// has 5.9 M of them, in the page's memory and, while it stacks them, the worker's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BandPiece {
    pub x0: u32,
    pub x1: u32,
    y0_low: u32,
    y0_high: u32,
    pub alloc: u32,
}

impl BandPiece {
    /// Allocation `alloc` at bytes `y0_bytes..` of the stack over ops `x0..x1`.
    #[must_use]
    pub fn new(x0: u32, x1: u32, y0_bytes: u64, alloc: u32) -> BandPiece {
        BandPiece {
            x0,
            x1,
            y0_low: y0_bytes as u32,
            y0_high: (y0_bytes >> 32) as u32,
            alloc,
        }
    }

    /// Its bottom: the bytes of the live allocations stacked below it.
    #[must_use]
    pub fn y0_bytes(&self) -> u64 {
        u64::from(self.y0_high) << 32 | u64::from(self.y0_low)
    }

    /// Its height: the requested bytes of its allocation in `ops`, the table it was
    /// stacked from.
    #[must_use]
    pub fn height_bytes(&self, ops: &OpsTable) -> u64 {
        ops.size_bytes(self.alloc as usize)
    }
}

/// Every live allocation stacked over the ops (`memory_viz`'s "Active Memory Timeline",
/// with every allocation).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Bands {
    /// Largest area (ops × bytes) first, so a level of detail is a prefix.
    #[serde(deserialize_with = "exact_vec")]
    pub pieces: Vec<BandPiece>,
    /// Largest sum of live requested bytes.
    pub peak_bytes: u64,
    /// Shifts of less than this many bytes are drawn late (bounds the piece count).
    pub epsilon_bytes: u64,
}

/// A loaded trace, as the UI needs it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[allow(clippy::struct_excessive_bools)] // independent facts about the file, not a state machine
pub struct TraceData {
    pub name: String,
    /// The device shown.
    pub device: u32,
    /// `(events, ops)` of every device of the file.
    pub devices: Vec<(u32, u32)>,
    /// The recording's `PYTORCH_CUDA_ALLOC_CONF` ("" if unset).
    pub recorded_conf: String,
    /// A recording (false: a synthetic workload).
    pub recorded: bool,
    /// Whether the PyTorch model reproduced the recording exactly (validate).
    pub exact: bool,
    /// The first divergence or what was inferred, one line each.
    pub notes: Vec<String>,
    /// The trace starts mid-program (the ring buffer wrapped).
    pub starts_mid_program: bool,
    /// Whether `time_us` is present.
    pub has_times: bool,
    /// The capacity as recorded on the device shown (`allocsim replay`'s default): inferred
    /// from the recording's refusals, or unlimited with nothing refused (None: a synthetic
    /// workload, which has no recording).
    pub recorded_capacity: Option<CapacityChoice>,
    /// The engine's own table, shared (natively no copy: the UI and the engine hold one
    /// `Arc`; to the browser's worker it crosses as its contents).
    pub ops: Arc<OpsTable>,
    pub stacks: Arc<StackTable>,
    /// Empty until [`Response::Bands`] brings them (stacked once every configuration is
    /// on screen).
    pub bands: Arc<Bands>,
}

/// Where a replay ran out of memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OomData {
    pub event_index: u64,
    pub op_index: u32,
    pub requested_bytes: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub free_bytes: u64,
    pub largest_free_bytes: u64,
    pub free_holes: u64,
    /// PyTorch's own OOM sentence (None for the other models).
    pub pytorch_message: Option<String>,
    /// Our explanation: the holes, the largest, why no segment could be had.
    pub explanation: String,
    /// The recording failed here too (and the program went on).
    pub recorded: bool,
    /// The program would have died here (the recording did not fail there too).
    pub fatal: bool,
}

/// The numbers of one replay (what `allocsim replay --json` reports).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplaySummary {
    pub allocator: String,
    pub config: String,
    pub capacity_bytes: Option<u64>,
    pub ops_done: u32,
    pub requests: u32,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub peak_requested_bytes: u64,
    pub final_reserved_bytes: u64,
    pub internal_waste_bytes_at_peak: u64,
    pub fragmentation_at_peak: f64,
    pub max_fragmentation: f64,
    pub segment_ops: u64,
    /// The OOM `allocsim replay` reports: the first, unless a fatal one follows recorded
    /// ones.
    pub oom: Option<OomData>,
    /// Every request the replay could not serve, in order.
    pub ooms: Vec<OomData>,
}

/// One replay: its numbers and its metrics timeline (one sample after every op done).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReplayData {
    /// The spec as asked (`NAME` or `NAME@CONFIG`).
    pub spec: String,
    pub summary: ReplaySummary,
    /// The replay's own timeline, core's compact columns (exact, about 10 bytes an op in
    /// all), moved out of the replay; to the browser's worker they cross as they are.
    pub timeline: Timeline,
}

impl ReplayData {
    /// The op at which allocated bytes peak first.
    #[must_use]
    pub fn peak_op(&self) -> u32 {
        self.timeline
            .allocated_bytes
            .iter()
            .enumerate()
            .fold(
                (0usize, 0u64),
                |(bi, bv), (i, v)| if v > bv { (i, v) } else { (bi, bv) },
            )
            .0 as u32
    }

    /// Where a newly opened trace's cursor goes once this (the main configuration's)
    /// replay is in: its first OOM, else its [`ReplayData::peak_op`].
    #[must_use]
    pub fn start_op(&self) -> u32 {
        self.summary
            .ooms
            .first()
            .map_or_else(|| self.peak_op(), |o| o.op_index)
    }
}

/// Block states in [`BlockView::state`].
pub mod block_state {
    pub const ALLOCATED: u8 = 0;
    pub const FREE: u8 = 1;
    pub const PENDING_FREE: u8 = 2;
    pub const UNMAPPED: u8 = 3;
}

/// One segment of a [`LayoutData`]; its blocks are `blocks[first..first + count]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentView {
    pub addr: u64,
    pub size_bytes: u64,
    pub stream: u64,
    pub pool: (u64, u64),
    pub small: bool,
    pub expandable: bool,
    pub first: u32,
    pub count: u32,
}

/// One block of a [`LayoutData`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockView {
    pub addr: u64,
    pub size_bytes: u64,
    pub requested_bytes: u64,
    /// A [`block_state`] constant.
    pub state: u8,
    /// The alloc op of the allocation in it ([`NO_OP`] for free space or a block that
    /// was already alive when the trace starts and has no alloc op).
    pub alloc: u32,
}

/// What a snapshot records for one device, read from the decoded file alone
/// (`engine::recorded`): one value per trace entry of `device_traces[device]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedData {
    pub name: String,
    pub device: u32,
    /// Bytes reserved from the device after each entry (`segment_*` entries), exact in
    /// core's compact column.
    pub reserved_bytes: Column,
    /// Requested bytes of the live allocations after each entry (`alloc` up to
    /// `free_completed`), exact in core's compact column.
    pub requested_bytes: Column,
    /// The file's `segments` of the device: the layout after its last entry (`op` is that
    /// entry's index; no block is linked to an alloc op).
    pub end_state: LayoutData,
}

/// The memory layout after ops `0..=op` (segments sorted by pool, stream, address).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutData {
    pub op: u32,
    /// The replay stopped (OOM) before `op`: this is the layout where it stopped.
    pub clamped_to: Option<u32>,
    pub segments: Vec<SegmentView>,
    pub blocks: Vec<BlockView>,
}

/// An allocation whose bytes contain a searched address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressHit {
    pub alloc: u32,
    pub addr: u64,
    pub size_bytes: u64,
}

/// One replay of a what-if: a PyTorch setting of `recommend`'s trade-off table, or
/// another runtime of the Compare tab.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WhatIfRow {
    /// `NAME` or `NAME@CONFIG` (`pytorch` alone: PyTorch's defaults).
    pub spec: String,
    /// The PyTorch setting `recommend` ranks first under the capacity.
    pub recommended: bool,
    /// Served every request (`whatif::served_all`).
    pub fits: bool,
    pub peak_reserved_bytes: u64,
    pub oom_event: Option<u64>,
    /// `cudaMalloc`s and `cudaFree`s (segments created and released).
    pub segment_ops: u64,
    /// Operations that synchronize the device (each `cudaFree`, each unmapping).
    pub synchronizing_ops: u64,
    /// Predicted time of the driver calls (core's cost table), microseconds.
    pub driver_time_us: f64,
    /// Why it could not be replayed at all (bad config), else empty.
    pub error: String,
}

/// `recommend`'s answer under a capacity: the snapshot's own settings, then the best
/// PyTorch settings in rank order (the best first).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WhatIfData {
    pub capacity_bytes: Option<u64>,
    /// The snapshot's own settings (the recorded `PYTORCH_CUDA_ALLOC_CONF`).
    pub recorded: Option<WhatIfRow>,
    pub tradeoffs: Vec<WhatIfRow>,
    /// Settings swept, replayed (the others act alike on this trace), and serving every
    /// request.
    pub candidates_tried: u32,
    pub candidates_replayed: u32,
    pub candidates_fitting: u32,
}

/// Encodes a message for a trip to or from the Web Worker.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, String> {
    postcard::to_allocvec(msg).map_err(|e| format!("cannot encode a message: {e}"))
}

/// Decodes a message [`encode`] made.
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, String> {
    postcard::from_bytes(bytes).map_err(|e| format!("cannot decode a message: {e}"))
}

/// At most this many points of a run's curve cross to the UI.
pub const CURVE_POINTS: usize = 2048;

/// A run's curve on the common axis, reduced: each point the maximum of its bucket of ops
/// (a peak is never lost), at the bucket's first position.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CurveData {
    pub x: Vec<f64>,
    pub reserved_bytes: Vec<u64>,
    pub allocated_bytes: Vec<u64>,
}

/// The answer to [`Request::Diff`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DiffData {
    pub diff: allocsim_core::diff::Diff,
    /// A's and B's curves.
    pub curves: [CurveData; 2],
}

/// The answer to [`Request::Ranks`]: the ranks that could be read, together, and those
/// that could not (the app shows the others and marks these).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RanksData {
    pub report: Option<allocsim_core::ranks::RanksReport>,
    pub failed: Vec<allocsim_core::ranks::RankFailure>,
    /// Why the readable ranks do not make one set (different devices), if so.
    pub error: Option<String>,
}

/// One rank's answer ([`Response::RankDone`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankOutcome {
    pub row: Result<allocsim_core::ranks::RankRow, allocsim_core::ranks::RankFailure>,
    /// The row's `devices` (the GPUs its process saw), which the row does not serialize:
    /// ranks of different devices make no set.
    pub devices: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Long columns come back equal and in vectors of exactly their length; a length the
    /// message cannot hold is refused, not allocated.
    #[test]
    fn long_columns_decode_into_vectors_of_their_length() {
        let n = 300_000u32;
        let bands = Bands {
            pieces: (0..n)
                .map(|i| BandPiece::new(i, i + 1 + i % 7, u64::from(i) << 20, n - i))
                .collect(),
            peak_bytes: 1 << 40,
            epsilon_bytes: 1 << 28,
        };
        let bytes = encode(&bands).unwrap();
        let back: Bands = decode(&bytes).unwrap();
        assert_eq!(back.pieces, bands.pieces);
        assert!(
            back.pieces
                .iter()
                .zip(0u64..)
                .all(|(p, i)| p.y0_bytes() == i << 20)
        );
        assert_eq!(std::mem::size_of::<BandPiece>(), 20, "no padding");
        assert_eq!(back.pieces.capacity(), back.pieces.len());
        let mut ops = super::super::ops::OpsBuilder::default();
        for k in 0..n {
            let alloc = allocsim_core::trace::OpKind::Alloc {
                size_bytes: u64::from(k) << (k % 40),
                stream: 0,
                pool: allocsim_core::trace::PoolIx(0),
                recorded_oom: false,
                restored: false,
            };
            ops.push(&alloc, k % 3, k, i64::from(k));
        }
        let ops = ops.finish();
        let back: OpsTable = decode(&encode(&ops).unwrap()).unwrap();
        assert!(back.sizes().eq(ops.sizes()));
        assert!(back.times_us().eq(ops.times_us()));
        assert!(back.event_indexes().eq(ops.event_indexes()));
        assert_eq!(back.heap_bytes(), ops.heap_bytes(), "in exactly their room");
        assert_eq!(back.kind.capacity(), n as usize);
        // A column of 8-byte differences past serde's 1 MiB start (1.6 MB of them), and a
        // replay's timeline of such columns: their bytes come back in exactly their room.
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let column: Column = (0..200_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x >> 1
            })
            .collect();
        let mut timeline = Timeline::default();
        for v in &column {
            timeline.push(&allocsim_core::models::ModelStats {
                reserved_bytes: v,
                allocated_bytes: v / 2,
                requested_bytes: v / 3,
                largest_free_bytes: v / 5,
                free_holes: v % 1000,
                ..allocsim_core::models::ModelStats::default()
            });
        }
        let back: Column = decode(&encode(&column).unwrap()).unwrap();
        assert_eq!(back, column);
        assert_eq!(back.capacity_bytes(), column.capacity_bytes());
        assert!(back.capacity_bytes() > 200_000 * 8);
        let mut shrunk = timeline.clone();
        shrunk.shrink_to_fit();
        let back: Timeline = decode(&encode(&timeline).unwrap()).unwrap();
        assert_eq!(back, timeline);
        assert_eq!(back.capacity_bytes(), shrunk.capacity_bytes());
        // A stated length of 2^32 pieces in a message of a few bytes.
        let mut lying = vec![0x80, 0x80, 0x80, 0x80, 0x10];
        lying.extend_from_slice(&[0; 8]);
        assert!(decode::<Bands>(&lying).is_err());
    }
}
