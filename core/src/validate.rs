//! `validate`: the comparison of the PyTorch model with what PyTorch really did, event by
//! event and at the end, and its report ([`DeviceReport`], [`Validation`]). The pass that
//! runs the comparison — the recording replayed through the model on the recorded device,
//! which infers what the snapshot leaves implicit and builds the replayable trace — is
//! [`crate::build`]; it keeps its counts in a [`Comparison`].

use std::collections::BTreeMap;

use crate::models::pytorch::PyTorchModel;
use crate::models::{Allocator, LayoutBlockState, ModelEvent, PoolId};
use crate::snapshot::{Action, BlockState, RawEvent, RawSnapshot, SegmentType};
use crate::trace::{Inference, Trace};

/// A recorded or simulated event in a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct EventView {
    pub action: &'static str,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
}

impl EventView {
    fn recorded(e: &RawEvent) -> EventView {
        EventView {
            action: e.action.as_str(),
            addr: e.addr,
            size: e.size,
            stream: e.stream,
        }
    }
    fn simulated(e: &ModelEvent) -> EventView {
        EventView {
            action: e.action.as_str(),
            addr: e.addr,
            size: e.size,
            stream: e.stream,
        }
    }
}

/// Where the simulation first left the recording.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Divergence {
    pub device: u32,
    /// Index into `device_traces[device]`.
    pub event_index: usize,
    pub recorded: Option<EventView>,
    pub simulated: Option<EventView>,
    pub context: String,
}

/// The validation of one device.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceReport {
    pub device: u32,
    pub exact: bool,
    pub events_compared: u64,
    pub events_matched: u64,
    pub end_state_matches: bool,
    pub end_state_difference: Option<String>,
    pub first_divergence: Option<Divergence>,
    pub peak_reserved_recorded: u64,
    pub peak_reserved_simulated: u64,
    pub inferred: Vec<Inference>,
    pub starts_empty: bool,
}

/// The whole validation: every device that has events.
#[derive(Debug, Clone)]
pub struct Validation {
    pub trace: Trace,
    pub devices: Vec<DeviceReport>,
}

impl Validation {
    /// Every device exact.
    #[must_use]
    pub fn exact(&self) -> bool {
        self.devices.iter().all(|d| d.exact)
    }
}

/// Whether an event is one the model decides, so compared: allocations, the segment
/// events and OOMs (frees are the program's, not the allocator's).
#[must_use]
pub fn compared(a: Action) -> bool {
    matches!(
        a,
        Action::Alloc
            | Action::SegmentAlloc
            | Action::SegmentFree
            | Action::SegmentMap
            | Action::SegmentUnmap
            | Action::Oom
    )
}

fn same(r: &RawEvent, s: &ModelEvent) -> bool {
    r.action == s.action
        && r.size == s.size
        && r.stream == s.stream
        && (r.action == Action::Oom || r.addr == s.addr)
}

/// Whether the model's events are the recorded ones, event for event (only the decided
/// ones: [`compared`]).
#[must_use]
pub fn events_match(recorded: &[RawEvent], out: &[ModelEvent]) -> bool {
    let mut r = recorded.iter().filter(|e| compared(e.action));
    let mut s = out.iter().filter(|e| compared(e.action));
    loop {
        match (r.next(), s.next()) {
            (None, None) => return true,
            (Some(a), Some(b)) if same(a, b) => {}
            _ => return false,
        }
    }
}

/// The comparison of one pass so far: how many decided events were compared and matched,
/// and where the simulation first left the recording.
#[derive(Debug, Clone)]
pub struct Comparison {
    device: u32,
    pub compared: u64,
    pub matched: u64,
    pub divergence: Option<Divergence>,
}

impl Comparison {
    /// Nothing compared yet on device `device`.
    #[must_use]
    pub fn new(device: u32) -> Comparison {
        Comparison {
            device,
            compared: 0,
            matched: 0,
            divergence: None,
        }
    }

    /// Compares the model's events with the recorded slice; counts and keeps the first
    /// divergence.
    pub fn compare(
        &mut self,
        first: usize,
        recorded: &[RawEvent],
        out: &[ModelEvent],
        context: &dyn Fn() -> String,
    ) {
        // Walked side by side, nothing collected: this runs once per recorded group.
        let mut rec = recorded
            .iter()
            .enumerate()
            .filter(|(_, e)| compared(e.action))
            .map(|(k, e)| (first + k, e));
        let mut sim = out.iter().filter(|e| compared(e.action));
        let mut bad: Option<(usize, Option<EventView>, Option<EventView>)> = None;
        loop {
            let (r, s) = (rec.next(), sim.next());
            if r.is_none() && s.is_none() {
                break;
            }
            self.compared += u64::from(r.is_some());
            match (r, s) {
                (Some((_, r)), Some(s)) if same(r, s) => self.matched += 1,
                (r, s) => {
                    if bad.is_none() {
                        let idx =
                            r.map_or_else(|| first + recorded.len().saturating_sub(1), |(i, _)| i);
                        bad = Some((
                            idx,
                            r.map(|(_, e)| EventView::recorded(e)),
                            s.map(EventView::simulated),
                        ));
                    }
                }
            }
        }
        if let (Some((idx, r, s)), None) = (bad, &self.divergence) {
            self.divergence = Some(Divergence {
                device: self.device,
                event_index: idx,
                recorded: r,
                simulated: s,
                context: context(),
            });
        }
    }

    /// Records that the model could not apply recorded event `i` (a free it refuses),
    /// unless an earlier divergence is already kept.
    pub fn diverge_input(&mut self, i: usize, e: &RawEvent, why: &str) {
        if self.divergence.is_none() {
            self.divergence = Some(Divergence {
                device: self.device,
                event_index: i,
                recorded: Some(EventView::recorded(e)),
                simulated: None,
                context: format!(
                    "device {}: the model cannot apply this event: {why}",
                    self.device
                ),
            });
        }
    }

    /// The recorded event where the simulation first left the recording (`usize::MAX`: it
    /// never did).
    #[must_use]
    pub fn diverges_at(&self) -> usize {
        self.divergence
            .as_ref()
            .map_or(usize::MAX, |d| d.event_index)
    }

    /// The report of device `device`: this comparison with the end state's
    /// (`end_state_difference`), the reserved peaks and what was inferred.
    #[must_use]
    pub fn report(
        self,
        end_state_difference: Option<String>,
        peak_reserved_recorded: u64,
        peak_reserved_simulated: u64,
        inferred: Vec<Inference>,
        starts_empty: bool,
    ) -> DeviceReport {
        DeviceReport {
            device: self.device,
            exact: self.divergence.is_none()
                && end_state_difference.is_none()
                && self.compared == self.matched,
            events_compared: self.compared,
            events_matched: self.matched,
            end_state_matches: end_state_difference.is_none(),
            end_state_difference,
            first_divergence: self.divergence,
            peak_reserved_recorded,
            peak_reserved_simulated,
            inferred,
            starts_empty,
        }
    }
}

/// The peak of reserved bytes the recording shows: `start_reserved` at the start, then
/// every segment event of `events`.
#[must_use]
pub fn peak_reserved_recorded(events: &[RawEvent], start_reserved: u64) -> u64 {
    let mut reserved = start_reserved;
    let mut peak = reserved;
    for e in events {
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => reserved += e.size,
            Action::SegmentFree | Action::SegmentUnmap => {
                reserved = reserved.saturating_sub(e.size);
            }
            _ => {}
        }
        peak = peak.max(reserved);
    }
    peak
}

/// One end-state segment: address, size, small pool, pool, blocks (address, size, state).
type EndSegment = (u64, u64, bool, PoolId, Vec<(u64, u64, BlockState)>);
/// A run of mapped blocks being collected: start, length, blocks.
type EndRun = (u64, u64, Vec<(u64, u64, BlockState)>);

/// The end state of the model in the snapshot's form (expandable segments as runs of
/// mapped blocks), compared with the snapshot's `segments` of the device.
#[must_use]
pub fn end_state_difference(
    snap: &RawSnapshot,
    device: u32,
    model: &PyTorchModel,
    renames: &BTreeMap<PoolId, PoolId>,
) -> Option<String> {
    let mut sim: Vec<EndSegment> = Vec::new();
    for s in model.layout().segments {
        let pool = renames.get(&s.pool).copied().unwrap_or(s.pool);
        let mut run: Option<EndRun> = None;
        for b in &s.blocks {
            let st = match b.state {
                LayoutBlockState::Allocated => Some(BlockState::ActiveAllocated),
                LayoutBlockState::PendingFree => Some(BlockState::ActivePendingFree),
                LayoutBlockState::Free => Some(BlockState::Inactive),
                LayoutBlockState::Unmapped => None,
            };
            match st {
                Some(st) => {
                    let r = run.get_or_insert((b.addr, 0, Vec::new()));
                    r.1 += b.size_bytes;
                    r.2.push((b.addr, b.size_bytes, st));
                }
                None => {
                    if let Some((a, sz, bl)) = run.take() {
                        sim.push((a, sz, s.small, pool, bl));
                    }
                }
            }
        }
        if let Some((a, sz, bl)) = run.take() {
            sim.push((a, sz, s.small, pool, bl));
        }
    }
    sim.sort_by_key(|s| s.0);
    let rec: Vec<_> = snap
        .segments
        .iter()
        .filter(|s| s.device == device)
        .collect();
    if rec.len() != sim.len() {
        return Some(format!(
            "{} segments recorded at the end, {} simulated",
            rec.len(),
            sim.len()
        ));
    }
    for (r, s) in rec.iter().zip(&sim) {
        if r.address != s.0 || r.total_size != s.1 {
            return Some(format!(
                "segment {:#x} ({} bytes) recorded, {:#x} ({} bytes) simulated",
                r.address, r.total_size, s.0, s.1
            ));
        }
        if (r.segment_type == SegmentType::Small) != s.2 {
            return Some(format!("segment {:#x}: pool type differs", r.address));
        }
        let rp = PoolId(r.segment_pool_id.0, r.segment_pool_id.1);
        if rp.is_private() != s.3.is_private() || (s.3.0 != u64::MAX && rp != s.3) {
            return Some(format!(
                "segment {:#x}: pool {rp:?} recorded, {:?} simulated",
                r.address, s.3
            ));
        }
        let rb: Vec<(u64, u64, BlockState)> = r
            .blocks
            .iter()
            .map(|b| (b.address, b.size, b.state))
            .collect();
        if rb != s.4 {
            let k = rb
                .iter()
                .zip(&s.4)
                .position(|(a, b)| a != b)
                .unwrap_or(rb.len().min(s.4.len()));
            return Some(format!(
                "segment {:#x}: block {k} is {:?} recorded, {:?} simulated",
                r.address,
                rb.get(k),
                s.4.get(k)
            ));
        }
    }
    None
}
